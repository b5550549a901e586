//go:build linux

package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// evSession is a session's state while the loop relays it; after done is closed it belongs to the session
// goroutine again, which ends it (end.go) through loopIO.
//
// Buffer ownership: cin and uin hold bytes read from the client and the upstream and not processed yet, at the
// front; the core is given bodies that point into them, valid for the call only. uout and cout hold what the
// core and the framing produced for the other side, until the socket takes it. All four are the loop
// goroutine's.
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

	end       endReason
	endErr    error
	uBoundary bool // the server side stopped between messages
	inTx      bool // counted in loop.inTx
	drainNow  bool

	// held is what the message at the front of cin waits for off the loop (heldNot: nothing): a worker planning
	// its Query or Parse (heldForPlan), which posts the plan back as job, or a goroutine asking its lock
	// question (heldForLock, lockquestion.go). The client side is then neither read nor processed. One field,
	// not a flag per cause: every message's pass through the loop reads it (fromClient), and only one can hold
	// the message at a time.
	held  heldFor
	job   *planJob
	fixed fixedPlan // the planner the core is given for a plan known in advance
	// lock: the lock question of the message at the front of cin, then its answer, until that message goes
	// through the core (a pass that sends it to be planned first keeps it; lockquestion.go).
	lock *lockJob

	done chan struct{}

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
func (ss *session) runInLoop() (ending, sessionIO, bool) {
	cfd, err := dupConnFD(ss.client)
	if err != nil {
		ss.logger().Debug("event loop handover failed", "err", err)
		return ending{}, nil, false
	}
	ufd, err := dupConnFD(ss.upstream)
	if err != nil {
		unix.Close(cfd)
		ss.logger().Debug("event loop handover failed", "err", err)
		return ending{}, nil, false
	}
	es := &evSession{ss: ss, loop: ss.srv.pickLoop(), cfd: cfd, ufd: ufd, uBoundary: true, done: make(chan struct{})}
	es.cin = takeBuffered(ss.cr.r)
	es.uin = takeBuffered(ss.sr.r)
	ss.evMu.Lock()
	if ss.closed {
		ss.evMu.Unlock()
		// forceClose got here first: end at once; the dups are the last references.
		es.forced.Store(true)
		return ending{why: endClientGone, err: net.ErrClosed}, &loopIO{es}, true
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
	return ending{why: es.end, err: es.endErr, atBoundary: es.uBoundary}, &loopIO{es}, true
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
	if err := rc.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, fmt.Errorf("dup: %w", derr)
	}
	if err := unix.SetNonblock(nfd, true); err != nil {
		unix.Close(nfd)
		return -1, err
	}
	return nfd, nil
}

// fdConn makes a net.Conn of a duplicate of fd; fd stays open.
func fdConn(fd int) (net.Conn, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup: %w", err)
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
	unix.Shutdown(es.cfd, unix.SHUT_RDWR)
	unix.Shutdown(es.ufd, unix.SHUT_RDWR)
}

// shutdownUpstream cuts a looped session's upstream connection from outside (a change of primary): the loop
// sees it close and ends the session from the upstream side.
func (es *evSession) shutdownUpstream() {
	es.mu.Lock()
	defer es.mu.Unlock()
	if !es.fdsClosed {
		unix.Shutdown(es.ufd, unix.SHUT_RDWR)
	}
}

func (es *evSession) closeFDs() {
	es.mu.Lock()
	defer es.mu.Unlock()
	if !es.fdsClosed {
		es.fdsClosed = true
		unix.Close(es.cfd)
		unix.Close(es.ufd)
	}
}

// loopIO is how the session's end (end.go) reaches the sockets of a session the loop gave back.
type loopIO struct{ es *evSession }

func (l *loopIO) forced() bool { return l.es.forced.Load() }

func (l *loopIO) sendUpstream(b []byte) {
	l.es.uout.b = append(l.es.uout.b, b...)
	writeAllFD(l.es.ufd, l.es.uout.b, time.Now().Add(farewellTimeout))
}

func (l *loopIO) sendClient(b []byte) {
	l.es.cout.b = append(l.es.cout.b, b...)
	writeAllFD(l.es.cfd, l.es.cout.b, time.Now().Add(farewellTimeout))
}

func (l *loopIO) finishClientMessage(deadline time.Time) bool {
	es := l.es
	for es.uskip > 0 {
		if len(es.uin) == 0 {
			if cap(es.uin) == 0 {
				es.uin = make([]byte, 0, readBufferSize)
			}
			ok, err := readFD(es.ufd, &es.uin)
			if err != nil || !ok && !waitFD(es.ufd, unix.POLLIN, deadline) {
				return false
			}
			continue
		}
		n := min(es.uskip, len(es.uin))
		es.cout.b = append(es.cout.b, es.uin[:n]...)
		es.uin = es.uin[:copy(es.uin, es.uin[n:])]
		es.uskip -= n
		if len(es.cout.b) >= keepBodyBuffer && !flushWithin(es.cfd, &es.cout, deadline) {
			return false
		}
	}
	return true
}

// flushWithin writes all of o to a non-blocking socket, waiting for it to drain until deadline (false then).
func flushWithin(fd int, o *outBuf, deadline time.Time) bool {
	for len(o.b) > 0 {
		if flushTo(fd, o) != nil {
			return false
		}
		if len(o.b) > 0 && !waitFD(fd, unix.POLLOUT, deadline) {
			return false
		}
	}
	return true
}

func (l *loopIO) lingerClient(deadline time.Time) {
	fd := l.es.cfd
	if unix.Shutdown(fd, unix.SHUT_WR) != nil {
		return
	}
	discardUntilEOF(fd, deadline)
}

func (l *loopIO) drainUpstream(deadline time.Time) bool {
	l.es.uin = l.es.uin[:0]
	return discardUntilEOF(l.es.ufd, deadline)
}

// discardUntilEOF reads and discards what a non-blocking socket receives until end of file (true), an error or
// deadline (false).
func discardUntilEOF(fd int, deadline time.Time) bool {
	var discard [4096]byte
	for {
		n, err := sysRead(fd, discard[:])
		switch {
		case n > 0:
			continue
		case err == nil:
			return true
		case err != unix.EAGAIN && err != unix.EINTR:
			return false
		}
		if !waitFD(fd, unix.POLLIN, deadline) {
			return false
		}
	}
}

func (l *loopIO) keepable() bool {
	return len(l.es.uout.b) == 0 && len(l.es.uin) == 0 && l.es.uskip == 0
}

func (l *loopIO) takeUpstream() (net.Conn, error) { return fdConn(l.es.ufd) }

func (l *loopIO) close() { l.es.closeFDs() }

// writeAllFD writes b to a non-blocking socket, waiting for it to drain until deadline; best effort.
func writeAllFD(fd int, b []byte, deadline time.Time) {
	for len(b) > 0 {
		n, err := sysWrite(fd, b)
		if n > 0 {
			b = b[n:]
			continue
		}
		if err != unix.EAGAIN && err != unix.EINTR {
			return
		}
		if !waitFD(fd, unix.POLLOUT, deadline) {
			return
		}
	}
}

// waitFD waits until a non-blocking socket is ready for events (POLLIN, POLLOUT) or deadline passes; false when
// the deadline has passed or poll failed.
func waitFD(fd int, events int16, deadline time.Time) bool {
	left := time.Until(deadline)
	if left <= 0 {
		return false
	}
	pfd := []unix.PollFd{{Fd: int32(fd), Events: events}}
	_, err := unix.Poll(pfd, int(left.Milliseconds())+1)
	return err == nil || err == unix.EINTR
}

// start registers a new session's sockets and relays what was buffered at the handover.
func (es *evSession) start(epfd int, byFD map[int32]*evSession) {
	es.setInTx(es.ss.state.inTx())
	byFD[int32(es.cfd)] = es
	byFD[int32(es.ufd)] = es
	es.cEv, es.uEv = unix.EPOLLIN, unix.EPOLLIN
	ev := unix.EpollEvent{Events: es.cEv, Fd: int32(es.cfd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, es.cfd, &ev); err != nil {
		es.finish(endRelayFailed, fmt.Errorf("epoll_ctl add client socket: %w", err))
		return
	}
	ev = unix.EpollEvent{Events: es.uEv, Fd: int32(es.ufd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, es.ufd, &ev); err != nil {
		es.finish(endRelayFailed, fmt.Errorf("epoll_ctl add upstream socket: %w", err))
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
	if es.end == endNone {
		es.updateInterest(epfd)
	}
}

// release takes an ended session out of the loop and gives it back to its goroutine.
func (es *evSession) release(epfd int, byFD map[int32]*evSession) {
	for _, fd := range [2]int{es.cfd, es.ufd} {
		if byFD[int32(fd)] != es {
			continue
		}
		delete(byFD, int32(fd))
		// The socket must leave this epoll set now: a kept upstream lives on in a dup of the same file
		// description, and its events would reach whichever session gets the descriptor number next.
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_DEL, fd, nil); err != nil && es.end != endRelayFailed {
			es.ss.logger().Warn("epoll_ctl del failed; not keeping the upstream connection", "err", err)
			es.forced.Store(true)
		}
	}
	es.setInTx(false)
	l := es.loop
	l.mu.Lock()
	l.nsess--
	l.mu.Unlock()
	close(es.done)
}

func (es *evSession) finish(kind endReason, err error) {
	if es.end == endNone {
		es.end, es.endErr = kind, err
	}
}

// guard runs f, turning a panic into the end of this session only, as handle's recover does.
func (es *evSession) guard(f func()) {
	defer func() {
		if r := recover(); r != nil {
			es.panicked(r)
		}
	}()
	f()
}

func (es *evSession) panicked(r any) {
	es.ss.logger().Error("session panic", "panic", r)
	es.forced.Store(true)
	es.finish(endClientGone, fmt.Errorf("panic: %v", r))
}

func (es *evSession) checkDrain() {
	if es.ss.state.idle() && es.clientQuiet() {
		es.finish(endDrained, nil)
	}
}

// clientQuiet reports whether nothing the client sent waits in the loop: no message partly read, none held
// while its statement is planned. A drain closes a session only then, so it never drops a statement that the
// core has not counted as pending yet.
func (es *evSession) clientQuiet() bool {
	return len(es.cin) == 0 && es.cskip == 0 && es.held == heldNot
}

// heldFor is what holds the message at the front of an evSession's cin (evSession.held).
type heldFor uint8

const (
	heldNot     heldFor = iota // nothing: the client side is read and processed
	heldForPlan                // a worker plans its statement (planFor, planned)
	heldForLock                // a goroutine asks its lock question (askLock, lockAnswered)
)

func (es *evSession) event(fd int32, ev uint32, epfd int) {
	es.guard(func() {
		const hup = unix.EPOLLHUP | unix.EPOLLERR
		if fd == int32(es.cfd) {
			if ev&(unix.EPOLLOUT|hup) != 0 && len(es.cout.b) > 0 {
				es.flushClient()
			}
			if es.end == endNone && ev&(unix.EPOLLIN|hup) != 0 {
				switch {
				case len(es.uout.b) == 0 && es.held == heldNot:
					es.readClient()
				case ev&hup != 0:
					es.finish(endClientGone, io.EOF)
				}
			}
		} else {
			if ev&(unix.EPOLLOUT|hup) != 0 && len(es.uout.b) > 0 {
				es.flushUpstream()
			}
			if es.end == endNone && ev&(unix.EPOLLIN|hup) != 0 {
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

// updateInterest registers what the loop waits for on each socket. Back-pressure: a side is not read while
// what was read from it still waits to be written to the other side, nor while its message is held (held).
func (es *evSession) updateInterest(epfd int) {
	var c, u uint32
	if len(es.uout.b) == 0 {
		if es.held == heldNot {
			c |= unix.EPOLLIN
		}
	} else {
		u |= unix.EPOLLOUT
	}
	if len(es.cout.b) == 0 {
		u |= unix.EPOLLIN
	} else {
		c |= unix.EPOLLOUT
	}
	if c != es.cEv {
		es.cEv = c
		ev := unix.EpollEvent{Events: c, Fd: int32(es.cfd)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_MOD, es.cfd, &ev); err != nil {
			es.finish(endRelayFailed, fmt.Errorf("epoll_ctl mod client socket: %w", err))
			return
		}
	}
	if u != es.uEv {
		es.uEv = u
		ev := unix.EpollEvent{Events: u, Fd: int32(es.ufd)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_MOD, es.ufd, &ev); err != nil {
			es.finish(endRelayFailed, fmt.Errorf("epoll_ctl mod upstream socket: %w", err))
		}
	}
}

// readFD reads once into the free end of *buf (level-triggered epoll calls again if more is waiting).
func readFD(fd int, buf *[]byte) (bool, error) {
	b := *buf
	n, err := sysRead(fd, b[len(b):cap(b)])
	if err == unix.EAGAIN || err == unix.EINTR {
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
	case errors.As(err, new(*sessionRefused)):
		es.finish(endRefused, err)
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
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
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

// fromClient frames what was read from the client and gives each message to the core, into uout. Messages
// the core does not read are streamed through as they arrive. It stops early, leaving the message at the
// front of cin, when that message goes to a worker: its statement to be planned, or its lock question.
func (es *evSession) fromClient() error {
	ss := es.ss
	b := es.cin
	box := ss.srv.plannerNow()
	p := box.p
	ss.planGen = box.gen // the generation of p, for what the core keeps of the client's statements (reloadkept.go)
	limit := ss.cr.max
	i, need := 0, 0
	for i < len(b) && es.held == heldNot {
		if es.cskip > 0 {
			n := min(es.cskip, len(b)-i)
			es.uout.b = append(es.uout.b, b[i:i+n]...)
			i += n
			es.cskip -= n
			continue
		}
		if len(b)-i < headerLen {
			break
		}
		typ, n, err := parseHeader(b[i:], limit)
		if err != nil {
			return err
		}
		total := headerLen + n
		whole := ss.clientNeedsBody(typ, p)
		if whole && len(b)-i < total {
			need = total
			break
		}
		var body []byte
		mp := p
		if whole {
			body = b[i+headerLen : i+total]
			if typ == msgQuery || typ == msgParse {
				var ready bool
				if mp, ready = es.planFor(typ, body, p); !ready {
					break // planned on a worker; this message waits at the front of cin
				}
			}
		}
		err = ss.onClientMsg(typ, body, mp, &es.uout)
		if err == errLockQuestionAsked {
			es.askLock()
			break // asked on a goroutine; this message waits at the front of cin
		}
		// The message went through the core: an answer it did not take (no longer needed) serves no later one.
		es.lock = nil
		if err != nil {
			if err == errTerminated {
				es.cin = es.cin[:0]
			}
			return err
		}
		es.cMsgs++
		es.cBytes += uint64(total)
		if whole {
			i += total
			continue
		}
		k := min(total, len(b)-i)
		es.uout.b = append(es.uout.b, b[i:i+k]...)
		es.cskip = total - k
		i += k
	}
	compact(&es.cin, i, need)
	return nil
}

// fromServer frames what was read from the server and gives each message to the core, into cout.
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
		if len(b)-i < headerLen {
			break
		}
		typ, n, err := parseHeader(b[i:], 0)
		if err != nil {
			return err
		}
		total := headerLen + n
		whole := ss.serverNeedsBody(typ)
		if whole && len(b)-i < total {
			need = total
			break
		}
		es.uMsgs++
		es.uBytes += uint64(total)
		if !whole {
			ss.onServerMsg(typ, nil, &es.cout)
			k := min(total, len(b)-i)
			es.cout.b = append(es.cout.b, b[i:i+k]...)
			es.uskip = total - k
			es.uBoundary = es.uskip == 0
			i += k
			continue
		}
		ev, err := ss.onServerMsg(typ, b[i+headerLen:i+total], &es.cout)
		if err != nil {
			es.uBoundary = false
			return err
		}
		if typ == msgReadyForQuery {
			es.setInTx(ss.state.inTx())
		}
		if ev&evDrainNow != 0 && es.clientQuiet() {
			es.drainNow = true
		}
		i += total
	}
	compact(&es.uin, i, need)
	return nil
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

// Planning off the loop (#20: a miss must not stall the other sessions of a loop). A plan that is not cached
// costs a parse and a deparse, a fraction of a millisecond; the loop asks the planner for the plan only if it
// can answer at once (tryPlanner), and otherwise has a worker goroutine plan the statement while the session's
// client side waits: the message stays at the front of cin, nothing after it is processed, and the client is
// not read. The server side goes on (answers to earlier statements still reach the client). When the worker
// posts the plan, the loop processes the message again with that plan, if it is still for the same text under
// the same settings (an answer relayed meanwhile may have changed them), else it asks again.

// tryPlanner is a Planner that can say whether it answers without planning (rewrite.Cache).
type tryPlanner interface {
	TryPlan(sql []byte, set rewrite.Settings) (rewrite.Plan, bool)
}

// planJob is a statement planned by a worker for a looped session.
type planJob struct {
	es       *evSession
	p        Planner
	sql      []byte // a copy: cin moves
	set      rewrite.Settings
	plan     rewrite.Plan
	panicked any
}

// fixedPlan is a Planner that answers with a plan known in advance, made by src.
type fixedPlan struct {
	plan rewrite.Plan
	src  Planner
}

func (f *fixedPlan) Plan([]byte, rewrite.Settings) rewrite.Plan { return f.plan }

// source is the planner that made the plan (positions.go: it maps the positions of the plan's answers).
func (f *fixedPlan) source() Planner { return f.src }

// planFor returns the planner to give the core for the Query or Parse body at the front of cin: one that
// answers with a plan already known (a cache hit, or a worker's plan for this text and settings). It returns
// false when the plan is not known: a worker plans it, and the session's client side waits.
func (es *evSession) planFor(typ byte, body []byte, p Planner) (Planner, bool) {
	tp, ok := p.(tryPlanner)
	if !ok {
		return p, true
	}
	sql, ok := planText(typ, body)
	if !ok {
		return p, true // malformed: the core refuses it
	}
	set := es.ss.readingSettings()
	if j := es.job; j != nil {
		es.job = nil
		// The worker's plan is used only if nothing it was made from changed meanwhile: the text, the reading
		// settings, and the planner (a reloaded table list or catalog is a new planner; planners are pointers).
		if j.set == set && j.p == p && bytes.Equal(j.sql, sql) {
			es.fixed.plan, es.fixed.src = j.plan, p
			return &es.fixed, true
		}
	}
	if plan, hit := tp.TryPlan(sql, set); hit {
		es.fixed.plan, es.fixed.src = plan, p
		return &es.fixed, true
	}
	es.held = heldForPlan
	j := &planJob{es: es, p: p, sql: bytes.Clone(sql), set: set}
	go j.run()
	return nil, false
}

// run plans the job's statement and gives the result to the loop.
func (j *planJob) run() {
	defer func() {
		if r := recover(); r != nil {
			j.panicked = r
		}
		j.es.loop.post(evCmd{es: j.es, planned: j})
	}()
	j.plan = j.p.Plan(j.sql, j.set)
}

// planned goes on with a session whose statement a worker planned.
func (es *evSession) planned(j *planJob, epfd int) {
	es.held = heldNot
	if j.panicked != nil {
		es.panicked(j.panicked)
		return
	}
	es.job = j
	es.guard(es.pumpClient)
	es.job = nil
	if es.end == endNone {
		es.updateInterest(epfd)
	}
}

// The lock question off the loop (lockquestion.go): the message waits at the front of cin as one being planned
// does, while a goroutine asks the host; its answer comes back as a command (evCmd.asked).

// lockJob is a looped session's lock question, asked by a goroutine.
type lockJob struct {
	es       *evSession
	q        lockQuestion
	panicked any
}

// lockAnswer is session.lockAnswer in the loop: the answer the loop brought for the message, if it is q's
// (taken: it serves that one pass only); else q is kept for askLock to ask, and the message waits.
func (es *evSession) lockAnswer(q lockQuestion) (lockQuestion, bool) {
	if j := es.lock; j != nil && j.q.answered && j.q.host == q.host && j.q.db == q.db && j.q.pid == q.pid && j.q.hold == q.hold {
		es.lock = nil
		return j.q, true
	}
	es.lock = &lockJob{es: es, q: q}
	return q, false
}

// askLock has a goroutine ask the question lockAnswer kept, while the session's client side waits: one per
// session at most, as nothing more of the client's is read or processed until its answer (lockAnswered).
func (es *evSession) askLock() {
	es.held = heldForLock
	go es.lock.run()
}

// run asks the job's question and gives the answer to the loop.
func (j *lockJob) run() {
	defer func() {
		if r := recover(); r != nil {
			j.panicked = r
		}
		j.es.loop.post(evCmd{es: j.es, asked: j})
	}()
	j.q.ask(j.es.ss.srv)
}

// lockAnswered goes on with a session whose message's lock question was answered: the message goes through the
// core again, which takes the answer and sends the message or ends the session.
func (es *evSession) lockAnswered(j *lockJob, epfd int) {
	es.held = heldNot
	if j.panicked != nil {
		es.panicked(j.panicked)
		return
	}
	// The answer waits in es.lock until the message goes through the core (fromClient): this pass may first
	// send its statement to a worker to be planned (a plan not cached), and the next pass takes it.
	es.guard(es.pumpClient)
	if es.end == endNone {
		es.updateInterest(epfd)
	}
}
