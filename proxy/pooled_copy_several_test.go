package proxy_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// COPY FROM STDIN in transaction pooling: several COPYs in one Query, a COPY and another statement in one
// pipelined batch, a Query pipelined into a COPY. From a review on 2026-12-03 of that day's stream-position
// accounting (c9125bf), where each test failed; the comments below say what happened there.

// bCheck: client B of the pool of one, after client A's steps; it must get its own answer.
func bCheck(t *testing.T, f *fenced) string {
	t.Helper()
	b := pooledPgConn(t, f, "&options=-c%20fence.token%3D7")
	bq := []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 2 AS b_two"}}
	got := wireSteps(t, b, 300*time.Millisecond, [][]string{{"", "", "", ""}}, bq)
	return fmt.Sprint(got)
}

// Two COPY FROM STDIN in one simple Query: two CopyInResponses. At c9125bf the first COPY's end counted for
// the second too, so a Sync sent during the second COPY's data (ignored by PostgreSQL, as in
// TestPooledCopyInSimpleFlushOrSync) was taken for the start of a unit and waited for the Query's
// ReadyForQuery, which never came: the server waited for the CopyDone the proxy did not read.
func TestPooledTwoCopiesOneQuerySync(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 10s\n")
	plainTable(t, f, "pcd_copy1")
	plainTable(t, f, "pcd_copy2")
	a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	sameAsDirect(t, a,
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "COPY pcd_copy1 FROM STDIN; COPY pcd_copy2 FROM STDIN"}},
		[]pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}},
		[]pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("2\n")}, &pgproto3.Sync{}, &pgproto3.CopyDone{}},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 42 AS answer"}})
	if got := bCheck(t, f); got != fmt.Sprint([][]string{{"T(b_two)", "D2", "SELECT 1", "ZI"}}) {
		t.Fatalf("client B: %s", got)
	}
}

// The same with everything pipelined: the Sync comes after the first CopyDone, before the second COPY starts.
func TestPooledTwoCopiesOneQuerySyncPipelined(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 10s\n")
	plainTable(t, f, "pcd_copy3")
	plainTable(t, f, "pcd_copy4")
	a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	sameAsDirect(t, a,
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "COPY pcd_copy3 FROM STDIN; COPY pcd_copy4 FROM STDIN"},
			&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, &pgproto3.Sync{},
			&pgproto3.CopyData{Data: []byte("2\n")}, &pgproto3.CopyDone{}},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 42 AS answer"}})
}

// A Query pipelined behind a simple COPY (a client error: PostgreSQL reads it in copy mode and fails the COPY,
// 08P01 "unexpected message type 0x51 during COPY from stdin", then FATAL). At c9125bf the pool held the
// second Query back until the COPY's ReadyForQuery, which never came: the server waited for data.
func TestPooledQueryPipelinedIntoSimpleCopy(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 10s\n")
	plainTable(t, f, "pcd_copy5")
	a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	sameAsDirect(t, a,
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "COPY pcd_copy5 FROM STDIN"}, &pgproto3.Query{String: "SELECT 1"}},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 42 AS answer"}})
}

// An extended COPY ended and followed by another Execute in the same batch, all pipelined before the
// CopyInResponse came: Parse, Bind, Execute (COPY), CopyData, CopyDone, Parse, Bind, Execute (SELECT), Sync,
// then a Query. At c9125bf the second Execute started the count again, so the batch's only Sync counted as
// one before the COPY's end; the CopyInResponse took it back (pl.open 0) though the server answers it, and
// marked the session unsynced, the copy running.
func TestPooledCopyThenExecuteSameBatch(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 10s\n")
	plainTable(t, f, "pcd_copy7")
	a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	sameAsDirect(t, a,
		[]pgproto3.FrontendMessage{
			&pgproto3.Parse{Query: "COPY pcd_copy7 FROM STDIN"}, &pgproto3.Bind{}, &pgproto3.Execute{},
			&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{},
			&pgproto3.Parse{Query: "SELECT pg_sleep(0.3)::text AS s"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
			&pgproto3.Query{String: "SELECT 42 AS answer"},
		},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 43 AS answer"}})
	if got := bCheck(t, f); got != fmt.Sprint([][]string{{"T(b_two)", "D2", "SELECT 1", "ZI"}}) {
		t.Fatalf("client B: %s", got)
	}
}

// The same with the end a CopyFail (the COPY fails, the server skips the rest up to the Sync).
func TestPooledCopyFailThenExecuteSameBatch(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 10s\n")
	plainTable(t, f, "pcd_copy8")
	a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	sameAsDirect(t, a,
		[]pgproto3.FrontendMessage{
			&pgproto3.Parse{Query: "COPY pcd_copy8 FROM STDIN"}, &pgproto3.Bind{}, &pgproto3.Execute{},
			&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyFail{Message: "no"},
			&pgproto3.Parse{Query: "SELECT 1"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
			&pgproto3.Query{String: "SELECT 42 AS answer"},
		},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 43 AS answer"}})
	if got := bCheck(t, f); got != fmt.Sprint([][]string{{"T(b_two)", "D2", "SELECT 1", "ZI"}}) {
		t.Fatalf("client B: %s", got)
	}
}
