package tokens

import (
	"context"
	"time"
)

// Store is a lock service that issues fencing tokens: etcd, PostgreSQL, ZooKeeper or Redis. `fenceproxy lock`
// and `fenceproxy locks` are thin command lines over it.
//
// What every Store guarantees, and what each documents it cannot:
//
//   - Tokens of successive holders of one lock strictly increase (whether the previous holder released the lock
//     or lost its lease), and tokens of one Store are comparable across its locks: they come from one
//     store-wide order (etcd's revision, one PostgreSQL sequence, ZooKeeper's zxid, one Redis counter).
//   - While a holder's lease is alive no other holder has the lock.
//   - [Held.Lost] is closed as soon as the lease is known to be gone or can no longer be confirmed; a holder
//     must then stop writing. It cannot know the exact moment its lease ends on the server, which is why the
//     database checks the token.
//
// Tokens from different stores are not comparable: use one store for the writers of one protected table.
type Store interface {
	// Acquire takes the lock name, waiting as long as ctx allows (or, with o.Try, not at all: then an error
	// wrapping [ErrLocked] when another holder has it). An error wrapping [ErrLeaseLost] means the lease was
	// lost while waiting.
	Acquire(ctx context.Context, name string, o AcquireOptions) (Held, error)
	// List describes the locks the store holds now (held or waited for).
	List(ctx context.Context) ([]LockInfo, error)
	// Kind names the store for logs and metrics: "etcd", "postgres", "zookeeper" or "redis".
	Kind() string
	// Close releases the store's connections. Locks still held are lost.
	Close() error
}

// AcquireOptions are the knobs every Store understands.
type AcquireOptions struct {
	// TTL is the lease's length; 0 means [DefaultTTL]. A store may round it (etcd: whole seconds).
	TTL time.Duration
	// Try fails at once with [ErrLocked] instead of waiting.
	Try bool
	// TokenOffset (>= 0) is added to the store's token; see [WithTokenOffset].
	TokenOffset int64
}

// Held is a lock held in a Store, with its fencing token. Its methods are safe for concurrent use.
type Held interface {
	// Name is the lock's name as given to Acquire.
	Name() string
	// Token is the fencing token: strictly greater than every earlier holder's of this lock.
	Token() int64
	// Lost is closed when the lock can no longer be relied on, or after Release.
	Lost() <-chan struct{}
	// Err is nil while the lock is held; afterwards an error wrapping [ErrLeaseLost] or [ErrReleased].
	Err() error
	// Release gives the lock up (only this holder's own lease: never someone else's). Idempotent.
	Release(ctx context.Context) error
}

// LockInfo describes one lock, for `fenceproxy locks` and the lock metrics.
type LockInfo struct {
	Name string
	// Holder identifies the holder's lease or session ("" when nobody holds the lock and only waiters exist).
	Holder string
	// Token is the holder's fencing token (0 when not held).
	Token int64
	// LeaseLeft is how long the holder's lease runs without renewal (negative: unknown).
	LeaseLeft time.Duration
	// Waiters is how many acquirers wait for the lock (-1: the store cannot tell).
	Waiters int
	// HeldFor is how long the holder has held the lock (0 when not held or unknown).
	HeldFor time.Duration
	// Counters are the lock's cumulative counts, for stores that keep them (PostgreSQL keeps them in its lease
	// table, so they count every process's events); nil for stores whose observer must infer them (etcd).
	Counters *LockCounters
}

// LockCounters are cumulative counts of one lock's events since it was first used.
type LockCounters struct {
	Acquisitions int64
	// Releases by the holder, before its lease expired.
	Releases int64
	// Expirations: leases that ended without a timely release (taken over after expiry, or released late).
	// Each is a moment when a paused or cut-off holder may still write under a stale token.
	Expirations int64
	// NonOwnerReleases: releases refused because the lease was no longer the caller's.
	NonOwnerReleases int64
	// RenewalFailures: renewals that failed, as far as holders could report them afterwards.
	RenewalFailures int64
	// AcquireTimeouts: acquirers that gave up waiting at their deadline.
	AcquireTimeouts int64
	// AcquireWaitSeconds: the total time acquirers waited before they got the lock.
	AcquireWaitSeconds float64
}

// The etcd lock is a Held.
var _ Held = (*Lock)(nil)
