package proxy

import (
	"crypto/tls"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// inputWaiting reports whether bytes the client sent wait unread in the socket of c (a *tls.Conn is asked about
// its connection underneath). False when it cannot tell.
func inputWaiting(c net.Conn) bool {
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
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

// peerClosed reports whether the peer of c closed its connection, or it failed: a read would give EOF or an
// error, and no byte waits (a *tls.Conn is asked about its connection underneath). False when it cannot tell,
// or bytes wait.
func peerClosed(c net.Conn) bool {
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	if err := raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		closed = err == nil && n == 0 || err != nil && err != unix.EAGAIN && err != unix.EINTR
	}); err != nil {
		return true // closed on this side (forceClose)
	}
	return closed
}
