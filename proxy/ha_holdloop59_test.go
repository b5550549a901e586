//go:build linux

package proxy_test

import (
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// The wait for a database's write hold (writehold.go: a session on a refused host sends nothing that runs until
// the hold of its database there is in place) must not hold up the other sessions of its event loop, as the lock
// question does not (TestLockQuestionLeavesItsEventLoopFree). From holdloop59 (hold59 measured the stall): a
// client of its own holds a write's lock on accounts in the test database, so the hold there waits for it (one
// lock_timeout, health_timeout here, before it is terminated); a session of that database sends a statement,
// which waits for the hold; another session of the same loop, in a database with nothing to hold, sends SELECT 1.
// Its answer must come while the hold still waits: the blocking client is still alive then (the hold terminates
// it once its LOCK has waited a lock_timeout, and settles only after). Once the blocker goes, the hold is in
// place and the waiting statement (a read outside a block) goes.
func TestWriteHoldWaitLeavesItsEventLoopFree(t *testing.T) {
	for _, mode := range []struct {
		name, yaml string
		loop       bool
	}{
		{"session", "relay:\n  event_loops: 1\n", true},
		{"session-goroutines", "relay:\n  mode: goroutines\n", false},
	} {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPairTuned(t, mode.yaml, nil, func(o *proxy.Options) {
				o.Config.Upstream.HealthTimeout = lockQuestionTimeout
			})
			ctx := haCtx(t)
			if _, err := admin.Exec(ctx, "CREATE DATABASE other59"); err != nil {
				t.Fatal(err)
			}
			waiting := tokenClient(ctx, t, h, 5)
			other := connect(t, h.proxy.DSN(pgtest.SuperUser, "", "other59"))
			if mode.loop {
				eventually(t, 10*time.Second, "both sessions in the one event loop", func() bool {
					n, _ := proxy.LoopSessions(h.proxy.Server)
					return len(n) == 1 && n[0] == 2
				})
			}
			blocker := beginWith(ctx, t, connect(t, h.primary.SuperDSN()), "LOCK TABLE accounts IN ROW EXCLUSIVE MODE")
			h.splitBrain(ctx, t)
			eventually(t, 30*time.Second, "the write hold to wait for the blocking client", func() bool {
				var n int
				err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fenceproxy: write hold' AND wait_event_type = 'Lock'").Scan(&n)
				return err == nil && n == 1
			})
			done := execAsync(ctx, waiting, "SELECT 2")
			start := time.Now()
			_, errOther := other.Exec(ctx, "SELECT 1")
			took := time.Since(start)
			_, errBlocker := blocker.Exec(ctx, "SELECT 1")
			if errBlocker == nil {
				if err := blocker.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
			}
			errWaiting := <-done
			t.Logf("the other session's SELECT 1: %v, in %v; the blocking client then: %v; the waiting session's statement: %v", errOther, took, errBlocker, errWaiting)
			if errOther != nil {
				t.Fatalf("the other session's SELECT 1: %v", errOther)
			}
			if errBlocker != nil {
				t.Errorf("another session's SELECT 1 was answered only after the write hold its loop waited for settled (the blocking client terminated by then: %v); want it answered while the hold waits", errBlocker)
			}
			if errWaiting != nil {
				t.Errorf("the waiting session's read, once the hold was in place: %v; want it answered", errWaiting)
			}
		})
	}
}
