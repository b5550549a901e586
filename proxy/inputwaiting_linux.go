package proxy

import (
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// inputWaiting reports whether bytes the client sent wait unread in the socket of c (a *tls.Conn is asked about
// its connection underneath). False when it cannot tell.
func inputWaiting(c net.Conn) bool {
	raw := socketOf(c)
	if raw == nil {
		return false
	}
	// A raw call, as rawSocket's: SIOCINQ never blocks, and a lend asks it of every idle server connection it takes.
	var n int32
	if err := raw.Control(func(fd uintptr) {
		unix.RawSyscall(unix.SYS_IOCTL, fd, unix.SIOCINQ, uintptr(unsafe.Pointer(&n)))
	}); err != nil {
		return false
	}
	return n > 0
}

// spokeOrClosed reports whether the peer of c sent bytes that wait unread, or closed its side (its FIN or a
// reset came), in one call that never blocks (a *tls.Conn is asked about its connection underneath): a peek at
// one byte gives more than zero, zero at the end of the stream, or an error other than "nothing yet". A server
// killed with SIGKILL, or a host or middlebox that dropped the connection, sends no FATAL, only that end: an
// idle server connection must not be lent after it. False when it cannot tell.
func spokeOrClosed(c net.Conn) bool {
	raw := socketOf(c)
	if raw == nil {
		return false
	}
	var b [1]byte
	gone := false
	if err := raw.Control(func(fd uintptr) {
		_, _, errno := unix.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		gone = errno != unix.EAGAIN && errno != unix.EINTR // 0: a byte, or the end of the stream
	}); err != nil {
		return true // closed on this side
	}
	return gone
}

// peerClosed reports whether the peer of c has closed its connection (a *tls.Conn is asked about its connection
// underneath): TCP says so (the peer's FIN came: CLOSE_WAIT; or a reset: CLOSE), whatever bytes it sent before
// wait unread. Bytes often do: a driver's Terminate before it closes (libpq's PQfinish, JDBC), a message it
// pipelined, TLS's close_notify. False when it cannot tell.
func peerClosed(c net.Conn) bool {
	raw := socketOf(c)
	if raw == nil {
		return false
	}
	closed := false
	if err := raw.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		closed = err == nil && (info.State == tcpCloseWait || info.State == tcpClose)
	}); err != nil {
		return true // closed on this side (forceClose)
	}
	return closed
}

// TCP states of Linux's tcp_info (include/net/tcp_states.h).
const (
	tcpClose     = 7
	tcpCloseWait = 8
)
