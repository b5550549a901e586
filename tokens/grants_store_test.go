package tokens

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/lockservers"
)

// grantStore is a Store that records each lock's newest grant for the failover barrier.
type grantStore interface {
	Store
	Granted(ctx context.Context) (map[string]int64, error)
}

// checkGrantsRecorded: each lock's newest grant stays readable after its holder released the lock (the failover
// barrier needs the last holder's token, not only a current one's), a later holder with a lower token (a
// smaller token offset) does not lower it, and a writer that does not hold the lock records nothing.
// recordAsNonHolder records a grant of lock name for someone whose lock is gone.
func checkGrantsRecorded(t *testing.T, s grantStore, recordAsNonHolder func(name string, token int64) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acquire := func(name string, offset int64) Held {
		t.Helper()
		h, err := s.Acquire(ctx, name, AcquireOptions{TTL: 5 * time.Second, TokenOffset: offset})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	granted := func() map[string]int64 {
		t.Helper()
		g, err := s.Granted(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	high := acquire("ledger", 1_000_000_000)
	if err := high.Release(ctx); err != nil {
		t.Fatal(err)
	}
	low := acquire("ledger", 0)
	if err := low.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if low.Token() >= high.Token() {
		t.Fatalf("the second holder's token %d is not below the first's %d: the test proves nothing", low.Token(), high.Token())
	}
	other := acquire("other", 0) // held now
	defer other.Release(ctx)
	g := granted()
	if g["ledger"] != high.Token() {
		t.Errorf("ledger: granted %d, want the highest grant %d (the later, lower grant was %d)", g["ledger"], high.Token(), low.Token())
	}
	if g["other"] != other.Token() || len(g) != 2 {
		t.Errorf("granted %v, want ledger %d and other %d only", g, high.Token(), other.Token())
	}
	err := recordAsNonHolder("ledger", high.Token()+1)
	if !errors.Is(err, ErrLeaseLost) {
		t.Errorf("a grant recorded for a lock its recorder does not hold: %v, want ErrLeaseLost", err)
	}
	if g := granted(); g["ledger"] != high.Token() {
		t.Errorf("ledger: granted %d after a non-holder's record, want %d", g["ledger"], high.Token())
	}
}

func TestRedisGrantsRecorded(t *testing.T) {
	srv := lockservers.Redis(t)
	s := newRedisStore(t, srv.Addr())
	checkGrantsRecorded(t, s, func(name string, token int64) error {
		return s.recordGrant(context.Background(), name, newOwner(), token)
	})
}
