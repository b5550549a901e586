package proxy_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A connection a client's cancel went to runs SELECT pg_catalog.pg_sleep(0) before it goes back to the pool
// (absorbCancel). Where the client's role may not run it (hardened servers revoke pg_sleep from PUBLIC), the
// round trip fails with 42501 after the client's transaction has ended and been answered: the connection is not
// known clear of the cancel, so it must go to nobody else, but the client did nothing wrong and its session
// has nothing left on that connection. Its next statement must run (on another connection); until review56 the
// session ended with FATAL 08006 "could not clear a cancel off the server connection" at every such cancel.
func TestPooledCancelWhoseAbsorbFailsKeepsTheClient(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	const role = "review56_nosleep"
	for _, sql := range []string{
		"DROP ROLE IF EXISTS " + role, "CREATE ROLE " + role + " LOGIN",
		"REVOKE EXECUTE ON FUNCTION pg_catalog.pg_sleep(double precision) FROM PUBLIC",
	} {
		fxExec(t, f.d, sql)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		d := direct(t)
		d.Exec(ctx, "GRANT EXECUTE ON FUNCTION pg_catalog.pg_sleep(double precision) TO PUBLIC")
		d.Exec(ctx, "DROP ROLE IF EXISTS "+role)
	})
	c := connect(t, f.p.DSN(role, "", pgtest.TestDB)+"&default_query_exec_mode=simple_protocol")
	ctx := ctxT(t)
	pid0 := 0
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid0); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		var n int64
		done <- c.QueryRow(ctx, "SELECT count(*) FROM generate_series(1, 2000000000) AS absorb_subject").Scan(&n)
	}()
	awaitOneActive(t, f, "the client's statement running", "absorb_subject")
	if err := sendCancelRequest(f.p.Addr, c.PgConn().PID(), c.PgConn().SecretKey()); err != nil {
		t.Fatalf("the CancelRequest: %v", err)
	}
	var pgErr *pgconn.PgError
	if err := <-done; !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("the cancelled statement: %v; want 57014", err)
	}
	var pid int
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatalf("the statement after a cancel whose absorb failed: %v", err)
	}
	if pid == pid0 {
		t.Fatalf("the connection whose absorb failed (backend %d) served the client again", pid0)
	}
}
