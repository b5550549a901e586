package proxy

import (
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// rawSocket reads and writes a TCP connection of the goroutine transport with the event loop's raw
// non-blocking system calls (sysRead, sysWrite), and parks in Go's netpoller (syscall.RawConn) only when the
// socket is not ready. A net.Conn's Read and Write tell the scheduler about every system call: with 64 clients
// on 8 server connections, the runtime monitor then took processors back from goroutines in a loopback write
// (which runs the receiver's TCP stack and wakes it) and polled every 20 µs, 16% of the proxy's CPU in
// transaction mode (perf, select-only at 64 clients). These calls never block, so they need not tell it.
//
// One goroutine reads and one writes at a time, as with the bufio.Reader and bufio.Writer over it; deadlines
// (interrupt.go) and Close work as for the net.Conn, whose file descriptor and netpoller entry it uses.
type rawSocket struct {
	rc      syscall.RawConn
	pending []byte // bytes read before the socket was wrapped, returned first

	readFn, writeFn func(fd uintptr) bool // made once: a closure per call would be an allocation per call
	rp              []byte
	rn              int
	rerr            error
	wp              []byte
	wn              int
	werr            error

	// waiter, if set (watchWrites), is told when a Write must wait for the peer to read, and when it returned:
	// tryFn is writeFn that reports such a wait (wouldBlock) rather than parking.
	waiter     writeWaiter
	tryFn      func(fd uintptr) bool
	wouldBlock bool

	// Held writes (holdWrites): while holding, Write keeps its bytes in held; the next Read writes them from
	// inside the netpoller's read, after it reset the socket's readiness, and then waits for the answer without
	// reading first (heldFn). heldOut: held's bytes are not all written yet.
	holding bool
	held    []byte
	heldOut bool
	heldFn  func(fd uintptr) bool

	// emptyReads counts the reads that found nothing (EAGAIN) and parked: a system call that a question sent
	// from inside the read (holdWrites) saves. Tests read it once the reader is done.
	emptyReads int
}

// rawIO is c read and written with raw system calls (rawSocket), after the bytes of pending; c itself (after
// pending) when it is not a plain socket, such as a *tls.Conn.
func rawIO(c net.Conn, pending []byte) io.ReadWriter {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return withPending(c, pending)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return withPending(c, pending)
	}
	s := &rawSocket{rc: rc, pending: pending}
	s.readFn = func(fd uintptr) bool {
		for {
			n, err := sysRead(int(fd), s.rp)
			switch err {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				s.emptyReads++
				return false // not ready: RawConn parks in the netpoller and calls again
			}
			s.rn, s.rerr = n, err
			return true
		}
	}
	s.writeFn = func(fd uintptr) bool {
		for s.wn < len(s.wp) {
			n, err := sysWrite(int(fd), s.wp[s.wn:])
			switch err {
			case nil:
				s.wn += n
			case unix.EINTR:
			case unix.EAGAIN:
				return false
			default:
				s.werr = err
				return true
			}
		}
		return true
	}
	s.tryFn = func(fd uintptr) bool {
		s.wouldBlock = !s.writeFn(fd)
		return true
	}
	s.heldFn = func(fd uintptr) bool {
		if !s.heldOut {
			return s.readFn(fd)
		}
		if !s.writeFn(fd) || s.werr != nil {
			return true // the socket is full, or the write failed: writeHeldThenRead goes on from here
		}
		s.heldOut = false
		return false // written: wait for the answer's edge (RawRead parks) without an empty read first
	}
	return s
}

// holdWrites makes Write, from now until holdWrites(false), keep its bytes for the next Read to write.
//
// Why: a goroutine that writes a statement and then reads the answer reads first and parks on EAGAIN, for an
// answer that cannot be there yet: one empty read per statement, a seventh of the proxy's system calls in a
// TPC-B transaction. Go's netpoller forgets a readiness edge that came before a read began (RawRead resets it
// first), so parking without that read would be safe only for bytes sent after the reset: the held bytes are
// written from inside the read, after the reset, and the answer they ask for comes after them. Bytes the server
// sent unasked before the reset (a notice, a FATAL before it closes) are read with the answer, or, when the
// connection closed, with the error its reset or close brings. Only for a reader that waits with a deadline
// (answerInline): nothing else depends on it.
func (s *rawSocket) holdWrites(on bool) { s.holding = on }

// writeHeldThenRead writes the held bytes and reads into s.rp, as Read does with readFn. The held bytes are
// written whatever the read does (a deadline that passed, an interrupt): a statement the caller counts as
// sent is sent.
func (s *rawSocket) writeHeldThenRead() (readErr, writeErr error) {
	s.wp, s.wn, s.werr, s.heldOut = s.held, 0, nil, true
	readErr = s.rc.Read(s.heldFn)
	if s.heldOut {
		// Not all written inside the read: the rest as Write writes, then the read as usual.
		s.heldOut = false
		if s.werr == nil {
			writeErr = s.rc.Write(s.writeFn)
		}
		if writeErr == nil && s.werr != nil {
			writeErr = &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("sendto", s.werr)}
		}
		if readErr == nil && writeErr == nil {
			readErr = s.rc.Read(s.readFn)
		}
	}
	s.wp, s.held = nil, s.held[:0]
	return readErr, writeErr
}

func (s *rawSocket) Read(p []byte) (int, error) {
	if len(s.pending) > 0 {
		n := copy(p, s.pending)
		s.pending = s.pending[n:]
		return n, nil
	}
	if len(p) == 0 {
		return 0, nil
	}
	s.rp, s.rn, s.rerr = p, 0, nil
	var err error
	if len(s.held) > 0 {
		var werr error
		if err, werr = s.writeHeldThenRead(); werr != nil {
			s.rp = nil
			return 0, werr
		}
	} else {
		err = s.rc.Read(s.readFn)
	}
	n, rerr := s.rn, s.rerr
	s.rp = nil
	switch {
	case err != nil: // closed, or a deadline: errors.Is(err, net.ErrClosed), isTimeout(err) as for the net.Conn
		return 0, err
	case rerr != nil:
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", rerr)}
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// watchWrites makes Write tell w when it must wait for the peer to read, and when that write returned.
func (s *rawSocket) watchWrites(w writeWaiter) { s.waiter = w }

// writeWatched writes s.wp as Write does, telling s.waiter around the wait when the socket cannot take it all
// now. The first try is the same system calls as an unwatched write; only a write that must wait tries again,
// parked. The waiter is told outside RawConn.Write: a Close waiting for this write to let go of the socket
// (endStuckWrites) may hold the waiter's lock.
func (s *rawSocket) writeWatched() error {
	s.wouldBlock = false
	if err := s.rc.Write(s.tryFn); err != nil || !s.wouldBlock {
		return err
	}
	s.waiter.writeWaits(true)
	defer s.waiter.writeWaits(false)
	return s.rc.Write(s.writeFn)
}

func (s *rawSocket) Write(p []byte) (int, error) {
	if s.holding {
		s.held = append(s.held, p...)
		return len(p), nil
	}
	if len(s.held) > 0 {
		// Bytes held for a read that did not come first go out before these: a write never overtakes them.
		if _, err := s.write(s.held); err != nil {
			return 0, err
		}
		s.held = s.held[:0]
	}
	return s.write(p)
}

// write writes p now (Write without the held bytes).
func (s *rawSocket) write(p []byte) (int, error) {
	s.wp, s.wn, s.werr = p, 0, nil
	var err error
	if s.waiter == nil {
		err = s.rc.Write(s.writeFn)
	} else {
		err = s.writeWatched()
	}
	n, werr := s.wn, s.werr
	s.wp = nil
	switch {
	case err != nil:
		return n, err
	case werr != nil:
		return n, &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("sendto", werr)}
	}
	return n, nil
}
