package tokens_test

import (
	"context"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// TestEtcdGrantedOutlivesTheLease: the newest token granted for a lock stays readable after its holder
// released it (the failover barrier needs the last holder's token, not only a current one's), per lock, and a
// current holder's token counts too.
func TestEtcdGrantedOutlivesTheLease(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	s := tokens.NewEtcdStore(e.Client(), tokens.DefaultPrefix)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acquire := func(name string) tokens.Held {
		h, err := s.Acquire(ctx, name, tokens.AcquireOptions{TTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	a := acquire("ledger")
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b := acquire("ledger")
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	other := acquire("other") // held now
	granted, err := s.Granted(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if granted["ledger"] != b.Token() || b.Token() <= a.Token() {
		t.Errorf("ledger: granted %d, want the last holder's token %d (the first's was %d)", granted["ledger"], b.Token(), a.Token())
	}
	if granted["other"] != other.Token() || len(granted) != 2 {
		t.Errorf("granted %v, want ledger %d and other %d only", granted, b.Token(), other.Token())
	}
	// The grants' keys are not locks: List does not show them.
	locks, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(locks) != 1 || locks[0].Name != "other" {
		t.Errorf("List shows %+v, want the held lock other only", locks)
	}
}
