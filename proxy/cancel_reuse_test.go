package proxy_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// cancelHoldingRelay is a TCP relay between the proxy and PostgreSQL that passes sessions through and holds each
// CancelRequest connection (its first packet) until the test releases it: a cancel still on its way to the
// server, as one is under load (the proxy dials the server for each).
type cancelHoldingRelay struct {
	ln      net.Listener
	target  string
	arrived chan struct{} // one send per CancelRequest that reached the relay
	release chan struct{} // closed (Release): held cancels go on
	once    sync.Once
}

// Release lets the held cancels, and those to come, go on.
func (r *cancelHoldingRelay) Release() { r.once.Do(func() { close(r.release) }) }

// awaitArrival waits up to 10 s for the next CancelRequest to reach the relay (the proxy dialled the server
// with it), failing the test with what otherwise.
func (r *cancelHoldingRelay) awaitArrival(t *testing.T, what string) {
	t.Helper()
	select {
	case <-r.arrived:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not reach the server's side within 10s", what)
	}
}

func startCancelHoldingRelay(t *testing.T, target string) *cancelHoldingRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &cancelHoldingRelay{ln: ln, target: target, arrived: make(chan struct{}, 16), release: make(chan struct{})}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.pair(c, track)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		r.Release()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return r
}

func (r *cancelHoldingRelay) pair(client net.Conn, track func(net.Conn)) {
	defer client.Close()
	var head [8]byte
	if _, err := io.ReadFull(client, head[:]); err != nil {
		return
	}
	if binary.BigEndian.Uint32(head[4:]) == 80877102 { // CancelRequest
		r.arrived <- struct{}{}
		<-r.release
	}
	server, err := net.Dial("tcp", r.target)
	if err != nil {
		return
	}
	track(server)
	defer server.Close()
	if _, err := server.Write(head[:]); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		io.Copy(client, server)
		client.Close()
		close(done)
	}()
	io.Copy(server, client)
	server.Close()
	<-done
}

// A cancel of a session that was on its way to PostgreSQL when the session ended must not reach the backend
// once the proxy keeps it for another session (upstream reuse, session mode): it would stop that session's
// statement. The client's key stops finding the ended session at once, and the backend is kept only after the
// cancels already sent for it were delivered. Before 2026-12-05 the ended session's backend went to the reuse
// pool at once, and a cancel dialing the server then (or looked up in the moment before the session
// unregistered) cancelled the next session's statement.
func TestCancelOnItsWayNeverReachesTheNextSessionOfTheBackend(t *testing.T) {
	pgtest.Require(t, pg)
	relay := startCancelHoldingRelay(t, pg.Addr())
	p := proxytest.Start(t, relay.ln.Addr().String(), proxytest.Options{})
	dsn := reuseDSN(p, reuseApp(t))

	a := connect(t, dsn)
	pidA := pidOf(t, a)
	cancelSent := make(chan error, 1)
	go func() { cancelSent <- sendCancelRequest(p.Addr, a.PgConn().PID(), a.PgConn().SecretKey()) }()
	select {
	case <-relay.arrived: // the proxy looked A up and is dialing the server with A's backend's key
	case err := <-cancelSent:
		t.Fatalf("A's CancelRequest never reached the server's side (the proxy dropped it): %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("A's CancelRequest did not reach the server's side within 10s")
	}
	closeConn(t, a)

	// The backend is kept only once the cancel is delivered: the proxy says it waits for it, and keeps none.
	eventually(t, 10*time.Second, "the proxy to wait for A's cancel before keeping its backend", func() bool {
		return strings.Contains(p.Logs.String(), "keeping the upstream connection waits for a cancel on its way to it")
	})
	if v, _ := metricValue(t, p.Registry, metricIdle); v != 0 {
		t.Fatalf("A's backend was kept (%v idle) while A's cancel was on its way to it", v)
	}
	relay.Release()
	if err := <-cancelSent; err != nil {
		t.Fatalf("A's CancelRequest: %v", err)
	}
	waitIdle(t, p, 1)

	// B gets A's backend, and its statement runs to the end: nothing of A's reaches it.
	b := connect(t, dsn)
	defer closeConn(t, b)
	if pid := pidOf(t, b); pid != pidA {
		t.Fatalf("B got backend %d, A had %d: not reused, the test cannot go on", pid, pidA)
	}
	held := holdQuery(t, b)
	held.stillRunning(t, "A's cancel, delivered before B got the backend")
	if err := held.release(t); err != nil {
		t.Fatalf("B's statement on A's old backend: %v", err)
	}
}

// sendCancelRequest sends a CancelRequest for (pid, key) to addr and waits until the proxy closes the
// connection, as libpq does.
func sendCancelRequest(addr string, pid uint32, key []byte) error {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.Write(cancelRequestPacket(pid, key)); err != nil {
		return err
	}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	var b [1]byte
	if _, err := conn.Read(b[:]); !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}
