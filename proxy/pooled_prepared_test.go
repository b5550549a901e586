package proxy_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Prepared fences in transaction pooling (proxy/prepared.go, docs/fence-sql.md): the templates belong to the
// server connection, and every client lent it uses them. The attacks here are the pool's own: another client of
// the same pool, whose code runs on the very connection the victim's next transaction gets.

// TestPooledSharedStatementsSwappedByAnotherClient: client A warms the shared connection's template and runs it as
// EXECUTE; client B, another client of the pool with no token, runs code that replaces the proxy's statement
// with an unfenced UPDATE under the same name. First a trigger does it, under an INSERT the pool does not look at
// afterwards: A's next statement of that shape must not run B's statement. A holds a stale token, so it is
// refused (55F01) and nothing is written; the proxy then prepares its own statement again, and A's next
// transactions run it. Then B calls the function itself, a transaction the pool looks at afterwards: the
// statements B left under the proxy's names are B's SQL PREPARE, and B is pinned to the connection, which serves
// nobody else; the proxy's own statements there never pin anyone.
// (The test's name, which names its table, holds none of "fence", "prepare" and "temp": texts with the first are
// not templated, with the second they run without prepared fences in a pool, and with the third the pool looks
// at the connection after every transaction.)
func TestPooledSharedStatementsSwappedByAnotherClient(t *testing.T) {
	f := newPooledFencedUpstream(t, 1, "  max_client_wait: 3s\n", "  prepared_fences: 64\n")
	fn := createSwapFunction(t, f.d, f.label)
	side := f.label + "_side"
	fxExec(t, f.d, fmt.Sprintf(`CREATE FUNCTION public.%[1]s_trg() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN PERFORM public.%[1]s(); RETURN NULL; END$$;
CREATE TABLE %[2]s (x int);
CREATE TRIGGER swap AFTER INSERT ON %[2]s FOR EACH STATEMENT EXECUTE FUNCTION public.%[1]s_trg()`, fn, side))
	t.Cleanup(func() {
		f.d.Exec(ctxT(t), "DROP TABLE IF EXISTS "+side)
		f.d.Exec(ctxT(t), "DROP FUNCTION IF EXISTS public."+fn+"_trg()")
	})
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, balance, fence_token) VALUES (1, 0, 1), (2, 0, 1)")

	simple := "&default_query_exec_mode=simple_protocol"
	a := pooledConn(t, f, simple+"&options=-c%20fence.token%3D5")
	b := pooledConn(t, f, simple)
	pf := &preparedFixture{p: f.p, d: f.d, name: f.name}
	transaction := func(id, delta int) error { return pf.transaction(t, a, id, delta) }
	balance := 0
	for i := 1; i <= 6; i++ {
		if err := transaction(1, i); err != nil {
			t.Fatalf("transaction %d: %v", i, err)
		}
		balance += i
	}
	before := serverExecutions(t, a)
	if before == 0 {
		t.Fatal("no statement ran as EXECUTE on the pool's connection before the attack (counted by the server)")
	}
	// A newer holder writes row 1: A's token is stale from here on.
	newer := pooledConn(t, f, simple+"&options=-c%20fence.token%3D9")
	fxExec(t, newer, fmt.Sprintf("UPDATE %s SET balance = balance + 100 WHERE id = 1", f.label))
	balance += 100

	// B's INSERT fires the trigger that swaps the statements on the shared connection.
	fxExec(t, b, "INSERT INTO "+side+" VALUES (1)")

	var pgErr *pgconn.PgError
	for i := range 3 {
		if err := transaction(1, 1000); !errors.As(err, &pgErr) || pgErr.Code != "55F01" {
			t.Fatalf("stale holder after another client's swap, statement %d: %v, want 55F01 (an unfenced statement ran?)", i, err)
		}
	}
	if got, want := fxSnapshot(t, f.d, f.label), fmt.Sprintf("1:%d:9 2:0:1", balance); got != want {
		t.Fatalf("rows %s, want %s", got, want)
	}
	if n := fxCounter(t, f.p.Registry, "fenceproxy_prepared_fences_total", map[string]string{"outcome": "replaced"}); n == 0 {
		t.Fatal("the verification did not count the replaced statement")
	}
	// The proxy's own statement is back, and runs: A writes row 2 (its token is not stale there).
	after := serverExecutions(t, a)
	for i := 1; i <= 4; i++ {
		if err := transaction(2, i); err != nil {
			t.Fatalf("transaction %d on row 2: %v", i, err)
		}
	}
	if serverExecutions(t, a) <= after {
		t.Fatal("the proxy did not prepare and run its statement again after the swap")
	}
	var foreign int
	if err := a.QueryRow(ctxT(t), `SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'fenceproxy\_p%' AND statement NOT LIKE '%fenceproxy_stmt%'`).Scan(&foreign); err != nil || foreign != 0 {
		t.Fatalf("%d statements not the proxy's left under its names (%v)", foreign, err)
	}
	if got, want := fxSnapshot(t, f.d, f.label), fmt.Sprintf("1:%d:9 2:10:5", balance); got != want {
		t.Fatalf("rows %s, want %s", got, want)
	}
	// A's transactions were looked at (their SET of application_name): the proxy's statements pinned nobody.
	fxExec(t, a, "SET application_name = 'holder'")
	if n := fxCounter(t, f.p.Registry, "fenceproxy_pool_pins_total", nil); n != 0 {
		t.Fatalf("%v pins: the proxy's prepared statements pinned a client", n)
	}

	// B swaps again in a transaction the pool looks at: B is pinned, for its SQL PREPARE.
	if _, err := b.Exec(ctxT(t), "SELECT public."+fn+"(); SET application_name = 'swapper'"); err != nil {
		t.Fatal(err)
	}
	// The pool looks at the connection after the transaction's answer went to the client.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n := fxCounter(t, f.p.Registry, "fenceproxy_pool_pins_total", map[string]string{"reason": "sql_prepare"})
		if n == 1 {
			break
		}
		if n > 1 || time.Now().After(deadline) {
			t.Fatalf("%v pins for SQL PREPARE after a function put statements under the proxy's names, want 1", n)
		}
	}
	closeConn(t, b)
	for i := range 2 { // the pool serves A again, on a connection with nothing of B's
		if err := transaction(1, 1000); !errors.As(err, &pgErr) || pgErr.Code != "55F01" {
			t.Fatalf("stale holder after the pinned client left, statement %d: %v, want 55F01", i, err)
		}
	}
	if got, want := fxSnapshot(t, f.d, f.label), fmt.Sprintf("1:%d:9 2:10:5", balance); got != want {
		t.Fatalf("rows %s, want %s", got, want)
	}
}
