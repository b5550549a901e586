package tokens_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

var lockSeq atomic.Int64

// lockName returns a name no other test uses.
func lockName(t *testing.T) string {
	return fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), lockSeq.Add(1))
}

// waitFor polls cond until it is true or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type acquired struct {
	lock *tokens.Lock
	err  error
}

// acquireAsync starts Acquire in the background.
func acquireAsync(ctx context.Context, c *clientv3.Client, name string, opts ...tokens.Option) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := tokens.Acquire(ctx, c, name, opts...)
		ch <- acquired{l, err}
	}()
	return ch
}

// waitAcquired waits for an asynchronous Acquire and fails the test on error.
func waitAcquired(t *testing.T, ch <-chan acquired, timeout time.Duration) *tokens.Lock {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("Acquire: %v", a.err)
		}
		t.Cleanup(func() { release(a.lock) })
		return a.lock
	case <-time.After(timeout):
		t.Fatalf("lock not acquired within %v", timeout)
		return nil
	}
}

func mustAcquire(t *testing.T, c *clientv3.Client, name string, opts ...tokens.Option) *tokens.Lock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := tokens.Acquire(ctx, c, name, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", name, err)
	}
	t.Cleanup(func() { release(l) })
	return l
}

func release(l *tokens.Lock) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	l.Release(ctx)
}

func waitLost(t *testing.T, l *tokens.Lock, timeout time.Duration) {
	t.Helper()
	select {
	case <-l.Lost():
	case <-time.After(timeout):
		t.Fatalf("Lost not closed within %v", timeout)
	}
}

func notYet(t *testing.T, ch <-chan acquired, what string) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("%s: acquired while the lock was held (err %v)", what, a.err)
	default:
	}
}

// TestTokensIncreaseAcrossHolders passes one lock through four holders: released, expired (its process's
// client went away), revoked by someone else. Each holder's token must exceed the previous one.
func TestTokensIncreaseAcrossHolders(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	admin := e.Client()
	name := lockName(t)
	key := tokens.DefaultPrefix + name
	ctx := context.Background()
	ttl := tokens.WithTTL(time.Second)

	a := mustAcquire(t, e.Client(), name, ttl)
	if a.Token() <= 0 {
		t.Fatalf("token %d", a.Token())
	}
	if !strings.HasPrefix(a.Key(), key+"/") {
		t.Fatalf("key %q is not under %q", a.Key(), key+"/")
	}
	if err := a.Err(); err != nil {
		t.Fatalf("Err of a held lock: %v", err)
	}
	// Unrelated writes between holders must not matter.
	admin.Put(ctx, "unrelated", "1")

	// b waits behind a, and gets the lock when a releases it.
	bClient := e.Client()
	bCh := acquireAsync(ctx, bClient, name, ttl)
	waitFor(t, 5*time.Second, "b queued", func() bool { return etcdtest.QueueLen(t, admin, key) == 2 })
	notYet(t, bCh, "b")
	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	waitLost(t, a, time.Second)
	if !errors.Is(a.Err(), tokens.ErrReleased) {
		t.Fatalf("a.Err() = %v, want ErrReleased", a.Err())
	}
	b := waitAcquired(t, bCh, 5*time.Second)
	if b.Token() <= a.Token() {
		t.Fatalf("b's token %d not above a's %d", b.Token(), a.Token())
	}

	// c waits behind b; b's process "dies" (its client closes, no keep-alive, no revoke): c gets the lock once
	// b's lease expires.
	cCh := acquireAsync(ctx, e.Client(), name, ttl)
	waitFor(t, 5*time.Second, "c queued", func() bool { return etcdtest.QueueLen(t, admin, key) == 2 })
	admin.Put(ctx, "unrelated", "2")
	bClient.Close()
	waitLost(t, b, 5*time.Second)
	c := waitAcquired(t, cCh, 15*time.Second)
	if c.Token() <= b.Token() {
		t.Fatalf("c's token %d not above b's %d", c.Token(), b.Token())
	}

	// d waits behind c; c's lease is revoked from another client: c learns it lost the lock, d gets it.
	dCh := acquireAsync(ctx, e.Client(), name, ttl)
	waitFor(t, 5*time.Second, "d queued", func() bool { return etcdtest.QueueLen(t, admin, key) == 2 })
	notYet(t, dCh, "d")
	if _, err := admin.Revoke(ctx, c.Lease()); err != nil {
		t.Fatal(err)
	}
	waitLost(t, c, 5*time.Second)
	if !errors.Is(c.Err(), tokens.ErrLeaseLost) {
		t.Fatalf("c.Err() = %v, want ErrLeaseLost", c.Err())
	}
	if err := c.Release(ctx); err != nil {
		t.Fatalf("Release of a revoked lock: %v", err)
	}
	d := waitAcquired(t, dCh, 5*time.Second)
	if d.Token() <= c.Token() {
		t.Fatalf("d's token %d not above c's %d", d.Token(), c.Token())
	}
	t.Logf("tokens: a=%d b=%d c=%d d=%d", a.Token(), b.Token(), c.Token(), d.Token())
}

// TestTokenIsGrantRevision checks the token's one definition: the revision at which the lock was granted,
// which for an uncontended lock is its key's create revision, plus the offset.
func TestTokenIsGrantRevision(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	admin := e.Client()
	ctx := context.Background()
	for _, offset := range []int64{0, 1_000_000} {
		l := mustAcquire(t, e.Client(), lockName(t), tokens.WithTokenOffset(offset))
		resp, err := admin.Get(ctx, l.Key())
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("Get %q: %v %v", l.Key(), resp, err)
		}
		if want := resp.Kvs[0].CreateRevision + offset; l.Token() != want {
			t.Fatalf("offset %d: token %d, want create revision %d + offset = %d", offset, l.Token(), resp.Kvs[0].CreateRevision, want)
		}
		if got, want := l.Key(), fmt.Sprintf("%s%s/%x", tokens.DefaultPrefix, l.Name(), int64(l.Lease())); got != want {
			t.Fatalf("key %q, want %q", got, want)
		}
	}
	// A custom prefix, and none at all (etcdctl's layout).
	for _, prefix := range []string{"/custom/", ""} {
		name := "/fenceproxy-test/" + lockName(t)
		l := mustAcquire(t, e.Client(), name, tokens.WithPrefix(prefix))
		if got, want := l.Key(), fmt.Sprintf("%s%s/%x", prefix, name, int64(l.Lease())); got != want {
			t.Fatalf("key %q, want %q", got, want)
		}
	}
}

// TestContendedTokenIsGrantRevision pins the token's one definition where it matters: a waiter that queued
// behind a holder is granted the lock at the revision that deleted the holder's key, which is above its own
// key's create revision (a write in between makes sure of it). Using the create revision instead would still
// give increasing tokens here, but not between holders in general (contract: one definition only).
func TestContendedTokenIsGrantRevision(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	admin := e.Client()
	name := lockName(t)
	key := tokens.DefaultPrefix + name
	ctx := context.Background()
	for _, offset := range []int64{0, 1_000_000} {
		holder := mustAcquire(t, e.Client(), name)
		waiterCh := acquireAsync(ctx, e.Client(), name, tokens.WithTokenOffset(offset))
		waitFor(t, 10*time.Second, "the waiter queued", func() bool { return etcdtest.QueueLen(t, admin, key) == 2 })
		waiterCreate := queuedCreateRevision(t, admin, key, holder.Lease())
		if _, err := admin.Put(ctx, "unrelated", "between queueing and grant"); err != nil {
			t.Fatal(err)
		}
		deleted := watchDelete(t, admin, holder.Key())
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		grant := waitDeleteRevision(t, deleted, holder.Key())
		w := waitAcquired(t, waiterCh, 10*time.Second)
		if w.Token() != grant+offset {
			t.Fatalf("offset %d: waiter's token %d, want the grant revision %d (the holder's key deleted) + offset; its key's create revision is %d",
				offset, w.Token(), grant, waiterCreate)
		}
		if waiterCreate >= grant {
			t.Fatalf("create revision %d not below the grant revision %d: the test does not tell the definitions apart", waiterCreate, grant)
		}
		if err := w.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// queuedCreateRevision returns the create revision of the one key queued under key whose lease is not holder's.
func queuedCreateRevision(t *testing.T, c *clientv3.Client, key string, holder clientv3.LeaseID) int64 {
	t.Helper()
	resp, err := c.Get(context.Background(), key+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var revs []int64
	for _, kv := range resp.Kvs {
		if clientv3.LeaseID(kv.Lease) != holder {
			revs = append(revs, kv.CreateRevision)
		}
	}
	if len(revs) != 1 {
		t.Fatalf("%d waiters' keys under %q, want 1", len(revs), key+"/")
	}
	return revs[0]
}

// watchDelete watches key from now on and sends the revision of its deletion.
func watchDelete(t *testing.T, c *clientv3.Client, key string) <-chan int64 {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	resp, err := c.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("key %q does not exist: nothing to watch", key)
	}
	wch := c.Watch(ctx, key, clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterPut())
	ch := make(chan int64, 1)
	go func() {
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					ch <- ev.Kv.ModRevision
					return
				}
			}
		}
	}()
	return ch
}

func waitDeleteRevision(t *testing.T, ch <-chan int64, key string) int64 {
	t.Helper()
	select {
	case rev := <-ch:
		return rev
	case <-time.After(10 * time.Second):
		t.Fatalf("key %q not deleted within 10s", key)
		return 0
	}
}

func TestAcquireRejectsBadOptions(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	c := e.Client()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opts []tokens.Option
	}{
		{"", nil},
		{"x", []tokens.Option{tokens.WithTTL(0)}},
		{"x", []tokens.Option{tokens.WithTTL(-time.Second)}},
		{"x", []tokens.Option{tokens.WithTokenOffset(-1)}},
	} {
		if l, err := tokens.Acquire(ctx, c, tc.name, tc.opts...); err == nil {
			l.Release(ctx)
			t.Errorf("Acquire(%q, %d options) succeeded", tc.name, len(tc.opts))
		}
	}
	leases, err := c.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 0 {
		t.Fatalf("rejected acquisitions left %d leases", len(leases.Leases))
	}
}

// TestTryAcquireAndCancelledWait checks that a failed try and an abandoned wait leave nothing behind and that
// the lock stays usable.
func TestTryAcquireAndCancelledWait(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	admin := e.Client()
	name := lockName(t)
	key := tokens.DefaultPrefix + name
	ctx := context.Background()

	holder := mustAcquire(t, e.Client(), name)
	other := e.Client()
	if l, err := tokens.TryAcquire(ctx, other, name); !errors.Is(err, tokens.ErrLocked) {
		t.Fatalf("TryAcquire of a held lock: %v, %v; want ErrLocked", l, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if l, err := tokens.Acquire(wctx, other, name); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with a short deadline: %v, %v; want DeadlineExceeded", l, err)
	}
	if n := etcdtest.QueueLen(t, admin, key); n != 1 {
		t.Fatalf("%d keys in the queue after a failed try and an abandoned wait, want 1", n)
	}
	leases, err := admin.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 1 {
		t.Fatalf("%d leases, want only the holder's", len(leases.Leases))
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := tokens.TryAcquire(ctx, other, name)
	if err != nil {
		t.Fatalf("TryAcquire after release: %v", err)
	}
	defer next.Release(ctx)
	if next.Token() <= holder.Token() {
		t.Fatalf("token %d not above %d", next.Token(), holder.Token())
	}
}

// TestLostWhenKeyDeleted: someone deletes the lock's key (etcdctl del): the lock is no longer exclusive.
func TestLostWhenKeyDeleted(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	l := mustAcquire(t, e.Client(), lockName(t), tokens.WithTTL(30*time.Second))
	if _, err := e.Client().Delete(context.Background(), l.Key()); err != nil {
		t.Fatal(err)
	}
	waitLost(t, l, 5*time.Second)
	if !errors.Is(l.Err(), tokens.ErrLeaseLost) {
		t.Fatalf("Err() = %v", l.Err())
	}
}

// TestLostWhenEtcdStops: no keep-alive answer within the TTL means the lock can't be relied on. After etcd
// comes back, tokens keep increasing.
func TestLostWhenEtcdStops(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	name := lockName(t)
	l := mustAcquire(t, e.Client(), name, tokens.WithTTL(2*time.Second))

	// A waiter queued behind l gives up once its own lease can't be kept alive, rather than hang.
	waiter := acquireAsync(context.Background(), e.Client(), name, tokens.WithTTL(2*time.Second))
	waitFor(t, 5*time.Second, "waiter queued", func() bool { return etcdtest.QueueLen(t, e.Client(), tokens.DefaultPrefix+name) == 2 })

	start := time.Now()
	e.Stop()
	t.Logf("stopped after %v", time.Since(start))
	waitLost(t, l, 10*time.Second)
	t.Logf("lost after %v", time.Since(start))
	if !errors.Is(l.Err(), tokens.ErrLeaseLost) {
		t.Fatalf("Err() = %v", l.Err())
	}
	select {
	case a := <-waiter:
		if !errors.Is(a.err, tokens.ErrLeaseLost) {
			t.Fatalf("waiter: %v, %v; want ErrLeaseLost", a.lock, a.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter still waiting with etcd down")
	}
	t.Logf("waiter gave up after %v", time.Since(start))

	if err := e.StartAgain(); err != nil {
		t.Fatal(err)
	}
	t.Logf("started again after %v", time.Since(start))
	// The old leases survive the restart until they expire (a new leader renews them first); the new holder
	// waits for that.
	next := mustAcquire(t, e.Client(), name, tokens.WithTTL(2*time.Second))
	t.Logf("acquired after %v", time.Since(start))
	if next.Token() <= l.Token() {
		t.Fatalf("token after restart %d not above %d", next.Token(), l.Token())
	}
}
