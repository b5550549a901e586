package faults

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// FuzzClientMessages starts one in-process proxy in front of the shared cluster (a protected table configured,
// so the rewriting paths run), and for each input: resets the table, logs in as an ordinary role, writes the
// input as client messages, half-closes, and reads until the proxy closes the connection. The proxy must close
// it within a deadline (no hang), still serve a fresh session, and end every session it started (no goroutine
// or backend leak). Then the fencing invariant is checked from a direct connection: every row the input wrote
// was written under a valid token, carries it, and no token was lowered (fuzzCheckInvariant). The seed corpus in
// testdata/fuzz/FuzzClientMessages runs as a unit test; it includes writes that must be refused (stale, no
// token, TRUNCATE, a token reset between Parse and Execute).
func FuzzClientMessages(f *testing.F) {
	pgtest.Require(f, pg)
	// The seed corpus names this table. It is protected, and triggers record every row write the database
	// commits (fuzzWrites), so that each input can be judged by the fencing invariant, not only by liveness.
	table := "fuzz_tbl"
	if err := pg.Exec(fuzzTableSQL(table, pgtest.MD5User)); err != nil {
		f.Fatal(err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), time.Hour)
	f.Cleanup(dcancel)
	d, err := pgx.Connect(dctx, pg.SuperDSN())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { d.Close(context.Background()) })
	p := proxytest.Start(f, pg.Addr(), proxytest.Options{YAML: fmt.Sprintf(
		"tables:\n  - name: %s\n    token_column: fence_token\nlimits:\n  max_message_size: 1048576\n  startup_timeout: 5s\n", table)})
	app := "faults-fuzz"
	dsn := proxytest.DSN(p.Addr, pgtest.MD5User, pgtest.MD5Password, pgtest.TestDB) +
		"&application_name=" + app + "&options=-c%20statement_timeout%3D5s"
	baseGoroutines := runtime.NumGoroutine()
	f.Cleanup(func() { noLeakedBackends(f, pg, app, 20*time.Second) })

	f.Fuzz(func(t *testing.T, input []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		fuzzReset(t, ctx, d, table)
		pc, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("startup before the input: %v", err)
		}
		hc, err := pc.Hijack()
		if err != nil {
			t.Fatal(err)
		}
		conn := hc.Conn
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(15 * time.Second))
		// The input, then a Terminate: a client that says goodbye, so that what the input asked for runs to
		// its end (a client that just vanishes has its running query cancelled) and the invariant below judges
		// it. An input that ends inside a message swallows the Terminate, which is fine for a fuzzer.
		conn.Write(append(input[:len(input):len(input)], 'X', 0, 0, 0, 4)) // the proxy may close before taking it all
		if tc, ok := conn.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		buf := make([]byte, 64<<10)
		for {
			if _, err := conn.Read(buf); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatalf("the proxy kept the connection open 15s after the client's input ended")
				}
				break
			}
		}
		conn.Close()

		fresh, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("the proxy no longer serves after input %q: %v", input, err)
		}
		if _, err := fresh.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
			t.Fatalf("fresh session after input %q: %v", input, err)
		}
		fresh.Close(ctx)
		waitFor(t, 10*time.Second, "the proxy's sessions to end", func() bool { return p.Server.ActiveSessions() == 0 })
		waitFor(t, 10*time.Second, "goroutines to settle", func() bool { return runtime.NumGoroutine() <= baseGoroutines+20 })
		// Every transaction of the input has ended with its session (a kept upstream connection is reset and
		// renamed first): what the triggers recorded is all the input committed.
		noLeakedBackends(t, pg, app, 10*time.Second)
		fuzzCheckInvariant(t, ctx, d, table, input)
	})
}
