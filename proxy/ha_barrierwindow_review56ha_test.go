package proxy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/proxy"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// A primary that stops claiming to be primary while another host already does (the standby promoted while the
// old primary still ran: a split brain, then the old one demoted, read-only) is no longer trusted with a fenced
// write while the barrier runs on the new one. From a review on 2026-12-05 (review56ha, attack: a transaction
// straddling the switch): decide kept the old primary published for the barrier's whole run (up to
// 4*health_timeout), the split brain's refusal was lifted as the old host stopped claiming, and a fenced write
// of a transaction opened READ WRITE on the old primary (default_transaction_read_only is only a default)
// committed there, where the new primary never sees it (a promoted standby does not stream from the old
// primary). The barrier is held here by a lock on lock_marks taken
// on the new primary, so the window is as long as the test needs.
func TestFencedWriteRefusedWhileTheBarrierRuns(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			c := tokenClient(ctx, t, h, 5)
			if _, err := c.Exec(ctx, "UPDATE accounts SET v = 1 WHERE id = 1"); err != nil {
				t.Fatalf("fenced write before the switch: %v", err)
			}
			h.onPrimary(ctx, t, c, "the client")
			h.splitBrain(ctx, t)
			eventually(t, 30*time.Second, "a fenced write to be refused during the split brain", func() bool {
				_, err := c.Exec(ctx, "UPDATE accounts SET v = 1 WHERE id = 1")
				return sqlstate(err) == "55F04"
			})
			// A transaction opened READ WRITE on the old primary during the split brain (a BEGIN writes nothing),
			// where default_transaction_read_only, only a default, does not reach it.
			if _, err := c.Exec(ctx, "BEGIN READ WRITE"); err != nil {
				t.Fatal(err)
			}
			h.onPrimary(ctx, t, c, "the transaction")
			hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
			_, writeErr := c.Exec(ctx, "UPDATE accounts SET v = 9 WHERE id = 2")
			_, commitErr := c.Exec(ctx, "COMMIT")
			if err := hold.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if sqlstate(writeErr) != "55F04" || !strings.Contains(writeErr.Error(), "no longer the primary") {
				t.Errorf("fenced write on the demoted primary while the barrier runs: %v (COMMIT: %v), want 55F04: the host is no longer the primary", writeErr, commitErr)
			}
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 2 AND v = 9").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("a fenced write committed on the demoted primary while the barrier ran on the new one")
			}
			eventually(t, 30*time.Second, "the new primary to be published", reachesPort(ctx, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB), h.standby.Port()))
		})
	}
}

// barrierModes are the pool modes (and session mode's two transports) the tests of the barrier's window run in.
var barrierModes = []struct{ name, yaml string }{
	{"transaction", pooledYAML("size: 2")},
	{"session", ""}, // the event loop relays it
	{"session-goroutines", "relay:\n  mode: goroutines\n"},
}

// startBarrierPair is startHAPairConf (yaml appended, conf for both servers) with the fenceproxy schema
// installed on the primary and a grant of lock L in etcd, which the barrier on a promoted standby must raise (it
// has no mark there, so the barrier inserts one): a lock on lock_marks there holds the barrier
// (withdrawBehindAHeldBarrier). It returns the pair and a superuser connection to the primary.
func startBarrierPair(t *testing.T, yaml string, conf map[string]string) (*haPair, *pgx.Conn) {
	t.Helper()
	return startBarrierPairTuned(t, yaml, conf, nil)
}

// startBarrierPairTuned is startBarrierPair with the proxy's options changed by tune (startHAPairConf's).
func startBarrierPairTuned(t *testing.T, yaml string, conf map[string]string, tune func(*proxy.Options)) (*haPair, *pgx.Conn) {
	t.Helper()
	e := etcdtest.Start(t)
	store := tokens.NewEtcdStore(e.Client(), tokens.DefaultPrefix)
	h := startHAPairConf(t, store, "", yaml, conf, tune)
	ctx := haCtx(t)
	admin := connect(t, h.primary.SuperDSN())
	installFence(ctx, t, admin)
	if _, err := store.Acquire(ctx, "L", tokens.AcquireOptions{TTL: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	return h, admin
}

// withdrawBehindAHeldBarrier, with the standby promoted while the old primary (admin's) still runs, locks
// lock_marks on the new primary, demotes the old one (read-only: the split brain is over, the old primary is
// withdrawn) and waits until the barrier waits for the lock. The caller rolls the returned transaction back to
// let the barrier finish and the new primary be published.
func withdrawBehindAHeldBarrier(ctx context.Context, t *testing.T, h *haPair, admin *pgx.Conn) pgx.Tx {
	t.Helper()
	hold := beginWith(ctx, t, connect(t, h.standby.SuperDSN()), "LOCK TABLE fenceproxy.lock_marks IN ACCESS EXCLUSIVE MODE")
	setReadOnly(ctx, t, admin)
	watch := connect(t, h.standby.SuperDSN())
	eventually(t, 30*time.Second, "the barrier to wait on the new primary", func() bool {
		var n int
		err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'fenceproxy: health%'
			AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	})
	return hold
}
