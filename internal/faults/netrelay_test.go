package faults

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// netRelay is a TCP relay between the proxy and PostgreSQL that the test can stall (per direction) or cut.
// While a direction is stalled, the relay reads what arrives but holds it back, as a network that has stopped
// delivering would; Thaw delivers it, late.
type netRelay struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	cond     *sync.Cond
	stallUp  bool // proxy to PostgreSQL
	stallDn  bool // PostgreSQL to proxy
	conns    map[net.Conn]struct{}
	gen      int          // incremented by Cut; a copy loop of an older generation gives up
	heldUp   atomic.Int64 // bytes read from the proxy and not yet delivered
	accepted atomic.Int64
}

func startRelay(t *testing.T, target string) *netRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &netRelay{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	r.cond = sync.NewCond(&r.mu)
	go r.serve()
	t.Cleanup(func() {
		ln.Close()
		r.Thaw()
		r.Cut()
	})
	return r
}

func (r *netRelay) Addr() string { return r.ln.Addr().String() }

func (r *netRelay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.accepted.Add(1)
		go r.pair(c)
	}
}

func (r *netRelay) pair(client net.Conn) {
	server, err := net.Dial("tcp", r.target)
	if err != nil {
		client.Close()
		return
	}
	r.mu.Lock()
	r.conns[client], r.conns[server] = struct{}{}, struct{}{}
	gen := r.gen
	r.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { r.copy(server, client, true, gen); done <- struct{}{} }()
	go func() { r.copy(client, server, false, gen); done <- struct{}{} }()
	<-done
	client.Close()
	server.Close()
	<-done
	r.mu.Lock()
	delete(r.conns, client)
	delete(r.conns, server)
	r.mu.Unlock()
}

func (r *netRelay) copy(dst, src net.Conn, up bool, gen int) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if up {
				r.heldUp.Add(int64(n))
			}
			r.mu.Lock()
			for ((up && r.stallUp) || (!up && r.stallDn)) && r.gen == gen {
				r.cond.Wait()
			}
			cut := r.gen != gen
			r.mu.Unlock()
			if cut {
				return
			}
			_, werr := dst.Write(buf[:n])
			if up {
				r.heldUp.Add(-int64(n))
			}
			if werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			if tc, ok := dst.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			return
		}
	}
}

// Stall holds back traffic in the given directions from now on.
func (r *netRelay) Stall(up, down bool) {
	r.mu.Lock()
	r.stallUp, r.stallDn = up, down
	r.mu.Unlock()
	r.cond.Broadcast()
}

// Thaw delivers what was held back and lets traffic flow again.
func (r *netRelay) Thaw() { r.Stall(false, false) }

// Cut resets every connection through the relay (new ones are still accepted).
func (r *netRelay) Cut() {
	r.mu.Lock()
	r.gen++
	for c := range r.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
	r.mu.Unlock()
	r.cond.Broadcast()
}
