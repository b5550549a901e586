package proxy_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// A server connection put back into the pool while a change of primary is published is not left among the idle
// ones after dropHost closed the pool's connections to the old host. From failover57 (2026-12-05, attack: a
// put-back, a lend's end or the pool.min_idle keeper's, judged fit just before the switch and put back just
// after it): release checked the connection's host before it took the pool's lock and put the connection back
// after, so dropHost, which ran between the two, closed it and took it off the pool's open connections while the
// put-back then added it to the idle ones. SHOW POOLS counted a closed connection idle (sv_idle 1) beside
// sv_active -1, SHOW SERVERS did not show it, the fenceproxy_pool_* gauges (the same counts) agreed with SHOW
// POOLS, and pool.min_idle, satisfied by it, opened none on the new primary. It was never lent (a lend judges
// each idle connection again: router.stale). The put-back is held here between the two (HoldPutBack) while the
// standby is promoted and dropHost runs.
func TestPooledPutBackRacingAChangeOfPrimary(t *testing.T) {
	hold := newHeldFirst()
	h := startHAPairConf(t, nil, "", pooledYAML("size: 3", "min_idle: 1", poolAdmin), nil,
		func(o *proxy.Options) { proxy.HoldPutBack(o, hold.hold) })
	dsn := h.simpleDSN(pgtest.TestDB)
	ctx := haCtx(t)
	c := h.connectOnPrimary(ctx, t, dsn, "the client")
	adm := connect(t, h.simpleDSN("fenceproxy"))
	oldPort, newPort := strconv.Itoa(h.primary.Port()), strconv.Itoa(h.standby.Port())
	// poolTrue reports whether SHOW POOLS agrees with SHOW SERVERS for the client's pool, with at least
	// pool.min_idle idle connections, every one to port.
	poolTrue := func(port string) (bool, string) {
		var idle, active int
		for _, r := range adminRows(t, adm, "SHOW SERVERS") {
			if r["database"] != pgtest.TestDB {
				continue
			}
			if r["port"] != port {
				return false, "a server connection to port " + r["port"].(string)
			}
			if r["state"] == "idle" {
				idle++
			} else {
				active++
			}
		}
		for _, r := range adminRows(t, adm, "SHOW POOLS") {
			if r["database"] == pgtest.TestDB {
				got := "SHOW POOLS sv_idle " + r["sv_idle"].(string) + " sv_active " + r["sv_active"].(string) +
					", SHOW SERVERS " + strconv.Itoa(idle) + " idle " + strconv.Itoa(active) + " active"
				return r["sv_idle"] == strconv.Itoa(idle) && r["sv_active"] == strconv.Itoa(active) && idle >= 1, got
			}
		}
		return false, "no pool"
	}
	eventually(t, 10*time.Second, "the pool settled on the primary", func() bool {
		ok, _ := poolTrue(oldPort)
		return ok
	})
	hold.arm(t)
	answered := make(chan struct{})
	go func() { // its server connection's put-back is the one held
		defer close(answered)
		serverPort(ctx, c)
	}()
	hold.reached(ctx, t, "put-back")
	h.failOver(ctx, t)
	eventually(t, 30*time.Second, "dropHost to close the pool's connections to the old primary", func() bool {
		for _, r := range adminRows(t, adm, "SHOW SERVERS") {
			if r["port"] == oldPort {
				return false
			}
		}
		return true
	})
	hold.release()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, got := poolTrue(newPort)
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a put-back that raced the change of primary: %s, want them equal with pool.min_idle on the new primary (port %s)", got, newPort)
		}
		time.Sleep(20 * time.Millisecond)
	}
	<-answered
	if port, err := serverPort(ctx, c); err != nil || port != h.standby.Port() {
		t.Errorf("the next transaction reached port %d (%v), want the new primary's %d", port, err, h.standby.Port())
	}
}

// heldFirst is a test hook that holds the first call made to it once armed (hold) until release, so that a test
// can run a change of primary inside the window the hook marks. The proxy takes the hook when it is built (the
// package's hooks are plain fields), so the calls before the test arms it pass. The test's cleanup releases it,
// so that no goroutine of the proxy stays held when the test ends early.
type heldFirst struct {
	armed    atomic.Bool
	held     atomic.Bool
	at       chan struct{} // closed when the first call is held
	resume   chan struct{}
	released sync.Once
}

func newHeldFirst() *heldFirst {
	return &heldFirst{at: make(chan struct{}), resume: make(chan struct{})}
}

// arm makes the next call the one held. Its cleanup, registered here, after the proxy's, runs before the proxy
// shuts down, so that a held call does not hold the shutdown.
func (h *heldFirst) arm(t *testing.T) {
	t.Cleanup(func() {
		if h.held.CompareAndSwap(false, true) {
			close(h.at)
		}
		h.release()
	})
	h.armed.Store(true)
}

// hold is the hook: once armed, the first call waits for release, the later ones pass.
func (h *heldFirst) hold() {
	if h.armed.Load() && h.held.CompareAndSwap(false, true) {
		close(h.at)
		<-h.resume
	}
}

// reached waits until the first call (of what) is held.
func (h *heldFirst) reached(ctx context.Context, t *testing.T, what string) {
	t.Helper()
	select {
	case <-h.at:
	case <-ctx.Done():
		t.Fatalf("no %s came", what)
	}
}

func (h *heldFirst) release() { h.released.Do(func() { close(h.resume) }) }
