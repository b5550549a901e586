package proxy_test

import (
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/proxy"
)

// In session mode the router's change shuts a fenced session's server connection before it cancels what runs
// there (endFencedTx, race58): PostgreSQL drops a cancel that finds the backend idle, so a write flushed after a
// cancel sent first would wait for its lock on the refused host and commit once it may. From mutate59
// (2026-12-06): with the two steps swapped, TestFencedWriteJudgedJustBeforeTheRouterChanges passed in both
// session transports (the write it releases reaches the backend before the cancel, which takes a connection of
// its own). Here the fenced write judged just before the change is released between the two steps
// (BetweenFencedShutAndCancel), and the test waits for it to reach the server or to be refused before the second
// step: shut first, it never reaches the server, and nothing commits there.
func TestFencedWriteReleasedBetweenTheShutAndTheCancel(t *testing.T) {
	for _, mode := range barrierModes[1:] { // transaction pooling ends no session at the change (cancelLent)
		t.Run(mode.name, func(t *testing.T) {
			judged := newHeldFirst()
			between := make(chan struct{})
			progressed := make(chan struct{})
			var once sync.Once
			h := startHAPairConf(t, nil, "", mode.yaml, nil, func(o *proxy.Options) {
				proxy.HoldFencedJudgement(o, judged.hold)
				proxy.BetweenFencedShutAndCancel(o, func() {
					once.Do(func() {
						close(between)
						judged.release()
						select { // bounded: a test that failed before closing it must not hold the proxy's shutdown
						case <-progressed:
						case <-time.After(30 * time.Second):
						}
					})
				})
			})
			ctx := haCtx(t)
			admin := connect(t, h.primary.SuperDSN())
			c := tokenClient(ctx, t, h, 5)
			lock := beginWith(ctx, t, connect(t, h.primary.SuperDSN()), "SELECT 1 FROM accounts WHERE id = 2 FOR UPDATE")
			judged.arm(t)
			pc := c.PgConn()
			fe := pc.Frontend()
			fe.Send(&pgproto3.Query{String: "UPDATE accounts SET v = 7 WHERE id = 2"})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			judged.reached(ctx, t, "judgement of the fenced UPDATE")
			answered := make(chan struct{})
			var tags, codes []string
			go func() {
				defer close(answered)
				tags, codes = tagsAndCodesUntilReady(pc, 1)
			}()
			h.splitBrain(ctx, t)
			select {
			case <-between:
			case <-ctx.Done():
				t.Fatal("the router's change did not end the session")
			}
			// Released between the steps: the UPDATE either reached the server (it waits for the row lock there) or
			// was refused, its session over.
			eventually(t, 30*time.Second, "the UPDATE to reach the server or its session to end", func() bool {
				select {
				case <-answered:
					return true
				default:
				}
				var n int
				err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%accounts%' AND query NOT LIKE '%pg_stat_activity%' AND wait_event_type = 'Lock'").Scan(&n)
				return err == nil && n == 1
			})
			close(progressed)
			if err := lock.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			<-answered
			t.Logf("tags %q, errors %q", tags, codes)
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 2 AND v = 7").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 || len(codes) == 0 {
				t.Errorf("a fenced UPDATE released between the change's two steps: tags %q, errors %q, rows committed on the old primary %d; want it refused and none", tags, codes, n)
			}
		})
	}
}
