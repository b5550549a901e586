package proxy_test

import (
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
	h, _ := startPooledHAPair(t, "size: 2")
	ctx := haCtx(t)
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
	row := expectedRepeatRow(1000)
	got := readBatchFirstRow(t, conn, row, "before the switchover")
	admin := connect(t, h.primary.SuperDSN())
	h.promote(ctx, t, func() { setReadOnly(ctx, t, admin) }) // a switchover: the old primary demoted, still up
	got = readToEnd(t, conn, got, "90 s")
	rows, fatal := wholeRowsThenFatal(t, got, row, "")
	if fatal.Severity != "FATAL" || fatal.Code != "08007" && fatal.Code != "57P01" {
		t.Fatalf("after %d rows: %s %s %s, want FATAL 08007 or 57P01", rows, fatal.Severity, fatal.Code, fatal.Message)
	}
	t.Logf("%d whole rows, then FATAL %s %s", rows, fatal.Code, fatal.Message)
}
