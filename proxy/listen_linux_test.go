package proxy

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// A TCP listener the proxy serves hands connections to Accept only once the client spoke (TCP_DEFER_ACCEPT).
func TestDeferAcceptSetsTheOption(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	deferAccept(ln)
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got int
	var gerr error
	if err := rc.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil || got != deferAcceptSeconds {
		t.Fatalf("TCP_DEFER_ACCEPT = %d (%v), want %d", got, gerr, deferAcceptSeconds)
	}
}
