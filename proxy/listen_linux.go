package proxy

import (
	"context"
	"net"

	"golang.org/x/sys/unix"
)

// Listen opens the proxy's client listener on addr (TCP). Its connections get TCP keepalive from the listening
// socket, which Linux copies to every connection it accepts (tuneListener), instead of Go setting it again on
// each: with net.Listen's default that was four setsockopt calls per connection (SO_KEEPALIVE, TCP_KEEPIDLE,
// TCP_KEEPINTVL, TCP_KEEPCNT), the most frequent system call of a connection-per-transaction client's session
// after its reads (pgbench -C: 4.5 per connection, pgbouncer 2; docs/benchmark.md). The probes are as before:
// after 15 s idle, every 15 s, 9 of them.
func Listen(addr string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1} // the listening socket's options apply (tuneListener)
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	tuneListener(ln)
	return ln, nil
}

// tuneListener sets, on a TCP listener, what the connections it accepts inherit: keepalive (Listen) and
// TCP_DEFER_ACCEPT. The latter hands a connection to Accept only once its first bytes arrived (pgbouncer sets
// it by default too): every PostgreSQL client speaks first (SSLRequest, GSSENCRequest, CancelRequest,
// StartupMessage, a TLS ClientHello), so the startup read finds its packet instead of an empty socket, a wait
// in the netpoller and a second read, per connection. A client that sends nothing is accepted after
// deferAcceptSeconds anyway (the kernel's retransmission of its SYN-ACK), and then meets limits.startup_timeout
// as before. Best effort: a listener that refuses an option accepts as before (a listener not made by Listen
// still has Go's keepalive set on each connection).
func tuneListener(ln net.Listener) {
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
		unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1)
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, clientKeepAliveSeconds)
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, clientKeepAliveSeconds)
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPCNT, clientKeepAliveProbes)
	})
}
