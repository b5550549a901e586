//go:build linux

package proxy_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/proxy"
)

// lockQuestionTimeout is the health_timeout of TestLockQuestionLeavesItsEventLoopFree, which bounds the lock
// question: long beside a round trip on a loaded machine, so that the question still waits on its host when the
// other session's statement is answered (a question that timed out would count as answered).
const lockQuestionTimeout = 10 * time.Second

// The lock question (unplanned.go) of one session must not hold up the other sessions of its event loop. From
// offloop59 (attack on where the question is asked; review58 measured the stall): a session in a block on a host
// the router refuses fenced writes on sends a statement while its host cannot answer the question (pg_inherits
// locked there); another session of the same loop, outside a block, sends SELECT 1. Its answer must come while
// the first question is still unanswered (a test hook counts the answers), whatever the timings; and once the
// host can answer (nothing written), the first session's statement goes.
func TestLockQuestionLeavesItsEventLoopFree(t *testing.T) {
	for _, mode := range []struct {
		name, yaml string
		loop       bool
	}{
		{"session", "relay:\n  event_loops: 1\n", true},
		{"session-goroutines", "relay:\n  mode: goroutines\n", false},
	} {
		t.Run(mode.name, func(t *testing.T) {
			var answered atomic.Int32
			h, admin := startBarrierPairTuned(t, mode.yaml, nil, func(o *proxy.Options) {
				o.Config.Upstream.HealthTimeout = lockQuestionTimeout
				proxy.AfterLockAnswer(o, func() { answered.Add(1) })
			})
			ctx := haCtx(t)
			asking := tokenClient(ctx, t, h, 5)
			other := tokenClient(ctx, t, h, 6)
			if mode.loop {
				eventually(t, 10*time.Second, "both sessions in the one event loop", func() bool {
					n, _ := proxy.LoopSessions(h.proxy.Server)
					return len(n) == 1 && n[0] == 2
				})
			}
			h.splitBrain(ctx, t)
			// The block opens after the router's change, whose own question about the blocks open then
			// (unplannedWritersRefused) would otherwise race with the lock on pg_inherits; its SELECT 1 is asked
			// about while the host still answers.
			beginWith(ctx, t, asking, "SELECT 1")
			base := answered.Load()
			lock := beginWith(ctx, t, connect(t, h.primary.SuperDSN()), "LOCK TABLE pg_catalog.pg_inherits IN ACCESS EXCLUSIVE MODE")
			done := execAsync(ctx, asking, "SELECT 2")
			eventually(t, 30*time.Second, "the lock question to wait for pg_inherits", func() bool {
				var n int
				err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fenceproxy: health check' AND wait_event_type = 'Lock'").Scan(&n)
				return err == nil && n == 1
			})
			start := time.Now()
			_, errOther := other.Exec(ctx, "SELECT 1")
			took := time.Since(start)
			answersBefore := answered.Load() - base
			if err := lock.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			errAsking := <-done
			t.Logf("the other session's SELECT 1: %v, in %v, lock questions answered by then %d; the asking session's statement: %v", errOther, took, answersBefore, errAsking)
			if errOther != nil {
				t.Fatalf("the other session's SELECT 1: %v", errOther)
			}
			if answersBefore != 0 {
				t.Errorf("another session's SELECT 1 was answered only after the lock question its loop asked for a session on a host that did not answer it (%d answered, timed out after health_timeout); want it answered while the question waits", answersBefore)
			}
			if errAsking != nil {
				t.Errorf("the asking session's statement, once its host answered the question (no write): %v; want it sent and answered", errAsking)
			}
		})
	}
}

// A lock question its host does not answer within health_timeout is judged as a write to a protected table
// (fail closed), asked off the event loop as on the goroutine transport: the message does not go and the session
// ends with 55F04, for a Query and an extended-protocol Execute alike, two sessions of the loop asking at once.
func TestUnansweredLockQuestionEndsTheSession(t *testing.T) {
	for _, mode := range []struct{ name, yaml string }{
		{"session", "relay:\n  event_loops: 1\n"},
		{"session-goroutines", "relay:\n  mode: goroutines\n"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			h, _ := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			query, execute := tokenClient(ctx, t, h, 5), tokenClient(ctx, t, h, 6)
			h.splitBrain(ctx, t)
			queryTx := beginWith(ctx, t, query, "SELECT 1")
			executeTx := beginWith(ctx, t, execute, "SELECT 1")
			lock := beginWith(ctx, t, connect(t, h.primary.SuperDSN()), "LOCK TABLE pg_catalog.pg_inherits IN ACCESS EXCLUSIVE MODE")
			queryDone := make(chan error, 1)
			go func() {
				_, err := queryTx.Conn().PgConn().Exec(ctx, "SELECT 2").ReadAll()
				queryDone <- err
			}()
			var n int
			errExecute := executeTx.QueryRow(ctx, "SELECT $1::int", 3).Scan(&n)
			errQuery := <-queryDone
			if err := lock.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("Query: %v; Execute: %v", errQuery, errExecute)
			for what, err := range map[string]error{"Query": errQuery, "Execute": errExecute} {
				if code := sqlstate(err); code != "55F04" {
					t.Errorf("a %s of a block whose lock question its host did not answer: %v; want FATAL 55F04", what, err)
				}
			}
		})
	}
}
