package tokens

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/lockservers"
)

func newRedisStore(t *testing.T, addr string) *RedisStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := NewRedisStore(ctx, addr, RedisOptions{DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestRedisLockTokensAndExclusion(t *testing.T) {
	srv := lockservers.Redis(t)
	a, b := newRedisStore(t, srv.Addr()), newRedisStore(t, srv.Addr())
	ctx := context.Background()
	h1, err := a.Acquire(ctx, "settle", AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "settle", AcquireOptions{TTL: 5 * time.Second, Try: true}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second holder: %v, want ErrLocked", err)
	}
	other, err := b.Acquire(ctx, "other", AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if other.Token() <= h1.Token() {
		t.Fatalf("tokens of one store are comparable across locks: other %d after settle %d", other.Token(), h1.Token())
	}
	infos, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 {
		t.Fatalf("List: %+v", infos)
	}
	for _, in := range infos {
		if in.Token < 1 || in.LeaseLeft <= 0 || in.Holder == "" || in.Waiters != -1 {
			t.Errorf("List entry %+v", in)
		}
	}
	// A waiter gets the lock when the holder releases it, with a higher token.
	got := make(chan Held, 1)
	go func() {
		h, err := b.Acquire(ctx, "settle", AcquireOptions{TTL: 5 * time.Second})
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	if err := h1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(h1.Err(), ErrReleased) {
		t.Errorf("Err after Release: %v", h1.Err())
	}
	h2 := <-got
	if h2 == nil || h2.Token() <= other.Token() {
		t.Fatalf("waiter's token %v, want > %d", h2, other.Token())
	}
	h2.Release(ctx)
	other.Release(ctx)
}

// TestRedisReleaseByNonOwner: a holder whose lease expired and went to someone else cannot release the new
// holder's lock; the attempt is reported.
func TestRedisReleaseByNonOwner(t *testing.T) {
	srv := lockservers.Redis(t)
	a, b := newRedisStore(t, srv.Addr()), newRedisStore(t, srv.Addr())
	ctx := context.Background()
	old, err := a.Acquire(ctx, "job", AcquireOptions{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// The lease runs out on the server (as after a long pause): the key goes.
	if err := a.client.Del(ctx, a.lockKey("job")).Err(); err != nil {
		t.Fatal(err)
	}
	newer, err := b.Acquire(ctx, "job", AcquireOptions{TTL: 3 * time.Second, Try: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Release(ctx); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("release by the old holder: %v, want ErrNotOwner", err)
	}
	select {
	case <-newer.Lost():
		t.Fatalf("the new holder lost its lock: %v", newer.Err())
	default:
	}
	if _, err := a.Acquire(ctx, "job", AcquireOptions{TTL: time.Second, Try: true}); !errors.Is(err, ErrLocked) {
		t.Fatalf("after the non-owner release: %v, want ErrLocked (still held)", err)
	}
	newer.Release(ctx)
}

// TestRedisLostWhenUnconfirmed: a paused Redis (or a cut connection) means renewals are not confirmed; the
// holder is told within the TTL, before the server could have let the lease go.
func TestRedisLostWhenUnconfirmed(t *testing.T) {
	srv := lockservers.Redis(t)
	s := newRedisStore(t, srv.Addr())
	// The bound checked below is the behaviour (the holder must know before the server lets the lease go); the
	// lease keeper's margin is a tenth of the TTL, 300 ms here.
	ttl := 3 * time.Second
	start := time.Now()
	h, err := s.Acquire(context.Background(), "paused", AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	<-h.Lost() // a hang here fails the test by its timeout
	if took := time.Since(start); took >= ttl {
		t.Errorf("Lost after %v, not before the TTL %v ran out", took, ttl)
	}
	if !errors.Is(h.Err(), ErrLeaseLost) {
		t.Errorf("Err: %v", h.Err())
	}
}

// TestRedisRestartWhileHeld: a Redis restarted without persistence loses the lock and the counter. The holder
// is told (Lost), and the next token starts again from 1: exactly the failover caveat of docs/locks.md, where
// the database refuses such tokens (55F01) until token.offset lifts them.
func TestRedisRestartWhileHeld(t *testing.T) {
	srv := lockservers.Redis(t)
	s := newRedisStore(t, srv.Addr())
	ctx := context.Background()
	var last int64
	for range 3 {
		h, err := s.Acquire(ctx, "r", AcquireOptions{TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		last = h.Token()
		h.Release(ctx)
	}
	h, err := s.Acquire(ctx, "r", AcquireOptions{TTL: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	<-h.Lost()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	var h2 Held
	for deadline := time.Now().Add(30 * time.Second); ; {
		h2, err = s.Acquire(ctx, "r", AcquireOptions{TTL: time.Second})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // the client reconnects
	}
	if err != nil {
		t.Fatal(err)
	}
	if h2.Token() > last {
		t.Fatalf("after a restart without persistence the counter restarted: token %d, earlier %d", h2.Token(), last)
	}
	// token.offset cures it: the same acquisition with an offset above the old tokens is above them again.
	h2.Release(ctx)
	h3, err := s.Acquire(ctx, "r", AcquireOptions{TTL: time.Second, TokenOffset: last})
	if err != nil {
		t.Fatal(err)
	}
	if h3.Token() <= last {
		t.Fatalf("with token offset %d: token %d", last, h3.Token())
	}
	h3.Release(ctx)
}

// TestRedisContention: 10 clients take one lock 5 times each (contend).
func TestRedisContention(t *testing.T) {
	srv := lockservers.Redis(t)
	contend(t, 10, 5, func() Store { return newRedisStore(t, srv.Addr()) }, AcquireOptions{TTL: 5 * time.Second})
}

// contend has clients clients of a store take one lock rounds times each: never two holders at once, and
// tokens strictly increasing in the order the lock was granted.
func contend(t *testing.T, clients, rounds int, open func() Store, o AcquireOptions) {
	t.Helper()
	var holders atomic.Int32
	var mu sync.Mutex
	var tokens []int64
	var wg sync.WaitGroup
	for range clients {
		s := open()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				h, err := s.Acquire(ctx, "hot", o)
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
				if n := holders.Add(1); n != 1 {
					t.Errorf("%d holders at once", n)
				}
				mu.Lock()
				tokens = append(tokens, h.Token())
				mu.Unlock()
				holders.Add(-1)
				if err := h.Release(context.Background()); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if len(tokens) != clients*rounds {
		t.Fatalf("%d acquisitions, want %d", len(tokens), clients*rounds)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("token %d after %d (grant %d)", tokens[i], tokens[i-1], i)
		}
	}
}
