package proxy_test

import (
	"net"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A client that asks for protocol 3.2, or with protocol options (_pq_.*), learns from NegotiateProtocolVersion
// that the pool speaks 3.0 and none of the options, as PostgreSQL tells it, before authentication; the options
// choose no pool and do not reach the server's login, and the session works (an attacker's review, 2026-12-04:
// it was told nothing, and believed it had 3.2).
func TestPooledNegotiatesProtocolVersion(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	for _, tc := range []struct {
		name    string
		version uint32
		params  map[string]string
		want    []string // unrecognized options; nil: no NegotiateProtocolVersion
	}{
		{"3.0", pgproto3.ProtocolVersionNumber, nil, nil},
		{"3.2", 3<<16 | 2, nil, []string{}},
		{"3.0 with options", pgproto3.ProtocolVersionNumber, map[string]string{"_pq_.b": "1", "_pq_.a": "x"}, []string{"_pq_.a", "_pq_.b"}},
		{"3.9999 with an option", 3<<16 | 9999, map[string]string{"_pq_.c": ""}, []string{"_pq_.c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.DialTimeout("tcp", f.p.Addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			fe := pgproto3.NewFrontend(conn, conn)
			params := map[string]string{"user": pgtest.SuperUser, "database": pgtest.TestDB}
			for k, v := range tc.params {
				params[k] = v
			}
			fe.Send(&pgproto3.StartupMessage{ProtocolVersion: tc.version, Parameters: params})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			var negotiated *pgproto3.NegotiateProtocolVersion
			first := true
			for {
				m, err := fe.Receive()
				if err != nil {
					t.Fatal(err)
				}
				if n, ok := m.(*pgproto3.NegotiateProtocolVersion); ok {
					if !first {
						t.Fatal("NegotiateProtocolVersion after other messages")
					}
					negotiated = &pgproto3.NegotiateProtocolVersion{NewestMinorProtocol: n.NewestMinorProtocol, UnrecognizedOptions: slices.Clone(n.UnrecognizedOptions)}
				}
				if e, ok := m.(*pgproto3.ErrorResponse); ok {
					t.Fatalf("startup refused: %s %s", e.Code, e.Message)
				}
				first = false
				if _, ok := m.(*pgproto3.ReadyForQuery); ok {
					break
				}
			}
			switch {
			case tc.want == nil && negotiated != nil:
				t.Fatalf("NegotiateProtocolVersion %+v for a 3.0 startup without options", negotiated)
			case tc.want != nil && negotiated == nil:
				t.Fatal("no NegotiateProtocolVersion")
			case tc.want != nil && (negotiated.NewestMinorProtocol != 0 || !slices.Equal(negotiated.UnrecognizedOptions, tc.want) && len(tc.want)+len(negotiated.UnrecognizedOptions) > 0):
				t.Fatalf("NegotiateProtocolVersion %+v, want minor 0 and %q", negotiated, tc.want)
			}
			fe.Send(&pgproto3.Query{String: "SELECT 1"})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			for {
				m, err := fe.Receive()
				if err != nil {
					t.Fatal(err)
				}
				if e, ok := m.(*pgproto3.ErrorResponse); ok {
					t.Fatalf("SELECT 1: %s %s", e.Code, e.Message)
				}
				if _, ok := m.(*pgproto3.ReadyForQuery); ok {
					break
				}
			}
		})
	}
}
