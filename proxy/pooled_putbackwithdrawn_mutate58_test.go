package proxy_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A server connection whose transaction ends after the router withdrew its host (read-only here, no other host
// promoted, so no dropHost runs) is not put back among the idle ones: release judges the host under the pool's
// lock (p.superseded), whatever dropHost did or did not do. From mutate58 (2026-12-06): with that judgement
// dropped from release (only the check that the connection is still open left), every test passed
// (TestPooledPutBackRacingAChangeOfPrimary races a dropHost, which the open check alone covers), and this one
// failed: the connection stayed idle on the withdrawn host, counted by SHOW POOLS and SHOW SERVERS, until the
// next publication. It is never lent (a lend judges idle connections again), but it holds a slot of the pool
// and satisfies pool.min_idle with a connection nobody may use.
func TestPooledPutBackOnAWithdrawnPrimary(t *testing.T) {
	h, dsn := startPooledHAPair(t, "size: 2", poolAdmin)
	ctx := haCtx(t)
	c := h.connectOnPrimary(ctx, t, dsn, "the client")
	adm := connect(t, h.simpleDSN("fenceproxy"))
	oldPort := strconv.Itoa(h.primary.Port())
	// servers is what SHOW SERVERS and SHOW POOLS say of the client's pool: its connections to the old
	// primary, and the pool's idle count.
	servers := func() (onOld int, svIdle string) {
		for _, r := range adminRows(t, adm, "SHOW SERVERS") {
			if r["database"] == pgtest.TestDB && r["port"] == oldPort {
				onOld++
			}
		}
		for _, r := range adminRows(t, adm, "SHOW POOLS") {
			if r["database"] == pgtest.TestDB {
				svIdle = r["sv_idle"].(string)
			}
		}
		return onOld, svIdle
	}
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	h.onPrimary(ctx, t, c, "the transaction")
	if onOld, svIdle := servers(); onOld != 1 || svIdle != "0" {
		t.Fatalf("before the withdrawal: %d server connections to the primary, sv_idle %s; want the one lent and none idle", onOld, svIdle)
	}
	setReadOnly(ctx, t, connect(t, h.primary.SuperDSN()))
	eventually(t, 30*time.Second, "the proxy to withdraw the read-only primary", func() bool {
		got, _ := metricValue(t, h.proxy.Registry, "fenceproxy_upstream_primary")
		changes, _ := metricValue(t, h.proxy.Registry, "fenceproxy_upstream_primary_changes_total")
		return got == 0 && changes == 2
	})
	if _, err := c.Exec(ctx, "COMMIT"); err != nil { // a read-only transaction ends on the withdrawn host
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		onOld, svIdle := servers()
		if onOld == 0 && svIdle == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after its transaction ended on the withdrawn primary: %d server connections to it, sv_idle %s; want it closed, none idle", onOld, svIdle)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
