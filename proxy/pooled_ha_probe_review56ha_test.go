package proxy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
	admin, done := holdProbeOnACatalogLock(ctx, t, c, h.primary.SuperDSN())
	h.switchOver(ctx, t, admin, dsn)
	err := <-done
	if err == nil {
		_, err = c.Exec(ctx, "SELECT 1")
	}
	if sqlstate(err) != "57P01" || !strings.Contains(err.Error(), h.standby.Addr()) {
		t.Errorf("the client whose probe the switchover cut: %v, want 57P01 naming %s", err, h.standby.Addr())
	}
}

// holdProbeOnACatalogLock has the pooled client c, whose server connection is on the server at serverDSN, run a
// SET, which brings the pool's look at the connection after the transaction (the probe), behind an ACCESS
// EXCLUSIVE lock on pg_cursors (which the probe reads) that a transaction of a direct connection to that server
// takes and holds, and returns once the probe waits for the lock: admin is another direct connection to that
// server, and done gets the SET's outcome (its answer goes to the client before the probe runs).
func holdProbeOnACatalogLock(ctx context.Context, t *testing.T, c *pgx.Conn, serverDSN string) (admin *pgx.Conn, done <-chan error) {
	t.Helper()
	admin = connect(t, serverDSN)
	beginWith(ctx, t, connect(t, serverDSN), "LOCK TABLE pg_catalog.pg_cursors IN ACCESS EXCLUSIVE MODE")
	done = execAsync(ctx, c, "SET work_mem = '2MB'")
	eventually(t, 10*time.Second, "the probe after the SET to wait for the lock on pg_cursors", func() bool {
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE relation = 'pg_catalog.pg_cursors'::regclass AND NOT granted").Scan(&n)
		return err == nil && n == 1
	})
	return admin, done
}
