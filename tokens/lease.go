package tokens

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// leaseKeeper is the client side of a lease that the holder renews itself (Redis; the PostgreSQL store has its
// own): it renews every ttl/3 and declares the lease lost as soon as it can no longer be sure the server still
// has it. The server starts the lease's time no earlier than the moment the request that set it was sent, so
// counting from the send time, minus a margin for clock rate differences, never believes in a lease the
// server has already let go.
type leaseKeeper struct {
	ttl    time.Duration
	renew  func(ctx context.Context) (bool, error) // false: the lease is gone or not ours
	lost   context.Context
	markAs context.CancelCauseFunc
	stop   chan struct{}
	once   sync.Once
	what   string // for error messages: the lock's name and key
}

// leaseMargin is the part of the TTL by which the local deadline comes before the server's: clocks of the client
// and the server may run at slightly different rates.
func leaseMargin(ttl time.Duration) time.Duration { return ttl / 10 }

// newLeaseKeeper starts renewing a lease that was set by a request sent at sentAt.
func newLeaseKeeper(what string, ttl time.Duration, sentAt time.Time, renew func(context.Context) (bool, error)) *leaseKeeper {
	lost, markAs := context.WithCancelCause(context.Background())
	k := &leaseKeeper{ttl: ttl, renew: renew, lost: lost, markAs: markAs, stop: make(chan struct{}), what: what}
	go k.run(sentAt.Add(ttl - leaseMargin(ttl)))
	return k
}

func (k *leaseKeeper) run(deadline time.Time) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	tick := time.NewTicker(k.ttl / 3)
	defer tick.Stop()
	// A renewal runs on its own goroutine, so that one that hangs (a paused server, a silent network) never
	// delays the deadline.
	type result struct {
		sent time.Time
		ok   bool
		err  error
	}
	done := make(chan result, 1)
	inFlight := false
	for {
		select {
		case <-k.stop:
			return
		case <-timer.C:
			k.markAs(fmt.Errorf("%w: %s: no renewal confirmed within the TTL %v (server unreachable or process paused)", ErrLeaseLost, k.what, k.ttl))
			return
		case r := <-done:
			inFlight = false
			switch {
			case r.err != nil:
				continue // not confirmed: the deadline decides
			case !r.ok:
				k.markAs(fmt.Errorf("%w: %s: the lease expired or was taken over", ErrLeaseLost, k.what))
				return
			}
			if time.Now().After(deadline) {
				// Confirmed too late to count: the process was paused past its deadline.
				k.markAs(fmt.Errorf("%w: %s: the lease's deadline passed before it was renewed", ErrLeaseLost, k.what))
				return
			}
			deadline = r.sent.Add(k.ttl - leaseMargin(k.ttl))
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(time.Until(deadline))
		case <-tick.C:
			if time.Now().After(deadline) {
				// A paused process wakes up here: the deadline passed while it slept.
				k.markAs(fmt.Errorf("%w: %s: the lease's deadline passed before it could be renewed", ErrLeaseLost, k.what))
				return
			}
			if inFlight {
				continue
			}
			inFlight = true
			go func(deadline time.Time) {
				sent := time.Now()
				ctx, cancel := context.WithDeadline(k.lost, deadline)
				ok, err := k.renew(ctx)
				cancel()
				done <- result{sent, ok, err}
			}(deadline)
		}
	}
}

// close stops renewing and marks the lease with cause (ErrReleased after a release).
func (k *leaseKeeper) close(cause error) {
	k.once.Do(func() {
		k.markAs(cause)
		close(k.stop)
	})
}

// backoff is a bounded exponential backoff with full jitter, for waiters that poll.
type backoff struct {
	next, max time.Duration
}

func newBackoff(max time.Duration) *backoff {
	return &backoff{next: 10 * time.Millisecond, max: max}
}

// wait sleeps for the next interval (at most bound, when bound > 0), or until ctx ends.
func (b *backoff) wait(ctx context.Context, bound time.Duration) error {
	d := jitter(b.next)
	if bound > 0 && d > bound {
		d = bound
	}
	b.next = min(b.next*2, b.max)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
