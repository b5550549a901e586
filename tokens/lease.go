package tokens

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// leaseKeeper is the client side of a lease that the holder renews itself (the PostgreSQL and Redis stores):
// it renews every ttl/3 (sooner again after a failed renewal) and declares the lease lost as soon as it can no
// longer be sure the server still has it. The server starts the lease's time no earlier than the moment the
// request that set it was sent, so counting from the send time, minus a margin for clock rate differences,
// never believes in a lease the server has already let go.
//
// A renewal runs on a goroutine of its own and the deadline on a timer of its own, so that a renewal stuck on
// a dead connection or a paused server never keeps the holder believing in its lease.
type leaseKeeper struct {
	ttl      time.Duration
	interval time.Duration                           // between confirmed renewals
	retry    time.Duration                           // after a failed one
	renew    func(ctx context.Context) (bool, error) // false: the lease is gone or not ours
	events   leaseEvents
	lost     context.Context
	markAs   context.CancelCauseFunc
	stop     chan struct{}
	stopped  chan struct{} // closed when run has returned
	once     sync.Once
	what     string // for error messages: the lock's name (and key)
}

// leaseEvents are what a store reports about its leases (logs, counters); nil fields are skipped. They run on
// the keeper's goroutine.
type leaseEvents struct {
	renewalFailed func(err error) // a renewal could not be confirmed (the lease may still be held)
	lost          func(err error) // the lease was declared lost (not called for a release)
}

// leaseMargin is the part of the TTL by which the local deadline comes before the server's: clocks of the client
// and the server may run at slightly different rates.
func leaseMargin(ttl time.Duration) time.Duration { return ttl / 10 }

// newLeaseKeeper starts renewing a lease that was set by a request sent at sentAt.
func newLeaseKeeper(what string, ttl time.Duration, sentAt time.Time, renew func(context.Context) (bool, error), events leaseEvents) *leaseKeeper {
	lost, markAs := context.WithCancelCause(context.Background())
	interval := ttl / 3
	k := &leaseKeeper{ttl: ttl, interval: interval, retry: min(max(ttl/20, 20*time.Millisecond), interval),
		renew: renew, events: events, lost: lost, markAs: markAs,
		stop: make(chan struct{}), stopped: make(chan struct{}), what: what}
	go k.run(sentAt)
	return k
}

func (k *leaseKeeper) run(sentAt time.Time) {
	defer close(k.stopped)
	deadline := sentAt.Add(k.ttl - leaseMargin(k.ttl))
	expiry := time.NewTimer(time.Until(deadline))
	defer expiry.Stop()
	next := time.NewTimer(time.Until(sentAt.Add(k.interval)))
	defer next.Stop()
	type result struct {
		sent time.Time
		ok   bool
		err  error
	}
	done := make(chan result, 1)
	for {
		select {
		case <-k.stop:
			return
		case <-expiry.C:
			k.lose(fmt.Errorf("%w: %s: no renewal confirmed within %v of the TTL %v (server unreachable, or the process was paused)",
				ErrLeaseLost, k.what, k.ttl-leaseMargin(k.ttl), k.ttl))
			return
		case r := <-done:
			switch {
			case r.err != nil:
				// Not confirmed: try again soon; the deadline decides.
				if k.events.renewalFailed != nil && k.lost.Err() == nil {
					k.events.renewalFailed(r.err)
				}
				next.Reset(k.retry)
				continue
			case !r.ok:
				k.lose(fmt.Errorf("%w: %s: renewal found the lease expired or taken over", ErrLeaseLost, k.what))
				return
			case time.Now().After(deadline):
				// Confirmed too late to count: the process was paused past its deadline.
				k.lose(fmt.Errorf("%w: %s: the lease's deadline passed before it was renewed", ErrLeaseLost, k.what))
				return
			}
			deadline = r.sent.Add(k.ttl - leaseMargin(k.ttl))
			expiry.Reset(time.Until(deadline))
			next.Reset(k.interval)
		case <-next.C:
			// next is re-armed only when a renewal's result is in: one renewal at a time.
			if time.Now().After(deadline) {
				// A paused process wakes up here: the deadline passed while it slept.
				k.lose(fmt.Errorf("%w: %s: the lease's deadline passed before it could be renewed", ErrLeaseLost, k.what))
				return
			}
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

// lose marks the lease lost with cause, once; later causes are ignored.
func (k *leaseKeeper) lose(cause error) {
	k.once.Do(func() {
		k.markAs(cause)
		close(k.stop)
		if k.events.lost != nil && !errors.Is(cause, ErrReleased) {
			k.events.lost(cause)
		}
	})
}

// close stops renewing, marks the lease with cause (ErrReleased for a release) unless it was lost already,
// and waits for the keeper's goroutine (not for a renewal in flight, whose context close cancels).
func (k *leaseKeeper) close(cause error) {
	k.lose(cause)
	<-k.stopped
}

// Err is nil while the lease is held; then the cause (wrapping ErrLeaseLost or ErrReleased).
func (k *leaseKeeper) Err() error {
	if k.lost.Err() == nil {
		return nil
	}
	return context.Cause(k.lost)
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
