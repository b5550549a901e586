package tokens_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// pg is the package's shared cluster for the PostgreSQL lock store's tests.
var pg *pgtest.Cluster

func TestMain(m *testing.M) { os.Exit(pgtest.RunMain(m, pgtest.Options{}, &pg)) }

func pgStore(t *testing.T, cl *pgtest.Cluster, o tokens.PGStoreOptions) *tokens.PGStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := tokens.NewPGStore(ctx, cl.SuperDSN(), o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func pgAcquire(t *testing.T, s tokens.Store, name string, o tokens.AcquireOptions) tokens.Held {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h, err := s.Acquire(ctx, name, o)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", name, err)
	}
	t.Cleanup(func() { h.Release(context.Background()) })
	return h
}

type heldResult struct {
	h   tokens.Held
	err error
}

func acquireBG(ctx context.Context, s tokens.Store, name string, o tokens.AcquireOptions) <-chan heldResult {
	ch := make(chan heldResult, 1)
	go func() {
		h, err := s.Acquire(ctx, name, o)
		ch <- heldResult{h, err}
	}()
	return ch
}

func heldLost(t *testing.T, h tokens.Held, within time.Duration) {
	t.Helper()
	select {
	case <-h.Lost():
	case <-time.After(within):
		t.Fatalf("Lost not closed within %v", within)
	}
}

// expireLease makes the lease of name end now by the server's clock, as if its holder had been paused past its
// TTL (the holder process cannot be frozen in-process; the fault tests freeze real processes).
func expireLease(t *testing.T, cl *pgtest.Cluster, name string) {
	t.Helper()
	if err := cl.Exec("UPDATE fenceproxy.lock_leases SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE name = '" + name + "'"); err != nil {
		t.Fatal(err)
	}
}

func lockRow(t *testing.T, s *tokens.PGStore, name string) tokens.LockInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	all, err := s.ListAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, li := range all {
		if li.Name == name {
			return li
		}
	}
	t.Fatalf("lock %q not listed", name)
	return tokens.LockInfo{}
}

// TestPGStoreLifecycle passes one lock through holders that release, expire and are taken over: tokens strictly
// increase, an expired holder notices (Lost) and cannot renew it back, its late release changes nothing and is
// reported and counted, and the counters in the lease table move.
func TestPGStoreLifecycle(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	s := pgStore(t, pg, tokens.PGStoreOptions{})
	name := lockName(t)
	ctx := context.Background()

	a := pgAcquire(t, s, name, tokens.AcquireOptions{TTL: 30 * time.Second})
	if _, err := s.Acquire(ctx, name, tokens.AcquireOptions{Try: true}); !errors.Is(err, tokens.ErrLocked) {
		t.Fatalf("Try while held: %v, want ErrLocked", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	if !errors.Is(a.Err(), tokens.ErrReleased) {
		t.Fatalf("Err after release: %v", a.Err())
	}

	b := pgAcquire(t, s, name, tokens.AcquireOptions{TTL: 3 * time.Second})
	if b.Token() <= a.Token() {
		t.Fatalf("token after release %d not above %d", b.Token(), a.Token())
	}
	// b's lease expires by the server's clock; b's next renewal finds it gone and b declares it lost.
	expireLease(t, pg, name)
	heldLost(t, b, 5*time.Second)
	if !errors.Is(b.Err(), tokens.ErrLeaseLost) {
		t.Fatalf("Err: %v", b.Err())
	}
	c := pgAcquire(t, s, name, tokens.AcquireOptions{TTL: 30 * time.Second, TokenOffset: 0})
	if c.Token() <= b.Token() {
		t.Fatalf("token after expiry %d not above %d", c.Token(), b.Token())
	}
	// b's late release must not free c's lease.
	if err := b.Release(ctx); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("late release by the expired holder: %v, want an error wrapping ErrLeaseLost", err)
	}
	if _, err := s.Acquire(ctx, name, tokens.AcquireOptions{Try: true}); !errors.Is(err, tokens.ErrLocked) {
		t.Fatalf("c's lease was freed by b's late release: %v", err)
	}
	li := lockRow(t, s, name)
	if li.Token != c.Token() || li.Holder == "" || li.LeaseLeft <= 20*time.Second {
		t.Fatalf("listed %+v, want c's token %d and a fresh lease", li, c.Token())
	}
	want := tokens.LockCounters{Acquisitions: 3, Releases: 1, Expirations: 1, NonOwnerReleases: 1}
	got := *li.Counters
	got.AcquireWaitSeconds, got.RenewalFailures = 0, 0
	if got != want {
		t.Fatalf("counters %+v, want %+v", got, want)
	}
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// An offset is added to the sequence's value.
	d := pgAcquire(t, s, name, tokens.AcquireOptions{TokenOffset: 1 << 40})
	if d.Token() <= 1<<40 || d.Token() <= c.Token() {
		t.Fatalf("token with offset: %d", d.Token())
	}
}

// TestPGStoreWaiterWokenByRelease: a waiter whose polling interval is a minute gets the lock within seconds of
// the release, so the release's NOTIFY woke it. It is listed as a waiter meanwhile.
func TestPGStoreWaiterWokenByRelease(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	s := pgStore(t, pg, tokens.PGStoreOptions{})
	slow := pgStore(t, pg, tokens.PGStoreOptions{PollMin: time.Minute, PollMax: time.Minute})
	name := lockName(t)
	a := pgAcquire(t, s, name, tokens.AcquireOptions{TTL: 5 * time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch := acquireBG(ctx, slow, name, tokens.AcquireOptions{})
	waitFor(t, 10*time.Second, "the waiter listed", func() bool { return lockRow(t, s, name).Waiters == 1 })
	if err := a.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		defer r.h.Release(context.Background())
		if r.h.Token() <= a.Token() {
			t.Fatalf("waiter's token %d not above %d", r.h.Token(), a.Token())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter was not woken by the release (it polls only every minute)")
	}
	if n := lockRow(t, s, name).Waiters; n != 0 {
		t.Fatalf("%d waiters listed after the waiter got the lock", n)
	}
}

// TestPGStoreWaiterNoticesExpiry: no NOTIFY comes when a lease expires; the waiter's polling finds it.
func TestPGStoreWaiterNoticesExpiry(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	s := pgStore(t, pg, tokens.PGStoreOptions{PollMax: 200 * time.Millisecond})
	name := lockName(t)
	a := pgAcquire(t, s, name, tokens.AcquireOptions{TTL: 3 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch := acquireBG(ctx, s, name, tokens.AcquireOptions{})
	waitFor(t, 10*time.Second, "the waiter listed", func() bool { return lockRow(t, s, name).Waiters == 1 })
	expireLease(t, pg, name)
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.h.Release(context.Background())
	heldLost(t, a, 5*time.Second)
	if r.h.Token() <= a.Token() {
		t.Fatalf("token %d not above %d", r.h.Token(), a.Token())
	}
}

// TestPGStoreWaitDeadline: a waiter whose deadline passes gives up with the context's cause, is no longer
// listed, and the timeout is counted.
func TestPGStoreWaitDeadline(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	s := pgStore(t, pg, tokens.PGStoreOptions{})
	name := lockName(t)
	pgAcquire(t, s, name, tokens.AcquireOptions{TTL: 5 * time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(ctx, name, tokens.AcquireOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline: %v", err)
	}
	li := lockRow(t, s, name)
	if li.Waiters != 0 || li.Counters.AcquireTimeouts != 1 {
		t.Fatalf("after the timeout: %d waiters, %d timeouts; want 0 and 1", li.Waiters, li.Counters.AcquireTimeouts)
	}
}

// TestPGStoreServerRestart: a restart shorter than the lease keeps it (the lease is a committed row, judged by
// the server's clock); renewals resume on a new connection, nobody else gets the lock, and tokens still
// increase after the restart.
func TestPGStoreServerRestart(t *testing.T) {
	t.Parallel()
	cl := pgtest.MustStart(t, pgtest.Options{})
	s := pgStore(t, cl, tokens.PGStoreOptions{})
	name := lockName(t)
	a := pgAcquire(t, s, name, tokens.AcquireOptions{TTL: 20 * time.Second})
	if err := cl.Restart(); err != nil {
		t.Fatal(err)
	}
	// Renewals (every TTL/3) must succeed again: the renewal_failures counter records the failed ones, and
	// the lease's end moves forward.
	before := lockRow(t, s, name).LeaseLeft
	waitFor(t, 20*time.Second, "a renewal after the restart", func() bool { return lockRow(t, s, name).LeaseLeft > before })
	if a.Err() != nil {
		t.Fatalf("lease lost across a short restart: %v", a.Err())
	}
	if _, err := s.Acquire(context.Background(), name, tokens.AcquireOptions{Try: true}); !errors.Is(err, tokens.ErrLocked) {
		t.Fatalf("the lock was free after the restart: %v", err)
	}
	other := pgAcquire(t, s, lockName(t), tokens.AcquireOptions{})
	if other.Token() <= a.Token() {
		t.Fatalf("token after the restart %d not above %d", other.Token(), a.Token())
	}
}

// TestPGStoreDatabaseUnreachable: the server stops answering (SIGSTOP: connections hang, no error arrives);
// the holder declares the lease lost by its local deadline, before the server could let it expire, and never
// later. A server that is killed (connections refused) has the same effect.
func TestPGStoreDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"paused", "killed"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			cl := pgtest.MustStart(t, pgtest.Options{})
			s := pgStore(t, cl, tokens.PGStoreOptions{})
			name := lockName(t)
			const ttl = 3 * time.Second
			a := pgAcquire(t, s, name, tokens.AcquireOptions{TTL: ttl})
			conn, err := pgx.Connect(context.Background(), cl.SuperDSN())
			if err != nil {
				t.Fatal(err)
			}
			// The latest lease end the holder could have obtained is one TTL after its last renewal; read it
			// just before the fault and add a TTL, as an upper bound in local time.
			var left float64
			if err := conn.QueryRow(context.Background(), "SELECT extract(epoch FROM expires_at - clock_timestamp())::float8 FROM fenceproxy.lock_leases WHERE name = $1", name).Scan(&left); err != nil {
				t.Fatal(err)
			}
			conn.Close(context.Background())
			faultAt := time.Now()
			serverExpiry := faultAt.Add(time.Duration(left * float64(time.Second)))
			switch fault {
			case "paused":
				if err := cl.Pause(); err != nil {
					t.Fatal(err)
				}
				defer cl.Resume()
			case "killed":
				if err := cl.Kill(); err != nil {
					t.Fatal(err)
				}
			}
			heldLost(t, a, 2*ttl)
			lostAt := time.Now()
			t.Logf("lost %v after the fault; the server's lease ended at the earliest %v after it", lostAt.Sub(faultAt).Round(time.Millisecond), serverExpiry.Sub(faultAt).Round(time.Millisecond))
			if !errors.Is(a.Err(), tokens.ErrLeaseLost) {
				t.Fatalf("Err: %v", a.Err())
			}
		})
	}
}

// TestPGStoreWaitDeadlineMidStatement: when the deadline interrupts a statement (here the acquisition, blocked
// on the lease row that another transaction has locked), the error still carries the context's cause, which
// `fenceproxy lock` turns into exit 124 rather than "unreachable".
func TestPGStoreWaitDeadlineMidStatement(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	s := pgStore(t, pg, tokens.PGStoreOptions{})
	name := lockName(t)
	ctx := context.Background()
	pgAcquire(t, s, name, tokens.AcquireOptions{}).Release(ctx)
	blocker, err := pgx.Connect(ctx, pg.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close(ctx)
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM fenceproxy.lock_leases WHERE name = $1 FOR UPDATE", name); err != nil {
		t.Fatal(err)
	}
	errMine := errors.New("my deadline")
	wctx, cancel := context.WithTimeoutCause(ctx, 500*time.Millisecond, errMine)
	defer cancel()
	if _, err := s.Acquire(wctx, name, tokens.AcquireOptions{}); !errors.Is(err, errMine) {
		t.Fatalf("Acquire interrupted mid-statement: %v, want an error wrapping the context's cause", err)
	}
}
