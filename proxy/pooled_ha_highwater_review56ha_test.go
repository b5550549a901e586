package proxy_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// The token high-water through a lossy failover for pooled clients, whose tokens the pool gives each
// transaction transaction-locally, with no lock service for the barrier to read: only what the proxy saw (the
// health checks read the primary's lock marks in upstream.health.database). Client A writes token 6 on lock L
// on the old primary only (the standby's WAL receiver stopped), a health check reads it, the primary is
// stopped, the standby promoted. A stale holder with token 5 through the pool on the new primary is refused
// 55F01 naming L, whichever way it gives its token: SET in a Query, set_config with bound parameters, and a
// named statement prepared (and run) before the switch, which the pool prepares again on the new primary. A's
// token still writes. Attack of a review on 2026-12-05 (review56ha); held.
func TestPooledLossyFailoverHighWaterSeenByTheProxy(t *testing.T) {
	pgtest.Require(t, pg)
	primary := pgtest.MustStart(t, pgtest.Options{})
	if err := primary.Exec(`CREATE TABLE accounts (id int PRIMARY KEY, v int NOT NULL, fence_token bigint);
		INSERT INTO accounts VALUES (1, 0, NULL), (2, 0, NULL);`); err != nil {
		t.Fatal(err)
	}
	ctx := haCtx(t)
	admin := connect(t, primary.SuperDSN())
	installFence(ctx, t, admin)
	standby := pgtest.MustStartStandby(t, primary, pgtest.Options{})
	p := proxytest.Start(t, "", proxytest.Options{
		Hosts: []string{primary.Addr(), standby.Addr()},
		Upstream: fmt.Sprintf("  health_interval: %s\n  health_timeout: 1s\n  connect_timeout: 2s\n  health:\n    database: %s\n",
			haInterval, pgtest.TestDB),
		YAML: "tables:\n  - name: accounts\n    token_column: fence_token\npool:\n  mode: transaction\n  size: 2\nauth:\n  type: trust\n",
	})
	dsn := p.DSN(pgtest.SuperUser, "", pgtest.TestDB)
	simple := dsn + "&default_query_exec_mode=simple_protocol"

	// The stale holder's named statement, prepared and run with token 5 before the failover.
	prep := connect(t, dsn)
	if _, err := prep.Exec(ctx, "SET fence.token = 5"); err != nil {
		t.Fatal(err)
	}
	if _, err := prep.Exec(ctx, "SET fence.lock = 'L'"); err != nil {
		t.Fatal(err)
	}
	if _, err := prep.Prepare(ctx, "upd", "UPDATE accounts SET v = $1 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if _, err := prep.Exec(ctx, "upd", 1); err != nil {
		t.Fatalf("token 5's prepared write before the failover: %v", err)
	}
	if err := standby.WaitReplayed(ctx, primary); err != nil {
		t.Fatal(err)
	}
	if err := standby.StopWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	a := connect(t, simple)
	if _, err := a.Exec(ctx, "SET fence.token = 6; SET fence.lock = 'L'; UPDATE accounts SET v = 2 WHERE id = 2"); err != nil {
		t.Fatalf("token 6's write on the old primary: %v", err)
	}
	var wrote time.Time
	if err := admin.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&wrote); err != nil {
		t.Fatal(err)
	}
	// A health check of the primary read its marks after token 6 committed (the check then records them
	// before it checks the primary again, which is what finds it lost).
	eventually(t, 10*time.Second, "a health check to read the marks after token 6's write", func() bool {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'fenceproxy: health%'
			AND datname = $1 AND query LIKE '%lock_marks%' AND state = 'idle' AND query_start > $2`, pgtest.TestDB, wrote).Scan(&n)
		return err == nil && n > 0
	})
	var mark int64
	if err := connect(t, standby.SuperDSN()).QueryRow(ctx, "SELECT mark FROM fenceproxy.lock_marks WHERE name = 'L'").Scan(&mark); err != nil || mark != 5 {
		t.Fatalf("the standby's mark of L is %d (%v), want 5 (token 6's write lost)", mark, err)
	}
	admin.Close(ctx)
	if err := primary.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the proxy to see the primary lost", func() bool {
		got, _ := metricValue(t, p.Registry, "fenceproxy_upstream_primary_changes_total")
		return got == 2
	})
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the proxy to route to the new primary", reachesPort(ctx, simple, standby.Port()))

	stale := func(err error) bool {
		return sqlstate(err) == "55F01" && strings.Contains(err.Error(), "lock L has accepted a newer token")
	}
	if _, err := prep.Exec(ctx, "upd", 3); !stale(err) {
		t.Errorf("token 5's named statement prepared before the failover, run after it: %v, want 55F01 naming lock L", err)
	}
	bound := connect(t, dsn)
	if _, err := bound.Exec(ctx, "SELECT set_config('fence.token', $1, false), set_config('fence.lock', $2, false)", "5", "L"); err != nil {
		t.Fatal(err)
	}
	if _, err := bound.Exec(ctx, "UPDATE accounts SET v = 4 WHERE id = 1"); !stale(err) {
		t.Errorf("token 5 given by set_config with bound parameters, after the failover: %v, want 55F01 naming lock L", err)
	}
	set := connect(t, simple)
	if _, err := set.Exec(ctx, "SET fence.token = 5; SET fence.lock = 'L'; UPDATE accounts SET v = 5 WHERE id = 1"); !stale(err) {
		t.Errorf("token 5 given by SET, after the failover: %v, want 55F01 naming lock L", err)
	}
	if _, err := a.Exec(ctx, "UPDATE accounts SET v = 6 WHERE id = 2"); err != nil {
		t.Errorf("token 6 after the failover: %v", err)
	}
	np := connect(t, standby.SuperDSN())
	var n int
	if err := np.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 1 AND v > 1", pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d stale writes (%v) on the new primary", n, err)
	}
}
