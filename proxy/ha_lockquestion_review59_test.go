//go:build linux

package proxy_test

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fenceproxy/fenceproxy/proxy"
)

// A statement the event loop must plan on a worker each time it sees it (a text over the plan cache's size limit
// that may touch a protected table: TryPlan always misses) and whose lock question is asked off the loop. From
// review59 (attack on offloop59): the question's pass through the core used the worker's plan, the answer's pass
// found no plan and sent the statement to a worker again, and the answer, not taken by that pass, was dropped, so
// the next pass asked again: the session asked its host over and over and its statement never went. The answer
// must serve the message until the message goes through the core: one question for one message, and the
// statement (a read, nothing written) answered. A fenced write of a new shape (planned twice: its template is
// built the second time) was asked about twice; once now.
func TestLockQuestionOfAStatementPlannedEachTime(t *testing.T) {
	for _, mode := range []struct{ name, yaml string }{
		{"session", "relay:\n  event_loops: 1\n"},
		{"session-goroutines", "relay:\n  mode: goroutines\n"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			var answered, base atomic.Int32
			base.Store(1 << 30)
			askedAgain := make(chan struct{})
			var closed atomic.Bool
			h, _ := startBarrierPairTuned(t, mode.yaml, nil, func(o *proxy.Options) {
				proxy.AfterLockAnswer(o, func() {
					// A third answer for the one message: the session asks over and over.
					if answered.Add(1)-base.Load() >= 3 && closed.CompareAndSwap(false, true) {
						close(askedAgain)
					}
				})
			})
			ctx := haCtx(t)
			asking := tokenClient(ctx, t, h, 5)
			h.splitBrain(ctx, t)
			tx := beginWith(ctx, t, asking, "SELECT 1")
			base.Store(answered.Load())
			// A read (delete is a column alias), over 64 KiB: planned in full, never cached.
			big := "SELECT v AS delete FROM accounts WHERE id = 1 AND length('" + strings.Repeat("x", 70<<10) + "') > 0"
			done := make(chan error, 1)
			go func() {
				_, err := tx.Conn().PgConn().Exec(ctx, big).ReadAll()
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("a read in a block that wrote nothing, on a host the router refuses fenced writes on: %v; want it answered", err)
				}
				if n := answered.Load() - base.Load(); n != 1 {
					t.Errorf("%d lock questions answered for one message; want 1", n)
				}
			case <-askedAgain:
				t.Fatalf("the lock question of one message was asked %d times and its statement has not gone; want one question, then the statement", answered.Load()-base.Load())
			}
			// A fenced write of a shape not seen before: planned on a worker twice (the shape's template is built
			// the second time), asked about once, then refused as a fenced write on that host.
			base.Store(answered.Load())
			_, err := tx.Conn().PgConn().Exec(ctx, "UPDATE accounts SET v = v + 1 WHERE id = 2").ReadAll()
			if code := sqlstate(err); code != "55F04" {
				t.Errorf("a fenced write on a host the router refuses fenced writes on: %v; want 55F04", err)
			}
			if n := answered.Load() - base.Load(); n != 1 {
				t.Errorf("%d lock questions answered for a fenced write of a new shape; want 1", n)
			}
		})
	}
}
