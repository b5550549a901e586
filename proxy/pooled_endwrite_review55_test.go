package proxy_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A session the pool ends from the client's side while the lend's server side still relays an answer to the
// client (here a Query sent inside an extended-protocol batch, refuseInsideBatch, behind an Execute whose rows
// are still coming): the session's end writes its FATAL to the client only once nothing else writes there, and
// never after a message cut in its middle. Before this review (stop 55) the refusal took the connection from the
// lend (pl.sc nil), so endPooled did not wait for the lend's server side (serveLend), and both wrote the
// client's one bufio.Writer at once: a data race (go test -race reported it in
// TestPooledCopyFailedByAMessageBeforeAPipelinedSync, and reports it here in every run on main), bytes sent
// twice or cut, a stream the client cannot frame; and a farewell written after a row the closed connection cut
// was read as the rest of that row. Every message the client gets must be whole: the rows, then the FATAL
// 0A000, then the end. Until 2026-12-05 the rows up to one cut in its middle and nothing after it passed too,
// which was nearly every round (probe57: the relay now stops at a message boundary, closeUnderRelay); the
// FATAL, when it came, failed the test, for pgproto3 reports the end after it as io.ErrUnexpectedEOF as it
// does a cut (translateEOFtoErrUnexpectedEOF): the end is told from a cut by the FATAL before it.
func TestPooledEndWritesAfterTheLendsServerSide(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	for round := range 30 { // the two writers' timing varies: on main about one round in ten showed it without -race
		t.Run(fmt.Sprint(round), func(t *testing.T) { endWhileRowsCome(t, f) })
	}
}

func endWhileRowsCome(t *testing.T, f *fenced) {
	fe := sendLargeUnsynced(t, f, 20000)
	rows := 0
	for rows == 0 { // the rows come: the lend's server side relays them
		m, err := fe.Receive()
		if err != nil {
			t.Fatalf("before the Query: %v", err)
		}
		if _, ok := m.(*pgproto3.DataRow); ok {
			rows++
		}
	}
	fe.Send(&pgproto3.Query{String: "SELECT 'inside the batch'"})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var fatal *pgproto3.ErrorResponse
	for {
		m, err := fe.Receive()
		if err != nil {
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				t.Fatalf("after %d rows: no end within 20 s", rows)
			case fatal == nil:
				t.Fatalf("after %d whole rows: the end (%v) without the FATAL that says why, or inside a row", rows, err)
			case !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF):
				t.Fatalf("after %d rows and the FATAL: a stream the client cannot read: %v", rows, err)
			}
			break
		}
		switch m := m.(type) {
		case *pgproto3.DataRow:
			if fatal != nil {
				t.Fatalf("a row after the FATAL")
			}
			if len(m.Values) != 1 || len(m.Values[0]) != 1000 {
				t.Fatalf("after %d rows: a broken row of %d values", rows, len(m.Values))
			}
			rows++
		case *pgproto3.ErrorResponse:
			if fatal != nil || m.Severity != "FATAL" || m.Code != "0A000" {
				t.Fatalf("after %d rows: %s %s %s (a FATAL before: %v)", rows, m.Severity, m.Code, m.Message, fatal != nil)
			}
			fatal = m
		default:
			t.Fatalf("after %d rows: %T, not a row of the answer nor the FATAL", rows, m)
		}
	}
	t.Logf("%d rows, then the FATAL", rows)
}

// rowsFlowing starts, on f's pool of one, a batch whose answer is 100,000 rows with no Sync (sendLargeUnsynced),
// reads up to its first row and checks that the subject's is the one session: the state both ends below start from.
func rowsFlowing(t *testing.T, f *fenced) *pgproto3.Frontend {
	t.Helper()
	fe := sendLargeUnsynced(t, f, 100000)
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m.(*pgproto3.DataRow); ok {
			break
		}
	}
	if n := f.p.Server.ActiveSessions(); n != 1 {
		t.Fatalf("%d sessions while the rows flow, want the subject's", n)
	}
	return fe
}

// The same end with a client that reads nothing more: the lend's server side is stuck in a write to the client,
// whose socket is full, when the session ends. The session's end waits for that side before its farewell
// (above), so the write must be bounded as the farewell's is: the session ends within the farewell's and the
// linger's time, its goroutines with it, not when (if ever) the client reads.
func TestPooledEndWithAClientThatReadsNothing(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fe := rowsFlowing(t, f)
	fe.Send(&pgproto3.Query{String: "SELECT 'inside the batch'"})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	// The client reads nothing from here on, and keeps its socket open.
	eventually(t, 15*time.Second, "the session ended", func() bool { return f.p.Server.ActiveSessions() == 0 })
}

// sendLargeUnsynced opens a pooled connection and sends, with a Flush and no Sync, a batch whose answer is rows
// rows of 1,000 bytes (the lend's server side relays them while the client reads or not), its read deadline 20 s.
func sendLargeUnsynced(t *testing.T, f *fenced, rows int) *pgproto3.Frontend {
	t.Helper()
	pc := pooledPgConn(t, f, "")
	fe := pc.Frontend()
	fe.Send(&pgproto3.Parse{Query: fmt.Sprintf("SELECT repeat('x', 1000) FROM generate_series(1, %d)", rows)})
	fe.Send(&pgproto3.Bind{})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Flush{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	pc.Conn().SetReadDeadline(time.Now().Add(20 * time.Second))
	return fe
}
