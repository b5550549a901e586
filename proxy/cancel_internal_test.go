package proxy

import (
	"bufio"
	"bytes"
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
	ss.host.addr = fp.ln.Addr().String()
	ss.state.ready.Store(true)
	ss.state.internal.Store(1)
	srv.registerKey(ss, 12345, 4)
	return ss, cancelBody(ss)
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

// cancelBody is the body of the CancelRequest the client of ss sends: the key it was given.
func cancelBody(ss *session) []byte {
	return append(binary.BigEndian.AppendUint32(nil, codeCancelRequest), ss.clientKey...)
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

// TestCancelSessionsOnTwoHostsWithOnePID: with upstream.hosts each server has its own PID space, so two
// session-mode sessions on two hosts may get one backend PID (here 12345, with different secrets), each
// registered as a session's upstream BackendKeyData is (backendKeyOut). Each client's cancel must reach its own
// backend, on its own host, and never the other's; the end of one session must leave the other's cancels
// working, and its own key must then cancel nothing. The registry was keyed by the PID alone: the later
// session's entry replaced the earlier's, whose client's cancels were dropped (docs/ha.md listed it as not
// done yet). Attack of cancel57 on 2026-12-05.
func TestCancelSessionsOnTwoHostsWithOnePID(t *testing.T) {
	srv := newTestServer(t, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var fps [2]*fakePostmaster
	var sss [2]*session
	for i := range sss {
		fps[i] = newFakePostmaster(t)
		ss := &session{srv: srv, prep: &prepState{max: 64}}
		ss.host.addr = fps[i].ln.Addr().String()
		ss.state.ready.Store(true)
		if err := ss.backendKeyOut(bufio.NewWriter(io.Discard), []byte{0, 0, 0x30, 0x39, byte(i + 1), 2, 3, 4}); err != nil {
			t.Fatal(err)
		}
		if got := binary.BigEndian.Uint32(ss.clientKey); got != 12345 {
			t.Fatalf("session %d: the client was given PID %d, want the backend's 12345", i, got)
		}
		srv.register(ss)
		sss[i] = ss
	}
	// cancel sends the client cancel connection of session i's client and fails unless exactly the cancel of
	// session i's backend reaches fps[i], and nothing reaches the other host.
	cancel := func(i int) {
		t.Helper()
		done := cancelConn(srv, cancelBody(sss[i]))
		want := append(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 16), codeCancelRequest), sss[i].cancelKey...)
		select {
		case got := <-fps[i].got:
			if !bytes.Equal(got, want) {
				t.Fatalf("session %d's host got the cancel %x, want %x", i, got, want)
			}
			fps[i].rel <- struct{}{}
		case got := <-fps[1-i].got:
			t.Fatalf("session %d's cancel reached the other session's host: %x", i, got)
		case <-time.After(5 * time.Second):
			t.Fatalf("session %d's cancel reached no host", i)
		}
		if !answered(done, 5*time.Second) {
			t.Fatalf("session %d's cancel connection was not answered once the cancel was taken", i)
		}
		select {
		case got := <-fps[1-i].got:
			t.Fatalf("session %d's cancel also reached the other session's host: %x", i, got)
		case <-time.After(100 * time.Millisecond):
		}
	}
	cancel(0)
	cancel(1)
	srv.unregister(sss[1]) // the later session ends
	cancel(0)
	done := cancelConn(srv, cancelBody(sss[1]))
	if !answered(done, 5*time.Second) {
		t.Fatal("the cancel of a session that ended was not answered")
	}
	for i, fp := range fps {
		select {
		case got := <-fp.got:
			t.Fatalf("the cancel of a session that ended reached host %d: %x", i, got)
		default:
		}
	}
}
