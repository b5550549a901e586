package tokens

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/lockservers"
)

func newZKStore(t *testing.T, addr string, session time.Duration) *ZKStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := NewZKStore(ctx, []string{addr}, ZKOptions{SessionTimeout: session, ConnectTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestZooKeeperLocks runs every ZooKeeper case against one server (a JVM takes seconds to start).
func TestZooKeeperLocks(t *testing.T) {
	srv := lockservers.ZooKeeper(t)
	t.Run("TokensAndExclusion", func(t *testing.T) {
		a, b := newZKStore(t, srv.Addr(), 4*time.Second), newZKStore(t, srv.Addr(), 4*time.Second)
		ctx := context.Background()
		h1, err := a.Acquire(ctx, "settle", AcquireOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Acquire(ctx, "settle", AcquireOptions{Try: true}); !errors.Is(err, ErrLocked) {
			t.Fatalf("second holder: %v, want ErrLocked", err)
		}
		other, err := b.Acquire(ctx, "other", AcquireOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if other.Token() <= h1.Token() {
			t.Fatalf("czxid tokens are comparable across locks: other %d after settle %d", other.Token(), h1.Token())
		}
		got := make(chan Held, 1)
		go func() {
			h, err := b.Acquire(ctx, "settle", AcquireOptions{})
			if err != nil {
				t.Error(err)
			}
			got <- h
		}()
		// The waiter is queued (two contenders) before the holder lets go.
		waitFor(t, func() bool {
			infos, err := a.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, in := range infos {
				if in.Name == "settle" && in.Waiters == 1 && in.Token == h1.Token() {
					return true
				}
			}
			return false
		})
		if err := h1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		h2 := <-got
		if h2 == nil || h2.Token() <= other.Token() {
			t.Fatalf("waiter's token %v, want > %d", h2, other.Token())
		}
		h2.Release(ctx)
		other.Release(ctx)
	})
	t.Run("SessionLostWhenConnectionCut", func(t *testing.T) {
		relay := lockservers.NewRelay(t, srv.Addr())
		a := newZKStore(t, relay.Addr(), 4*time.Second)
		b := newZKStore(t, srv.Addr(), 4*time.Second)
		ctx := context.Background()
		h, err := a.Acquire(ctx, "cut", AcquireOptions{})
		if err != nil {
			t.Fatal(err)
		}
		relay.Cut()
		<-h.Lost() // a hang fails the test by its timeout
		if !errors.Is(h.Err(), ErrLeaseLost) {
			t.Fatalf("Err: %v", h.Err())
		}
		// The server ends the session after its timeout and deletes the node: the next holder gets a higher token.
		ctx2, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		h2, err := b.Acquire(ctx2, "cut", AcquireOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if h2.Token() <= h.Token() {
			t.Fatalf("token after takeover %d, earlier %d", h2.Token(), h.Token())
		}
		// The lost holder's release cannot touch the new holder's node (its path names its own sequence number).
		if err := h.Release(ctx); err == nil {
			t.Errorf("release by the lost holder succeeded")
		}
		select {
		case <-h2.Lost():
			t.Fatalf("the new holder lost its lock: %v", h2.Err())
		default:
		}
		h2.Release(ctx)
	})
	t.Run("Contention", func(t *testing.T) {
		contend(t, 10, 3, func() Store { return newZKStore(t, srv.Addr(), 10*time.Second) }, AcquireOptions{})
	})
	t.Run("GrantsRecorded", func(t *testing.T) {
		// A root of its own: the other cases' grants are not this case's business.
		s, err := NewZKStore(context.Background(), []string{srv.Addr()}, ZKOptions{Root: "/grants-recorded", ConnectTimeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		checkGrantsRecorded(t, s, func(name string, token int64) error {
			return s.recordGrant(name, "/grants-recorded/"+name+"/_c_gone-"+lockSuffix+"0000000099", token)
		})
	})
	t.Run("ServerRestartWhileHeld", func(t *testing.T) {
		a := newZKStore(t, srv.Addr(), 4*time.Second)
		h, err := a.Acquire(context.Background(), "restart", AcquireOptions{})
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
		b := newZKStore(t, srv.Addr(), 4*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// The data survived (ZooKeeper persists its log); the old session's node goes when the session expires.
		h2, err := b.Acquire(ctx, "restart", AcquireOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if h2.Token() <= h.Token() {
			t.Fatalf("token after restart %d, earlier %d", h2.Token(), h.Token())
		}
		h2.Release(ctx)
	})
}

// waitFor polls cond until it holds; a condition that never holds fails the test by its timeout.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for !cond() {
		time.Sleep(20 * time.Millisecond)
	}
}

// TestZooKeeperVerifier: a lock's token (its node's czxid) passes; a token above the ensemble's current zxid
// is refused; an unreachable ensemble fails closed.
func TestZooKeeperVerifier(t *testing.T) {
	srv := lockservers.ZooKeeper(t)
	s := newZKStore(t, srv.Addr(), 4*time.Second)
	ctx := context.Background()
	h, err := s.Acquire(ctx, "verified", AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(ctx)
	v, err := NewZKVerifier([]string{srv.Addr()}, VerifierConfig{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if err := v.Check(ctx, h.Token()); err != nil {
		t.Fatalf("the holder's token %d: %v", h.Token(), err)
	}
	var notIssued *TokenNotIssuedError
	if err := v.Check(ctx, h.Token()+1_000_000); !errors.As(err, &notIssued) || notIssued.Revision < h.Token() ||
		!strings.Contains(err.Error(), "never issued by ZooKeeper") {
		t.Fatalf("forged token: %v", err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(ctx, h.Token()+2_000_000); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("ZooKeeper down: %v, want ErrUnavailable (fail closed)", err)
	}
	if err := v.Check(ctx, h.Token()); err != nil {
		t.Fatalf("a token under the bound already seen needs no round trip: %v", err)
	}
	srv.Start()
}
