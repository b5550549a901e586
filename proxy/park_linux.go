package proxy

import (
	"io"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// parker holds transaction-mode clients that sat idle between transactions for a while, with no goroutine and
// no buffers of theirs (parked), and hands each back to a handler goroutine when its socket becomes readable or
// ends (resumePooled).
//
// Why: a pooled client's session goroutine blocks in its read between transactions, with a stack of 8 KiB and a
// read and a write buffer of 8 KiB each. With 2,000 idle clients that was 23 KiB per client (bench/idlemem),
// where pgbouncer keeps about 1 KiB: the clients a transaction pooler exists for (a process pool of an
// application, serverless functions) are idle nearly all the time. A busy client is not parked: the sweep parks
// only a session that waited at the same message boundary through a whole sweep period, so the hot path pays
// two atomic additions per message (pooledState.turns) and nothing else.
//
// The parked sockets are watched by one epoll instance of the parker's own (a socket may be in several), one
// shot each: the first readiness (bytes, the peer's end, an error) removes it and resumes the session, which
// reads as it did before it parked. Shutdown resumes them all (close), so that each ends through its own drain
// (intrDrain, 57P01) as an idle session does.
type parker struct {
	srv   *Server
	after time.Duration // the sweep period: a session idle through one is parked
	epfd  int
	wake  int // an eventfd in the epoll set: close writes it, so that the wait returns at once

	mu     sync.Mutex
	parked map[int32]*session // by the client socket's descriptor
	closed bool
	sweeps atomic.Int64 // sweeps made (tests wait for them)
	// parks counts the sessions parked since the parker last gave memory back (sweep).
	parks atomic.Int64
}

// freeAfterParks is how many sessions park before the parker has the runtime give their memory back to the
// system at once (debug.FreeOSMemory: a collection): about 24 KiB each (a goroutine's stack and two buffers),
// which an idle process would otherwise keep until its next forced collection, two minutes on, and the
// scavenger's pace after that. It does so once a wave of parking is over (the clients that came together, for a
// burst of work or at a deploy, all parked): at a sweep after a sweep period in which none parked, at most
// every freeQuiet (the goroutines that served them ended when they parked, but maxIdleHandlers: server.go).
// Else every freeEvery: clients that pause a second or two between their transactions park and resume all the
// time, and a collection a second for them would cost more than the memory is worth. Before, the parker freed
// at the first sweep that saw freeAfterParks parks and then not for freeEvery: the clients of a wave that parked
// after its first 256 kept their memory for half a minute (bench/idlemem, 2,000 clients: 11.7 to 22.6 KiB
// per client ten seconds after the last one spoke, against 9 after forty seconds).
const (
	freeAfterParks = 256
	freeEvery      = 30 * time.Second
	freeQuiet      = 5 * time.Second
)

// freeDue reports whether the parker has the memory given back now: parks sessions parked since it last did,
// quiet says none parked in the last sweep period, and since is the time since it last did.
func freeDue(parks int64, quiet bool, since time.Duration) bool {
	return parks >= freeAfterParks && (since >= freeEvery || quiet && since >= freeQuiet)
}

// parkableSocket is the descriptor of the client's socket if it is a plain socket the session reads with raw
// calls and that holds nothing read or to write ahead of the session's buffers.
func parkableSocket(rw io.ReadWriter) (int, bool) {
	raw, ok := rw.(*rawSocket)
	if !ok || len(raw.pending) > 0 || len(raw.held) > 0 {
		return -1, false
	}
	fd := -1
	raw.rc.Control(func(f uintptr) { fd = int(f) })
	return fd, fd >= 0
}

// newParker starts a parker with its sweep, or returns nil when the system refuses it an epoll instance (the
// sessions then keep their goroutines, as before).
func newParker(s *Server, after time.Duration) *parker {
	epfd, wake, err := newEpollWithWake()
	if err != nil {
		return nil
	}
	pk := &parker{srv: s, after: after, epfd: epfd, wake: wake, parked: map[int32]*session{}}
	go pk.run()
	return pk
}

// park watches fd, the socket of ss's client, and keeps ss until it is readable; false when the parker is
// closed or the socket cannot be watched (the caller goes on serving ss itself). From a true return on, ss
// belongs to whoever resumes it: the caller must not touch it.
func (pk *parker) park(ss *session, fd int) bool {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.closed {
		return false
	}
	pk.parked[int32(fd)] = ss
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: int32(fd)}
	if err := unix.EpollCtl(pk.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		delete(pk.parked, int32(fd))
		return false
	}
	ss.pooled.parked.Store(true)
	pk.parks.Add(1)
	return true
}

// take removes fd's session from the parked ones, nil when it is not parked (already taken).
func (pk *parker) take(fd int32) *session {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	ss := pk.parked[fd]
	if ss == nil {
		return nil
	}
	delete(pk.parked, fd)
	// The descriptor stays open (the session owns it) until resumed: removing it here keeps a later park of
	// the same descriptor (ADD) from failing with EEXIST.
	unix.EpollCtl(pk.epfd, unix.EPOLL_CTL_DEL, int(fd), nil)
	ss.pooled.parked.Store(false)
	return ss
}

// count is the number of parked sessions.
func (pk *parker) count() int {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	return len(pk.parked)
}

// close stops parking and resumes every parked session (Shutdown: each then ends through its drain).
func (pk *parker) close() {
	pk.mu.Lock()
	if pk.closed {
		pk.mu.Unlock()
		return
	}
	pk.closed = true
	fds := make([]int32, 0, len(pk.parked))
	for fd := range pk.parked {
		fds = append(fds, fd)
	}
	pk.mu.Unlock()
	for _, fd := range fds {
		if ss := pk.take(fd); ss != nil {
			pk.srv.resumeParked(ss)
		}
	}
	wakeEpoll(pk.wake)
}

// run waits for parked sockets to become readable and sweeps the sessions every pk.after, until close.
func (pk *parker) run() {
	defer unix.Close(pk.epfd)
	defer unix.Close(pk.wake)
	events := make([]unix.EpollEvent, 64)
	next := time.Now().Add(pk.after)
	var freed time.Time // when the parker last had the memory given back
	var swept int64     // pk.parks at the last sweep
	for {
		wait := max(time.Until(next), 0)
		n, err := unix.EpollWait(pk.epfd, events, int(wait.Milliseconds())+1)
		if err != nil && err != unix.EINTR {
			pk.srv.log.Error("idle client parking stopped: epoll wait failed", "err", err)
			pk.close()
			return
		}
		for _, ev := range events[:max(n, 0)] {
			if ev.Fd == int32(pk.wake) {
				return // closed
			}
			if ss := pk.take(ev.Fd); ss != nil {
				pk.srv.resumeParked(ss)
			}
		}
		if now := time.Now(); !now.Before(next) {
			// The parks since the last sweep answered the sweep before it: the sessions it asked to park did so
			// at their next message boundary, at once for idle ones.
			parks := pk.parks.Load()
			quiet := parks == swept
			pk.sweep()
			next = now.Add(pk.after)
			swept = parks
			if freeDue(parks, quiet, now.Sub(freed)) {
				pk.parks.Add(-parks) // parks counted since the load stay for the next time
				swept = 0
				freed = now
				go debug.FreeOSMemory() // not on this goroutine: parked clients that speak are resumed meanwhile
			}
		}
	}
}

// sweep asks every pooled session that waited for its client at the same message boundary since the last sweep
// to park (intrPark): relayPooled parks it there if it is still idle.
func (pk *parker) sweep() {
	s := pk.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	defer pk.sweeps.Add(1)
	for ss := range s.sessions {
		pl := ss.pooled
		if pl == nil || pl.parked.Load() {
			continue
		}
		t := pl.turns.Load()
		if t%2 == 1 && t == pl.sweptTurns {
			ss.clientIntr.raise(intrPark)
		}
		pl.sweptTurns = t
	}
}
