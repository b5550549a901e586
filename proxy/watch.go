package proxy

import (
	"sync"
	"sync/atomic"
	"time"
)

// clientWatch ends a wait of the session goroutine on the server side when the client leaves. That goroutine
// reads the client no more while it waits, so without a look at the client's socket its leaving went unseen,
// and a wait whose answer never comes (the server waits for the client: a Sync the pool counts wrong; or it is
// blocked for good, behind a lock) held the server connection, its transaction and locks, until the proxy
// stopped (TestPooledClientVanishingWhileItsNextUnitWaits, TestPooledClientVanishingWhileItsSettingsReplay).
// Every such wait goes through watchClient: one rule in one place.
//
// The client has left when TCP says its peer closed (a FIN or a reset came, whatever bytes it sent before wait
// unread: peerClosed's meaning), or when the session was forced out (forceClose, which wakes the watch itself:
// its socket, closed on this side, says nothing any more). On Linux the socket's end wakes the wait
// (clientWatcher, watch_linux.go): the client's socket joins one epoll set of the Server's for
// EPOLLRDHUP|EPOLLHUP|EPOLLERR, never EPOLLIN (a client may pipeline bytes while it waits; the session reads
// them after the wait). Elsewhere, or when the epoll set refuses the socket, the watch looks at the socket every
// waitCheck (poll). Until 2026-12-05 every watch polled: a client that left was seen up to 100 ms late, and
// each waiting session cost ten wake-ups a second (TestPooledClientVanishingIsSeenAtOnce).
type clientWatch struct {
	ss   *session
	wake func() // makes the waiter look at gone again; may come after end, and must be harmless then
	gone atomic.Bool
	// notBefore: the client's leaving ends the wait only from then on (watchClient's grace); zero: at once.
	notBefore time.Time
	// ended: end ran (set before end takes mu, so that an arming that waits for mu sees it).
	ended atomic.Bool
	mu    sync.Mutex    // between arming the watch (the platform's start, poll) and end
	stop  chan struct{} // closed by end: the poll's ticker stops; nil when the watch does not poll
	sock  sockWatch     // the platform's part (watch_linux.go, watch_other.go)
	next  *clientWatch  // in pooledState.watches (under its waitMu)
}

// watchClient watches the client for one wait's length (end stops it). Once the client has left it marks the
// watch gone and calls wake, from a goroutine of its own: wake may wait for the locks the waiter holds at end.
// With a grace, a leaving seen earlier counts only once the wait has lasted that long (leaveGrace).
func (ss *session) watchClient(wake func(), grace time.Duration) *clientWatch {
	w := &clientWatch{ss: ss, wake: wake}
	if grace > 0 {
		w.notBefore = time.Now().Add(grace)
	}
	pl := ss.pooled
	// forceClose sets forcedOut before it takes waitMu to wake the watches: a watch added before it does is
	// woken by it, one added after sees forcedOut here.
	pl.waitMu.Lock()
	w.next, pl.watches = pl.watches, w
	forced := ss.forcedOut.Load()
	pl.waitMu.Unlock()
	if forced {
		go w.left()
		return w
	}
	ss.srv.pools.clientWatcher.start(w)
	return w
}

// leaveGrace is the grace of the waits whose client's leaving is expected or costs more to act on at once than
// to wait out: the wait for the last unit's settle after a Terminate (a client says goodbye and closes its
// socket right after its last answer, as pgbench -C and every pool's close do, often while the pool still
// settles that answer) and the post-transaction probe (the proxy's own statement, after the client's answer).
// Acting at once cancels what the server runs and closes the connection: a new backend for the next client, for
// a wait that nearly always ends within a millisecond or two. A wait that lasts past the grace is one whose
// answer may never come (a lock, a Sync the pool counted wrong): it ends then, as every wait did at the 100 ms
// poll's first look until 2026-12-05 (TestPooledConnectionLogLines: a client that set application_name and
// closed was logged "server closed" and its connection closed, with a grace of none).
const leaveGrace = waitCheck

// left marks the watch gone and wakes the waiter, once, unless the wait is over; within the watch's grace it
// looks again when the grace is over.
func (w *clientWatch) left() {
	if w.ended.Load() || w.gone.Load() {
		return
	}
	if d := time.Until(w.notBefore); d > 0 {
		time.AfterFunc(d, w.left)
		return
	}
	if !w.gone.CompareAndSwap(false, true) {
		return
	}
	w.wake()
}

// end stops the watch (the wait is over).
func (w *clientWatch) end() {
	w.ended.Store(true)
	pl := w.ss.pooled
	pl.waitMu.Lock()
	for p := &pl.watches; *p != nil; p = &(*p).next {
		if *p == w {
			*p = w.next
			break
		}
	}
	pl.waitMu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stop != nil {
		close(w.stop)
	}
	w.unwatch()
}

// wakeWatches wakes the waits under way of a session whose client left: forceClose forced it out, or its
// socket ended (clientWatcher).
func (pl *pooledState) wakeWatches() {
	for _, w := range pl.watchesNow() {
		go w.left() // the caller may hold locks wake waits for (forceClose under Shutdown holds the Server's)
	}
}

// watchesNow lists the watches under way.
func (pl *pooledState) watchesNow() []*clientWatch {
	pl.waitMu.Lock()
	defer pl.waitMu.Unlock()
	var ws []*clientWatch
	for w := pl.watches; w != nil; w = w.next {
		ws = append(ws, w)
	}
	return ws
}

// poll looks at the client's socket every waitCheck until end (w.mu held): where nothing wakes the watch when
// the socket ends (another system, or an epoll set that refused it).
func (w *clientWatch) poll() {
	w.stop = make(chan struct{})
	stop := w.stop
	go func() {
		t := time.NewTicker(waitCheck)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			if w.ss.forcedOut.Load() || peerClosed(w.ss.client) {
				w.left()
				return
			}
		}
	}()
}
