package proxy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// A client that sends more after its Terminate, in the same write, leaves those bytes in the buffer its session
// read into; the next clients, whose sessions get that buffer back (connBuffers), see none of it: each gets the
// answers to its own statements only, and the left-over statement never runs.
func TestPooledClientBuffersStartClean(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	fxExec(t, f.d, fmt.Sprintf("INSERT INTO %s (id) VALUES (1)", f.label))
	leftover := fmt.Sprintf("UPDATE %s SET balance = 666 WHERE id = 1", f.label)
	for i := range 20 {
		conn, err := net.Dial("tcp", f.p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		r := bufio.NewReader(conn)
		params := "user\x00" + pgtest.SuperUser + "\x00database\x00" + pgtest.TestDB + "\x00\x00"
		startup := binary.BigEndian.AppendUint32(nil, uint32(8+len(params)))
		startup = binary.BigEndian.AppendUint32(startup, 3<<16)
		if _, err := conn.Write(append(startup, params...)); err != nil {
			t.Fatal(err)
		}
		readUntilReady(t, r)
		// Its own statement, Terminate, and a statement after it: all in one write, so in one read.
		var out []byte
		out = appendQuery(out, fmt.Sprintf("SELECT %d", i))
		out = append(out, 'X', 0, 0, 0, 4)
		out = appendQuery(out, leftover)
		if _, err := conn.Write(out); err != nil {
			t.Fatal(err)
		}
		if rows := readUntilReady(t, r); len(rows) != 1 || rows[0] != fmt.Sprint(i) {
			t.Fatalf("client %d got rows %q, want only its own %d", i, rows, i)
		}
		conn.Close()
	}
	var balance int
	if err := f.d.QueryRow(ctx, fmt.Sprintf("SELECT balance FROM %s WHERE id = 1", f.label)).Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if balance == 666 {
		t.Fatalf("the statement a client sent after its Terminate ran")
	}
}

// The pooled session's connection lines name the client, its user and database and its application_name as the
// session last reported it (a SET application_name reaches the "connection ended" line); a connection that breaks
// the protocol before its StartupMessage is logged with its address.
func TestPooledConnectionLogLines(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	c := connect(t, withApp(f.dsn(), "pooled-connlog"))
	if _, err := c.Exec(ctx, "SET application_name = 'pooled-connlog-renamed'"); err != nil {
		t.Fatal(err)
	}
	local := c.PgConn().Conn().LocalAddr().String()
	c.Close(context.Background())
	start := connLine(t, f.p, "connection started", "pooled-connlog")
	end := connLine(t, f.p, "connection ended", "pooled-connlog-renamed")
	for _, l := range []map[string]string{start, end} {
		if l["client"] != local || l["user"] != pgtest.SuperUser || l["database"] != pgtest.TestDB {
			t.Errorf("%s line: client %q user %q database %q; want %s %s %s", l["msg"], l["client"], l["user"], l["database"], local, pgtest.SuperUser, pgtest.TestDB)
		}
	}
	if end["outcome"] != "client terminated" {
		t.Errorf("outcome %q, want client terminated", end["outcome"])
	}

	bad, err := net.Dial("tcp", f.p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	badAddr := bad.LocalAddr().String()
	if _, err := bad.Write([]byte{0, 0, 0, 4}); err != nil { // a startup packet too short to hold a version
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the protocol violation's line", func() bool {
		for _, l := range logLines(f.p.Logs.String(), "startup protocol violation") {
			if l["client"] == badAddr {
				return true
			}
		}
		return false
	})
}

func appendQuery(b []byte, sql string) []byte {
	b = append(b, 'Q')
	b = binary.BigEndian.AppendUint32(b, uint32(4+len(sql)+1))
	return append(append(b, sql...), 0)
}

// readUntilReady reads messages up to ReadyForQuery (readRawMsg), failing on an ErrorResponse, and returns the
// first column of every DataRow.
func readUntilReady(t *testing.T, r *bufio.Reader) []string {
	t.Helper()
	var rows []string
	for {
		typ, body, err := readRawMsg(r)
		if err != nil {
			t.Fatal(err)
		}
		switch typ {
		case 'E':
			t.Fatalf("server error: %q", body)
		case 'D':
			n := binary.BigEndian.Uint32(body[2:6])
			rows = append(rows, string(body[6:6+n]))
		case 'Z':
			return rows
		}
	}
}

// In transaction mode a client's socket is read and written with raw system calls from its first byte
// (negotiate): a refused SSLRequest is answered through it, and a client that starts TLS moves to the TLS
// connection, which startPooled then relays. Both log in and run a transaction.
func TestPooledClientTLSAndRefusedSSLRequest(t *testing.T) {
	pgtest.Require(t, pg)
	caFile, certFile, keyFile := writeTestCerts(t, t.TempDir())
	pool := "pool:\n  mode: transaction\n  size: 1\nauth:\n  type: trust\n"
	withTLS := startProxy(t, proxytest.Options{YAML: pool + fmt.Sprintf("tls:\n  cert_file: %s\n  key_file: %s\n", certFile, keyFile)})
	plain := startProxy(t, proxytest.Options{YAML: pool})
	ctx := ctxT(t)
	for _, tc := range []struct {
		name, dsn string
		tls       bool
	}{
		{"TLS", strings.Replace(withTLS.DSN(pgtest.SuperUser, "", pgtest.TestDB), "sslmode=disable", "sslmode=verify-full&sslrootcert="+caFile, 1), true},
		{"SSLRequest refused", strings.Replace(plain.DSN(pgtest.SuperUser, "", pgtest.TestDB), "sslmode=disable", "sslmode=prefer", 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 3 { // the handler goroutines and buffers serve the next clients as they served the first
				c, err := pgx.Connect(ctx, tc.dsn)
				if err != nil {
					t.Fatalf("connect: %v", err)
				}
				if _, isTLS := c.PgConn().Conn().(*tls.Conn); isTLS != tc.tls {
					t.Fatalf("client connection is %T, want TLS %v", c.PgConn().Conn(), tc.tls)
				}
				var n int
				if err := c.QueryRow(ctx, "SELECT 41 + 1").Scan(&n); err != nil || n != 42 {
					t.Fatalf("SELECT: %d, %v", n, err)
				}
				c.Close(ctx)
			}
		})
	}
}
