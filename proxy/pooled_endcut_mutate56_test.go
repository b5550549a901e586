package proxy_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// The end of TestPooledEndWritesAfterTheLendsServerSide read byte for byte: the session ends (a Query inside
// an extended-protocol batch, refused) while its lend relays rows. The relay stops only at a message boundary
// it knows (closeUnderRelay: the row it is in is read to its end), so the client gets whole rows of the answer,
// then the whole FATAL 0A000 that says why, then the end: never part of a row, never the end without the
// FATAL. Until 2026-12-05 the closed server connection cut the row being relayed (clientCut): the session's end
// then wrote nothing more, and in nearly every round the client got whole rows and the end with no reason
// (mutate56 pass: endPooled writing its farewell whatever clientCut said passed the looser form of this test;
// probe57 pass: the FATAL missing, 10 rounds of 10). Every byte is checked against the message it belongs to.
func TestPooledEndWritesNothingAfterACutRow(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	row := expectedRepeatRow(1000)
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
		got := readBatchFirstRow(t, conn, row, "before the Query") // the Query goes once a whole row came
		fe.Send(&pgproto3.Query{String: "SELECT 'inside the batch'"})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		got = readToEnd(t, conn, got, "20 s")
		rows, fatal := wholeRowsThenFatal(t, got, row, fmt.Sprintf("round %d: ", round))
		if fatal.Severity != "FATAL" || fatal.Code != "0A000" {
			t.Fatalf("after %d rows: %s %s %s, want FATAL 0A000", rows, fatal.Severity, fatal.Code, fatal.Message)
		}
	}
}

// batchHead is how a batch of Parse, Bind and Execute is answered first: ParseComplete, BindComplete.
var batchHead = []byte{'1', 0, 0, 0, 4, '2', 0, 0, 0, 4}

// readBatchFirstRow reads conn up to the first whole row of such a batch's answer (row), and fails, naming
// when (what), unless the answer starts with batchHead. It returns what it read.
func readBatchFirstRow(t *testing.T, conn net.Conn, row []byte, what string) []byte {
	t.Helper()
	var got []byte
	buf := make([]byte, 64<<10)
	for len(got) < len(batchHead)+len(row) {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("%s: %v after %d bytes", what, err, len(got))
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.HasPrefix(got, batchHead) {
		t.Fatalf("the answer starts %q, want ParseComplete, BindComplete", got[:len(batchHead)])
	}
	return got
}

// readToEnd appends what conn sends to got until the stream ends, and fails if conn's read deadline (within)
// comes first.
func readToEnd(t *testing.T, conn net.Conn, got []byte, within string) []byte {
	t.Helper()
	buf := make([]byte, 64<<10)
	for {
		n, err := conn.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("no end within %s", within)
			}
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				t.Logf("the stream ended with %v", err)
			}
			return got
		}
	}
}

// wholeRowsThenFatal checks, byte for byte, that got (a batch's answer to its end) is batchHead, whole rows
// (row), then one whole ErrorResponse and nothing after it: never part of a row, never the end without it. It
// returns the rows and the ErrorResponse; its failures start with prefix.
func wholeRowsThenFatal(t *testing.T, got, row []byte, prefix string) (int, *pgproto3.ErrorResponse) {
	t.Helper()
	rest := got[len(batchHead):]
	rows := 0
	for len(rest) >= len(row) && bytes.Equal(rest[:len(row)], row) {
		rest, rows = rest[len(row):], rows+1
	}
	switch {
	case len(rest) == 0:
		t.Fatalf("%s%d whole rows, then the end without the FATAL", prefix, rows)
	case bytes.HasPrefix(row, rest):
		t.Fatalf("%s%d whole rows, then %d bytes of a row cut in its middle, then the end", prefix, rows, len(rest))
	case rest[0] != 'E':
		t.Fatalf("%safter %d whole rows: %d bytes that are neither a row nor a FATAL nor the beginning of a row: %q...", prefix, rows, len(rest), rest[:min(len(rest), 40)])
	}
	return rows, readFatal(t, rest, rows)
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
