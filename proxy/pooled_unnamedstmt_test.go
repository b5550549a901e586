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
	fxExec(t, f.d, `CREATE OR REPLACE FUNCTION pooled_run_unnamed() RETURNS text LANGUAGE plpgsql AS $f$
DECLARE r text;
BEGIN
  EXECUTE 'EXECUTE fenceproxy_u' INTO r;
  RETURN r;
EXCEPTION WHEN invalid_sql_statement_name THEN
  RETURN 'gone';
END $f$`)
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_run_unnamed()") })
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
