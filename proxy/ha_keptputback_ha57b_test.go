package proxy_test

import (
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/proxy"
)

// A session-mode upstream connection kept for reuse (upstream.reuse) while a change of primary is published is
// not left kept after the change closed the kept connections of the old epoch. From ha57b (2026-12-05, attack:
// the session-mode twin of TestPooledPutBackRacingAChangeOfPrimary): a session that ended cleanly just before
// the switch had its connection reset (DISCARD ALL) and then put into the reuse pool, while dropHost, which ran
// between the two, had already closed the old primary's kept connections. The put added it anyway: a connection
// no session could ever take (get matches host and epoch exactly), counted by fenceproxy_upstream_idle and
// holding a slot of upstream.reuse.max_idle until reuse.idle_timeout. The put is held here before the pool's
// lock (HoldKeep) while the standby is promoted.
func TestKeptConnectionRacingAChangeOfPrimary(t *testing.T) {
	hold := newHeldFirst()
	h := startHAPairConf(t, nil, "", "", nil, func(o *proxy.Options) { proxy.HoldKeep(o, hold.hold) })
	ctx := haCtx(t)
	// first is kept before the switch: its drop shows that the change of primary has closed the kept
	// connections. Its startup differs from held's (application_name), so held's session does not take it.
	first := h.connectOnPrimary(ctx, t, reuseDSN(h.proxy, reuseApp(t)+"-first"), "the first session")
	closeConn(t, first)
	waitIdle(t, h.proxy, 1)

	hold.arm(t)
	dsn := reuseDSN(h.proxy, reuseApp(t))
	held := h.connectOnPrimary(ctx, t, dsn, "the held session")
	closeConn(t, held) // its connection, reset, waits in the hook to be kept
	hold.reached(ctx, t, "keeping of a connection")
	h.failOver(ctx, t)
	eventually(t, 30*time.Second, "the change of primary to close the connection kept on the old primary", func() bool {
		v, _ := metricValue(t, h.proxy.Registry, metricIdle)
		return v == 0
	})
	hold.release()
	// The held session's end, the keeping included, runs on its handler, which stops counting it only after.
	eventually(t, 10*time.Second, "the held session to end", func() bool { return h.proxy.Server.ActiveSessions() == 0 })
	wantMetric(t, h.proxy, metricIdle, 0)

	// Never handed out: a session with the same startup after the switch gets a new backend on the new primary.
	next := connect(t, dsn)
	if port, err := serverPort(ctx, next); err != nil || port != h.standby.Port() {
		t.Errorf("a session after the switch reached port %d (%v), want the new primary's %d", port, err, h.standby.Port())
	}
	wantMetric(t, h.proxy, metricReused, 0)
}

// A session that ends cleanly on a primary the router has withdrawn (read-only here, no other host promoted yet)
// does not leave its connection kept: the withdrawal moved the router's epoch, and a connection of an earlier
// one is never taken again (a session dialled later is in a later epoch, even to the same host). From ha57b
// (2026-12-05, attack: the window between a withdrawal and the next publication, where no dropHost ran): the
// connection was kept, counted by fenceproxy_upstream_idle, until idle_timeout or the next publication.
func TestKeptConnectionOfAWithdrawnPrimary(t *testing.T) {
	h := startHAPair(t, nil, "")
	ctx := haCtx(t)
	c := h.connectOnPrimary(ctx, t, reuseDSN(h.proxy, reuseApp(t)), "the session")
	setReadOnly(ctx, t, connect(t, h.primary.SuperDSN()))
	waitMetric(t, h.proxy, "fenceproxy_upstream_primary_changes_total", 2, "the proxy to withdraw the read-only primary")
	closeConn(t, c) // a session on the withdrawn host ends only at the next publication: this one ends itself
	eventually(t, 10*time.Second, "the session to end", func() bool { return h.proxy.Server.ActiveSessions() == 0 })
	wantMetric(t, h.proxy, metricIdle, 0)
}
