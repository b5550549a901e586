package proxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// A client's CancelRequest that the proxy sends on to the server takes as long as PostgreSQL takes to fork a
// process for it and signal the backend: under load (pgxsuite with CPU burners) a median of 60 ms, and
// hundreds of milliseconds in its tail. Directly, the answer of a statement never waits for that: it comes when
// the statement ends, cancelled or not. Through the pool it did: the answer was read only once the cancel had
// arrived (the relaying goroutine sent a deferred cancel itself, and a cancel sent at once held the session's
// lock that the read of the answer needed when it handed over), and pgx's
// TestCancelRequestContextWatcherHandler/Stress, which gives up on the connection 1 s after its context ends,
// failed about 3 runs in 250 on a loaded machine (the transaction pooler's compat run).
//
// Here the server side of every cancel is held (cancelHoldingRelay) at two points of a unit's life: while a
// unit of the proxy's own runs before the client's statement (the replay of its settings, blocked behind a lock
// on pg_tablespace: the cancel waits for it, then goes), and while the client's statement runs. Each time the
// statement's answer must reach the client while its cancel is still on its way, as directly; the server
// connection must not serve anyone else before the cancel arrived (the second client, on a pool of one, runs
// its statement after, untouched), and the client's next statement is not hit by it either.
func TestPooledAnswerNeverWaitsForItsCancel(t *testing.T) {
	for _, at := range []string{"deferred behind the replay", "while the statement runs"} {
		t.Run(at, func(t *testing.T) {
			pgtest.Require(t, pg)
			relay, f, a, b := startCancelRelayPool(t, "20s")
			d := f.d
			ctx := ctxT(t)
			run := func(c *pgx.Conn, sql string) chan cancelAnswer { return queryIntAsync(ctx, c, sql) }
			waitActivity := func(what, cond string) {
				t.Helper()
				eventually(t, 10*time.Second, what, func() bool {
					var n int
					err := d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND "+cond).Scan(&n)
					return err == nil && n == 1
				})
			}
			cancelled := make(chan error, 1)
			var first chan cancelAnswer
			if at == "deferred behind the replay" {
				// The replay of a's setting, a unit of the proxy's own that goes in the same write as a's statement
				// once b used the connection, waits for a lock; the cancel comes meanwhile and waits for the replay
				// (cancelDeferred), then goes as a's statement runs, and is held.
				fxExec(t, a, "SET temp_tablespaces = 'pg_default'")
				fxExec(t, b, "SELECT 'b was here'")
				// The replay checks the tablespace's name in pg_tablespace unless the backend has it cached (a's
				// SET cached it): a change of the row drops it from every cache.
				fxExec(t, d, "ALTER TABLESPACE pg_default SET (seq_page_cost = 1)")
				t.Cleanup(func() { d.Exec(context.Background(), "ALTER TABLESPACE pg_default RESET (seq_page_cost)") })
				// On a connection of its own: in the lock's transaction pg_stat_activity would show the first
				// look's snapshot for good.
				tx, err := direct(t).Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(context.Background())
				if _, err := tx.Exec(ctx, "LOCK TABLE pg_catalog.pg_tablespace IN ACCESS EXCLUSIVE MODE"); err != nil {
					t.Fatal(err)
				}
				first = run(a, "SELECT 1")
				waitActivity("a's settings replay waiting for the lock on pg_tablespace",
					"wait_event_type = 'Lock' AND query LIKE '%set_config(s.n, s.v, false)%'")
				// The proxy answers a cancel it defers at once: taken, before the replay can end.
				if err := sendCancelRequest(f.p.Addr, a.PgConn().PID(), a.PgConn().SecretKey()); err != nil {
					t.Fatalf("a's CancelRequest: %v", err)
				}
				cancelled <- nil
				if err := tx.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				// a's statement runs; the cancel goes to the server at once, and is held there until after the
				// statement ended by itself, as PostgreSQL under load takes its time.
				first = run(a, "SELECT 1 FROM pg_sleep(0.5) AS cancel_subject")
				waitActivity("a's statement running", "state = 'active' AND query LIKE '%cancel_subject%'")
				go func() { cancelled <- sendCancelRequest(f.p.Addr, a.PgConn().PID(), a.PgConn().SecretKey()) }()
			}
			relay.awaitArrival(t, "a's cancel") // the proxy dialled the server with it; it stays on its way
			select {
			case got := <-first:
				if got.err != nil || got.v != 1 {
					t.Fatalf("a got %d, %v; want 1", got.v, got.err)
				}
			case <-time.After(3 * time.Second):
				// Well within the 5 s the proxy gives a cancel to reach the server (cancelUpstream): an answer that
				// waits for its cancel comes only when the proxy gives up on it.
				t.Fatal("a's answer did not come within 3s while a's cancel was on its way to the server: the answer waits for its cancel")
			}
			// The connection stays a's until the cancel arrived: b, on the pool of one, waits, and its statement
			// is not the one the cancel stops; nor is a's next.
			bAnswer := run(b, "SELECT 2 FROM pg_sleep(0.3)")
			relay.Release()
			if err := <-cancelled; err != nil {
				t.Fatalf("a's CancelRequest: %v", err)
			}
			for _, w := range []struct {
				who  string
				ch   chan cancelAnswer
				want int
			}{{"b", bAnswer, 2}, {"a's next statement", run(a, "SELECT 3"), 3}} {
				select {
				case got := <-w.ch:
					if got.err != nil || got.v != w.want {
						t.Fatalf("%s after a's cancel arrived: %d, %v; want %d", w.who, got.v, got.err, w.want)
					}
				case <-time.After(20 * time.Second):
					t.Fatalf("%s did not end within 20s", w.who)
				}
			}
		})
	}
}

// cancelAnswer is a one-value statement's answer: its value or its error.
type cancelAnswer struct {
	v   int
	err error
}

// startCancelRelayPool starts a transaction pool of one in front of a cancelHoldingRelay to the shared server
// (the proxy's cancels to PostgreSQL can be held there), with a fenced table and two clients, a and b, over the
// simple protocol: the setup of the tests of a cancel on its way while the pool's one connection moves on.
func startCancelRelayPool(t *testing.T, maxClientWait string) (relay *cancelHoldingRelay, f *fenced, a, b *pgx.Conn) {
	t.Helper()
	pgtest.Require(t, pg)
	relay = startCancelHoldingRelay(t, pg.Addr())
	d := direct(t)
	name := fxName(t, "tp")
	fxCreateTable(t, d, "public."+name)
	yaml := fxTables("public."+name) + "pool:\n  mode: transaction\n  size: 1\n  max_client_wait: " + maxClientWait + "\nauth:\n  type: trust\n"
	f = &fenced{p: proxytest.Start(t, relay.ln.Addr().String(), proxytest.Options{YAML: yaml}), d: d, name: name, label: "public." + name}
	q := "&default_query_exec_mode=simple_protocol"
	return relay, f, pooledConn(t, f, q), pooledConn(t, f, q)
}

// queryIntAsync runs sql, which returns one integer, on c in a goroutine of its own and gives its answer on the
// channel it returns.
func queryIntAsync(ctx context.Context, c *pgx.Conn, sql string) chan cancelAnswer {
	ch := make(chan cancelAnswer, 1)
	go func() {
		var v int
		err := c.QueryRow(ctx, sql).Scan(&v)
		ch <- cancelAnswer{v, err}
	}()
	return ch
}
