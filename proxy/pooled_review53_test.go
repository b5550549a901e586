package proxy_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// A message PostgreSQL does not take after the login (a type it does not know, a PasswordMessage, the bytes of
// a second StartupMessage, SSLRequest or GSSENCRequest, whose first byte reads as type 0) ends the session with
// FATAL 08P01 there, between transactions as inside one. PostgreSQL is the judge: each is sent to it directly
// first. In transaction pooling, between transactions (no server connection lent) the proxy read such a
// message's body and dropped it, as it drops CopyData outside a COPY: the length a StartupMessage's bytes give
// swallowed the client's next messages as that body, and the client waited for answers that never came
// (review53proto).
func TestPooledUnknownMessageBetweenTransactions(t *testing.T) {
	pgtest.Require(t, pg)
	pool := startProxy(t, proxytest.Options{YAML: "pool:\n  mode: transaction\n  size: 1\nauth:\n  type: trust\n"})
	session := startProxy(t, proxytest.Options{})
	startup, err := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": pgtest.SuperUser, "database": pgtest.TestDB}}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	request := func(code uint32) []byte {
		return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), code)
	}
	query, err := (&pgproto3.Query{String: "SELECT 1"}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		msg  []byte
	}{
		{"unknown type", []byte{'!', 0, 0, 0, 4}},
		{"PasswordMessage", []byte{'p', 0, 0, 0, 6, 'x', 0}},
		{"second StartupMessage", startup},
		{"SSLRequest", request(80877103)},
		{"GSSENCRequest", request(80877104)},
	}
	for _, c := range cases {
		for _, where := range []struct{ name, addr string }{{"direct", pg.Addr()}, {"session", session.Addr}, {"transaction", pool.Addr}} {
			for _, inBlock := range []bool{false, true} {
				name := c.name + "/" + where.name
				if inBlock {
					name += "/in a block"
				}
				t.Run(name, func(t *testing.T) {
					conn, fe, _ := rawStartup(t, where.addr, pgproto3.ProtocolVersionNumber, nil)
					if inBlock {
						fe.Send(&pgproto3.Query{String: "BEGIN"})
						if err := fe.Flush(); err != nil {
							t.Fatal(err)
						}
						for {
							m, err := fe.Receive()
							if err != nil {
								t.Fatal(err)
							}
							if _, ok := m.(*pgproto3.ReadyForQuery); ok {
								break
							}
						}
					}
					// A Query behind it: directly, the server never reads it.
					if _, err := conn.Write(append(append([]byte(nil), c.msg...), query...)); err != nil {
						t.Fatal(err)
					}
					e := expectClosedWithError(t, conn, 5*time.Second)
					if e == nil || e.Code != "08P01" || e.Severity != "FATAL" {
						t.Fatalf("want FATAL 08P01 and the connection closed, got %+v", e)
					}
				})
			}
		}
	}
	healthy(t, pool)
	healthy(t, session)
}
