// Package tokens gives writers fencing tokens and lets the proxy judge them.
//
// # Locks and tokens
//
// [Acquire] takes a named lock in etcd with the concurrency package's Mutex, bound to a lease (a
// concurrency.Session) that is kept alive in the background. The lock's token is the revision at which etcd
// granted the lock, Mutex.Header().Revision, exactly what `etcdctl lock` exports as ETCD_LOCK_REV, plus an
// optional offset (see [WithTokenOffset]). The lock's key prefix is prefix+name, so with [WithPrefix]("") the
// lock is the one `etcdctl lock NAME` takes, and with the default prefix it is the one
// `etcdctl lock /fenceproxy/locks/NAME` takes.
//
// What is guaranteed:
//
//   - Tokens of successive holders of the same lock strictly increase, whether the previous holder released
//     the lock, was revoked or let its lease expire: a holder's token is a revision read after every earlier
//     holder's key was deleted, and etcd revisions only grow.
//   - While the lease is alive no other session holds the lock.
//
// What is not: a holder cannot know the exact moment its lease expires on the server. [Lock.Lost] is closed as
// soon as the lease is known to be gone (revoked, expired, key deleted) or can no longer be confirmed (no
// keep-alive answer within the TTL, for instance because the process was frozen or etcd is unreachable), and the
// holder must then stop writing; but a holder that was paused can still issue a write after another holder
// took over. That late write is made harmless by the fence in the database (fenceproxy refuses a write whose
// token is older than the row's), not by this package.
//
// # Verifying tokens
//
// [RevisionVerifier] lets the proxy refuse a token that etcd never issued (larger than etcd's current
// revision), so that a client cannot forge a huge token and lock everyone else out of a row.
package tokens

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// DefaultPrefix is the key prefix under which locks are kept unless [WithPrefix] says otherwise.
const DefaultPrefix = "/fenceproxy/locks/"

// DefaultTTL is the lease TTL unless [WithTTL] says otherwise.
const DefaultTTL = 10 * time.Second

// ErrLocked is returned by [TryAcquire] when another session holds the lock. It wraps concurrency.ErrLocked.
var ErrLocked = fmt.Errorf("lock is held by another session: %w", concurrency.ErrLocked)

// ErrLeaseLost is the cause reported by [Lock.Err] when the lease was revoked, expired, could not be kept
// alive, or the lock's key was deleted.
var ErrLeaseLost = errors.New("lock lease lost")

// ErrReleased is the cause reported by [Lock.Err] after [Lock.Release].
var ErrReleased = errors.New("lock released")

// Option configures [Acquire] and [TryAcquire].
type Option func(*options)

type options struct {
	ttl    time.Duration
	prefix string
	offset int64
}

// WithTTL sets the lease TTL. etcd leases have whole seconds: the TTL is rounded up to a second, and must be
// positive. Default [DefaultTTL].
func WithTTL(ttl time.Duration) Option { return func(o *options) { o.ttl = ttl } }

// WithPrefix sets the key prefix; the lock's keys live under prefix+name+"/". Default [DefaultPrefix]; use ""
// for the keys `etcdctl lock name` uses.
func WithPrefix(prefix string) Option { return func(o *options) { o.prefix = prefix } }

// WithTokenOffset adds offset (>= 0) to the revision to form the token. Use it when etcd was restored from a
// snapshot and its revisions restarted below tokens already written to the database: an offset larger than
// the highest token ever issued keeps tokens increasing. Every writer and the proxy's verifier must use the
// same offset.
func WithTokenOffset(offset int64) Option { return func(o *options) { o.offset = offset } }

// Lock is a held etcd lock and its fencing token. Its methods are safe for concurrent use.
type Lock struct {
	name    string
	key     string
	token   int64
	client  *clientv3.Client
	session *concurrency.Session

	lost   context.Context // done when the lock is lost or released
	markAs context.CancelCauseFunc

	releaseOnce sync.Once
	releaseErr  error
}

// Acquire takes the lock name, waiting as long as ctx allows while another session holds it. ctx bounds only
// the acquisition; the lease is then kept alive, for as long as client is open, until [Lock.Release] or until
// it is lost. If ctx ends first, or the lease is lost while waiting (no keep-alive answer within the TTL),
// Acquire revokes the lease, which withdraws it from the queue, and returns an error: ctx's cause, or one
// wrapping [ErrLeaseLost]. When etcd is unreachable at that moment, the revocation is given up after a few
// seconds and the lease expires by itself within its TTL.
func Acquire(ctx context.Context, client *clientv3.Client, name string, opts ...Option) (*Lock, error) {
	return acquire(ctx, client, name, false, opts)
}

// TryAcquire is [Acquire] without waiting: it returns an error wrapping [ErrLocked] at once if another
// session holds the lock.
func TryAcquire(ctx context.Context, client *clientv3.Client, name string, opts ...Option) (*Lock, error) {
	return acquire(ctx, client, name, true, opts)
}

func acquire(ctx context.Context, client *clientv3.Client, name string, try bool, opts []Option) (*Lock, error) {
	o := options{ttl: DefaultTTL, prefix: DefaultPrefix}
	for _, opt := range opts {
		opt(&o)
	}
	if name == "" {
		return nil, errors.New("lock name is empty")
	}
	if o.ttl <= 0 {
		return nil, fmt.Errorf("lock TTL %v is not positive", o.ttl)
	}
	if o.offset < 0 {
		return nil, fmt.Errorf("token offset %d is negative", o.offset)
	}
	ttlSeconds := int64((o.ttl + time.Second - 1) / time.Second)
	key := o.prefix + name

	// Grant the lease ourselves so that ctx bounds the round trip; the session then only keeps it alive, for
	// as long as the client lives.
	grant, err := client.Grant(ctx, ttlSeconds)
	if err != nil {
		return nil, fmt.Errorf("lock %q: grant lease: %w", key, err)
	}
	session, err := concurrency.NewSession(client, concurrency.WithLease(grant.ID), concurrency.WithTTL(int(ttlSeconds)))
	if err != nil {
		revokeQuietly(client, grant.ID)
		return nil, fmt.Errorf("lock %q: keep lease alive: %w", key, err)
	}
	mutex := concurrency.NewMutex(session, key)

	// Stop waiting when the lease is lost: a lock granted on a dead lease is no lock.
	lockCtx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(session.Ctx(), cancel)
	locked := make(chan error, 1)
	go func() {
		if try {
			locked <- mutex.TryLock(lockCtx)
		} else {
			locked <- mutex.Lock(lockCtx)
		}
	}()
	select {
	case err = <-locked:
	case <-lockCtx.Done():
		// A cancelled Mutex.Lock deletes its queue key with the client's context, which blocks for as long as
		// etcd is unreachable. Don't wait for it: revoking the lease below deletes the key too, and if etcd
		// cannot be reached the lease expires within its TTL.
		err = lockCtx.Err()
	}
	stop()
	cancel()
	if err == nil {
		select {
		case <-session.Done():
			err = concurrency.ErrSessionExpired
		default:
		}
	}
	if err != nil {
		sessionLost := session.Ctx().Err() != nil
		abandon(session) // revoking the lease deletes any key we left in the queue
		switch {
		case errors.Is(err, concurrency.ErrLocked):
			return nil, fmt.Errorf("lock %q: %w", key, ErrLocked)
		case ctx.Err() != nil:
			return nil, fmt.Errorf("lock %q: %w", key, context.Cause(ctx))
		case sessionLost || errors.Is(err, concurrency.ErrSessionExpired):
			return nil, fmt.Errorf("lock %q: lease lost while waiting: %w", key, ErrLeaseLost)
		default:
			return nil, fmt.Errorf("lock %q: %w", key, err)
		}
	}

	rev := mutex.Header().Revision
	if rev > math.MaxInt64-o.offset {
		abandon(session)
		return nil, fmt.Errorf("lock %q: revision %d plus offset %d overflows a token", key, rev, o.offset)
	}
	lost, markAs := context.WithCancelCause(context.Background())
	l := &Lock{
		name:    name,
		key:     mutex.Key(),
		token:   rev + o.offset,
		client:  client,
		session: session,
		lost:    lost,
		markAs:  markAs,
	}
	go l.watchSession()
	go l.watchKey(rev)
	return l, nil
}

// Token is the lock's fencing token: the etcd revision at which the lock was granted, plus the token offset.
func (l *Lock) Token() int64 { return l.token }

// Name is the lock's name as given to [Acquire].
func (l *Lock) Name() string { return l.name }

// Key is the etcd key that holds this session's place in the lock (prefix+name+"/"+lease ID in hex).
func (l *Lock) Key() string { return l.key }

// Lease is the ID of the lease the lock is bound to.
func (l *Lock) Lease() clientv3.LeaseID { return l.session.Lease() }

// Lost returns a channel that is closed when the lock can no longer be relied on: the lease was revoked or
// expired, no keep-alive was answered within the TTL (etcd unreachable, process paused), the lock's key was
// deleted, the client was closed, or [Lock.Release] was called. A holder must stop writing under this token
// when it fires. It is a local observation: the lease can expire on the server a little before Lost fires
// (and a paused process notices only when it runs again), which is why the database must check the token.
func (l *Lock) Lost() <-chan struct{} { return l.lost.Done() }

// Err returns nil while the lock is held; after [Lock.Lost] is closed it returns why: an error wrapping
// [ErrLeaseLost] or [ErrReleased].
func (l *Lock) Err() error {
	if l.lost.Err() == nil {
		return nil
	}
	return context.Cause(l.lost)
}

// Release gives up the lock: it stops the keep-alive and revokes the lease, which deletes the lock's key and
// lets the next waiter in. Releasing a lock whose lease is already gone is not an error. Release is
// idempotent; later calls return the first call's result.
func (l *Lock) Release(ctx context.Context) error {
	l.releaseOnce.Do(func() {
		l.markAs(ErrReleased)
		l.session.Orphan()
		_, err := l.client.Revoke(ctx, l.session.Lease())
		if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			l.releaseErr = fmt.Errorf("lock %q: revoke lease: %w (the lease expires by itself within its TTL)", l.key, err)
		}
	})
	return l.releaseErr
}

func (l *Lock) watchSession() {
	select {
	case <-l.session.Done():
		l.markAs(fmt.Errorf("%w: key %q: lease %x not kept alive within its TTL (expired, revoked, or etcd unreachable)",
			ErrLeaseLost, l.key, int64(l.session.Lease())))
	case <-l.lost.Done():
	}
}

// watchKey reports the loss as soon as the lock's key is deleted (the lease was revoked, or someone deleted the
// key), without waiting for the next keep-alive answer.
func (l *Lock) watchKey(grantedAt int64) {
	ctx, cancel := context.WithCancel(l.lost)
	defer cancel()
	from := grantedAt + 1
	for ctx.Err() == nil {
		wch := l.client.Watch(clientv3.WithRequireLeader(ctx), l.key, clientv3.WithRev(from))
		for resp := range wch {
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					l.markAs(fmt.Errorf("%w: key %q deleted at revision %d (lease revoked or key deleted)", ErrLeaseLost, l.key, ev.Kv.ModRevision))
					return
				}
			}
			if resp.Header.Revision >= from {
				from = resp.Header.Revision + 1
			}
		}
		if ctx.Err() != nil {
			return
		}
		// The watch ended (compaction, no leader, client closed): check the key is still there and watch again.
		resp, err := l.client.Get(ctx, l.key)
		switch {
		case err != nil && l.client.Ctx().Err() != nil:
			l.markAs(fmt.Errorf("%w: key %q: etcd client closed", ErrLeaseLost, l.key))
			return
		case err != nil:
			// etcd unreachable: the session's keep-alive deadline decides.
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		case len(resp.Kvs) == 0:
			l.markAs(fmt.Errorf("%w: key %q is gone", ErrLeaseLost, l.key))
			return
		default:
			from = resp.Header.Revision + 1
		}
	}
}

// abandon stops keeping the session's lease alive and revokes it, briefly: if etcd does not answer, the lease
// expires by itself within its TTL.
func abandon(s *concurrency.Session) {
	s.Orphan()
	revokeQuietly(s.Client(), s.Lease())
}

func revokeQuietly(client *clientv3.Client, id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(client.Ctx(), 2*time.Second)
	defer cancel()
	client.Revoke(ctx, id)
}
