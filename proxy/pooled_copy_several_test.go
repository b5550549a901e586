package proxy_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// COPY FROM STDIN in transaction pooling: several COPYs in one Query, a COPY and another statement in one
// pipelined batch, a Query pipelined into a COPY. From a review on 2026-12-03 of that day's stream-position
// accounting (c9125bf), where each test failed; the comments below say what happened there.

// Two COPY FROM STDIN in one simple Query: two CopyInResponses. At c9125bf the first COPY's end counted for
// the second too, so a Sync sent during the second COPY's data (ignored by PostgreSQL, as in
// TestPooledCopyInSimpleFlushOrSync) was taken for the start of a unit and waited for the Query's
// ReadyForQuery, which never came: the server waited for the CopyDone the proxy did not read.
func TestPooledTwoCopiesOneQuerySync(t *testing.T) {
	copySameAsDirect(t, []string{"pcd_copy1", "pcd_copy2"},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "COPY pcd_copy1 FROM STDIN; COPY pcd_copy2 FROM STDIN"}},
		[]pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}},
		[]pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("2\n")}, &pgproto3.Sync{}, &pgproto3.CopyDone{}},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 42 AS answer"}})
}

// The same with everything pipelined: the Sync comes after the first CopyDone, before the second COPY starts.
func TestPooledTwoCopiesOneQuerySyncPipelined(t *testing.T) {
	copySameAsDirect(t, []string{"pcd_copy3", "pcd_copy4"},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "COPY pcd_copy3 FROM STDIN; COPY pcd_copy4 FROM STDIN"},
			&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, &pgproto3.Sync{},
			&pgproto3.CopyData{Data: []byte("2\n")}, &pgproto3.CopyDone{}},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 42 AS answer"}})
}

// A Query pipelined behind a simple COPY (a client error: PostgreSQL reads it in copy mode and fails the COPY,
// 08P01 "unexpected message type 0x51 during COPY from stdin", then FATAL). At c9125bf the pool held the
// second Query back until the COPY's ReadyForQuery, which never came: the server waited for data.
func TestPooledQueryPipelinedIntoSimpleCopy(t *testing.T) {
	copySameAsDirect(t, []string{"pcd_copy5"},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "COPY pcd_copy5 FROM STDIN"}, &pgproto3.Query{String: "SELECT 1"}},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 42 AS answer"}})
}

// An extended COPY ended and followed by another Execute in the same batch, all pipelined before the
// CopyInResponse came: Parse, Bind, Execute (COPY), CopyData, CopyDone, Parse, Bind, Execute (SELECT), Sync,
// then a Query. At c9125bf the second Execute started the count again, so the batch's only Sync counted as
// one before the COPY's end; the CopyInResponse took it back (pl.open 0) though the server answers it, and
// marked the session unsynced, the copy running.
func TestPooledCopyThenExecuteSameBatch(t *testing.T) {
	copySameAsDirect(t, []string{"pcd_copy7"},
		[]pgproto3.FrontendMessage{
			&pgproto3.Parse{Query: "COPY pcd_copy7 FROM STDIN"}, &pgproto3.Bind{}, &pgproto3.Execute{},
			&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{},
			&pgproto3.Parse{Query: "SELECT pg_sleep(0.3)::text AS s"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
			&pgproto3.Query{String: "SELECT 42 AS answer"},
		},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 43 AS answer"}})
}

// The same with the end a CopyFail (the COPY fails, the server skips the rest up to the Sync).
func TestPooledCopyFailThenExecuteSameBatch(t *testing.T) {
	copySameAsDirect(t, []string{"pcd_copy8"},
		[]pgproto3.FrontendMessage{
			&pgproto3.Parse{Query: "COPY pcd_copy8 FROM STDIN"}, &pgproto3.Bind{}, &pgproto3.Execute{},
			&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyFail{Message: "no"},
			&pgproto3.Parse{Query: "SELECT 1"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
			&pgproto3.Query{String: "SELECT 42 AS answer"},
		},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 43 AS answer"}})
}
