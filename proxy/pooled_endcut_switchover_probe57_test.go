package proxy_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A switchover published while a pooled client's rows stream from the old primary (an extended-protocol batch
// with a Flush and no Sync, its rows trickling, so that the relay waits in the middle of a row most of the
// time: the server sends its output in blocks that end inside rows). The change of primary closes the lent
// connection (dropHost); the relay stops at a message boundary (closeUnderRelay), and the client gets whole
// rows, then the whole FATAL that says why (57P01 naming the new primary, as nothing is committed before a
// Sync; 08007 where an answer that may hold a commit was lost), then the end.
// Read byte for byte. Attack of probe57 on 2026-12-05: the close cut the row being relayed, and the client got
// whole rows and the end with no reason, or part of a row.
func TestPooledSwitchoverUnderRelayedRows(t *testing.T) {
	h := startHAPairWith(t, nil, "", "pool:\n  mode: transaction\n  size: 2\nauth:\n  type: trust\n")
	ctx := haCtx(t)
	if err := h.standby.WaitReplayed(ctx, h.primary); err != nil {
		t.Fatal(err)
	}
	pc, err := pgconn.Connect(ctx, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close(ctx) })
	conn, fe := pc.Conn(), pc.Frontend()
	fe.Send(&pgproto3.Parse{Query: "SELECT repeat('x', 1000) FROM generate_series(1, 1000000) AS g WHERE pg_catalog.pg_sleep(0.001) IS NOT NULL"})
	fe.Send(&pgproto3.Bind{})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Flush{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(90 * time.Second))
	head := []byte{'1', 0, 0, 0, 4, '2', 0, 0, 0, 4}
	row := expectedRepeatRow(1000)
	var got []byte
	buf := make([]byte, 64<<10)
	for len(got) < len(head)+len(row) {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("before the switchover: %v after %d bytes", err, len(got))
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.HasPrefix(got, head) {
		t.Fatalf("the answer starts %q, want ParseComplete, BindComplete", got[:len(head)])
	}
	admin := connect(t, h.primary.SuperDSN())
	if _, err := admin.Exec(ctx, "ALTER SYSTEM SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	if err := h.standby.Promote(); err != nil {
		t.Fatal(err)
	}
	for {
		n, err := conn.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("no end within 90 s")
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
		t.Fatalf("%d whole rows, then the end without the FATAL", rows)
	case bytes.HasPrefix(row, rest):
		t.Fatalf("%d whole rows, then %d bytes of a row cut in its middle, then the end", rows, len(rest))
	case rest[0] == 'E':
		fatal := readFatal(t, rest, rows)
		if fatal.Severity != "FATAL" || fatal.Code != "08007" && fatal.Code != "57P01" {
			t.Fatalf("after %d rows: %s %s %s, want FATAL 08007 or 57P01", rows, fatal.Severity, fatal.Code, fatal.Message)
		}
		t.Logf("%d whole rows, then FATAL %s %s", rows, fatal.Code, fatal.Message)
	default:
		t.Fatalf("after %d whole rows: %d bytes that are neither a row nor a FATAL nor the beginning of a row: %q...", rows, len(rest), rest[:min(len(rest), 40)])
	}
}
