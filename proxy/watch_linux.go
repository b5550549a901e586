package proxy

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// clientWatcher wakes the waits of pooled sessions whose client left (clientWatch): one epoll instance per
// Server, and one goroutine that waits in it. A wait's client socket joins the set only once the wait has
// lasted watchArmAfter (one timer): most waits are over long before, and then cost that timer and nothing
// else, where each used to cost a goroutine and a ticker, and no system call is added to a transaction that
// does not wait. The socket is watched for EPOLLRDHUP (the peer's FIN), EPOLLHUP and EPOLLERR (a reset, a
// timeout: the connection is dead), which is what peerClosed reads from TCP's state, and never EPOLLIN: a
// client may pipeline bytes while it waits, which the session reads after the wait.
//
// Waits are rare on a busy session: through a pool of 8, 64 pgbench clients for 5 s started 0.0004 watches per
// transaction select-only (simple and extended protocol) and 0.004-0.005 with a fenced BEGIN, UPDATE, SELECT,
// INSERT, COMMIT (the next statement sent as the lend's goroutine still settles the one before). Per watch
// (BenchmarkWatchClient, a shared and loaded machine): 0.6-1 µs and 3 allocations for one that ends before it
// arms, where the goroutine and ticker every watch had before cost 3.3-9 µs; 10-14 µs for one that arms (two
// epoll_ctl calls), which only a wait of a millisecond or more does.
//
// A socket is in the set once per session (sockReg), for as long as any of the session's watches is armed: a
// probe's watch on a lend's goroutine may overlap the session goroutine's (watchProbe), and a socket cannot be
// added twice. Its end wakes every watch of the session, and is reported once (EPOLLONESHOT): a peer that
// closed stays closed, so a watch that arms after that is gone at once.
//
// A socket is added and removed while its descriptor is held (syscall.RawConn's Control), so the number always
// names the client's socket: forceClose may close it meanwhile, and the number may then be reused by another
// connection. A removal that finds the socket closed leaves nothing behind: the kernel drops a file's entries
// from every epoll set when the file closes, and the socket is never duplicated. An event names its socket by
// an id of the watcher's (not the descriptor), so a late event of a socket that left the set finds nothing.
type clientWatcher struct {
	epfd, wake int
	armAfter   time.Duration // watchArmAfter; 0 arms at once (tests)

	mu        sync.Mutex
	bySession map[*session]*sockReg
	byID      map[uint64]*sockReg
	next      uint64 // the next id; from 1<<32 on, so that no id is the eventfd's data (Pad 0)
	closed    bool   // no more changes to the set: its descriptor may be closed

	woken atomic.Int64 // sockets whose end the set reported (tests)
}

// sockReg is a session's client socket in the watcher's set (under the watcher's mu).
type sockReg struct {
	ss    *session
	id    uint64
	armed int  // the session's watches armed
	ended bool // the set reported the socket's end: the session's client has left
}

// watchArmAfter is how long a wait lasts before its client's socket joins the watcher's set. A client that
// left before is seen at that moment (the set reports a socket that already ended when it is added).
const watchArmAfter = time.Millisecond

// sockWatch is a clientWatch's part on Linux (under its mu): the timer that arms it, and, once armed, the
// socket it holds a place in the set for.
type sockWatch struct {
	cw    *clientWatcher
	timer *time.Timer
	armed bool
	rc    syscall.RawConn
}

var errWatcherClosed = errors.New("the client watcher is closed")

// newClientWatcher starts a Server's client watcher, or returns nil when the system refuses it an epoll
// instance (every watch then polls, as on other systems).
func newClientWatcher() *clientWatcher {
	epfd, wake, err := newEpollWithWake()
	if err != nil {
		return nil
	}
	cw := &clientWatcher{epfd: epfd, wake: wake, armAfter: watchArmAfter, bySession: map[*session]*sockReg{},
		byID: map[uint64]*sockReg{}, next: 1 << 32}
	go cw.run()
	return cw
}

// start watches w's client for its wait: from armAfter on through the set, or by polling without a watcher.
func (cw *clientWatcher) start(w *clientWatch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if cw == nil {
		w.poll()
		return
	}
	w.sock.cw = cw
	if cw.armAfter <= 0 {
		cw.arm(w)
		return
	}
	// The timer's function waits for w.mu, which is held until the timer is noted.
	w.sock.timer = time.AfterFunc(cw.armAfter, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		cw.arm(w)
	})
}

// arm puts w's client socket into the set, or counts w to its place there (w.mu held), unless the wait is
// over. A socket closed on this side (forceClose) counts as gone, as peerClosed says; one the set refuses is
// polled instead.
func (cw *clientWatcher) arm(w *clientWatch) {
	if w.ended.Load() {
		return
	}
	rc := socketOf(w.ss.client)
	if rc == nil {
		return // not a socket (peerClosed says false for it too): only forceClose ends the wait
	}
	var ended bool
	var err error
	if cerr := rc.Control(func(fd uintptr) { ended, err = cw.add(int(fd), w.ss) }); cerr != nil {
		go w.left() // not under w.mu: wake may wait for locks the waiter holds at end
		return
	}
	if err != nil {
		if log := w.ss.srv.log; log != nil {
			log.Warn("a pooled client is watched by polling: its socket could not join the client watcher's epoll set", "err", err)
		}
		w.poll()
		return
	}
	w.sock.armed, w.sock.rc = true, rc
	if ended {
		go w.left()
	}
}

// add counts an armed watch of ss, whose client socket is fd (its descriptor held), putting the socket into the
// set for the first; ended reports that the set already reported the socket's end.
func (cw *clientWatcher) add(fd int, ss *session) (ended bool, err error) {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	if cw.closed {
		return false, errWatcherClosed
	}
	r := cw.bySession[ss]
	if r == nil {
		id := cw.next
		ev := unix.EpollEvent{Events: unix.EPOLLRDHUP | unix.EPOLLHUP | unix.EPOLLERR | unix.EPOLLONESHOT, Fd: int32(id), Pad: int32(id >> 32)}
		if err := unix.EpollCtl(cw.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return false, fmt.Errorf("epoll_ctl ADD of descriptor %d: %w", fd, err)
		}
		cw.next++
		r = &sockReg{ss: ss, id: id}
		cw.bySession[ss] = r
		cw.byID[id] = r
	}
	r.armed++
	return r.ended, nil
}

// unwatch stops the platform's part of w (w.mu held): its timer, and its count to its socket's place in the set.
func (w *clientWatch) unwatch() {
	s := &w.sock
	if s.timer != nil {
		s.timer.Stop()
	}
	if !s.armed {
		return
	}
	s.armed = false
	done := false
	s.rc.Control(func(fd uintptr) { s.cw.release(w.ss, int(fd)); done = true })
	if !done {
		s.cw.release(w.ss, -1) // closed on this side: the kernel dropped the socket's entry with the file
	}
}

// release counts an armed watch of ss less, and takes its socket, fd (-1: closed), out of the set after the
// last.
func (cw *clientWatcher) release(ss *session, fd int) {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	r := cw.bySession[ss]
	if r == nil {
		return
	}
	if r.armed--; r.armed > 0 {
		return
	}
	delete(cw.bySession, ss)
	delete(cw.byID, r.id)
	if fd >= 0 && !cw.closed {
		unix.EpollCtl(cw.epfd, unix.EPOLL_CTL_DEL, fd, nil)
	}
}

// run wakes the watches of the sessions whose sockets ended, until close. Should the wait fail, every watch in
// the set polls from then on: a client that leaves is never left unseen.
func (cw *clientWatcher) run() {
	defer unix.Close(cw.epfd)
	defer unix.Close(cw.wake)
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(cw.epfd, events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			cw.fallBack()
			return
		}
		for _, ev := range events[:n] {
			if ev.Fd == int32(cw.wake) && ev.Pad == 0 {
				return // closed
			}
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			cw.mu.Lock()
			r := cw.byID[id]
			if r != nil {
				r.ended = true
			}
			cw.mu.Unlock()
			if r != nil {
				cw.woken.Add(1)
				r.ss.pooled.wakeWatches()
			}
		}
	}
}

// fallBack closes the set to changes and has every armed watch poll.
func (cw *clientWatcher) fallBack() {
	cw.mu.Lock()
	cw.closed = true
	sessions := make([]*session, 0, len(cw.bySession))
	for ss := range cw.bySession {
		sessions = append(sessions, ss)
	}
	cw.mu.Unlock()
	for _, ss := range sessions {
		for _, w := range ss.pooled.watchesNow() {
			w.mu.Lock()
			if !w.ended.Load() && w.stop == nil {
				w.poll()
			}
			w.mu.Unlock()
		}
	}
}

// close stops the watcher (Shutdown, once every session ended).
func (cw *clientWatcher) close() {
	if cw == nil {
		return
	}
	cw.mu.Lock()
	defer cw.mu.Unlock()
	if cw.closed {
		return
	}
	cw.closed = true
	wakeEpoll(cw.wake)
}

// newEpollWithWake makes an epoll instance with an eventfd in its set (its data: the eventfd's descriptor, Pad
// 0), which wakeEpoll makes ready: how the parker and the client watcher end the wait of their goroutine.
func newEpollWithWake() (epfd, wake int, err error) {
	epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return -1, -1, fmt.Errorf("epoll_create1: %w", err)
	}
	wake, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return -1, -1, fmt.Errorf("eventfd: %w", err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)}); err != nil {
		unix.Close(wake)
		unix.Close(epfd)
		return -1, -1, fmt.Errorf("epoll_ctl ADD of the eventfd: %w", err)
	}
	return epfd, wake, nil
}

// wakeEpoll makes the eventfd of newEpollWithWake ready.
func wakeEpoll(wake int) {
	var one = [8]byte{1}
	unix.Write(wake, one[:])
}
