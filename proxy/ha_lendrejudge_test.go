package proxy_test

import (
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A pooled fenced write sent while its host was the only primary, waiting for a server connection (a pool of
// one, held by another client's transaction) while a split brain begins. The router keeps the old primary
// published during a split brain, so the write's lend gets a connection there once the other client is done;
// fenced writes are refused there now. Server.fencedHostsRefused finds nothing lent to the waiting client to
// cancel: the rule must hold because a pooled unit is judged (checkPlan) only once it has its connection, after
// the change: 55F04, and no row on the old primary. An attack of stop 57 that held; kept so that a pool that
// judged a unit before its wait shows here.
func TestPooledFencedWriteWaitingForASlotAcrossASplitBrain(t *testing.T) {
	h, admin := startBarrierPair(t, pooledYAML("size: 1", poolAdmin), nil)
	ctx := haCtx(t)
	dsn := h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB)
	c := tokenClient(ctx, t, h, 5)
	holder := beginWith(ctx, t, connect(t, dsn), "SELECT 1") // the pool's one connection, idle in its block
	done := execAsync(ctx, c, "UPDATE accounts SET v = 9 WHERE id = 2")
	waitingClients(t, connect(t, h.proxy.DSN(pgtest.SuperUser, "", "fenceproxy")+"&default_query_exec_mode=simple_protocol"), 1)
	h.splitBrain(ctx, t)
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	err := <-done
	t.Logf("the waiting write: %v", err)
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 2 AND v = 9").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if sqlstate(err) != "55F04" || n != 0 {
		t.Errorf("a fenced write that waited for a connection across the start of a split brain: %v, %d rows on the old primary; want 55F04 and none", err, n)
	}
}
