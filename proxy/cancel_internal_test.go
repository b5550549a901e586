package proxy

import (
	"bufio"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// fakePostmaster takes cancel requests as PostgreSQL does: it reads the packet, and closes the connection
// (the cancel is taken) only when the test says so (release).
type fakePostmaster struct {
	ln  net.Listener
	got chan []byte   // each request's packet, as it arrives
	rel chan struct{} // one receive per request: it is taken, the connection closes
}

func newFakePostmaster(t *testing.T) *fakePostmaster {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fp := &fakePostmaster{ln: ln, got: make(chan []byte, 64), rel: make(chan struct{})}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 16)
				if _, err := io.ReadFull(c, b); err != nil {
					return
				}
				fp.got <- b
				select {
				case <-fp.rel:
				case <-done:
				}
			}()
		}
	}()
	return fp
}

// cancelSession is a registered session-mode session whose backend's postmaster is fp, with the proxy's own
// commands running (internal: 1); body is the CancelRequest its client would send.
func cancelSession(t *testing.T, fp *fakePostmaster) (ss *session, body []byte) {
	t.Helper()
	srv := newTestServer(t, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ss = &session{srv: srv, prep: &prepState{max: 64}}
	ss.cancelKey = []byte{0, 0, 0x30, 0x39, 1, 2, 3, 4} // the backend's: PID 12345
	ss.clientKey = []byte{0, 0, 0x30, 0x39, 9, 8, 7, 6}
	ss.host.addr = fp.ln.Addr().String()
	ss.state.ready.Store(true)
	ss.state.internal.Store(1)
	srv.registerPID(ss, 12345)
	body = binary.BigEndian.AppendUint32(nil, codeCancelRequest)
	return ss, append(body, ss.clientKey...)
}

// ownAnswered feeds ss the ReadyForQuery that ends the last of the proxy's own commands.
func ownAnswered(t *testing.T, ss *session) {
	t.Helper()
	if _, err := ss.onPreparedAnswer(ss.prep, msgReadyForQuery, []byte{txIdle}, bufio.NewWriter(io.Discard)); err != nil {
		t.Fatal(err)
	}
}

// cancelConn runs a client's cancel connection (forwardCancel) and says when it is answered.
func cancelConn(srv *Server, body []byte) <-chan struct{} {
	done := make(chan struct{})
	go func() { srv.forwardCancel(body); close(done) }()
	return done
}

// answered reports whether done is closed within the time given (0: now).
func answered(done <-chan struct{}, within time.Duration) bool {
	select {
	case <-done:
		return true
	default:
	}
	if within == 0 {
		return false
	}
	select {
	case <-done:
		return true
	case <-time.After(within):
		return false
	}
}

// TestDeferredCancelAnswersOnlyItsOwnClients: a client's cancel (a) waits behind the proxy's own commands; their
// last answer sends it, and PostgreSQL is slow to take it. Meanwhile the client's next statement comes behind a
// new command of the proxy's, and a second cancel (b) waits for that one. When PostgreSQL takes the first, a
// is answered, and b must not be: its cancel has not been sent (answered, a client that waits for its cancel
// before its next statement would have that statement hit by it).
func TestDeferredCancelAnswersOnlyItsOwnClients(t *testing.T) {
	fp := newFakePostmaster(t)
	ss, body := cancelSession(t, fp)
	a := cancelConn(ss.srv, body)
	if answered(a, 100*time.Millisecond) {
		t.Fatal("the cancel was answered while the proxy's own commands ran")
	}
	ownAnswered(t, ss) // the deferred cancel goes
	<-fp.got
	ss.state.internal.Store(1) // the next idle point: a command of the proxy's before the client's statement
	b := cancelConn(ss.srv, body)
	if answered(b, 100*time.Millisecond) {
		t.Fatal("the second cancel was answered while the proxy's own commands ran")
	}
	fp.rel <- struct{}{} // PostgreSQL takes the first
	if !answered(a, 5*time.Second) {
		t.Fatal("the first cancel was not answered once PostgreSQL took it")
	}
	if answered(b, 200*time.Millisecond) {
		t.Fatal("the second cancel was answered when the first was taken: it has not been sent")
	}
	ownAnswered(t, ss)
	<-fp.got
	fp.rel <- struct{}{}
	if !answered(b, 5*time.Second) {
		t.Fatal("the second cancel was not answered once PostgreSQL took it")
	}
}

// TestDeferredCancelFloodHoldsLittle: many CancelRequests with the key of a session whose own commands run
// (they may wait for a lock for long) each held a goroutine and a place under limits.max_client_connections
// until the commands ended. One cancel stops the statement; only a few wait (cancelWaitMax), the rest are
// answered at once, and one cancel is sent at the end.
func TestDeferredCancelFloodHoldsLittle(t *testing.T) {
	fp := newFakePostmaster(t)
	ss, body := cancelSession(t, fp)
	const n = 50
	var conns []<-chan struct{}
	for range n {
		conns = append(conns, cancelConn(ss.srv, body))
	}
	time.Sleep(200 * time.Millisecond)
	waiting := 0
	for _, c := range conns {
		if !answered(c, 0) {
			waiting++
		}
	}
	if waiting > cancelWaitMax {
		t.Fatalf("%d of %d cancel connections wait for the proxy's own commands, want at most %d", waiting, n, cancelWaitMax)
	}
	ownAnswered(t, ss)
	<-fp.got
	fp.rel <- struct{}{}
	for i, c := range conns {
		if !answered(c, 5*time.Second) {
			t.Fatalf("cancel connection %d not answered once the cancel was taken", i)
		}
	}
	select {
	case b := <-fp.got:
		t.Fatalf("a second cancel sent: %x", b)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestDeferredCancelAfterTheSessionEnded: a cancel looked its session up just before the session ended, with the
// proxy's own commands unanswered (the server connection was lost). It must be answered at once, and never
// sent: nothing will answer those commands, and the session's backend may be serving another session.
func TestDeferredCancelAfterTheSessionEnded(t *testing.T) {
	fp := newFakePostmaster(t)
	ss, _ := cancelSession(t, fp)
	ss.srv.unregister(ss)
	done := make(chan struct{})
	go func() {
		if ch := ss.cancelAfterOwn(); ch != nil {
			<-ch
		}
		close(done)
	}()
	if !answered(done, 2*time.Second) {
		t.Fatal("a cancel for a session that has ended waits (cancelWaitLimit)")
	}
	select {
	case b := <-fp.got:
		t.Fatalf("a cancel sent for a session that has ended: %x", b)
	case <-time.After(100 * time.Millisecond):
	}
}
