package proxy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// The goroutine transport blocks in reads; another goroutine stops such a read by setting the connection's
// read deadline to now. interrupt is the one way it does that: it records why, so that the reader, when its
// read fails with a timeout, asks the interrupt what the timeout means instead of guessing from flags.
//
// Reasons are ordered: a stronger reason replaces a weaker one, never the reverse, so a drain wake-up cannot
// hide a stop. Who raises what:
//
//   - intrPark (the parker's sweep, park_linux.go): a transaction-mode client waited for its next message
//     through a whole sweep; relayPooled parks the session at its message boundary if it is still idle there.
//     A message being read is read to its end. The weakest: anything else replaces it.
//   - intrDrain (upstream reader): Shutdown wants the server-to-client side to look at the session at the next
//     message boundary and, if it is idle, ask the client side. (client reader): the server-to-client side saw
//     the session idle while draining; the client-to-server side ends it at its next message boundary if it is
//     still idle there (clientDrain). A message being read is read to its end.
//   - intrHandover (client reader): the server-to-client side saw startup end and wants the session moved to
//     the event loop. A message being read is read to its end, then the reader stops.
//   - intrEndLend (a pooled server connection's reader, the lend's server side: closeUnderRelay): the connection
//     is closed; the relay reads the message it is in to its end, stops there and closes it, so that the
//     client never gets part of a message before its farewell. Raised on no other reader.
//   - intrStop (upstream reader): the client-to-server side ended; the server-to-client side stops now, at a
//     message boundary if it is at one (the session's end then knows whether the upstream could be kept).
//   - intrPeerEnded (client reader): the server-to-client side ended (the upstream closed or failed, the client
//     could not be written to, a drain closed the session); the client-to-server side stops now.
//
// The reason and its deadline change together, under mu: a raise is two steps (the reason, then the deadline), and
// a clear (take, dropPark) that ran between them left the raise's deadline behind with no reason pending. The
// reader's next read then failed with a timeout no interrupt explained, which relayPooled took for the client's
// failure and ended the session: a sweep raising intrPark as the session parked, or dropped it, at its message
// boundary (TestInterruptClearNeverLeavesADeadlineWithoutReason). Readers look at the reason without the lock.
type interrupt struct {
	conn net.Conn
	mu   sync.Mutex // held by whoever changes why or the deadline
	why  atomic.Int32
}

type intrReason int32

const (
	intrNone intrReason = iota
	intrPark
	intrDrain
	intrHandover
	intrEndLend
	intrStop
	intrPeerEnded
)

// waitsForBoundary reports whether a read interrupted for r may go on to the end of the message it is in.
func (r intrReason) waitsForBoundary() bool {
	return r == intrPark || r == intrDrain || r == intrHandover || r == intrEndLend
}

// raise interrupts the reader's current or next read for r, unless a stronger reason is already pending.
func (i *interrupt) raise(r intrReason) {
	i.mu.Lock()
	defer i.mu.Unlock()
	for {
		cur := i.why.Load()
		if intrReason(cur) >= r {
			break
		}
		if i.why.CompareAndSwap(cur, int32(r)) {
			break
		}
	}
	// Set after the reason, so that a reader that sees the timeout also sees the reason (or a stronger one).
	i.conn.SetReadDeadline(time.Now())
}

// reason is the pending reason, intrNone if none. Cheap: readers check it at every message boundary.
func (i *interrupt) reason() intrReason { return intrReason(i.why.Load()) }

// take clears the interrupt and returns the reason it had; a raise racing with it is either taken now or comes
// after it, reason and deadline (mu).
func (i *interrupt) take() intrReason {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.conn.SetReadDeadline(time.Time{})
	return intrReason(i.why.Swap(int32(intrNone)))
}

// caught reports the reason a read failed with err, intrNone when err is not an interrupt's timeout.
func (i *interrupt) caught(err error) intrReason {
	if i == nil || !isTimeout(err) {
		return intrNone
	}
	return i.reason()
}

// resume is for a read that failed with err in the middle of a message: it reports whether the failure was an
// interrupt that waits for the message boundary, in which case the deadline is lifted (the reason stays
// pending, for the reader to act on at the boundary) and the read may be retried.
func (i *interrupt) resume(err error) bool {
	return i.caught(err).waitsForBoundary() && i.lift()
}

// dropPark clears a pending intrPark and its deadline; a stronger reason pending, or raised meanwhile, stays
// (the reader looks at the reason again at its message boundary).
func (i *interrupt) dropPark() {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.why.CompareAndSwap(int32(intrPark), int32(intrNone)) {
		i.conn.SetReadDeadline(time.Time{})
	}
}

// lift lifts the deadline of a pending reason that waits for the message boundary, keeping the reason, so that
// the reader may read on; false (the deadline back in place) when a stronger reason arrived meanwhile.
func (i *interrupt) lift() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.conn.SetReadDeadline(time.Time{})
	if !i.reason().waitsForBoundary() {
		// A stronger reason arrived meanwhile; put its deadline back.
		i.conn.SetReadDeadline(time.Now())
		return false
	}
	return true
}
