//go:build linux

package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// The event loop relays plain-TCP sessions after startup the way pgbouncer does: one goroutine waits in
// epoll_wait over every such session's two sockets and does the non-blocking reads and writes itself. On a
// machine where waking a thread is expensive this matters: the goroutine path costs, per round trip, two
// goroutine parks and wake-ups through the runtime's poller and a read that returns EAGAIN on each side.
//
// The loop does the same framing and inspection as the goroutine path, with the same handlers (queryOut,
// parseOut, errorOut, paramStatusOut) writing into outBufs instead of bufio.Writers. Back-pressure: a side is
// not read while what was read from it is still waiting to be written to the other side (EPOLLOUT).
// Sessions end on the goroutine path: the loop hands the session back (done) with the reason, and the session
// goroutine does the blocking parts (cancel requests, farewell messages with a deadline, closing).

// evLoop is one of a Server's event loops. Its goroutine runs while it has sessions and exits when it has none.
type evLoop struct {
	srv  *Server
	spin time.Duration // how long to poll before sleeping (spinPoll); 0: never
	// inTx counts this loop's sessions inside a transaction block (last ReadyForQuery not 'I'). Written by the
	// loop goroutine only; atomic so that tests can read it.
	inTx atomic.Int32

	mu      sync.Mutex
	running bool
	epfd    int
	wakefd  int // eventfd: commands are waiting
	cmds    []evCmd
	nsess   int
}

// loopYieldEvents is how many socket events the loop handles between yields to the scheduler: an event
// costs tens of microseconds, so this yields every few milliseconds, inside the runtime's 10 ms time slice.
const loopYieldEvents = 128

type evCmd struct {
	es    *evSession
	drain bool // check whether the session is idle and a drain may close it; else add it
}

// newEvLoops makes n event loops. A Server has several because one loop is one thread: pgbouncer's single
// thread is its ceiling on a machine with idle cores, and sessions spread over one loop per CPU lift it.
func newEvLoops(s *Server, n int, spin time.Duration) []*evLoop {
	loops := make([]*evLoop, max(n, 1))
	for i := range loops {
		loops[i] = &evLoop{srv: s, spin: spin}
	}
	return loops
}

// pickLoop returns the loop with the fewest sessions.
func (s *Server) pickLoop() *evLoop {
	var best *evLoop
	fewest := 0
	for _, l := range s.loops {
		l.mu.Lock()
		n := l.nsess
		l.mu.Unlock()
		if best == nil || n < fewest {
			best, fewest = l, n
		}
	}
	return best
}

// Why a session left the loop.
const (
	endNone = iota
	endTerminate
	endProtocol
	endClientGone
	endUpstreamGone
	endDrained
)

var errTerminated = errors.New("client sent Terminate")

// evSession is a session's state while the loop relays it; after done is closed it belongs to the session
// goroutine again.
type evSession struct {
	ss       *session
	loop     *evLoop
	cfd, ufd int
	cin, uin []byte // data read and not yet processed, at the front of each buffer
	// cskip and uskip count the bytes of a message being streamed through that have not arrived yet.
	cskip, uskip int
	uout, cout   outBuf // processed data waiting to be written upstream, to the client
	cEv, uEv     uint32 // epoll interest now registered

	cMsgs, cBytes, uMsgs, uBytes uint64

	end       int
	endErr    error
	uBoundary bool // the server side stopped between messages
	inTx      bool // counted in loop.inTx
	drainNow  bool
	done      chan struct{}

	mu        sync.Mutex // guards fdsClosed against forceClose
	fdsClosed bool
	forced    atomic.Bool
}

// outBuf is a msgSink that appends to a byte slice.
type outBuf struct{ b []byte }

func (o *outBuf) Write(p []byte) (int, error)       { o.b = append(o.b, p...); return len(p), nil }
func (o *outBuf) WriteByte(c byte) error            { o.b = append(o.b, c); return nil }
func (o *outBuf) WriteString(s string) (int, error) { o.b = append(o.b, s...); return len(s), nil }

// loopEligible reports whether the session can be relayed by the event loop once it is ready: plain TCP on
// both sides, and no token verification (a lock-service round trip must not stall the loop).
func (ss *session) loopEligible() bool {
	if len(ss.srv.loops) == 0 || ss.noLoop || ss.clientTLS || ss.srv.verifier != nil {
		return false
	}
	_, c := ss.client.(*net.TCPConn)
	_, u := ss.upstream.(*net.TCPConn)
	return c && u
}

// runInLoop moves the session into the event loop and waits there until it ends. It reports false, having
// changed nothing, when the sockets could not be taken over.
func (ss *session) runInLoop() bool {
	cfd, err := dupConnFD(ss.client)
	if err != nil {
		ss.log.Debug("event loop handover failed", "err", err)
		return false
	}
	ufd, err := dupConnFD(ss.upstream)
	if err != nil {
		syscall.Close(cfd)
		ss.log.Debug("event loop handover failed", "err", err)
		return false
	}
	es := &evSession{ss: ss, loop: ss.srv.pickLoop(), cfd: cfd, ufd: ufd, uBoundary: true, done: make(chan struct{})}
	es.cin = takeBuffered(ss.cr.r)
	es.uin = takeBuffered(ss.sr.r)
	ss.evMu.Lock()
	if ss.closed {
		ss.evMu.Unlock()
		syscall.Close(cfd)
		syscall.Close(ufd)
		return true // forceClose got here first; the dups were the last references
	}
	ss.ev = es
	ss.evMu.Unlock()
	// The duplicates keep the sockets open; closing the originals takes them out of the runtime's poller.
	ss.client.Close()
	ss.upstream.Close()
	ss.cr.r, ss.sr.r = nil, nil
	es.loop.add(es)
	if ss.srv.draining.Load() {
		es.loop.post(evCmd{es: es, drain: true})
	}
	<-es.done
	ss.finishLoop(es)
	return true
}

// takeBuffered returns a read buffer holding what r has buffered.
func takeBuffered(r interface {
	Buffered() int
	Peek(int) ([]byte, error)
}) []byte {
	n := r.Buffered()
	b := make([]byte, 0, max(readBufferSize, n))
	p, _ := r.Peek(n)
	return append(b, p...)
}

func dupConnFD(c net.Conn) (int, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return -1, errors.New("not a TCP connection")
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return -1, err
	}
	nfd := -1
	var derr error
	if err := rc.Control(func(fd uintptr) { nfd, derr = dupFD(int(fd)) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, derr
	}
	if err := syscall.SetNonblock(nfd, true); err != nil {
		syscall.Close(nfd)
		return -1, err
	}
	return nfd, nil
}

// dupFD duplicates fd, close-on-exec.
func dupFD(fd int) (int, error) {
	r, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_DUPFD_CLOEXEC, 0)
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

// fdConn makes a net.Conn of a duplicate of fd; fd stays open.
func fdConn(fd int) (net.Conn, error) {
	nfd, err := dupFD(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(nfd), "upstream")
	defer f.Close()
	return net.FileConn(f)
}

// shutdownSockets ends a looped session from outside (forceClose): the loop sees both sockets close.
func (es *evSession) shutdownSockets() {
	es.mu.Lock()
	defer es.mu.Unlock()
	if es.fdsClosed {
		return
	}
	es.forced.Store(true)
	syscall.Shutdown(es.cfd, syscall.SHUT_RDWR)
	syscall.Shutdown(es.ufd, syscall.SHUT_RDWR)
}

func (es *evSession) closeFDs() {
	es.mu.Lock()
	defer es.mu.Unlock()
	if !es.fdsClosed {
		es.fdsClosed = true
		syscall.Close(es.cfd)
		syscall.Close(es.ufd)
	}
}

// finishLoop ends a session the loop gave back, as relay does for the goroutine path.
func (ss *session) finishLoop(es *evSession) {
	deadline := time.Now().Add(time.Second)
	forced := es.forced.Load()
	ss.outcome = loopOutcome(es)
	var protoErr error
	ss.stopping.Store(true)
	switch es.end {
	case endProtocol:
		protoErr = es.endErr
		ss.srv.metrics.protocolError()
		ss.log.Info("client protocol violation; closing", "err", protoErr)
	case endUpstreamGone:
		ss.upstreamGone.Store(true)
		if !forced && es.uBoundary && !ss.clientFatal.Load() {
			ss.srv.metrics.upstreamError()
			ss.log.Warn("upstream connection lost", "err", es.endErr)
			ss.clientFatal.Store(true)
			es.cout.b = append(es.cout.b, errorResponse("FATAL", "08006", "fenceproxy lost the connection to the upstream server", es.endErr.Error(), "")...)
		}
	case endDrained:
		ss.clientFatal.Store(true)
		es.cout.b = append(es.cout.b, errorResponse("FATAL", "57P01", "terminating connection because fenceproxy is shutting down", "", "")...)
	case endClientGone:
		if ss.ready.Load() && (ss.pending.Load() > 0 || ss.unsynced.Load()) && ss.cancelKey != nil {
			ss.srv.cancelUpstream(ss.cancelKey)
		}
	}
	if es.end == endTerminate && !forced && ss.mayKeep() && len(es.uout.b) == 0 && len(es.uin) == 0 && es.uskip == 0 {
		// The client ended the session between messages: keep the upstream connection for reuse.
		up, err := fdConn(es.ufd)
		es.closeFDs()
		if err != nil {
			ss.log.Debug("upstream connection not kept", "err", err)
			return
		}
		ss.keep(up)
		return
	}
	if es.end != endUpstreamGone {
		es.uout.b = append(es.uout.b, 'X', 0, 0, 0, 4)
		if !forced {
			writeAllFD(es.ufd, es.uout.b, deadline)
		}
	}
	if protoErr != nil && !ss.clientFatal.Load() {
		es.cout.b = append(es.cout.b, errorResponse("FATAL", "08P01", "invalid message from client", protoErr.Error(), "")...)
	}
	if !forced && es.end != endClientGone {
		writeAllFD(es.cfd, es.cout.b, deadline)
	}
	es.closeFDs()
}

// writeAllFD writes b to a non-blocking socket, waiting for it to drain until deadline; best effort.
func writeAllFD(fd int, b []byte, deadline time.Time) {
	for len(b) > 0 {
		n, err := sysWrite(fd, b)
		if n > 0 {
			b = b[n:]
			continue
		}
		if err != syscall.EAGAIN && err != syscall.EINTR {
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		pfd := [1]pollFd{{fd: int32(fd), events: pollOut}}
		syscall.Syscall(syscall.SYS_POLL, uintptr(unsafe.Pointer(&pfd[0])), 1, uintptr(left.Milliseconds()+1))
	}
}

type pollFd struct {
	fd      int32
	events  int16
	revents int16
}

const pollOut = 0x4

// sysRead and sysWrite are raw non-blocking socket calls: they never block, so they need not tell the
// scheduler. Writes use send(MSG_NOSIGNAL) so that a vanished peer is an EPIPE, not a signal.
func sysRead(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func sysWrite(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r, _, e := syscall.RawSyscall6(syscall.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), syscall.MSG_NOSIGNAL, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// add gives the loop a session, starting the loop goroutine if it is not running.
func (l *evLoop) add(es *evSession) {
	l.mu.Lock()
	l.nsess++
	l.cmds = append(l.cmds, evCmd{es: es})
	if l.running {
		l.mu.Unlock()
		l.wake()
		return
	}
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	var wfd uintptr
	if err == nil {
		var e syscall.Errno
		wfd, _, e = syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
		if e != 0 {
			syscall.Close(epfd)
			err = e
		}
	}
	if err != nil {
		// Without a loop the session cannot be relayed; end it as a client loss would.
		l.nsess--
		l.cmds = l.cmds[:len(l.cmds)-1]
		l.mu.Unlock()
		es.ss.log.Warn("event loop unavailable", "err", err)
		es.end, es.endErr = endClientGone, err
		close(es.done)
		return
	}
	l.epfd, l.wakefd = epfd, int(wfd)
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(wfd)}
	syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, int(wfd), &ev)
	l.running = true
	one := uint64(1)
	sysWrite2(l.wakefd, (*[8]byte)(unsafe.Pointer(&one))[:]) // the first command is waiting
	l.mu.Unlock()
	go l.run(epfd, int(wfd))
}

// post queues a command for a session already in the loop.
func (l *evLoop) post(c evCmd) {
	l.mu.Lock()
	if !l.running {
		l.mu.Unlock()
		return
	}
	l.cmds = append(l.cmds, c)
	l.mu.Unlock()
	l.wake()
}

func (l *evLoop) wake() {
	one := uint64(1)
	l.mu.Lock()
	if l.running {
		sysWrite2(l.wakefd, (*[8]byte)(unsafe.Pointer(&one))[:])
	}
	l.mu.Unlock()
}

func sysWrite2(fd int, p []byte) {
	syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
}

func (l *evLoop) run(epfd, wakefd int) {
	events := make([]syscall.EpollEvent, 128)
	byFD := map[int32]*evSession{}
	var cmds []evCmd
	var drain [8]byte
	// busy is true while polls find several sockets ready (many sessions at work): the next poll is then a raw
	// non-blocking one, which under load usually finds more without telling the scheduler. Otherwise the loop
	// blocks directly, so a lone session's round trip costs one epoll_wait per wake-up, as in pgbouncer.
	busy := false
	// Work done since the loop last gave the scheduler a chance. The runtime preempts a goroutine that runs
	// for 10 ms without rescheduling (blocking in a system call does not count) with a signal, and wakes other
	// threads to take over; under a steady load this goroutine never reschedules, so it yields now and then
	// instead, which costs far less.
	sinceYield := 0
	var load *loadReader // for spinPoll only
	if l.spin > 0 {
		load = openLoadReader()
		defer load.close()
	}
	for {
		if sinceYield >= loopYieldEvents {
			sinceYield = 0
			runtime.Gosched()
		}
		n := 0
		if busy {
			n = pollNow(epfd, events)
		}
		if n == 0 && l.spin > 0 {
			n = l.spinPoll(epfd, events, load)
		}
		if n == 0 {
			var err error
			n, err = syscall.EpollWait(epfd, events, -1)
			if err != nil {
				busy = false
				continue // EINTR
			}
			busy = n > 1
		} else {
			busy = true
		}
		sinceYield += n
		ended := false
		for i := range events[:n] {
			fd := events[i].Fd
			if fd == int32(wakefd) {
				sysRead(wakefd, drain[:])
				l.mu.Lock()
				cmds, l.cmds = l.cmds, cmds[:0]
				l.mu.Unlock()
				for _, c := range cmds {
					if c.drain {
						if byFD[int32(c.es.cfd)] == c.es {
							c.es.checkDrain()
						}
					} else {
						c.es.start(epfd, byFD)
					}
					if c.es.end != endNone && byFD[int32(c.es.cfd)] == c.es {
						c.es.release(epfd, byFD)
						ended = true
					}
				}
				clear(cmds)
				continue
			}
			es := byFD[fd]
			if es == nil {
				continue
			}
			es.event(fd, events[i].Events, epfd)
			if es.end != endNone {
				es.release(epfd, byFD)
				ended = true
			}
		}
		if ended {
			l.mu.Lock()
			if l.nsess == 0 && len(l.cmds) == 0 {
				l.running = false
				syscall.Close(epfd)
				syscall.Close(wakefd)
				l.mu.Unlock()
				return
			}
			l.mu.Unlock()
		}
	}
}

// start registers a new session's sockets and relays what was buffered at the handover.
func (es *evSession) start(epfd int, byFD map[int32]*evSession) {
	es.setInTx(!es.ss.txIdle.Load())
	byFD[int32(es.cfd)] = es
	byFD[int32(es.ufd)] = es
	es.cEv, es.uEv = syscall.EPOLLIN, syscall.EPOLLIN
	ev := syscall.EpollEvent{Events: es.cEv, Fd: int32(es.cfd)}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, es.cfd, &ev); err != nil {
		es.finish(endClientGone, fmt.Errorf("epoll: %w", err))
		return
	}
	ev = syscall.EpollEvent{Events: es.uEv, Fd: int32(es.ufd)}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, es.ufd, &ev); err != nil {
		es.finish(endClientGone, fmt.Errorf("epoll: %w", err))
		return
	}
	es.guard(func() {
		if len(es.uin) > 0 {
			es.pumpServer()
		}
		if es.end == endNone && len(es.cin) > 0 {
			es.pumpClient()
		}
	})
	es.updateInterest(epfd)
}

// release takes an ended session out of the loop and gives it back to its goroutine.
func (es *evSession) release(epfd int, byFD map[int32]*evSession) {
	if byFD[int32(es.cfd)] == es {
		delete(byFD, int32(es.cfd))
		syscall.EpollCtl(epfd, syscall.EPOLL_CTL_DEL, es.cfd, nil)
	}
	if byFD[int32(es.ufd)] == es {
		delete(byFD, int32(es.ufd))
		syscall.EpollCtl(epfd, syscall.EPOLL_CTL_DEL, es.ufd, nil)
	}
	es.setInTx(false)
	l := es.loop
	l.mu.Lock()
	l.nsess--
	l.mu.Unlock()
	close(es.done)
}

func (es *evSession) finish(kind int, err error) {
	if es.end == endNone {
		es.end, es.endErr = kind, err
	}
}

// guard runs f, turning a panic into the end of this session only, as handle's recover does.
func (es *evSession) guard(f func()) {
	defer func() {
		if r := recover(); r != nil {
			es.ss.log.Error("session panic", "panic", r)
			es.forced.Store(true)
			es.finish(endClientGone, fmt.Errorf("panic: %v", r))
		}
	}()
	f()
}

func (es *evSession) checkDrain() {
	if es.ss.idle() && len(es.cin) == 0 && es.cskip == 0 {
		es.finish(endDrained, nil)
	}
}

func (es *evSession) event(fd int32, ev uint32, epfd int) {
	es.guard(func() {
		const hup = syscall.EPOLLHUP | syscall.EPOLLERR
		if fd == int32(es.cfd) {
			if ev&(syscall.EPOLLOUT|hup) != 0 && len(es.cout.b) > 0 {
				es.flushClient()
			}
			if es.end == endNone && ev&(syscall.EPOLLIN|hup) != 0 {
				if len(es.uout.b) == 0 {
					es.readClient()
				} else if ev&hup != 0 {
					es.finish(endClientGone, io.EOF)
				}
			}
		} else {
			if ev&(syscall.EPOLLOUT|hup) != 0 && len(es.uout.b) > 0 {
				es.flushUpstream()
			}
			if es.end == endNone && ev&(syscall.EPOLLIN|hup) != 0 {
				if len(es.cout.b) == 0 {
					es.readServer()
				} else if ev&hup != 0 {
					es.finish(endUpstreamGone, io.EOF)
				}
			}
		}
	})
	if es.end == endNone {
		es.updateInterest(epfd)
	}
}

func (es *evSession) updateInterest(epfd int) {
	var c, u uint32
	if len(es.uout.b) == 0 {
		c |= syscall.EPOLLIN
	} else {
		u |= syscall.EPOLLOUT
	}
	if len(es.cout.b) == 0 {
		u |= syscall.EPOLLIN
	} else {
		c |= syscall.EPOLLOUT
	}
	if c != es.cEv {
		es.cEv = c
		ev := syscall.EpollEvent{Events: c, Fd: int32(es.cfd)}
		syscall.EpollCtl(epfd, syscall.EPOLL_CTL_MOD, es.cfd, &ev)
	}
	if u != es.uEv {
		es.uEv = u
		ev := syscall.EpollEvent{Events: u, Fd: int32(es.ufd)}
		syscall.EpollCtl(epfd, syscall.EPOLL_CTL_MOD, es.ufd, &ev)
	}
}

// readFD reads once into the free end of *buf (level-triggered epoll calls again if more is waiting).
func readFD(fd int, buf *[]byte) (bool, error) {
	b := *buf
	n, err := sysRead(fd, b[len(b):cap(b)])
	if err == syscall.EAGAIN || err == syscall.EINTR {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if n == 0 {
		return false, io.EOF
	}
	*buf = b[:len(b)+n]
	return true, nil
}

func (es *evSession) readClient() {
	ok, err := readFD(es.cfd, &es.cin)
	if err != nil {
		es.finish(endClientGone, err)
		return
	}
	if ok {
		es.pumpClient()
	}
}

func (es *evSession) readServer() {
	ok, err := readFD(es.ufd, &es.uin)
	if err != nil {
		es.finish(endUpstreamGone, err)
		return
	}
	if ok {
		es.pumpServer()
	}
}

func (es *evSession) pumpClient() {
	err := es.fromClient()
	switch {
	case err == errTerminated:
		es.finish(endTerminate, nil)
		return
	case err != nil:
		es.finish(endProtocol, err)
		return
	}
	es.ss.relayed[dirClientToServer] += es.cBytes
	es.ss.srv.metrics.forwardedCount(dirClientToServer, es.cMsgs, es.cBytes)
	es.cMsgs, es.cBytes = 0, 0
	es.flushUpstream()
}

func (es *evSession) pumpServer() {
	if err := es.fromServer(); err != nil {
		es.finish(endUpstreamGone, err)
		return
	}
	es.ss.relayed[dirServerToClient] += es.uBytes
	es.ss.srv.metrics.forwardedCount(dirServerToClient, es.uMsgs, es.uBytes)
	es.uMsgs, es.uBytes = 0, 0
	es.flushClient()
	if es.drainNow && len(es.cout.b) == 0 {
		es.finish(endDrained, nil)
	}
}

// flushTo writes as much of o as the socket takes; it reports an error other than a full buffer.
func flushTo(fd int, o *outBuf) error {
	for len(o.b) > 0 {
		n, err := sysWrite(fd, o.b)
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN {
			return nil
		}
		if err != nil {
			return err
		}
		if n == len(o.b) {
			if cap(o.b) > keepBodyBuffer {
				o.b = nil
			} else {
				o.b = o.b[:0]
			}
			return nil
		}
		o.b = o.b[:copy(o.b, o.b[n:])]
	}
	return nil
}

func (es *evSession) flushUpstream() {
	if err := flushTo(es.ufd, &es.uout); err != nil {
		es.finish(endUpstreamGone, err)
	}
}

func (es *evSession) flushClient() {
	if err := flushTo(es.cfd, &es.cout); err != nil {
		es.finish(endClientGone, err)
		return
	}
	if es.drainNow && len(es.cout.b) == 0 {
		es.finish(endDrained, nil)
	}
}

// compact moves the unprocessed tail b[i:] to the front of *buf, growing it when the message it starts must
// be read whole and does not fit, and dropping a grown buffer once it is empty.
func compact(buf *[]byte, i int, need int) {
	b := *buf
	rest := len(b) - i
	if need > cap(b) {
		nb := make([]byte, rest, need)
		copy(nb, b[i:])
		*buf = nb
		return
	}
	if rest == 0 && cap(b) > keepBodyBuffer {
		*buf = make([]byte, 0, readBufferSize)
		return
	}
	*buf = b[:copy(b, b[i:])]
}

// fromClient processes what was read from the client, as clientToServer does, into uout.
func (es *evSession) fromClient() error {
	ss := es.ss
	b := es.cin
	p := ss.srv.currentPlanner()
	limit := ss.cr.max
	i, need := 0, 0
	for i < len(b) {
		if es.cskip > 0 {
			n := min(es.cskip, len(b)-i)
			es.uout.b = append(es.uout.b, b[i:i+n]...)
			i += n
			es.cskip -= n
			continue
		}
		if len(b)-i < 5 {
			break
		}
		typ := b[i]
		length := int(int32(binary.BigEndian.Uint32(b[i+1:])))
		if length < 4 {
			return fmt.Errorf("%w: message %q with length %d", errProtocol, typ, length)
		}
		if limit > 0 && length-4 > limit {
			return fmt.Errorf("%w: message %q of %d bytes exceeds the limit of %d", errProtocol, typ, length, limit)
		}
		total := 1 + length
		inspect := p != nil && (typ == 'Q' || typ == 'P') || typ == 'F' && ss.srv.fastpathGuarded()
		if inspect && len(b)-i < total {
			need = total
			break
		}
		es.cMsgs++
		es.cBytes += uint64(total)
		var set rewrite.Settings
		if inspect {
			set = ss.readingSettings() // before this message counts as pending
		}
		switch typ {
		case 'Q', 'S', 'F':
			ss.pending.Add(1)
			if typ == 'S' {
				ss.unsynced.Store(false)
			}
		case 'P', 'B', 'E', 'D', 'C', 'H':
			ss.unsynced.Store(true)
		case 'd', 'c', 'f', 'p', 'X':
		default:
			return fmt.Errorf("%w: unknown message type %q", errProtocol, typ)
		}
		if inspect {
			body := b[i+5 : i+total]
			var err error
			switch typ {
			case 'F':
				err = ss.functionCallOut(&es.uout, body)
			case 'Q':
				err = ss.queryOut(&es.uout, p, body, set)
			default:
				err = ss.parseOut(&es.uout, p, body, set)
			}
			if err != nil {
				return err
			}
			i += total
			continue
		}
		if typ == 'X' {
			// finishLoop sends Terminate upstream, or keeps the connection for reuse.
			es.cin = es.cin[:0]
			return errTerminated
		}
		n := min(total, len(b)-i)
		es.uout.b = append(es.uout.b, b[i:i+n]...)
		es.cskip = total - n
		i += n
	}
	compact(&es.cin, i, need)
	return nil
}

// fromServer processes what was read from the server, as serverToClient does, into cout.
func (es *evSession) fromServer() error {
	ss := es.ss
	b := es.uin
	i, need := 0, 0
	for i < len(b) {
		if es.uskip > 0 {
			n := min(es.uskip, len(b)-i)
			es.cout.b = append(es.cout.b, b[i:i+n]...)
			i += n
			es.uskip -= n
			continue
		}
		es.uBoundary = true
		if len(b)-i < 5 {
			break
		}
		typ := b[i]
		length := int(int32(binary.BigEndian.Uint32(b[i+1:])))
		if length < 4 {
			es.uBoundary = false
			return fmt.Errorf("upstream sent message %q with length %d", typ, length)
		}
		total := 1 + length
		inspect := typ == 'E' || typ == 'S' || typ == 'Z'
		if inspect && len(b)-i < total {
			need = total
			break
		}
		es.uMsgs++
		es.uBytes += uint64(total)
		if !inspect {
			n := min(total, len(b)-i)
			es.cout.b = append(es.cout.b, b[i:i+n]...)
			es.uskip = total - n
			es.uBoundary = es.uskip == 0
			i += n
			continue
		}
		body := b[i+5 : i+total]
		switch typ {
		case 'E':
			ss.errorOut(&es.cout, body)
		case 'S':
			ss.paramStatusOut(&es.cout, body)
		case 'Z':
			if len(body) != 1 {
				es.uBoundary = false
				return fmt.Errorf("upstream sent ReadyForQuery of %d bytes", len(body))
			}
			if ss.pending.Add(-1) < 0 {
				ss.pending.Store(0)
			}
			ss.txIdle.Store(body[0] == 'I')
			es.setInTx(body[0] != 'I')
			es.cout.b = append(es.cout.b, b[i:i+total]...)
			if ss.srv.draining.Load() && ss.idle() {
				es.drainNow = true
			}
		}
		i += total
	}
	compact(&es.uin, i, need)
	return nil
}

// pollNow is a non-blocking epoll_wait that does not tell the scheduler (it cannot block); 0 on error.
func pollNow(epfd int, events []syscall.EpollEvent) int {
	r, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_WAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0
	}
	return int(r)
}

// setInTx records whether the session is inside a transaction block, for spinPoll.
func (es *evSession) setInTx(in bool) {
	if in == es.inTx {
		return
	}
	es.inTx = in
	if in {
		es.loop.inTx.Add(1)
	} else {
		es.loop.inTx.Add(-1)
	}
}

// spinPoll polls the loop's sockets without sleeping, for up to l.spin, and returns the number of events found
// (0: the loop should sleep in epoll_wait).
//
// Sleeping costs a round trip twice: the thread that sends to a sleeping loop has to wake it, and on a virtual
// machine a CPU that went idle takes tens of microseconds to wake up. Between two messages of one session (a
// query on its way to PostgreSQL and the answer coming back, an answer and the client's next query) there are
// often only tens of microseconds, so the loop polls for a while first, as a spinning mutex does. It gives
// the CPU to any other runnable thread between polls (sched_yield), and it polls only while that takes no CPU
// from anyone: while fewer threads are runnable than there are CPUs (/proc/loadavg), or while one of its
// sessions is inside a transaction, because that session's row locks hold other sessions up and the sooner its
// next statement goes through the sooner they proceed. And at most one loop per two CPUs polls at a time (as
// the Go runtime bounds its own spinning threads), so polling loops never hold every CPU. Under a CPU-bound
// load a loop therefore sleeps at once, like pgbouncer; with one busy client it does not sleep between round
// trips, which took select-only pgbench with one client from about 11,500 to 17,300 TPS on a 2-vCPU VM
// (docs/benchmark.md).
func (l *evLoop) spinPoll(epfd int, events []syscall.EpollEvent, load *loadReader) int {
	spinners := &l.srv.spinners
	if spinners.Add(1) > int32(max(1, load.ncpu/2)) {
		spinners.Add(-1)
		return 0
	}
	defer spinners.Add(-1)
	deadline := time.Now().Add(l.spin)
	for {
		if l.inTx.Load() == 0 && !load.cpuFree() {
			return 0
		}
		syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
		if n := pollNow(epfd, events); n > 0 {
			return n
		}
		if !time.Now().Before(deadline) {
			return 0
		}
	}
}

// loadReader reads how many threads are runnable from /proc/loadavg, whose fourth field is
// "runnable/total" (the reader itself is one of the runnable).
type loadReader struct {
	fd   int // -1: unavailable, so the CPU never counts as free
	ncpu int
	buf  [128]byte
}

func openLoadReader() *loadReader {
	fd, err := syscall.Open("/proc/loadavg", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		fd = -1
	}
	return &loadReader{fd: fd, ncpu: runtime.NumCPU()}
}

func (lr *loadReader) close() {
	if lr.fd >= 0 {
		syscall.Close(lr.fd)
		lr.fd = -1
	}
}

// cpuFree reports whether no thread is waiting for a CPU: at most as many runnable threads as CPUs, counting
// the caller.
func (lr *loadReader) cpuFree() bool {
	if lr.fd < 0 {
		return false
	}
	n, err := syscall.Pread(lr.fd, lr.buf[:], 0)
	if err != nil {
		return false
	}
	r, ok := runnableThreads(lr.buf[:n])
	return ok && r <= lr.ncpu
}

// runnableThreads parses the runnable count out of /proc/loadavg's text ("0.52 0.58 0.59 3/185 12345").
func runnableThreads(b []byte) (int, bool) {
	fields := 0
	i := 0
	for ; i < len(b) && fields < 3; i++ {
		if b[i] == ' ' {
			fields++
		}
	}
	r, digits := 0, 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9' && digits < 9; i++ {
		r = r*10 + int(b[i]-'0')
		digits++
	}
	if digits == 0 || i >= len(b) || b[i] != '/' {
		return 0, false
	}
	return r, true
}
