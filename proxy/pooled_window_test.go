package proxy_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// directPgConn is a pgconn connection straight to the test's PostgreSQL, closed when the test ends.
func directPgConn(t *testing.T) *pgconn.PgConn {
	t.Helper()
	pc, err := pgconn.Connect(ctxT(t), pg.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close(context.Background()) })
	return pc
}

// A client that reads some of a batch's answers before the batch's BEGIN with transaction modes runs (a Parse,
// then a Flush, waiting for its ParseComplete; then Bind, Execute, Sync) gets exactly what a direct connection
// gives: the token statement that goes after the BEGIN is hidden whole, and the session goes on (its answers
// leaked, and a later transaction hung, when the answers to relay first were counted from the whole window;
// third review of the put-back). Also with an error in the window, and a second time on the same session.
func TestPooledModesBeginAfterFlushedAnswers(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	run := func(pc *pgconn.PgConn, parse string) []string {
		var got []string
		if err := exchange(pc.Frontend(), []pgproto3.FrontendMessage{&pgproto3.Parse{Query: parse}, &pgproto3.Flush{}},
			func(m pgproto3.BackendMessage) bool { got = append(got, fmt.Sprintf("%T", m)); return true }); err != nil {
			t.Fatal(err)
		}
		got = append(got, shortAnswers(t, pc, &pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Flush{}, &pgproto3.Execute{}, &pgproto3.Sync{},
			&pgproto3.Query{String: "SELECT current_setting('transaction_isolation')"}, &pgproto3.Query{String: "ROLLBACK"})...)
		return append(got, shortAnswers(t, pc, &pgproto3.Query{String: "SELECT 1"})...)
	}
	d, pc := directPgConn(t), pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	for _, parse := range []string{"BEGIN ISOLATION LEVEL SERIALIZABLE", "BEGIN ISOLATION LEVEL REPEATABLE READ"} {
		want, got := run(d, parse), run(pc, parse)
		if !slices.Equal(got, want) {
			t.Fatalf("%s:\nproxy  %q\ndirect %q", parse, got, want)
		}
	}
	// An error read in the window (a Bind with a parameter too many): the server skips the rest of the batch,
	// the token statement too, and nothing is left to hide.
	failed := func(pc *pgconn.PgConn) []string {
		var got []string
		if err := exchange(pc.Frontend(), []pgproto3.FrontendMessage{&pgproto3.Parse{Query: "BEGIN ISOLATION LEVEL SERIALIZABLE"},
			&pgproto3.Bind{Parameters: [][]byte{[]byte("1")}}, &pgproto3.Flush{}},
			func(m pgproto3.BackendMessage) bool {
				got = append(got, fmt.Sprintf("%T", m))
				_, isErr := m.(*pgproto3.ErrorResponse)
				return isErr
			}); err != nil {
			t.Fatal(err)
		}
		got = append(got, shortAnswers(t, pc, &pgproto3.Execute{}, &pgproto3.Sync{}, &pgproto3.Query{String: "SELECT 1"})...)
		return append(got, shortAnswers(t, pc, &pgproto3.Query{String: "SELECT 2"})...)
	}
	if want, got := failed(d), failed(pc); !slices.Equal(got, want) {
		t.Fatalf("an error in the window:\nproxy  %q\ndirect %q", got, want)
	}
	// The block the flushed window opened has the client's token.
	if err := exchange(pc.Frontend(), []pgproto3.FrontendMessage{&pgproto3.Parse{Query: "BEGIN ISOLATION LEVEL SERIALIZABLE"}, &pgproto3.Flush{}},
		func(pgproto3.BackendMessage) bool { return true }); err != nil {
		t.Fatal(err)
	}
	got := shortAnswers(t, pc, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
		&pgproto3.Query{String: "SELECT current_setting('fence.token')"}, &pgproto3.Query{String: "ROLLBACK"})
	if want := []string{"2", "BEGIN", "ZT", "T", "D5", "SELECT 1", "ZT", "ROLLBACK", "ZI"}; !slices.Equal(got, want) {
		t.Fatalf("the flushed window's block:\ngot  %q\nwant %q", got, want)
	}
}

// A batch that starts with a BEGIN with transaction modes and ends, for now, in a Flush (no Sync yet): the
// client gets the BEGIN's answers at once, as directly, though the hidden token statement's answers come last
// and no ReadyForQuery follows (they waited for one, and the client for ever: second review of the thirteenth
// pass). Then the Sync, and the block has the client's token.
func TestPooledModesBeginEndingInFlush(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	untilBegin := func(pc *pgconn.PgConn, msgs ...pgproto3.FrontendMessage) []string {
		var got []string
		pc.Conn().SetDeadline(time.Now().Add(5 * time.Second))
		defer pc.Conn().SetDeadline(time.Time{})
		err := exchange(pc.Frontend(), msgs, func(m pgproto3.BackendMessage) bool {
			got = append(got, fmt.Sprintf("%T", m))
			cc, ok := m.(*pgproto3.CommandComplete)
			return ok && string(cc.CommandTag) == "BEGIN"
		})
		if err != nil {
			return append(got, "HANG")
		}
		return got
	}
	d, pc := directPgConn(t), pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	for _, shape := range [][]pgproto3.FrontendMessage{
		{&pgproto3.Parse{Query: "BEGIN ISOLATION LEVEL REPEATABLE READ"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Flush{}},
		{&pgproto3.Parse{Query: "BEGIN ISOLATION LEVEL REPEATABLE READ"}, &pgproto3.Describe{ObjectType: 'S'}, &pgproto3.Flush{},
			&pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Flush{}},
	} {
		want, got := untilBegin(d, shape...), untilBegin(pc, shape...)
		if !slices.Equal(got, want) {
			t.Fatalf("\nproxy  %q\ndirect %q", got, want)
		}
		shortAnswers(t, d, &pgproto3.Sync{}, &pgproto3.Query{String: "ROLLBACK"})
		rest := shortAnswers(t, pc, &pgproto3.Sync{}, &pgproto3.Query{String: "SELECT current_setting('fence.token')"}, &pgproto3.Query{String: "ROLLBACK"})
		if want := []string{"ZT", "T", "D5", "SELECT 1", "ZT", "ROLLBACK", "ZI"}; !slices.Equal(rest, want) {
			t.Fatalf("after the Flush:\ngot  %q\nwant %q", rest, want)
		}
	}
}
