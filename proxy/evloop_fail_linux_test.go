//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"golang.org/x/sys/unix"
)

// TestLoopEpollFailureEndsTheSession: when epoll refuses a session's socket (here the "upstream" is a regular
// file, which epoll_ctl rejects with EPERM), the session leaves the loop with endRelayFailed, and its end logs
// why, tells the client with a FATAL 08006 and closes both sides; the loop goes on serving (and stops when it
// has no session left).
func TestLoopEpollFailureEndsTheSession(t *testing.T) {
	var logs bytes.Buffer
	s := newTestServer(t, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	cfd, err := dupConnFD(server)
	if err != nil {
		t.Fatal(err)
	}
	server.Close() // as runInLoop does: the duplicate is the session's socket now
	f, err := os.CreateTemp(t.TempDir(), "not-a-socket")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ufd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}

	ss := &session{srv: s, client: server, prep: &prepState{}}
	ss.state.ready.Store(true)
	es := &evSession{ss: ss, loop: s.pickLoop(), cfd: cfd, ufd: ufd, uBoundary: true, done: make(chan struct{})}
	es.loop.add(es)
	<-es.done
	if es.end != endRelayFailed || es.endErr == nil || !strings.Contains(es.endErr.Error(), "epoll_ctl add upstream socket") {
		t.Fatalf("ended with %v: %v; want endRelayFailed from epoll_ctl", es.end, es.endErr)
	}
	ss.end(ending{why: es.end, err: es.endErr, atBoundary: es.uBoundary}, &loopIO{es})
	if ss.outcome != outcomeRelayFailed {
		t.Errorf("outcome %q, want %q", ss.outcome, outcomeRelayFailed)
	}
	if !strings.Contains(logs.String(), "relay failed") || !strings.Contains(logs.String(), "operation not permitted") {
		t.Errorf("no log line says why the session ended:\n%s", logs.String())
	}

	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	fe := pgproto3.NewFrontend(bufio.NewReader(client), io.Discard)
	msg, err := fe.Receive()
	if err != nil {
		t.Fatalf("the client got no farewell: %v", err)
	}
	er, ok := msg.(*pgproto3.ErrorResponse)
	if !ok || er.Severity != "FATAL" || er.Code != sqlstateConnectionFailure {
		t.Fatalf("farewell %#v, want a FATAL %s", msg, sqlstateConnectionFailure)
	}
	if _, err := fe.Receive(); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("after the farewell: %v, want the connection closed", err)
	}
	// The loop has no session left and stops.
	for {
		es.loop.mu.Lock()
		running := es.loop.running
		es.loop.mu.Unlock()
		if !running {
			break
		}
		time.Sleep(time.Millisecond)
	}
}
