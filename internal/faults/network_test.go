package faults

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// relayedProxies starts one proxy process whose upstream is a netRelay in front of the shared cluster, and one
// that talks to the cluster directly.
func relayedProxies(t *testing.T, e *etcdtest.Etcd, table string) (*netRelay, *proxyProc, *proxyProc) {
	r := startRelay(t, pg.Addr())
	viaRelay := startProxyProc(t, proxyConfig{Upstream: r.Addr(), Tables: []string{table}, Etcd: e.Endpoints()})
	direct := startProxyProc(t, proxyConfig{Upstream: pg.Addr(), Tables: []string{table}, Etcd: e.Endpoints()})
	return r, viaRelay, direct
}

// holderConn takes the lock name and returns it with a connection through p that carries its token.
func holderConn(t *testing.T, ctx context.Context, e *etcdtest.Etcd, p *proxyProc, name, app string) (*tokens.Lock, *pgx.Conn) {
	t.Helper()
	l, err := tokens.Acquire(ctx, e.Client(), name, tokens.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Release(context.Background()) })
	c := connect(t, p.DSN(app))
	if err := tokens.SetToken(ctx, c, l.Token(), ""); err != nil {
		t.Fatal(err)
	}
	return l, c
}

// revoke ends l's lease from outside, as an expiry would, and waits until its holder knows.
func revoke(t *testing.T, ctx context.Context, e *etcdtest.Etcd, l *tokens.Lock) {
	t.Helper()
	if _, err := e.Client().Revoke(ctx, l.Lease()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-ctx.Done():
		t.Fatal("the holder did not notice its revoked lease")
	}
}

// TestDelayedWriteArrivesLate: the network between A's proxy and PostgreSQL stalls while A's write is on its
// way; A's lease ends, B takes the lock and writes through the other proxy; the network recovers and A's old
// request reaches the database late: 55F01, and the row keeps B's write.
func TestDelayedWriteArrivesLate(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	e := etcdtest.Start(t)
	table := fencedTable(t, pg, 1)
	relay, viaRelay, direct := relayedProxies(t, e, table)
	ctx := ctxFor(t, 60*time.Second)
	name := uniqueName("late")
	h := &History{Mode: pgx.QueryExecModeExec}

	a, ac := holderConn(t, ctx, e, viaRelay, name, "faults-late-a")
	relay.Stall(true, false)
	aDone := make(chan Attempt, 1)
	go func() { aDone <- h.Write(ctx, ac, table, "A", a.Token(), 1) }()
	waitFor(t, 10*time.Second, "A's write held in the stalled network", func() bool { return relay.heldUp.Load() > 0 })

	revoke(t, ctx, e, a)
	b, bc := holderConn(t, ctx, e, direct, name, "faults-late-b")
	if b.Token() <= a.Token() {
		t.Fatalf("B's token %d not above A's %d", b.Token(), a.Token())
	}
	if bw := h.Write(ctx, bc, table, "B", b.Token(), 1); bw.Outcome != Applied {
		t.Fatalf("B's write: %v", bw)
	}
	select {
	case aw := <-aDone:
		t.Fatalf("A's write finished while the network was stalled: %v", aw)
	default:
	}
	relay.Thaw()
	aw := <-aDone
	if aw.Outcome != Stale || aw.RowToken != b.Token() {
		t.Fatalf("A's late write: %v (row token %d), want 55F01 naming B's token %d", aw, aw.RowToken, b.Token())
	}
	h.Check(t, pg, table)
}

// TestUnknownOutcomeThenTakeover: A's write is applied but its acknowledgement is lost (the network from
// PostgreSQL stalls) and A times out not knowing. B takes over and writes; A retries with its old token, which
// is refused (55F01). The history shows A's write was applied once, before B's.
func TestUnknownOutcomeThenTakeover(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	e := etcdtest.Start(t)
	table := fencedTable(t, pg, 1)
	relay, viaRelay, direct := relayedProxies(t, e, table)
	ctx := ctxFor(t, 60*time.Second)
	name := uniqueName("unknown")
	h := &History{Mode: pgx.QueryExecModeExec}

	a, ac := holderConn(t, ctx, e, viaRelay, name, "faults-unknown-a")
	relay.Stall(false, true)
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	aw := h.Write(wctx, ac, table, "A", a.Token(), 1)
	cancel()
	if aw.Outcome != Unknown {
		t.Fatalf("A's write with its answer held back: %v, want an unknown outcome", aw)
	}
	db := connect(t, pg.SuperDSN())
	waitFor(t, 10*time.Second, "A's unacknowledged write to be applied", func() bool {
		var n int
		db.QueryRow(ctx, "SELECT count(*) FROM "+table+"_history WHERE val = $1", aw.Val).Scan(&n)
		return n == 1
	})

	revoke(t, ctx, e, a)
	b, bc := holderConn(t, ctx, e, direct, name, "faults-unknown-b")
	if bw := h.Write(ctx, bc, table, "B", b.Token(), 1); bw.Outcome != Applied {
		t.Fatalf("B's write: %v", bw)
	}
	retry := connect(t, direct.DSN("faults-unknown-a"))
	if err := tokens.SetToken(ctx, retry, a.Token(), ""); err != nil {
		t.Fatal(err)
	}
	if rw := h.Write(ctx, retry, table, "A-retry", a.Token(), 1); rw.Outcome != Stale {
		t.Fatalf("A's retry with its old token: %v, want 55F01", rw)
	}
	relay.Thaw()
	// The abandoned session's backend goes away, and the relayed proxy serves new sessions.
	retry.Close(ctx)
	noLeakedBackends(t, pg, "faults-unknown-a", 20*time.Second)
	var one int
	if err := connect(t, viaRelay.DSN("faults-unknown-c")).QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("proxy after the stall: %v", err)
	}
	h.Check(t, pg, table)
}

// TestUpstreamNetworkStallAndCut: with the network to PostgreSQL stalled, a client's timed-out query returns
// and the other proxy keeps serving; after recovery the abandoned backend is gone. A cut (reset) network ends
// the sessions through it promptly with an error, and new sessions work at once.
func TestUpstreamNetworkStallAndCut(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	e := etcdtest.Start(t)
	table := fencedTable(t, pg, 1)
	relay, viaRelay, direct := relayedProxies(t, e, table)
	ctx := ctxFor(t, 90*time.Second)

	stalled := connect(t, viaRelay.DSN("faults-stall"))
	relay.Stall(true, true)
	qctx, cancel := context.WithTimeout(ctx, time.Second)
	returned := make(chan error, 1)
	go func() { _, err := stalled.Exec(qctx, "SELECT 1"); returned <- err }()
	// The client's timeout must free it although the proxy's upstream is stalled. The bound is far above the
	// 1s timeout, so that only a query that does not return at all fails it, not a slow machine.
	var err error
	select {
	case err = <-returned:
	case <-time.After(60 * time.Second):
		t.Fatal("the timed-out query through a stalled network had not returned 60s later")
	}
	cancel()
	if err == nil {
		t.Fatal("a query through a stalled network succeeded")
	}
	var one int
	if err := connect(t, direct.DSN("faults-stall-other")).QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("the other proxy while the network is stalled: %v", err)
	}
	relay.Thaw()
	stalled.Close(ctx)
	noLeakedBackends(t, pg, "faults-stall", 20*time.Second)

	var cut []*pgx.Conn
	for range 5 {
		cut = append(cut, connect(t, viaRelay.DSN("faults-cut")))
	}
	waitFor(t, 10*time.Second, "5 backends", func() bool { return backends(t, pg, "faults-cut") == 5 })
	relay.Cut()
	for i, c := range cut {
		// A reset upstream connection ends the session at once; the deadline only tells a session the proxy
		// never ends (a hang) from one it ends, so it is far above any slow machine's delay.
		qctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		_, err := c.Exec(qctx, "SELECT 1")
		timedOut := qctx.Err() != nil
		cancel()
		if err == nil {
			t.Fatalf("session %d survived a cut network", i)
		}
		if timedOut {
			t.Fatalf("session %d: the cut was not noticed 60s later: %v", i, err)
		}
	}
	noLeakedBackends(t, pg, "faults-cut", 20*time.Second)
	if err := connect(t, viaRelay.DSN("faults-cut-after")).QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("proxy after the cut: %v", err)
	}
}
