package tokens

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The keeper's own edge: renewals scripted by the test (the stores' tests run it against real servers).

// TestLeaseKeeperRetriesAfterAFailure: failed renewals are reported and retried before the next interval,
// and a renewal that then succeeds keeps the lease.
func TestLeaseKeeperRetriesAfterAFailure(t *testing.T) {
	var calls, failures atomic.Int32
	// TTL 30 s: renewals every 10 s, retries after 1.5 s, the local deadline 27 s after sentAt. sentAt 10 s ago
	// makes the first renewal due now and leaves 17 s: two failures followed by a third try a whole interval
	// later (20 s) would lose the lease; only retrying sooner keeps it.
	k := newLeaseKeeper("lock \"t\"", 30*time.Second, time.Now().Add(-10*time.Second), func(context.Context) (bool, error) {
		if calls.Add(1) <= 2 {
			return false, errors.New("connection refused")
		}
		return true, nil
	}, leaseEvents{renewalFailed: func(error) { failures.Add(1) }, lost: func(err error) { t.Errorf("lost: %v", err) }})
	defer k.close(ErrReleased)
	waitFor(t, func() bool { return calls.Load() >= 3 || k.Err() != nil })
	if got := failures.Load(); got != 2 {
		t.Errorf("renewalFailed called %d times, want 2", got)
	}
	if err := k.Err(); err != nil {
		t.Fatalf("lease lost: %v", err)
	}
}

// TestLeaseKeeperDeadlineBeatsAHungRenewal: a renewal that never returns cannot keep the lease: the deadline
// (0.9 TTL from the send time of the last confirmed renewal) declares it lost.
func TestLeaseKeeperDeadlineBeatsAHungRenewal(t *testing.T) {
	var lostErr atomic.Pointer[error]
	sent := time.Now()
	k := newLeaseKeeper("lock \"t\"", time.Second, sent, func(ctx context.Context) (bool, error) {
		<-ctx.Done() // hangs until the keeper gives up on it
		return false, ctx.Err()
	}, leaseEvents{lost: func(err error) { lostErr.Store(&err) }})
	select {
	case <-k.lost.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a hung renewal kept the lease")
	}
	if at := time.Since(sent); at < 900*time.Millisecond {
		t.Errorf("lost after %v, before the local deadline", at)
	}
	if !errors.Is(k.Err(), ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", k.Err())
	}
	waitFor(t, func() bool { return lostErr.Load() != nil })
	k.close(ErrReleased) // after a loss: returns, keeps the first cause
	if !errors.Is(k.Err(), ErrLeaseLost) {
		t.Fatalf("Err after close = %v, want ErrLeaseLost kept", k.Err())
	}
}

// TestLeaseKeeperNotOursIsLost: a renewal the server refuses (the lease expired or went to another owner) is a
// lost lease at once.
func TestLeaseKeeperNotOursIsLost(t *testing.T) {
	k := newLeaseKeeper("lock \"t\"", 300*time.Millisecond, time.Now(), func(context.Context) (bool, error) { return false, nil }, leaseEvents{})
	select {
	case <-k.lost.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a refused renewal did not lose the lease")
	}
	if err := k.Err(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", err)
	}
}

// TestLeaseKeeperRelease: a release stops renewing, is not reported as a loss, and Err says ErrReleased.
func TestLeaseKeeperRelease(t *testing.T) {
	var mu sync.Mutex
	renewals := 0
	k := newLeaseKeeper("lock \"t\"", 150*time.Millisecond, time.Now(), func(context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		renewals++
		return true, nil
	}, leaseEvents{lost: func(err error) { t.Errorf("a release reported as a loss: %v", err) }})
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return renewals > 0 })
	k.close(ErrReleased)
	if err := k.Err(); !errors.Is(err, ErrReleased) {
		t.Fatalf("Err = %v, want ErrReleased", err)
	}
	mu.Lock()
	after := renewals
	mu.Unlock()
	time.Sleep(200 * time.Millisecond) // longer than three intervals: no renewal may come
	mu.Lock()
	defer mu.Unlock()
	if renewals > after+1 { // one may have been in flight at the close
		t.Fatalf("%d renewals after the release", renewals-after)
	}
}
