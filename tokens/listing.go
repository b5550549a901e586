package tokens

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"
)

// DefaultListTimeout bounds one reading of the lock stores by a listing or an observer, so that a store that
// does not answer makes a listing fail instead of hang.
const DefaultListTimeout = 5 * time.Second

// Listing is the lock stores that `fenceproxy locks` and the admin console's SHOW LOCKS list: the locks that
// are held or waited for in each store, and, with Marks, each listed lock's mark (lock fences).
type Listing struct {
	Stores []Store
	// Marks, when set, reads lock fences' marks: the newest token each lock has accepted (fenceproxy.lock_marks
	// of one database; an empty map where `fenceproxy install` did not run).
	Marks func(ctx context.Context) (map[string]int64, error)
	// Timeout bounds the whole reading (every store and the marks); 0 means DefaultListTimeout.
	Timeout time.Duration
}

// ListedLock is one lock of a listing.
type ListedLock struct {
	LockInfo
	// Store is the store's Kind.
	Store string
	// Mark is the newest token the lock has accepted (lock fences), when the listing read marks and the lock
	// has one; 0 otherwise.
	Mark int64
}

// List reads every store, in order, then the marks, within the listing's timeout. The locks of each store are
// sorted by name. The first failure is the error, naming the store (or the marks): a partial listing could be
// read as "nobody holds the lock".
func (l Listing) List(ctx context.Context) ([]ListedLock, error) {
	timeout := l.Timeout
	if timeout <= 0 {
		timeout = DefaultListTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var out []ListedLock
	for _, s := range l.Stores {
		locks, err := s.List(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s lock store: %w", s.Kind(), err)
		}
		sort.Slice(locks, func(i, j int) bool { return locks[i].Name < locks[j].Name })
		for _, li := range locks {
			out = append(out, ListedLock{LockInfo: li, Store: s.Kind()})
		}
	}
	if l.Marks != nil && len(out) > 0 {
		marks, err := l.Marks(ctx)
		if err != nil {
			return nil, fmt.Errorf("lock marks: %w", err)
		}
		for i := range out {
			out[i].Mark = marks[out[i].Name]
		}
	}
	return out, nil
}

// Known is what a listing may say of a lock: nil where the store cannot tell, and for a lock nobody holds
// (only waiters) nil for all but Waiters. It is the one rule `fenceproxy locks` (table and JSON) and SHOW LOCKS
// follow.
type Known struct {
	Token     *int64
	LeaseLeft *time.Duration
	HeldFor   *time.Duration
	// Waiters is nil where the store keeps no queue (Redis).
	Waiters *int
}

// Known is what a listing may say of l.
func (l LockInfo) Known() Known {
	var k Known
	if l.Waiters >= 0 {
		k.Waiters = &l.Waiters
	}
	if l.Holder == "" {
		return k
	}
	if l.Token > 0 {
		k.Token = &l.Token
	}
	if l.LeaseLeft >= 0 {
		k.LeaseLeft = &l.LeaseLeft
	}
	if l.HeldFor > 0 {
		k.HeldFor = &l.HeldFor
	}
	return k
}

// LockCells is a lock as text, as the listings show it: "-" for what a lock nobody holds has none of (holder,
// token, lease left, held for), "?" for what the store cannot tell; durations to 100ms ("9.9s").
type LockCells struct {
	Holder, Token, LeaseLeft, HeldFor, Waiters string
}

// Cells is l as text (LockCells).
func (l LockInfo) Cells() LockCells {
	k := l.Known()
	c := LockCells{Holder: l.Holder, Token: "?", LeaseLeft: "?", HeldFor: "?", Waiters: "?"}
	if k.Waiters != nil {
		c.Waiters = strconv.Itoa(*k.Waiters)
	}
	if l.Holder == "" {
		c.Holder, c.Token, c.LeaseLeft, c.HeldFor = "-", "-", "-", "-"
		return c
	}
	if k.Token != nil {
		c.Token = strconv.FormatInt(*k.Token, 10)
	}
	if k.LeaseLeft != nil {
		c.LeaseLeft = k.LeaseLeft.Round(100 * time.Millisecond).String()
	}
	if k.HeldFor != nil {
		c.HeldFor = k.HeldFor.Round(100 * time.Millisecond).String()
	}
	return c
}
