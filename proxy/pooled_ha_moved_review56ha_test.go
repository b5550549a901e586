package proxy_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// Through a failover (the primary stopped, the standby promoted) in transaction pooling: a client pinned to a
// server connection on the old primary (a session advisory lock) is told 57P01 naming the lost host or the
// new primary at its next statement, as a session is (docs/ha.md), and nothing of it runs; the admin console tells the truth meanwhile (SHOW SERVERS lists no
// connection on the old primary, SHOW POOLS and the fenceproxy_pool_servers gauges count what SHOW SERVERS
// lists); and a client whose transactions moved to the new primary cancels its statement there with the key
// it was given before the failover. Attacks of a review on 2026-12-05 (review56ha): the admin console and the
// cancel held; the pinned client got FATAL 08006 (the lend's generic loss), which says nothing of the host.
func TestPooledPinnedAdminAndCancelThroughAFailover(t *testing.T) {
	h, dsn := startPooledHAPair(t, "size: 3", poolAdmin)
	ctx := haCtx(t)
	adm := connect(t, h.simpleDSN("fenceproxy"))
	pinned := connect(t, dsn)
	if _, err := pinned.Exec(ctx, "SELECT pg_advisory_lock(42)"); err != nil {
		t.Fatal(err)
	}
	h.onPrimary(ctx, t, pinned, "the pinned client")
	mover := h.connectOnPrimary(ctx, t, dsn, "the client")
	h.failOver(ctx, t)
	eventually(t, 30*time.Second, "a pooled client connecting now to reach the new primary", reachesPort(ctx, dsn, h.standby.Port()))

	// The admin console and the gauges, after the switch.
	eventually(t, 10*time.Second, "the admin console to agree with itself", func() bool {
		servers := adminRows(t, adm, "SHOW SERVERS")
		listed := 0
		for _, r := range servers {
			if r["database"] != pgtest.TestDB {
				continue
			}
			if r["port"] == strconv.Itoa(h.primary.Port()) {
				t.Fatalf("SHOW SERVERS lists a server connection on the old primary after the failover: %v", r)
			}
			listed++
		}
		counted := -1
		for _, r := range adminRows(t, adm, "SHOW POOLS") {
			if r["database"] == pgtest.TestDB {
				active, _ := strconv.Atoi(r["sv_active"].(string))
				idle, _ := strconv.Atoi(r["sv_idle"].(string))
				login, _ := strconv.Atoi(r["sv_login"].(string))
				if login != 0 {
					return false // a dial in flight: looked at again
				}
				counted = active + idle
			}
		}
		gauged, _ := metricValue(t, h.proxy.Registry, "fenceproxy_pool_servers")
		return counted == listed && int(gauged) == listed
	})

	// The client whose transactions moved cancels its statement on the new primary.
	done := execAsync(ctx, mover, "SELECT pg_sleep(30)")
	np := connect(t, h.standby.SuperDSN())
	waitRunning(ctx, t, np, "SELECT pg_sleep(30)", "the statement to run on the new primary")
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := mover.PgConn().CancelRequest(cctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if sqlstate(err) != "57014" {
			t.Errorf("the moved client's statement after its cancel: %v, want 57014", err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the moved client's cancel did not reach its statement on the new primary")
	}

	_, err := pinned.Exec(ctx, "CREATE TABLE pinned_ran (i int)")
	// Its connection ended with the old primary, before the new one was published, or was closed when it was:
	// 57P01 naming the lost host, or the new primary (ha.md), not 08006.
	if sqlstate(err) != "57P01" || !strings.Contains(err.Error(), h.primary.Addr()) && !strings.Contains(err.Error(), h.standby.Addr()) {
		t.Errorf("the client pinned on the old primary, after the failover: %v, want 57P01 naming %s or %s", err, h.primary.Addr(), h.standby.Addr())
	}
	var n int
	if err := np.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = 'pinned_ran'").Scan(&n); err != nil || n != 0 {
		t.Errorf("the pinned client's statement ran on the new primary (%d, %v)", n, err)
	}
}

// The primary dies (every process SIGKILLed: no FATAL reaches the proxy, only the end of the streams) under a
// pooled client's statement and beside a pinned client between statements. As a session is told (docs/ha.md,
// upstreamLostFarewell): the statement's client 08007, its outcome unknown (a statement in an implicit
// transaction may have committed; the proxy never replays it), and the pinned client 57P01 naming the lost
// host. From a review on 2026-12-05 (review56ha): both got FATAL 08006, which a client may take for a
// statement that did not run.
func TestPooledPrimaryKilledUnderAStatement(t *testing.T) {
	h, dsn := startPooledHAPair(t, "size: 3")
	ctx := haCtx(t)
	pinned := connect(t, dsn)
	if _, err := pinned.Exec(ctx, "SELECT pg_advisory_lock(42)"); err != nil {
		t.Fatal(err)
	}
	running := connect(t, dsn)
	done := execAsync(ctx, running, "SET fence.token = 5; UPDATE accounts SET v = 1 WHERE id = 1; SELECT pg_sleep(30)")
	admin := connect(t, h.primary.SuperDSN())
	eventually(t, 10*time.Second, "the statement to run on the primary", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the statement ended before the primary died: %v", err)
		default:
		}
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'").Scan(&n) // the query column is cut before the sleep: the token statement goes first
		return err == nil && n == 1
	})
	if err := h.primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; sqlstate(err) != "08007" {
		t.Errorf("a statement running on the primary as it died: %v, want 08007", err)
	}
	_, err := pinned.Exec(ctx, "SELECT 1")
	// PostgreSQL's own FATAL counts too: a backend may see its postmaster gone before its own SIGKILL comes
	// (KillServer kills the postmaster first) and say so, which the pool relays (the CI run at fff9958).
	serverSaid := sqlstate(err) == "57P01" && strings.Contains(err.Error(), "unexpected postmaster exit")
	if !serverSaid && (sqlstate(err) != "57P01" || !strings.Contains(err.Error(), h.primary.Addr())) {
		t.Errorf("a client pinned on the primary, between statements as it died: %v, want 57P01 naming %s", err, h.primary.Addr())
	}
}
