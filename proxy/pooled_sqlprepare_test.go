package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

// simpleOutcome is what a client sees of a Query: per statement its command tag and rows, or the SQLSTATE that
// ended it.
func simpleOutcome(ctx context.Context, pc *pgconn.PgConn, sql string) string {
	results, err := pc.Exec(ctx, sql).ReadAll()
	var b strings.Builder
	for _, r := range results {
		if r.Err != nil {
			continue
		}
		b.WriteString(r.CommandTag.String())
		for _, row := range r.Rows {
			for _, v := range row {
				fmt.Fprintf(&b, " %q", v)
			}
		}
		b.WriteString("; ")
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		b.WriteString("ERROR " + pe.Code)
	} else if err != nil {
		b.WriteString("FAILED " + err.Error())
	}
	return b.String()
}

// sqlPrepareScript is run by two clients, A and B, in this order; on one shared server connection through the
// pool the two use the same statement names for different statements.
var sqlPrepareScript = []struct{ client, sql string }{
	{"A", "PREPARE q AS SELECT 'a' || $1::text"},
	{"B", "PREPARE q (int) AS SELECT $1 * 10"},
	{"A", "EXECUTE q('x')"},
	{"B", "EXECUTE q(4)"},
	{"B", "EXECUTE r"}, // never prepared by anyone yet
	{"A", "PREPARE r AS SELECT 2; EXECUTE r; DEALLOCATE r; EXECUTE r"},
	{"B", "PREPARE r AS SELECT 'b-r'"},
	{"A", "EXECUTE r"}, // B's r is not A's
	{"A", "PREPARE q AS SELECT 1"},
	{"B", "BEGIN"},
	{"B", "PREPARE s AS SELECT 3"},
	{"B", "ROLLBACK"},
	{"B", "EXECUTE s"}, // PREPARE is not undone by ROLLBACK
	{"B", "BEGIN; PREPARE t AS SELECT 4; SELECT 1/0"},
	{"B", "ROLLBACK"},
	{"B", "EXECUTE t"},
	{"A", "PREPARE bad AS SELECT * FROM no_such_table_at_all"},
	{"A", "EXECUTE bad"},
	{"A", "DEALLOCATE ALL"},
	{"A", "EXECUTE q('y')"},
	{"B", "EXECUTE q(5)"},
	{"A", "PREPARE q AS SELECT 'again'; EXPLAIN (COSTS OFF) EXECUTE q"},
	{"A", "CREATE TABLE sqlprep_oracle_ctas AS EXECUTE q"},
	{"A", "DROP TABLE sqlprep_oracle_ctas"},
	{"A", "DEALLOCATE PREPARE q; DEALLOCATE q"},
	{"A", "EXECUTE fenceproxy_t('1', '1')"},
	{"A", "EXECUTE fenceproxy_u('1', '1')"},
	{"B", "DEALLOCATE nothere"},
	{"B", "PREPARE w AS SELECT $1::int + 1; EXECUTE w(1); EXECUTE w(2); EXECUTE w('z')"},
	{"B", "EXECUTE w(7)"},
	{"A", "PREPARE w AS SELECT 'a-w'; PREPARE w AS SELECT 'dup'"},
	{"A", "EXECUTE w"},
	// The same client twice in a row, on the connection it held last: the statement is known to be there, and
	// a PREPARE of the same text under the name it drops in the same Query gets the same server statement (a
	// Close of it in front of the Query would drop it before the DEALLOCATE ran).
	{"B", "PREPARE v AS SELECT 'v'"},
	{"B", "DEALLOCATE v; PREPARE v AS SELECT 'v'; EXECUTE v"},
	{"B", "EXECUTE v; DEALLOCATE v; PREPARE v AS SELECT 'v'; EXECUTE v"},
	{"B", "EXECUTE v; DEALLOCATE ALL; PREPARE v AS SELECT 'v'; EXECUTE v"},
	{"B", "DEALLOCATE v; PREPARE v AS SELECT 'v2'; DEALLOCATE v; PREPARE v AS SELECT 'v'; EXECUTE v"},
	// In a failed block, after the error made the connection's statements unknown: a Query that first ends the
	// failed state runs the rest as directly (the hidden PREPARE goes right before the EXECUTE, never in front,
	// where the failed block refused it and the whole Query with it: TestPooledSQLPrepareFuzzOracle seed 1); one
	// that does not is refused, as directly.
	{"B", "PREPARE x AS SELECT 'b-x'"},
	{"B", "BEGIN"},
	{"B", "SELECT 1/0"},
	{"B", "ROLLBACK; EXECUTE x"},
	{"B", "BEGIN; SAVEPOINT sp; SELECT 1/0"},
	{"B", "ROLLBACK TO SAVEPOINT sp; EXECUTE x; DEALLOCATE x; COMMIT"},
	{"B", "BEGIN; PREPARE x AS SELECT 'b-x2'; SELECT 1/0"},
	{"B", "SELECT 1; ROLLBACK; EXECUTE x"},
	{"B", "ROLLBACK TO SAVEPOINT nosuch; EXECUTE x"},
	{"B", "END; DEALLOCATE PREPARE x; EXECUTE x"},
	// A hidden PREPARE goes right before the first statement that uses its name (B's Query in between: the
	// connection holds none of A's statements then). Before 2026-12-05 it went in front of the whole Query:
	// analysed before the client's statements, it did not see the table they made again (42P01 where directly
	// the EXECUTE runs), and when it failed, work that they committed was not done.
	{"A", "CREATE TABLE sqlprep_oracle_t0 (a int); INSERT INTO sqlprep_oracle_t0 VALUES (1)"},
	{"A", "PREPARE t0 AS SELECT count(*) FROM sqlprep_oracle_t0"},
	{"A", "DROP TABLE sqlprep_oracle_t0"},
	{"B", "SELECT 'b'"},
	{"A", "CREATE TABLE sqlprep_oracle_t0 (a int); COMMIT; EXECUTE t0"},
	{"A", "DROP TABLE sqlprep_oracle_t0"},
	{"B", "SELECT 'b'"},
	{"A", "CREATE TABLE sqlprep_oracle_t1 (a int); INSERT INTO sqlprep_oracle_t1 VALUES (7); COMMIT; SELECT 'é'; EXECUTE t0; SELECT 2"},
	{"A", "SELECT a FROM sqlprep_oracle_t1"}, // committed before the EXECUTE that failed
	{"A", "DROP TABLE sqlprep_oracle_t1"},
	// Several, each before its first use; a statement prepared twice in a Query's text is prepared once.
	{"A", "PREPARE m1 AS SELECT 'm1'; PREPARE m2 (int) AS SELECT $1 + 1; PREPARE m3 AS SELECT 'm3-ü'"},
	{"B", "SELECT 'b'"},
	{"A", "EXECUTE m1; SELECT 'é'; EXECUTE m2(1); EXECUTE m1; SELECT 2; EXPLAIN (COSTS OFF) EXECUTE m3; EXECUTE m2(2)"},
	{"B", "SELECT 'b'"},
	{"A", "SELECT 'ü'; EXECUTE m1; SELECT 1/0; EXECUTE m2(3)"}, // an error between them: the rest does not run
	{"A", "SELECT 'ü'; EXECUTE m1; EXECUTE m2('z'); EXECUTE m3"},
	{"A", "SELECT 'ü'; EXECUTE m3; SELECT nosuchcol; EXECUTE m2(4)"},
	{"A", "SELECT 'ü'; DEALLOCATE m3; EXECUTE m2(4); EXECUTE m3"},
	// In a failed block, after statements of the Query that end it, and under the modes of a BEGIN before it
	// (in front of the BEGIN the hidden PREPARE took a snapshot: 25001).
	{"A", "BEGIN; SELECT 1/0"},
	{"A", "ROLLBACK; SELECT 'é'; EXECUTE m1; BEGIN; EXECUTE m2(5); COMMIT"},
	{"A", "BEGIN; SAVEPOINT sp; SELECT 1/0"},
	{"A", "SELECT 1; EXECUTE m1"},
	{"A", "ROLLBACK TO SAVEPOINT sp; SELECT 'é'; EXECUTE m2(6); SELECT 1/0"},
	{"A", "ROLLBACK; BEGIN ISOLATION LEVEL REPEATABLE READ; EXECUTE m1; COMMIT"},
	{"B", "SELECT 'b'"},
	{"A", "BEGIN ISOLATION LEVEL SERIALIZABLE; EXECUTE m2(7); SHOW transaction_isolation; COMMIT"},
	{"A", "DEALLOCATE ALL"},
}

// The same script direct (two connections) and through the pool (two clients on one server connection) gives
// the same command tags, rows and SQLSTATEs; no client is pinned.
func TestPooledSQLPrepareOracle(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	run := func(dsn string) []string {
		conns := map[string]*pgconn.PgConn{}
		for _, c := range []string{"A", "B"} {
			pc, err := pgconn.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close(context.Background())
			conns[c] = pc
		}
		var out []string
		for _, step := range sqlPrepareScript {
			out = append(out, simpleOutcome(ctx, conns[step.client], step.sql))
		}
		return out
	}
	want := run(pg.SuperDSN())
	got := run(f.dsn())
	for i, step := range sqlPrepareScript {
		if got[i] != want[i] {
			t.Errorf("%s: %s\n pooled %s\n direct %s", step.client, step.sql, got[i], want[i])
		}
	}
	if n := fxCounter(t, f.p.Registry, "fenceproxy_pool_pins_total", nil); n != 0 {
		t.Fatalf("%v clients were pinned", n)
	}
}

// A statement prepared by SQL on one server connection is executed on another, which never saw the PREPARE (it
// is prepared there first, its answer hidden); the client is not pinned and sees only its own answers.
func TestPooledSQLPrepareMoves(t *testing.T) {
	f := newPooledFenced(t, 2, "")
	ctx := ctxT(t)
	q := "&default_query_exec_mode=simple_protocol"
	a := pooledConn(t, f, q)
	b := pooledPgConn(t, f, "")
	fxExec(t, a, "BEGIN") // a holds one server connection
	pidA := backendPID(t, a)
	if got := simpleOutcome(ctx, b, "PREPARE s1 (int) AS SELECT pg_backend_pid(), $1 + 1"); got != "PREPARE; " {
		t.Fatalf("PREPARE: %s", got)
	}
	c := pooledConn(t, f, q)
	fxExec(t, c, "BEGIN")  // c holds the connection where s1 was prepared
	fxExec(t, a, "COMMIT") // a's connection is the one left for b
	want := fmt.Sprintf("SELECT 1 %q %q; ", fmt.Sprint(pidA), "42")
	if got := simpleOutcome(ctx, b, "EXECUTE s1(41)"); got != want {
		t.Fatalf("EXECUTE on the other connection: %s, want %s", got, want)
	}
	fxExec(t, c, "COMMIT")
	if got := simpleOutcome(ctx, b, "DEALLOCATE s1; EXECUTE s1(1)"); got != "DEALLOCATE; ERROR 26000" {
		t.Fatalf("after DEALLOCATE: %s", got)
	}
	if n := fxCounter(t, f.p.Registry, "fenceproxy_pool_pins_total", nil); n != 0 {
		t.Fatalf("%v clients were pinned", n)
	}
}

// Statements left on a shared server connection behind the proxy's back, by a function (which the proxy does
// not see), never run for another client: a name of the client's own that the client never prepared gets 26000
// (by SQL EXECUTE and by a protocol-level Bind), and a replaced server statement of the proxy's is prepared again
// before the client that owns the name runs it.
func TestPooledSQLPrepareHostileFunction(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	fxExec(t, f.d, `CREATE OR REPLACE FUNCTION pooled_sqlprep_plant() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE 'PREPARE planted AS SELECT ''planted''';
	RETURN 1;
END $$`)
	fxExec(t, f.d, `CREATE OR REPLACE FUNCTION pooled_sqlprep_replace() RETURNS int LANGUAGE plpgsql AS $$
DECLARE n text; k int := 0;
BEGIN
	FOR n IN SELECT name FROM pg_prepared_statements WHERE name LIKE 'fenceproxy\_q%' LOOP
		EXECUTE format('DEALLOCATE %I', n);
		EXECUTE format('PREPARE %I AS SELECT ''hijacked''', n);
		k := k + 1;
	END LOOP;
	RETURN k;
END $$`)
	t.Cleanup(func() {
		f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_sqlprep_plant(), pooled_sqlprep_replace()")
	})
	owner := pooledPgConn(t, f, "")
	hostile := pooledPgConn(t, f, "")
	victim := pooledPgConn(t, f, "")
	if got := simpleOutcome(ctx, owner, "PREPARE mine AS SELECT 'mine'; EXECUTE mine"); got != `PREPARE; SELECT 1 "mine"; ` {
		t.Fatalf("owner: %s", got)
	}
	if got := simpleOutcome(ctx, hostile, "SELECT pooled_sqlprep_plant(), pooled_sqlprep_replace()"); got != `SELECT 1 "1" "1"; ` {
		t.Fatalf("hostile: %s (the function should plant one statement and replace the owner's)", got)
	}
	if got := simpleOutcome(ctx, victim, "EXECUTE planted"); got != "ERROR 26000" {
		t.Fatalf("a client ran a statement another client's function left: %s", got)
	}
	if got := simpleOutcome(ctx, hostile, "SELECT pooled_sqlprep_plant()"); got != `SELECT 1 "1"; ` {
		t.Fatalf("hostile again: %s", got)
	}
	_, err := victim.Prepare(ctx, "", "SELECT 1", nil) // the extended protocol: a Bind of the planted name
	if err != nil {
		t.Fatal(err)
	}
	rr := victim.ExecPrepared(ctx, "planted", nil, nil, nil).Read()
	var pe *pgconn.PgError
	if !errors.As(rr.Err, &pe) || pe.Code != "26000" {
		t.Fatalf("a Bind of a name another client's function left: %v %q", rr.Err, rr.Rows)
	}
	if got := simpleOutcome(ctx, hostile, "SELECT pooled_sqlprep_plant()"); got != `SELECT 1 "1"; ` {
		t.Fatalf("hostile again: %s", got)
	}
	rr = victim.ExecParams(ctx, "EXECUTE planted", nil, nil, nil, nil).Read() // a Parse of EXECUTE
	if !errors.As(rr.Err, &pe) || pe.Code != "26000" {
		t.Fatalf("EXECUTE by the extended protocol of a name another client's function left: %v %q", rr.Err, rr.Rows)
	}
	if got := simpleOutcome(ctx, owner, "EXECUTE mine"); got != `SELECT 1 "mine"; ` {
		t.Fatalf("the owner ran a replaced statement: %s", got)
	}
}

// A PREPAREd write to a protected table stays fenced wherever it runs: each EXECUTE writes with the token of the
// client that runs it, a stale holder's EXECUTE is refused 55F01 and a client without a token 55F02, on one
// shared server connection.
func TestPooledSQLPrepareFenced(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
	prep := "PREPARE upd AS UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1 RETURNING fence_token"
	old := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	cur := pooledPgConn(t, f, "&options=-c%20fence.token%3D6")
	none := pooledPgConn(t, f, "")
	for _, c := range []*pgconn.PgConn{old, cur, none} {
		if got := simpleOutcome(ctx, c, prep); got != "PREPARE; " {
			t.Fatalf("PREPARE: %s", got)
		}
	}
	if got := simpleOutcome(ctx, old, "EXECUTE upd"); got != `UPDATE 1 "5"; ` {
		t.Fatalf("token 5: %s", got)
	}
	if got := simpleOutcome(ctx, cur, "EXECUTE upd"); got != `UPDATE 1 "6"; ` {
		t.Fatalf("token 6: %s", got)
	}
	if got := simpleOutcome(ctx, old, "EXECUTE upd"); got != "ERROR 55F01" {
		t.Fatalf("stale token 5 after 6: %s", got)
	}
	if got := simpleOutcome(ctx, none, "EXECUTE upd"); got != "ERROR 55F02" {
		t.Fatalf("no token: %s", got)
	}
	f.wantToken(t, 1, 6)
}

// SQL PREPARE sent by the extended protocol is not mapped: it leaves a statement of the client's own name on the
// server connection, and the client is pinned to it (reason sql_prepare), where its statement stays usable.
func TestPooledSQLPrepareExtendedPins(t *testing.T) {
	f := newPooledFenced(t, 2, "")
	ctx := ctxT(t)
	a := pooledPgConn(t, f, "")
	if _, err := a.ExecParams(ctx, "PREPARE ext_pinned AS SELECT 'ext'", nil, nil, nil, nil).Close(); err != nil {
		t.Fatal(err)
	}
	if got := simpleOutcome(ctx, a, "EXECUTE ext_pinned"); got != `SELECT 1 "ext"; ` {
		t.Fatalf("EXECUTE of the pinned statement: %s", got)
	}
	if n := fxCounter(t, f.p.Registry, "fenceproxy_pool_pins_total", map[string]string{"reason": "sql_prepare"}); n != 1 {
		t.Fatalf("pins{reason=sql_prepare} = %v, want 1", n)
	}
}

// psql, one statement per Query, on a server connection where another client prepared the same names for other
// statements, prints what it prints on a connection of its own (SQLSTATEs for errors).
func TestPooledSQLPreparePsql(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Fatal("psql not found: run scripts/setup (postgresql-client)")
	}
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	script := `\set VERBOSITY sqlstate
PREPARE q AS SELECT 'psql-q' || $1::text;
EXECUTE q('1');
EXECUTE r;
PREPARE r (int) AS SELECT $1 + 1;
EXECUTE r(1);
PREPARE r AS SELECT 1;
DEALLOCATE r;
EXECUTE r(1);
EXPLAIN (COSTS OFF) EXECUTE q('3');
DEALLOCATE ALL;
EXECUTE q('2');
PREPARE q AS SELECT 'again';
EXECUTE q;
`
	run := func(dsn string) string {
		other, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close(context.Background())
		if got := simpleOutcome(ctx, other, "PREPARE q AS SELECT 'other'; PREPARE r AS SELECT 'other-r'"); got != "PREPARE; PREPARE; " {
			t.Fatalf("other client: %s", got)
		}
		cmd := exec.Command(psql, "-X", "-At", "-f", "-", dsn)
		cmd.Stdin = strings.NewReader(script)
		cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("psql: %v\n%s", err, out)
		}
		return string(out) + simpleOutcome(ctx, other, "EXECUTE q; EXECUTE r")
	}
	want := run(pg.SuperDSN())
	if got := run(f.dsn()); got != want {
		t.Fatalf("through the pool:\n%s\ndirect:\n%s", got, want)
	}
	if !strings.Contains(want, "psql-q1") || !strings.Contains(want, "26000") {
		t.Fatalf("the script did not run as meant:\n%s", want)
	}
}

// 60 clients on a pool of 4, each with its own token, use SQL-level statements under the same names s0..s4 for
// texts of their own (s4 is the fenced write), in Queries of random kinds (alone, several in one Query, inside
// BEGIN..COMMIT), and now and then DEALLOCATE one (or all) and PREPARE it again: every answer is the client's own
// statement's, every write carries the client's token, no error, no client pinned, and statements ran on server
// connections that never saw their client's PREPARE.
func TestPooledSQLPrepareManyClients(t *testing.T) {
	const clients, rounds, poolSize = 60, 15, 4
	f := newPooledFenced(t, poolSize, "  max_client_wait: 120s\n")
	fxExec(t, f.d, fmt.Sprintf("INSERT INTO %s (id) SELECT g FROM generate_series(1, %d) g", f.label, clients))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	prepare := func(c, k int) string {
		if k == 4 {
			return fmt.Sprintf("PREPARE s4 AS UPDATE %s SET balance = balance + 1 WHERE id = %d RETURNING fence_token, pg_backend_pid()", f.label, c)
		}
		return fmt.Sprintf("PREPARE s%d AS SELECT %d, pg_backend_pid()", k, c*10+k)
	}
	want := func(c, k int) string {
		if k == 4 {
			return strconv.Itoa(1000 + c)
		}
		return strconv.Itoa(c*10 + k)
	}
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	var mu sync.Mutex
	movers := 0
	for c := 1; c <= clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			pc, err := pgconn.Connect(ctx, f.dsn()+fmt.Sprintf("&options=-c%%20fence.token%%3D%d", 1000+c))
			if err != nil {
				errs <- err
				return
			}
			defer pc.Close(context.Background())
			rng := rand.New(rand.NewSource(int64(c)))
			var all []string
			for k := 0; k < 5; k++ {
				all = append(all, prepare(c, k))
			}
			if _, err := pc.Exec(ctx, strings.Join(all, "; ")).ReadAll(); err != nil {
				errs <- fmt.Errorf("client %d: PREPARE: %w", c, err)
				return
			}
			backends := map[string]bool{}
			check := func(sql string, ks []int) error {
				results, err := pc.Exec(ctx, sql).ReadAll()
				if err != nil {
					return fmt.Errorf("%s: %w", sql, err)
				}
				i := 0
				for _, r := range results {
					if len(r.Rows) == 0 {
						continue
					}
					if i >= len(ks) || string(r.Rows[0][0]) != want(c, ks[i]) {
						return fmt.Errorf("%s: answer %d is %q, not the client's own", sql, i, r.Rows[0][0])
					}
					backends[string(r.Rows[0][1])] = true
					i++
				}
				if i != len(ks) {
					return fmt.Errorf("%s: %d answers, want %d", sql, i, len(ks))
				}
				return nil
			}
			for round := 0; round < rounds; round++ {
				ks := rng.Perm(5)[:1+rng.Intn(3)]
				var ex []string
				for _, k := range ks {
					ex = append(ex, fmt.Sprintf("EXECUTE s%d", k))
				}
				sql := strings.Join(ex, "; ")
				switch rng.Intn(4) {
				case 0:
					sql = "BEGIN; " + sql + "; COMMIT"
				case 1:
					k := rng.Intn(5)
					sql = fmt.Sprintf("DEALLOCATE s%d; %s; %s", k, prepare(c, k), sql)
				case 2:
					sql = "DEALLOCATE ALL; " + strings.Join(all, "; ") + "; " + sql
				}
				if err := check(sql, ks); err != nil {
					errs <- fmt.Errorf("client %d round %d: %w", c, round, err)
					return
				}
			}
			if len(backends) > 1 {
				mu.Lock()
				movers++
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := fxCounter(t, f.p.Registry, "fenceproxy_pool_pins_total", nil); n != 0 {
		t.Fatalf("%v clients were pinned", n)
	}
	if movers < clients/2 {
		t.Fatalf("only %d of %d clients ran their statements on more than one server connection", movers, clients)
	}
}

// The proxy's own server statements are never the client's: a Bind of the name of the one that carries the
// client's unnamed statement (with any token as its argument) or an EXECUTE of it, by either protocol, gets
// 26000, as for any name the client never prepared, and the token statement stays (it is not what gets closed).
func TestPooledProxyStatementNamesAreNotTheClients(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
	pc := pooledPgConn(t, f, "")
	if _, err := pc.ExecParams(ctx, "SELECT 1", nil, nil, nil, nil).Close(); err != nil { // the token statement is prepared
		t.Fatal(err)
	}
	rr := pc.ExecPrepared(ctx, "fenceproxy_u", [][]byte{[]byte("999"), nil}, nil, nil).Read()
	var pe *pgconn.PgError
	if !errors.As(rr.Err, &pe) || pe.Code != "26000" {
		t.Fatalf("a Bind of the token statement: %v %q", rr.Err, rr.Rows)
	}
	if got := simpleOutcome(ctx, pc, "EXECUTE fenceproxy_u('999', NULL)"); got != "ERROR 26000" {
		t.Fatalf("EXECUTE of the token statement: %s", got)
	}
	_, err := pc.ExecParams(ctx, "EXECUTE fenceproxy_u('999', NULL)", nil, nil, nil, nil).Close()
	if !errors.As(err, &pe) || pe.Code != "26000" {
		t.Fatalf("EXECUTE of the token statement by the extended protocol: %v", err)
	}
	if _, err := pc.ExecParams(ctx, "SELECT 2", nil, nil, nil, nil).Close(); err != nil { // the token statement is intact
		t.Fatalf("the next extended-protocol batch: %v", err)
	}
	if got := simpleOutcome(ctx, pc, "UPDATE "+f.label+" SET balance = 1 WHERE id = 1"); got != "ERROR 55F02" {
		t.Fatalf("a write without a token: %s", got)
	}
}

// The server's errors about a client's SQL-level statement name it as the client does, not by the server
// statement that carries it: the same messages as directly, for a name in use, a wrong number of parameters
// (also under EXPLAIN) and a name dropped earlier in the Query.
func TestPooledSQLPrepareErrorsNameTheClientsStatement(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	steps := []string{
		"PREPARE \"Mixed Name\" (int) AS SELECT $1 + 1",
		"EXECUTE \"Mixed Name\"",
		"EXPLAIN (COSTS OFF) EXECUTE \"Mixed Name\"(1, 2)",
		"PREPARE \"Mixed Name\" AS SELECT 2",
		"PREPARE p2 AS SELECT 1; PREPARE p2 AS SELECT 2",
		"DEALLOCATE p2; EXECUTE p2",
		"EXECUTE nothere",
		"SELECT '\"fenceproxy_q00\"'::int",
		// Names of the proxy's that the client never prepared go as one name nothing holds; the server's 26000
		// names the first, as the client wrote it.
		"EXECUTE fenceproxy_qabc; DEALLOCATE fenceproxy_x",
		"DEALLOCATE fenceproxy_x; EXECUTE fenceproxy_qabc",
	}
	run := func(dsn string) []string {
		pc, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close(context.Background())
		var out []string
		for _, sql := range steps {
			_, err := pc.Exec(ctx, sql).ReadAll()
			var pe *pgconn.PgError
			if !errors.As(err, &pe) {
				out = append(out, fmt.Sprintf("no error (%v)", err))
				continue
			}
			out = append(out, pe.Code+" "+pe.Message+" "+pe.Detail)
		}
		return out
	}
	want := run(pg.SuperDSN())
	got := run(f.dsn())
	for i, sql := range steps {
		if got[i] != want[i] {
			t.Errorf("%s\n pooled %s\n direct %s", sql, got[i], want[i])
		}
	}
}

// An error's position (P) counts characters of the client's text, also where hidden PREPAREs of text that is
// not ASCII went in front of it or among its statements (also after a ROLLBACK in a failed block); an error inside a hidden
// PREPARE (its table dropped since) points at nothing the client wrote in the Query, and has no position.
func TestPooledSQLPrepareErrorPositions(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	table := fxName(t, "sqlprep_pos")
	fxExec(t, f.d, "CREATE TABLE "+table+" (a int)")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	pc := pooledPgConn(t, f, "")
	position := func(sql string) (string, int32) {
		_, err := pc.Exec(ctx, sql).ReadAll()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			return fmt.Sprintf("no error (%v)", err), 0
		}
		return pe.Code, pe.Position
	}
	step := func(sql, code string, pos int32) {
		t.Helper()
		if c, p := position(sql); c != code || p != pos {
			t.Errorf("%s: %s at %d, want %s at %d", sql, c, p, code, pos)
		}
	}
	// Every error makes the connection's statements unknown: the next EXECUTE gets its PREPARE again.
	step("PREPARE u AS SELECT 'é'; PREPARE t AS SELECT a FROM "+table+"; SELECT 1/0", "22012", 0)
	step("SELECT nosuchcol; EXECUTE u", "42703", 8) // in front, after the token statement
	step("BEGIN", "no error (<nil>)", 0)
	step("SELECT 1/0", "22012", 0)
	step("ROLLBACK; SELECT nosuchcol; EXECUTE u", "42703", 18) // after ROLLBACK
	// Hidden PREPAREs in the middle of the text, right before the EXECUTE that needs each, after text that is
	// not ASCII: a position after them counts without them (in the deparsed text, where the server name
	// fenceproxy_q<20 hex digits> stands for the client's).
	server := strings.Repeat("x", 32)
	chars := func(s string) int32 { return int32(utf8.RuneCountInString(s)) + 1 }
	step("SELECT 'é'; EXECUTE u; SELECT nosuchcol", "42703", chars("SELECT 'é'; EXECUTE "+server+"; SELECT "))
	step("SELECT 'é'; SELECT nosuchcol; EXECUTE u", "42703", chars("SELECT 'é'; SELECT "))
	step("SELECT 'ü'; EXECUTE u; SELECT 'é'; EXECUTE t; SELECT nosuchcol", "42703",
		chars("SELECT 'ü'; EXECUTE "+server+"; SELECT 'é'; EXECUTE "+server+"; SELECT "))
	step("BEGIN", "no error (<nil>)", 0)
	step("SELECT 1/0", "22012", 0)
	step("ROLLBACK; SELECT 'é'; EXECUTE u; SELECT nosuchcol", "42703", chars("ROLLBACK; SELECT 'é'; EXECUTE "+server+"; SELECT "))
	fxExec(t, f.d, "DROP TABLE "+table)
	step("EXECUTE t", "42P01", 0)
	step("SELECT 'é'; EXECUTE u; EXECUTE t; SELECT nosuchcol", "42P01", 0) // the hidden PREPARE of t fails
	step("BEGIN", "no error (<nil>)", 0)
	step("SELECT 1/0", "22012", 0)
	step("ROLLBACK; EXECUTE t", "42P01", 0)
}
