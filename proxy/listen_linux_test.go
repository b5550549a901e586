package proxy

import (
	"net"
	"syscall"
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
	tuneListener(ln)
	if got := sockopts(t, ln.(*net.TCPListener), [][2]int{{unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT}}); got[0] != deferAcceptSeconds {
		t.Fatalf("TCP_DEFER_ACCEPT = %d, want %d", got[0], deferAcceptSeconds)
	}
}

// A connection accepted by Listen's listener has TCP keepalive on, with the proxy's probes, though Go sets
// none on it (ListenConfig.KeepAlive -1): Linux copies the listening socket's options to it. Without
// tuneListener's keepalive lines it has SO_KEEPALIVE 0 and the kernel's defaults.
func TestListenConnectionsInheritKeepAlive(t *testing.T) {
	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte{0}); err != nil { // TCP_DEFER_ACCEPT: Accept waits for a byte
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	got := sockopts(t, a.(*net.TCPConn), [][2]int{
		{unix.SOL_SOCKET, unix.SO_KEEPALIVE},
		{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE},
		{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL},
		{unix.IPPROTO_TCP, unix.TCP_KEEPCNT},
		{unix.IPPROTO_TCP, unix.TCP_NODELAY},
	})
	want := []int{1, clientKeepAliveSeconds, clientKeepAliveSeconds, clientKeepAliveProbes, 1}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("accepted connection's SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT, TCP_NODELAY = %v, want %v", got, want)
		}
	}
}

// sockopts reads integer socket options of c.
func sockopts(t *testing.T, c interface {
	SyscallConn() (syscall.RawConn, error)
}, opts [][2]int) []int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	got := make([]int, len(opts))
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		for i, o := range opts {
			if got[i], gerr = unix.GetsockoptInt(int(fd), o[0], o[1]); gerr != nil {
				return
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return got
}
