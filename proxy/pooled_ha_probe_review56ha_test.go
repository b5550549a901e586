package proxy_test

import (
	"strings"
	"testing"
	"time"
)

// A switchover published while the pool's look at a client's server connection after its transaction (the
// probe, which a SET brings) waits on the old primary (behind a lock on pg_cursors, which the probe reads): the
// change of primary closes the connection under the probe, and the client is told what a client whose
// connection a change of primary closed is told, 57P01 naming the new primary, not that the proxy could not
// read the connection's session state (08006). Attack of a review on 2026-12-05 (review56ha: a pooled server
// connection in the post-transaction probe at the switch).
func TestPooledProbeCutByASwitchover(t *testing.T) {
	h, dsn := startPooledHAPair(t, "size: 2")
	ctx := haCtx(t)
	c := h.connectOnPrimary(ctx, t, dsn, "the client")
	admin := connect(t, h.primary.SuperDSN())
	beginWith(ctx, t, connect(t, h.primary.SuperDSN()), "LOCK TABLE pg_catalog.pg_cursors IN ACCESS EXCLUSIVE MODE")
	done := execAsync(ctx, c, "SET work_mem = '2MB'")
	eventually(t, 10*time.Second, "the probe after the SET to wait for the lock on pg_cursors", func() bool {
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE relation = 'pg_catalog.pg_cursors'::regclass AND NOT granted").Scan(&n)
		return err == nil && n == 1
	})
	h.switchOver(ctx, t, admin, dsn)
	err := <-done
	if err == nil {
		_, err = c.Exec(ctx, "SELECT 1")
	}
	if sqlstate(err) != "57P01" || !strings.Contains(err.Error(), h.standby.Addr()) {
		t.Errorf("the client whose probe the switchover cut: %v, want 57P01 naming %s", err, h.standby.Addr())
	}
}
