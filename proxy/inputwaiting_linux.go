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
