package proxy_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// The server statement that carries a client's unnamed statement (fenceproxy_u; the server's unnamed statement
// holds the token statement) is the client's alone, as its unnamed statement is on a connection of its own: on
// a pool of one connection, client A leaves an unnamed statement whose text names a secret, and client B, by
// the simple protocol, by a Parse of its own and by a function's dynamic SQL, neither finds its text in
// pg_prepared_statements nor runs it. A client that never parsed one gets the server's words for the unnamed
// statement, not the proxy's name.
func TestPooledUnnamedStatementNotLeftForTheNextClient(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	runUnnamedFunction(t, f)
	const seen = "SELECT count(*) FROM pg_catalog.pg_prepared_statements WHERE statement LIKE '%secret' || '-a%'"
	leaveSecret := func(a *pgconn.PgConn) {
		t.Helper()
		if got := shortAnswers(t, a, &pgproto3.Parse{Query: "SELECT 'secret-a'"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}); !slices.Contains(got, "Dsecret-a") {
			t.Fatalf("A's unnamed statement: %q", got)
		}
	}
	a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	b := pooledPgConn(t, f, "&options=-c%20fence.token%3D6")

	leaveSecret(a)
	if got := shortAnswers(t, b, &pgproto3.Query{String: seen}); !slices.Equal(got, []string{"T", "D0", "SELECT 1", "ZI"}) {
		t.Fatalf("B's Query found A's unnamed statement: %q", got)
	}
	leaveSecret(a)
	if got := shortAnswers(t, b, &pgproto3.Parse{Query: seen}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}); !slices.Equal(got, []string{"1", "2", "D0", "SELECT 1", "ZI"}) {
		t.Fatalf("B's Parse found A's unnamed statement: %q", got)
	}
	leaveSecret(a)
	if got := shortAnswers(t, b, &pgproto3.Query{String: "SELECT pooled_run_unnamed()"}); !slices.Equal(got, []string{"T", "Dgone", "SELECT 1", "ZI"}) {
		t.Fatalf("B's function ran A's unnamed statement: %q", got)
	}
	leaveSecret(a)
	if got := shortAnswers(t, b, &pgproto3.Bind{PreparedStatement: "fenceproxy_u"}, &pgproto3.Execute{}, &pgproto3.Sync{}); !slices.Equal(got, []string{"E26000", "ZI"}) {
		t.Fatalf("B's Bind of the proxy's name: %q", got)
	}

	// A's own unnamed statement is still A's, bound on the connection B used in between.
	leaveSecret(a)
	shortAnswers(t, b, &pgproto3.Query{String: "SELECT 1"})
	if got := shortAnswers(t, a, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}); !slices.Equal(got, []string{"2", "Dsecret-a", "SELECT 1", "ZI"}) {
		t.Fatalf("A's Bind of its unnamed statement after B: %q", got)
	}

	c := pooledPgConn(t, f, "")
	rr := c.ExecPrepared(ctxT(t), "", nil, nil, nil).Read()
	var pe *pgconn.PgError
	if !errors.As(rr.Err, &pe) || pe.Code != "26000" || pe.Message != "unnamed prepared statement does not exist" {
		t.Fatalf("a Bind of an unnamed statement never parsed: %v", rr.Err)
	}
	rr = c.ExecPrepared(ctxT(t), "", nil, nil, nil).Read() // after the error: the same words, the connection in step
	if !errors.As(rr.Err, &pe) || pe.Code != "26000" || pe.Message != "unnamed prepared statement does not exist" {
		t.Fatalf("a Bind of an unnamed statement never parsed, again: %v", rr.Err)
	}
}

// runUnnamedFunction creates pooled_run_unnamed(), which runs fenceproxy_u by dynamic SQL, as any client's
// function can ('gone' when there is none).
func runUnnamedFunction(t *testing.T, f *fenced) {
	t.Helper()
	fxExec(t, f.d, `CREATE OR REPLACE FUNCTION pooled_run_unnamed() RETURNS text LANGUAGE plpgsql AS $f$
DECLARE r text;
BEGIN
  EXECUTE 'EXECUTE fenceproxy_u' INTO r;
  RETURN r;
EXCEPTION WHEN invalid_sql_statement_name THEN
  RETURN 'gone';
END $f$`)
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_run_unnamed()") })
}

// Client A leaves an unnamed statement (fenceproxy_u on the server). Client B's first message on that
// connection is a Parse of its own unnamed statement, so closeLastUnnamed leaves the Close to the one in front
// of B's Parse (writeUnnamedParse), which goes after the token statement, in the same batch. When the token
// statement fails (here: B's own session settings make its snapshot wait, and B's statement_timeout cancels
// it), the server skips the rest of the batch, the Close too: B's next transaction on the same connection gets
// the Close of a unit of its own (unnamedOwner not known), and B's function never runs A's statement (a
// review's finding: it ran it, as B held the connection last).
func TestPooledFailedFirstBatchLeavesNoUnnamedForTheNext(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	runUnnamedFunction(t, f)
	a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	b := pooledPgConn(t, f, "&options=-c%20fence.token%3D6")

	// B's session settings (nothing blocks yet).
	for _, set := range []string{"SET default_transaction_isolation = serializable", "SET default_transaction_read_only = on",
		"SET default_transaction_deferrable = on", "SET statement_timeout = 500"} {
		if got := shortAnswers(t, b, &pgproto3.Query{String: set}); !slices.Equal(got, []string{"SET", "ZI"}) {
			t.Fatalf("B's %s: %q", set, got)
		}
	}
	if got := shortAnswers(t, a, &pgproto3.Parse{Query: "SELECT 'secret-a'"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}); !slices.Contains(got, "Dsecret-a") {
		t.Fatalf("A's unnamed statement: %q", got)
	}
	// A serializable read-write transaction is open: a deferrable read-only serializable snapshot waits for it.
	d := directPgConn(t)
	if got := shortAnswers(t, d, &pgproto3.Query{String: "BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT 1"}); !slices.Contains(got, "ZT") {
		t.Fatalf("direct BEGIN: %q", got)
	}
	// B's batch: its token statement waits for a safe snapshot and is cancelled by B's statement_timeout.
	got := shortAnswers(t, b, &pgproto3.Parse{Query: "SELECT 2"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
	if !slices.Equal(got, []string{"E57014", "ZI"}) {
		t.Fatalf("B's batch: %q", got)
	}
	shortAnswers(t, d, &pgproto3.Query{String: "COMMIT"})
	// B's function must not find A's statement.
	if got := shortAnswers(t, b, &pgproto3.Query{String: "SELECT pooled_run_unnamed()"}); !slices.Equal(got, []string{"T", "Dgone", "SELECT 1", "ZI"}) {
		t.Fatalf("B's function ran A's unnamed statement: %q", got)
	}
}

// A simple Query drops the unnamed statement (PostgreSQL's exec_simple_query), so a later Bind of it fails 26000,
// also inside a block (one lend), where the server statement that carries it, fenceproxy_u, is still there (a
// review's finding: it ran the old statement again).
func TestPooledQueryDropsTheUnnamedStatement(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	run := func(pc *pgconn.PgConn) []string {
		var got []string
		got = append(got, shortAnswers(t, pc, &pgproto3.Query{String: "BEGIN"})...)
		got = append(got, shortAnswers(t, pc, &pgproto3.Parse{Query: "SELECT 'old'"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})...)
		got = append(got, shortAnswers(t, pc, &pgproto3.Query{String: "SELECT 1"})...)
		got = append(got, shortAnswers(t, pc, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})...)
		got = append(got, shortAnswers(t, pc, &pgproto3.Query{String: "ROLLBACK"})...)
		return got
	}
	want := run(directPgConn(t))
	got := run(pooledPgConn(t, f, "&options=-c%20fence.token%3D5"))
	if !slices.Equal(got, want) {
		t.Fatalf("\nproxy  %q\ndirect %q", got, want)
	}
}

// A DEALLOCATE ALL drops fenceproxy_u, which directly leaves the unnamed statement. A Bind of the unnamed
// statement behind one in the same batch (a statement whose text says DEALLOCATE or DISCARD) gets it parsed
// again first, as directly. Behind a function's, which the proxy cannot see, in a block or on a pinned
// connection (whose transactions are not read back), the first Bind gets 26000 (docs/pooling.md, known
// differences) and the next binds the client's statement again (unnamedNameOut: dropped); never another's.
func TestPooledDeallocateAllAndTheUnnamedStatement(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, `CREATE OR REPLACE FUNCTION pooled_dealloc_all() RETURNS int LANGUAGE plpgsql AS $f$
BEGIN
  EXECUTE 'DEALLOCATE ALL';
  RETURN 1;
END $f$`)
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_dealloc_all()") })
	sameBatch := func(pc *pgconn.PgConn) []string {
		return shortAnswers(t, pc, &pgproto3.Parse{Query: "SELECT 'u'"}, &pgproto3.Bind{}, &pgproto3.Execute{},
			&pgproto3.Parse{Name: "d", Query: "DEALLOCATE ALL"}, &pgproto3.Bind{PreparedStatement: "d"}, &pgproto3.Execute{},
			&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
	}
	if want, got := sameBatch(directPgConn(t)), sameBatch(pooledPgConn(t, f, "&options=-c%20fence.token%3D5")); !slices.Equal(got, want) {
		t.Errorf("same batch:\nproxy  %q\ndirect %q", got, want)
	}
	bindU := []pgproto3.FrontendMessage{&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}}
	for _, c := range []struct{ name, open, close string }{
		{"function in a block", "BEGIN", "ROLLBACK"},
		{"function on a pinned connection", "SELECT pg_advisory_lock(4848)", "SELECT pg_advisory_unlock(4848)"},
	} {
		pc := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
		shortAnswers(t, pc, &pgproto3.Query{String: c.open})
		shortAnswers(t, pc, &pgproto3.Parse{Query: "SELECT 'u'"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
		shortAnswers(t, pc, &pgproto3.Parse{Name: "f", Query: "SELECT pooled_dealloc_all()"}, &pgproto3.Bind{PreparedStatement: "f"}, &pgproto3.Execute{}, &pgproto3.Sync{})
		first := shortAnswers(t, pc, bindU...)
		if !slices.Equal(first, []string{"2", "Du", "SELECT 1", "ZT"}) && !slices.Equal(first, []string{"2", "Du", "SELECT 1", "ZI"}) {
			if first[0] != "E26000" {
				t.Errorf("%s: the first Bind after the function: %q", c.name, first)
			}
			if c.open == "BEGIN" { // by named statements: a Query would drop the unnamed statement, directly too
				shortAnswers(t, pc, &pgproto3.Parse{Name: "rb", Query: "ROLLBACK"}, &pgproto3.Bind{PreparedStatement: "rb"}, &pgproto3.Execute{}, &pgproto3.Sync{})
				shortAnswers(t, pc, &pgproto3.Parse{Name: "bg", Query: "BEGIN"}, &pgproto3.Bind{PreparedStatement: "bg"}, &pgproto3.Execute{}, &pgproto3.Sync{})
			}
		}
		if got := shortAnswers(t, pc, bindU...); got[0] != "2" || got[1] != "Du" {
			t.Errorf("%s: the next Bind: %q (want the client's statement again)", c.name, got)
		}
		shortAnswers(t, pc, &pgproto3.Query{String: c.close})
		pc.Close(context.Background())
	}
}

// The server's errors are given the unnamed statement's words only where they are about the proxy's statement:
// a client's own error whose text quotes its name keeps its words (a review's finding).
func TestPooledErrorWordsOfTheClientsOwnText(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	msg := func(pc *pgconn.PgConn) string {
		_, err := pc.Exec(ctxT(t), `SELECT '"fenceproxy_u"'::int`).ReadAll()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			t.Fatalf("no PgError: %v", err)
		}
		return pe.Code + " " + pe.Message
	}
	want := msg(directPgConn(t))
	if got := msg(pooledPgConn(t, f, "&options=-c%20fence.token%3D5")); got != want {
		t.Errorf("\nproxy  %q\ndirect %q", got, want)
	}
}
