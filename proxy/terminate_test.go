package proxy_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// TestTerminateAfterPipelineRunsEverything: a client that sends, in one write, Query messages and then
// Terminate has every statement run before the server closes, as on a direct connection: the client reads
// until end of file and then finds the row its last statement inserted. The proxy used to close (or keep) the
// upstream connection while the server still had the client's input to read and answers to send: the close
// with unread answers reset the connection, and the server never ran the last statement.
func TestTerminateAfterPipelineRunsEverything(t *testing.T) {
	d := direct(t)
	ctx := ctxT(t)
	if _, err := d.Exec(ctx, "DROP TABLE IF EXISTS terminate_pipeline; CREATE TABLE terminate_pipeline (via text)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Exec(context.Background(), "DROP TABLE IF EXISTS terminate_pipeline") })
	run := func(t *testing.T, addr, via string) {
		for i := range 5 { // more than once: the lost statement depended on when the reset came
			c := dialRaw(t, addr, pgtest.SuperUser, pgtest.TestDB, nil)
			c.fe.Send(&pgproto3.Query{String: "SELECT 1"})
			c.fe.Send(&pgproto3.Query{String: "SELECT 2"})
			c.fe.Send(&pgproto3.Query{String: "INSERT INTO terminate_pipeline VALUES ('" + via + "')"})
			c.fe.Send(&pgproto3.Terminate{})
			c.conn.SetDeadline(time.Now().Add(20 * time.Second))
			if err := c.fe.Flush(); err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, c.conn) // until the connection closes: the server has done what it was sent
			c.conn.Close()
			var n int
			if err := d.QueryRow(ctx, "SELECT count(*) FROM terminate_pipeline WHERE via = $1", via).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != i+1 {
				t.Fatalf("after %d pipelines ending in Terminate, %d rows inserted", i+1, n)
			}
		}
	}
	t.Run("direct", func(t *testing.T) { run(t, pg.Addr(), "direct") })
	for _, tr := range []struct{ name, yaml, upstream string }{
		{"event loop", "", ""},
		{"goroutines", goroutinesYAML, ""},
		{"event loop without reuse", "", "  reuse:\n    max_idle: 0\n"},
		{"goroutines without reuse", goroutinesYAML, "  reuse:\n    max_idle: 0\n"},
		{"transaction pooling", "pool:\n  mode: transaction\n  size: 2\nauth:\n  type: trust\n", ""},
	} {
		t.Run(tr.name, func(t *testing.T) {
			p := startProxy(t, proxytest.Options{YAML: tr.yaml, Upstream: tr.upstream})
			run(t, p.Addr, tr.name)
		})
	}
}

// TestTerminateWaitIsCutByShutdown: a session whose client sent a long statement and then Terminate waits for
// the server (the client's connection stays open meanwhile), and a shutdown that runs out of time ends that wait
// and cancels the statement: the backend goes away instead of sleeping on. Both transports.
func TestTerminateWaitIsCutByShutdown(t *testing.T) {
	for _, tr := range []struct{ name, yaml string }{{"event loop", ""}, {"goroutines", goroutinesYAML}} {
		t.Run(tr.name, func(t *testing.T) {
			p := startProxy(t, proxytest.Options{YAML: tr.yaml})
			d := direct(t)
			conn, fe, _ := rawStartup(t, p.Addr, pgproto3.ProtocolVersionNumber, nil)
			pid := rawBackendPID(t, fe)
			fe.Send(&pgproto3.Query{String: "SELECT pg_sleep(60)"})
			fe.Send(&pgproto3.Terminate{})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "the query to run", func() bool { return backendState(t, d, pid) == "active" })
			// The proxy has not closed the client: it waits for the server to answer and close.
			conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			var b [1]byte
			if _, err := conn.Read(b[:]); !isTimeoutErr(err) {
				t.Fatalf("the client's connection ended while its statement ran: %v", err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // no time to drain: the proxy closes every session at once
			p.Server.Shutdown(ctx)
			eventually(t, 10*time.Second, "the backend to go away", func() bool { return backendState(t, d, pid) == "gone" })
		})
	}
}
