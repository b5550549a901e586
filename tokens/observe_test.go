package tokens_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/lockservers"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// lockMetric returns the value of series name for lock (0 if absent) from reg.
func lockMetric(t *testing.T, reg *prometheus.Registry, name, lock string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "lock" && lp.GetValue() == lock {
					if m.Gauge != nil {
						return m.GetGauge().GetValue()
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestPGObserverMetricsMove drives one lock through every event the PostgreSQL store counts and checks that
// each series moves.
func TestPGObserverMetricsMove(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	app := "observe-" + lockName(t)
	dsn := pg.SuperDSN() + "&application_name=" + app
	ctx := context.Background()
	s, err := tokens.NewPGStore(ctx, dsn, tokens.PGStoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ro, err := tokens.NewPGStore(ctx, pg.SuperDSN(), tokens.PGStoreOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	ob := tokens.NewPGObserver(ro, tokens.ObserverOptions{MaxLocks: 10000})
	reg := prometheus.NewRegistry()
	reg.MustRegister(ob)
	name := lockName(t)
	m := func(series string) float64 {
		ob.Poll(ctx)
		return lockMetric(t, reg, series, name)
	}
	eventually := func(series string, cond func(float64) bool) {
		t.Helper()
		waitFor(t, 20*time.Second, series, func() bool { return cond(m(series)) })
	}

	a := pgAcquire(t, s, name, tokens.AcquireOptions{TTL: 3 * time.Second})
	if v := m("fenceproxy_lock_held"); v != 1 {
		t.Errorf("held = %v", v)
	}
	if v := m("fenceproxy_lock_token"); v != float64(a.Token()) {
		t.Errorf("token = %v, want %d", v, a.Token())
	}
	if v := m("fenceproxy_lock_acquisitions_total"); v != 1 {
		t.Errorf("acquisitions = %v", v)
	}
	if v := m("fenceproxy_lock_lease_left_seconds"); v <= 0 || v > 3 {
		t.Errorf("lease left = %v", v)
	}
	eventually("fenceproxy_lock_held_seconds", func(v float64) bool { return v > 0 })

	// A waiter that times out.
	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := s.Acquire(tctx, name, tokens.AcquireOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("timed-out waiter: %v", err)
	}
	cancel()
	if v := m("fenceproxy_lock_acquire_timeouts_total"); v != 1 {
		t.Errorf("acquire timeouts = %v", v)
	}

	// A waiter that is served when a is released.
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	ch := acquireBG(wctx, s, name, tokens.AcquireOptions{TTL: 3 * time.Second})
	eventually("fenceproxy_lock_waiters", func(v float64) bool { return v == 1 })
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	b := r.h
	defer b.Release(ctx)
	if v := m("fenceproxy_lock_releases_total"); v != 1 {
		t.Errorf("releases = %v", v)
	}
	if v := m("fenceproxy_lock_acquisitions_total"); v != 2 {
		t.Errorf("acquisitions = %v", v)
	}
	if v := m("fenceproxy_lock_acquire_wait_seconds_total"); v <= 0 {
		t.Errorf("acquire wait seconds = %v", v)
	}
	if v := m("fenceproxy_lock_waiters"); v != 0 {
		t.Errorf("waiters after the waiter was served = %v", v)
	}

	// The holder's connection is killed: a renewal fails, the next one (on a new connection) reports it.
	if err := pg.Exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '" + app + "'"); err != nil {
		t.Fatal(err)
	}
	eventually("fenceproxy_lock_renewal_failures_total", func(v float64) bool { return v >= 1 })
	if b.Err() != nil {
		t.Fatalf("a renewal failure shorter than the lease lost it: %v", b.Err())
	}

	// The lease expires; a new holder takes over; the old holder's release is refused.
	expireLease(t, pg, name)
	c := pgAcquire(t, s, name, tokens.AcquireOptions{TTL: 30 * time.Second})
	if v := m("fenceproxy_lock_expirations_total"); v != 1 {
		t.Errorf("expirations = %v", v)
	}
	heldLost(t, b, 5*time.Second)
	if err := b.Release(ctx); err == nil {
		t.Fatal("the expired holder's release was not refused")
	}
	if v := m("fenceproxy_lock_non_owner_releases_total"); v != 1 {
		t.Errorf("non-owner releases = %v", v)
	}
	if v := m("fenceproxy_lock_token"); v != float64(c.Token()) {
		t.Errorf("token = %v, want %d", v, c.Token())
	}
}

// TestObserverBoundsCardinality: locks beyond MaxLocks are summed under the label "other".
func TestObserverBoundsCardinality(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	ctx := context.Background()
	s, err := tokens.NewPGStore(ctx, pg.SuperDSN(), tokens.PGStoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Other tests' locks share the table: whichever two names come first get labels, the rest is "other".
	ob := tokens.NewPGObserver(s, tokens.ObserverOptions{MaxLocks: 2})
	reg := prometheus.NewRegistry()
	reg.MustRegister(ob)
	for range 4 {
		pgAcquire(t, s, lockName(t), tokens.AcquireOptions{TTL: time.Minute})
	}
	ob.Poll(ctx)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "fenceproxy_lock_held" {
			continue
		}
		labels := map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "lock" {
					labels[lp.GetValue()] = true
				}
			}
		}
		if len(labels) != 3 || !labels[tokens.OtherLocks] {
			t.Fatalf("lock labels %v: want 2 names and %q", labels, tokens.OtherLocks)
		}
		return
	}
	t.Fatal("no fenceproxy_lock_held series")
}

// TestEtcdObserverMetricsMove: acquisitions, token, waiters, a release and an expiration, inferred from etcd.
func TestEtcdObserverMetricsMove(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	ctx := context.Background()
	s := tokens.NewEtcdStore(e.Client(), tokens.DefaultPrefix)
	ob := tokens.NewEtcdObserver(s, tokens.ObserverOptions{MaxLocks: 10000, Interval: 100 * time.Millisecond})
	reg := prometheus.NewRegistry()
	reg.MustRegister(ob)
	octx, stop := context.WithCancel(ctx)
	defer stop()
	go ob.Run(octx)
	name := lockName(t)
	eventually := func(series string, cond func(float64) bool) {
		t.Helper()
		waitFor(t, 20*time.Second, series, func() bool { return cond(lockMetric(t, reg, series, name)) })
	}

	a, err := s.Acquire(ctx, name, tokens.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	eventually("fenceproxy_lock_token", func(v float64) bool { return v == float64(a.Token()) })
	eventually("fenceproxy_lock_held", func(v float64) bool { return v == 1 })
	eventually("fenceproxy_lock_acquisitions_total", func(v float64) bool { return v == 1 })
	eventually("fenceproxy_lock_lease_left_seconds", func(v float64) bool { return v > 20 })
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ch := acquireBG(wctx, s, name, tokens.AcquireOptions{TTL: 30 * time.Second})
	eventually("fenceproxy_lock_waiters", func(v float64) bool { return v == 1 })
	a.Release(ctx)
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	eventually("fenceproxy_lock_releases_total", func(v float64) bool { return v == 1 })
	eventually("fenceproxy_lock_acquisitions_total", func(v float64) bool { return v == 2 })
	r.h.Release(ctx)

	// A holder whose process goes away without releasing: its lease expires.
	c2, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.NewEtcdStore(c2, tokens.DefaultPrefix).Acquire(ctx, name, tokens.AcquireOptions{TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	eventually("fenceproxy_lock_acquisitions_total", func(v float64) bool { return v == 3 })
	c2.Close()
	eventually("fenceproxy_lock_expirations_total", func(v float64) bool { return v == 1 })
	eventually("fenceproxy_lock_held", func(v float64) bool { return v == 0 })
}

// TestListObserverMetricsMove: the ZooKeeper and Redis observers (NewListObserver) show a holder's token, its
// acquisitions and releases (and, for ZooKeeper, its waiters).
func TestListObserverMetricsMove(t *testing.T) {
	ctx := context.Background()
	zk := lockservers.ZooKeeper(t)
	redis := lockservers.Redis(t)
	for _, c := range []struct {
		name    string
		open    func(observe bool) tokens.Store
		waiters bool
	}{
		{"zookeeper", func(observe bool) tokens.Store {
			s, err := tokens.NewZKStore(ctx, []string{zk.Addr()}, tokens.ZKOptions{ConnectTimeout: 30 * time.Second, Observe: observe})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}, true},
		{"redis", func(bool) tokens.Store {
			s, err := tokens.NewRedisStore(ctx, redis.Addr(), tokens.RedisOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ob := tokens.NewListObserver(c.open(true), tokens.ObserverOptions{MaxLocks: 10000, Interval: 100 * time.Millisecond})
			reg := prometheus.NewRegistry()
			reg.MustRegister(ob)
			octx, stop := context.WithCancel(ctx)
			defer stop()
			go ob.Run(octx)
			name := lockName(t)
			eventually := func(series string, cond func(float64) bool) {
				t.Helper()
				waitFor(t, 30*time.Second, series, func() bool { return cond(lockMetric(t, reg, series, name)) })
			}
			s := c.open(false)
			a, err := s.Acquire(ctx, name, tokens.AcquireOptions{TTL: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			eventually("fenceproxy_lock_token", func(v float64) bool { return v == float64(a.Token()) })
			eventually("fenceproxy_lock_held", func(v float64) bool { return v == 1 })
			eventually("fenceproxy_lock_acquisitions_total", func(v float64) bool { return v == 1 })
			if c.waiters {
				wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				ch := acquireBG(wctx, c.open(false), name, tokens.AcquireOptions{TTL: 30 * time.Second})
				eventually("fenceproxy_lock_waiters", func(v float64) bool { return v == 1 })
				a.Release(ctx)
				r := <-ch
				if r.err != nil {
					t.Fatal(r.err)
				}
				eventually("fenceproxy_lock_acquisitions_total", func(v float64) bool { return v == 2 })
				r.h.Release(ctx)
			} else {
				a.Release(ctx)
			}
			eventually("fenceproxy_lock_held", func(v float64) bool { return v == 0 })
			eventually("fenceproxy_lock_releases_total", func(v float64) bool { return v >= 1 })
		})
	}
}

// An observer of a database without the lock tables says why its up series is 0, at the first reading (not
// only when a store that worked goes away), once, and says so again when it can read.
func TestPGObserverSaysWhyItIsDown(t *testing.T) {
	pgtest.Require(t, pg)
	if err := pg.Exec("CREATE DATABASE observe_no_tables"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dsn := pg.DSN(pgtest.SuperUser, "", "observe_no_tables")
	ro, err := tokens.NewPGStore(ctx, dsn, tokens.PGStoreOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	ob := tokens.NewPGObserver(ro, tokens.ObserverOptions{Logger: slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))})
	reg := prometheus.NewRegistry()
	reg.MustRegister(ob)
	ob.Poll(ctx)
	ob.Poll(ctx)
	if got := strings.Count(logs.String(), "no lock tables in this database yet"); got != 1 {
		t.Fatalf("want one log line saying the lock tables are missing, got %d:\n%s", got, logs.String())
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "fenceproxy_lock_observer_up" && mf.GetMetric()[0].GetGauge().GetValue() != 0 {
			t.Fatalf("observer up with no lock tables")
		}
	}
	// The first fenceproxy lock --pg creates them; the observer reads again and says so.
	if _, err := tokens.NewPGStore(ctx, dsn, tokens.PGStoreOptions{}); err != nil {
		t.Fatal(err)
	}
	ob.Poll(ctx)
	if !strings.Contains(logs.String(), "reading the lock store again") {
		t.Fatalf("no line saying the observer reads again:\n%s", logs.String())
	}
}

// syncWriter serializes writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
