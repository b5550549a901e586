package proxy_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/proxy"
)

// A fenced write judged allowed on its host just before the router stops trusting that host, and sent just
// after, is stopped: the router's change acts on the session (Server.fencedHostsRefused) whatever the order of
// the judgement and the change. From race58 (2026-12-06, found on re-reading tidy58's change): the session noted
// the fenced transaction (fencedTxOut) only after the judgement, so a change and the whole of
// fencedHostsRefused could run in between; the write, unseen there, was sent to the refused host, where a
// lone UPDATE waiting for a row lock committed once the lock was released, as fa23c8d had stopped for writes
// noted earlier. The judgement is held here (HoldFencedJudgement) while two hosts come to claim to be primary,
// until the proxy has chosen the sessions it acts on (AfterFencedScan).
func TestFencedWriteJudgedJustBeforeTheRouterChanges(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			judged := newHeldFirst()
			scanned := make(chan struct{})
			var once sync.Once
			h := startHAPairConf(t, nil, "", mode.yaml, nil, func(o *proxy.Options) {
				proxy.HoldFencedJudgement(o, judged.hold)
				proxy.AfterFencedScan(o, func() { once.Do(func() { close(scanned) }) })
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
			h.splitBrain(ctx, t)
			select {
			case <-scanned:
			case <-ctx.Done():
				t.Fatal("the router's change did not reach the sessions")
			}
			judged.release()
			// Stopped, the UPDATE is never sent (session mode: the connection is shut) or cancelled while it waits
			// for the lock (transaction pooling); unseen, it waits there until the lock is released.
			answered := make(chan struct{})
			var tags, codes []string
			go func() {
				defer close(answered)
				tags, codes = tagsAndCodesUntilReady(pc, 1)
			}()
			select {
			case <-answered:
			case <-time.After(15 * time.Second):
				t.Errorf("the fenced UPDATE judged before the change got no answer while the lock is held: it waits on the host the router no longer trusts")
			}
			if err := lock.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			<-answered
			t.Logf("tags %q, errors %q", tags, codes)
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 2 AND v = 7").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 && !slices.Contains(codes, "08007") {
				t.Errorf("a fenced UPDATE judged just before the change committed on the old primary (%d rows), the client told %q %q; want none, or 08007", n, tags, codes)
			}
			if len(codes) == 0 {
				t.Errorf("the fenced UPDATE was acknowledged (%q); want it refused or cancelled", tags)
			}
		})
	}
}
