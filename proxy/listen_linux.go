package proxy

import (
	"net"

	"golang.org/x/sys/unix"
)

// deferAccept makes a TCP listener hand a connection to Accept only once its first bytes arrived (Linux's
// TCP_DEFER_ACCEPT, which pgbouncer sets by default too): every PostgreSQL client speaks first (SSLRequest,
// GSSENCRequest, CancelRequest, StartupMessage, a TLS ClientHello), so the startup read finds its packet instead of
// an empty socket, a wait in the netpoller and a second read, per connection. A client that sends nothing is
// accepted after deferAcceptSeconds anyway (the kernel's retransmission of its SYN-ACK), and then meets
// limits.startup_timeout as before. Best effort: a listener that refuses the option accepts as before.
func deferAccept(ln net.Listener) {
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		return
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, deferAcceptSeconds)
	})
}
