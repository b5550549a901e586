package proxy_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// The end of TestPooledEndWritesAfterTheLendsServerSide read byte for byte: after a row cut in its middle (the
// closed server connection cut it, clientCut) the session's end writes nothing more, so no byte of the farewell
// is read as the rest of that row. Read through pgproto3 a farewell written after the cut could not be told:
// its bytes, fewer than the rest of the row, completed nothing and the stream still ended inside a message
// (mutation pass mutate56: endPooled writing its farewell whatever clientCut said passed that test 30 rounds of
// 30). Here every byte is checked against the message it belongs to: whole rows of the answer, then a whole
// FATAL 0A000 and the end, or a strict beginning of a row and the end, or the end after whole rows (the cut
// row's bytes still in the client's writer, never flushed).
func TestPooledEndWritesNothingAfterACutRow(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	row := expectedRepeatRow(1000)
	cuts := 0
	for round := range 10 {
		pc := pooledPgConn(t, f, "")
		conn := pc.Conn()
		fe := pc.Frontend()
		fe.Send(&pgproto3.Parse{Query: "SELECT repeat('x', 1000) FROM generate_series(1, 20000)"})
		fe.Send(&pgproto3.Bind{})
		fe.Send(&pgproto3.Execute{})
		fe.Send(&pgproto3.Flush{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		// ParseComplete and BindComplete, then rows: the Query goes once a whole row came.
		head := []byte{'1', 0, 0, 0, 4, '2', 0, 0, 0, 4}
		var got []byte
		buf := make([]byte, 64<<10)
		for len(got) < len(head)+len(row) {
			n, err := conn.Read(buf)
			if err != nil {
				t.Fatalf("before the Query: %v after %d bytes", err, len(got))
			}
			got = append(got, buf[:n]...)
		}
		if !bytes.HasPrefix(got, head) {
			t.Fatalf("the answer starts %q, want ParseComplete, BindComplete", got[:len(head)])
		}
		fe.Send(&pgproto3.Query{String: "SELECT 'inside the batch'"})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		for {
			n, err := conn.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatalf("no end within 20 s")
				}
				if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
					t.Logf("the stream ended with %v", err)
				}
				break
			}
		}
		rest := got[len(head):]
		rows := 0
		for len(rest) >= len(row) && bytes.Equal(rest[:len(row)], row) {
			rest, rows = rest[len(row):], rows+1
		}
		switch {
		case len(rest) == 0:
			// The end without the FATAL: a row the lend's server side had begun was cut before any of it reached
			// the client (the cut part stayed in the client's writer, clientCut set). Nothing after a cut, as
			// wanted; the reason is lost, which this test does not judge.
			t.Logf("round %d: %d whole rows, then the end without the FATAL", round, rows)
		case bytes.HasPrefix(row, rest):
			cuts++ // a row cut in its middle, and nothing after it
		case rest[0] == 'E':
			fatal := readFatal(t, rest, rows)
			if fatal.Severity != "FATAL" || fatal.Code != "0A000" {
				t.Fatalf("after %d rows: %s %s %s, want FATAL 0A000", rows, fatal.Severity, fatal.Code, fatal.Message)
			}
		default:
			n := min(len(rest), 40)
			t.Fatalf("after %d whole rows: %d bytes that are neither a row nor the FATAL nor the beginning of a row: %q...", rows, len(rest), rest[:n])
		}
	}
	t.Logf("%d of 10 rounds ended inside a row", cuts)
}

// expectedRepeatRow is the DataRow of one repeat('x', n) value, as the server sends it.
func expectedRepeatRow(n int) []byte {
	row := []byte{'D'}
	row = binary.BigEndian.AppendUint32(row, uint32(4+2+4+n))
	row = binary.BigEndian.AppendUint16(row, 1)
	row = binary.BigEndian.AppendUint32(row, uint32(n))
	return append(row, bytes.Repeat([]byte{'x'}, n)...)
}

// readFatal decodes the ErrorResponse that must be all of b, the last bytes of the stream.
func readFatal(t *testing.T, b []byte, rows int) *pgproto3.ErrorResponse {
	t.Helper()
	if len(b) < 5 || int(binary.BigEndian.Uint32(b[1:5]))+1 != len(b) {
		t.Fatalf("after %d rows: an ErrorResponse that is not the whole rest of the stream (%d bytes)", rows, len(b))
	}
	var e pgproto3.ErrorResponse
	if err := e.Decode(b[5:]); err != nil {
		t.Fatalf("after %d rows: %v", rows, err)
	}
	return &e
}
