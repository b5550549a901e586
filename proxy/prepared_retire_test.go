package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The prepared fences' statements that the proxy drops (forget, evict) stay on the server until a sweep or a
// DEALLOCATE of them succeeds (prepState.retiring). Until then they are still the proxy's own: the pool's probe
// must not take them for the client's SQL PREPARE (which pins the client, or with pool.on_session_state:
// refuse ends its session), a sweep that fails goes again, and a client's cancel never lands on one of those
// hidden commands instead of on the client's statement. (Found by a review on 2026-12-03; each test fails
// without its mend.)

// TestPreparedDroppedStayTheProxys: pool.size 1, on_session_state: refuse. A template the proxy forgot (the
// client's text holds CREATE) or evicted (prepared_fences: 1, a second shape) is still on the server at the end
// of that transaction, whose probe runs before the next idle point sweeps it away. The session goes on, and
// nobody is pinned.
func TestPreparedDroppedStayTheProxys(t *testing.T) {
	for _, tc := range []struct {
		name, upstream string
		drop           func(t *testing.T, f *preparedFixture, c *pgx.Conn)
	}{
		{"forgotten", "  prepared_fences: 64\n", func(t *testing.T, f *preparedFixture, c *pgx.Conn) {
			// CREATE makes the proxy forget its templates; the tag makes the pool probe the connection.
			idx := f.name + "_bidx"
			t.Cleanup(func() { f.d.Exec(context.Background(), "DROP INDEX IF EXISTS "+idx) })
			fxExec(t, c, "CREATE INDEX "+idx+" ON public."+f.name+" (balance)")
		}},
		{"evicted", "  prepared_fences: 1\n", func(t *testing.T, f *preparedFixture, c *pgx.Conn) {
			// A second shape takes the only place: the first is evicted, its DEALLOCATE queued for the next idle
			// point; the SET makes the pool probe at the block's end.
			fxExec(t, c, "BEGIN")
			for i := 0; i < 3; i++ {
				fxExec(t, c, "UPDATE public."+f.name+" SET balance = 7 WHERE id = 1")
			}
			fxExec(t, c, "SET application_name = 'evicted'")
			fxExec(t, c, "COMMIT")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newPreparedFixturePool(t, pooledTransport, "  on_session_state: refuse\n", tc.upstream)
			c := f.simple(t, "5")
			for i := 0; i < 3; i++ {
				fxExec(t, c, "UPDATE public."+f.name+" SET balance = balance + 1 WHERE id = 1")
			}
			if got := serverStatements(t, c); len(got) == 0 {
				t.Fatal("setup: no template of the proxy's on the server connection")
			}
			tc.drop(t, f, c)
			fxExec(t, c, "SELECT 1") // refused (FATAL 0A000) if the probe took a template for the client's SQL PREPARE
			if n := fxCounter(t, f.p.Registry, "fenceproxy_pool_pins_total", nil); n != 0 {
				t.Fatalf("pinned %v times by the proxy's own statements", n)
			}
		})
	}
}

// blockSweep holds a lock that makes the proxy's sweep (a DO block, which looks its language up) wait, until the
// returned function releases it.
func blockSweep(t *testing.T, d *pgx.Conn) (release func()) {
	t.Helper()
	tx, err := d.Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctxT(t), "LOCK TABLE pg_catalog.pg_language IN ACCESS EXCLUSIVE MODE"); err != nil {
		tx.Rollback(context.Background())
		t.Fatal(err)
	}
	released := false
	release = func() {
		if !released {
			released = true
			tx.Rollback(context.Background())
		}
	}
	t.Cleanup(release)
	return release
}

// sweepWaiting reports whether a DO block waits for a lock (the proxy's sweep, behind blockSweep). d polls from
// inside blockSweep's transaction, where pg_stat_activity is read once and kept until the transaction ends: a
// first look taken before the sweep got to the lock stayed the answer (a timeout, though the sweep waited), so
// each look clears that snapshot first.
func sweepWaiting(t *testing.T, d *pgx.Conn) func() bool {
	return func() bool {
		var n int
		d.Exec(ctxT(t), "SELECT pg_stat_clear_snapshot()")
		d.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'DO %'").Scan(&n)
		return n > 0
	}
}

// TestPreparedCancelWaitsForTheProxysCommands: the client's text holds CREATE, so its next Query goes after the
// proxy's sweep, in the same write. The sweep waits for a lock; the client cancels its statement (pg_sleep(3)).
// The cancel waits for the sweep (released after 100 ms) and cancels the client's statement (57014), which
// otherwise ran to its end while the sweep failed; the session goes on, and the templates are gone. Every
// transport: session mode on the event loop and on goroutines (forwardCancel: cancelAfterOwn), transaction
// pooling (cancelPooled).
//
// The cancel goes when the sweep has answered, with the client's statement behind it on the connection; a
// backend that has sent that answer and not yet started the statement (descheduled, under load) reads its next
// command, and PostgreSQL drops a cancel then, as on a direct connection with one statement behind another
// (pipelined, or just sent): the statement runs to its end. Nothing tells the proxy when the backend starts
// a statement, and a second cancel, sent in case, could stop the one after. So a statement that ran to its
// end must show, in the server log, that no cancel hit the sweep (the fault this test is for), and the run
// goes again, up to cancelAttempts times.
func TestPreparedCancelWaitsForTheProxysCommands(t *testing.T) {
	for _, tr := range []struct {
		name string
		tr   preparedTransport
	}{{"loop", loopTransport}, {"goroutines", goroutineTransport}, {"pooled", pooledTransport}} {
		t.Run(tr.name, func(t *testing.T) {
			for attempt := 1; ; attempt++ {
				// A new proxy, server connection and backend each run (a subtest, whose table goes at its end):
				// blockSweep holds back the first DO block of a backend only (later ones find plpgsql cached).
				hit := false
				t.Run(fmt.Sprintf("run%d", attempt), func(t *testing.T) {
					f := newPreparedFixturePool(t, tr.tr, "  on_session_state: refuse\n", "  prepared_fences: 64\n")
					c := f.simple(t, "5")
					if hit = cancelHitTheStatement(t, f, c, tr.tr); !hit {
						return
					}
					fxExec(t, c, "SET application_name = 'after'") // probed in the pool
					if got := serverStatements(t, c); len(got) != 0 {
						t.Fatalf("the proxy's statements left on the server connection after its sweep: %+v", got)
					}
				})
				if hit || t.Failed() {
					break
				}
				if attempt == cancelAttempts {
					t.Fatalf("the cancel reached no statement in %d runs (dropped between the sweep and the client's statement each time?)", attempt)
				}
				t.Logf("run %d: the cancel reached the backend between the sweep and the client's statement; again", attempt)
			}
		})
	}
}

// cancelAttempts bounds the runs of TestPreparedCancelWaitsForTheProxysCommands.
const cancelAttempts = 3

// sweepCancelled finds in the server log a cancel that hit a DO block (the proxy's sweep): PostgreSQL logs the
// statement an error ended on the line after the error.
var sweepCancelled = regexp.MustCompile(`ERROR:  canceling statement due to user request\n[^\n]*STATEMENT:  DO `)

// cancelHitTheStatement runs TestPreparedCancelWaitsForTheProxysCommands once on c: true when the cancel ended
// the client's statement (57014), false when the statement ran to its end with the sweep not cancelled (the
// cancel dropped between the two); any other outcome fails the test.
func cancelHitTheStatement(t *testing.T, f *preparedFixture, c *pgx.Conn, tr preparedTransport) bool {
	t.Helper()
	for i := 0; i < 3; i++ {
		fxExec(t, c, "UPDATE public."+f.name+" SET balance = balance + 1 WHERE id = 1")
	}
	fxExec(t, c, "SELECT 'create'") // the proxy forgets its templates: a sweep goes before the next Query
	logFrom := logSize(t)
	release := blockSweep(t, f.d)
	defer release()
	done := make(chan error, 1)
	start := time.Now()
	go func() { _, err := c.Exec(context.Background(), "SELECT pg_sleep(3)"); done <- err }()
	eventually(t, 5*time.Second, "the proxy's sweep waiting for the lock", sweepWaiting(t, f.d))
	// The cancel returns, as directly, once PostgreSQL has taken it: after the sweep, which waits for the
	// lock, so it is sent from a goroutine of its own. A client goes on after it returns: the second signal
	// PostgreSQL sends for one cancel then cannot hit the statements that follow.
	cancelled := make(chan error, 1)
	go func() { cancelled <- c.PgConn().CancelRequest(ctxT(t)) }()
	time.Sleep(100 * time.Millisecond) // the cancel has come: it must wait for the sweep
	if tr != pooledTransport {         // transaction pooling defers its cancel in a way of its own (cancelPooled)
		select {
		case err := <-cancelled:
			t.Fatalf("the cancel returned while the proxy's sweep still waited (%v): it has not been delivered", err)
		default:
		}
	}
	release()
	err := <-done
	if cerr := <-cancelled; cerr != nil {
		t.Fatal(cerr)
	}
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "57014" {
		return true
	}
	if err != nil {
		t.Fatalf("the client's statement after its cancel: %v after %v, want 57014", err, time.Since(start).Round(time.Millisecond))
	}
	if sweepCancelled.Match(logSince(t, logFrom)) {
		t.Fatalf("the client's statement ran to its end (%v) and the cancel hit the proxy's sweep", time.Since(start).Round(time.Millisecond))
	}
	return false
}

// logSize is the server log's size: what logSince reads from.
func logSize(t *testing.T) int64 {
	t.Helper()
	fi, err := os.Stat(pg.LogFile())
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// logSince is what the server logged from offset from on.
func logSince(t *testing.T, from int64) []byte {
	t.Helper()
	b, err := os.ReadFile(pg.LogFile())
	if err != nil {
		t.Fatal(err)
	}
	return b[min(from, int64(len(b))):]
}

// TestPreparedFailedSweepGoesAgain: the client leaves statement_timeout at 300 ms, and the sweep that follows
// its CREATE waits for a lock until that cancels it. The statements it was to drop are still the proxy's own
// (the probe after the client's SET does not take them for its SQL PREPARE), and once the lock is gone the next
// idle point sweeps again: none is left on the connection.
func TestPreparedFailedSweepGoesAgain(t *testing.T) {
	for _, tr := range []struct {
		name string
		tr   preparedTransport
	}{{"loop", loopTransport}, {"pooled", pooledTransport}} {
		t.Run(tr.name, func(t *testing.T) {
			f := newPreparedFixturePool(t, tr.tr, "  on_session_state: refuse\n", "  prepared_fences: 64\n")
			c := f.simple(t, "5")
			for i := 0; i < 3; i++ {
				fxExec(t, c, "UPDATE public."+f.name+" SET balance = balance + 1 WHERE id = 1")
			}
			fxExec(t, c, "SET statement_timeout = '300ms'")
			fxExec(t, c, "SELECT 'create'")
			release := blockSweep(t, f.d)
			fxExec(t, c, "SELECT 1")                       // after the sweep, which the timeout ends
			fxExec(t, c, "SET application_name = 'swept'") // the same again, and a probe in the pool
			release()
			fxExec(t, c, "SET statement_timeout = 0") // the sweep goes again, before it
			if got := serverStatements(t, c); len(got) != 0 {
				t.Fatalf("the proxy's statements left on the server connection after a failed sweep: %+v", got)
			}
			if tr.tr == pooledTransport {
				if n := fxCounter(t, f.p.Registry, "fenceproxy_pool_pins_total", nil); n != 0 {
					t.Fatalf("pinned %v times by the proxy's own statements", n)
				}
			}
		})
	}
}
