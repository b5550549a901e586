package proxy_test

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// Prepared fences (proxy/prepared.go): fenced statements with inlined constants run as EXECUTE of a template
// the proxy prepared on the upstream connection, with the same outcome as the fenced SQL.

// preparedFixture is a proxy protecting one table, with its metrics, for one transport.
type preparedFixture struct {
	p    *proxytest.Proxy
	d    *pgx.Conn
	name string
}

func newPreparedFixture(t *testing.T, tr preparedTransport, upstream string) *preparedFixture {
	t.Helper()
	return newPreparedFixturePool(t, tr, "", upstream)
}

// newPreparedFixturePool is newPreparedFixture with pool, lines of the pool section for the pooled transport.
func newPreparedFixturePool(t *testing.T, tr preparedTransport, pool, upstream string) *preparedFixture {
	t.Helper()
	d := direct(t)
	name := preparedName(t)
	fxCreateTable(t, d, "public."+name)
	fxExec(t, d, fmt.Sprintf("INSERT INTO public.%s (id, balance, fence_token) VALUES (1, 0, 1), (2, 0, 1)", name))
	p := startProxy(t, tr.options(fxTables("public."+name), pool, upstream))
	return &preparedFixture{p: p, d: d, name: name}
}

// preparedTransport is what a prepared-fences test runs on: session mode on the event loop or on the goroutine
// transport (the templates are the session's, on its own upstream connection), or transaction pooling with a
// pool of one server connection (its templates serve every client the connection is lent to, and any of them
// may run code on it).
type preparedTransport int

const (
	loopTransport preparedTransport = iota
	goroutineTransport
	pooledTransport
)

// options are the proxy's options for the transport, with yaml (the tables), pool (the pool section's extra
// lines, for the pooled transport) and upstream (the upstream section's extra lines).
func (tr preparedTransport) options(yaml, pool, upstream string) proxytest.Options {
	if tr == pooledTransport {
		yaml += "pool:\n  mode: transaction\n  size: 1\n" + pool + "auth:\n  type: trust\n"
		if !strings.Contains(upstream, "prepared_fences") {
			upstream += "  prepared_fences: 64\n" // off by default in transaction mode
		}
	}
	return proxytest.Options{YAML: yaml, DisableEventLoop: tr != loopTransport, Upstream: upstream}
}

// preparedName is the test's table name. It must not hold the token setting's first part, "fence": the shape
// cache does not normalise texts that mention it (their analysis may read constants), so they are never prepared.
// Nor the words of SQL-level prepared statements: in transaction pooling a text that holds one runs with its
// EXECUTE names mapped as the client's (pooledsqlprep.go), without prepared fences.
func preparedName(t *testing.T) string {
	return strings.NewReplacer("fence", "fnc", "prepare", "prp", "execute", "xct", "deallocate", "dlc").Replace(fxName(t, "pf"))
}

// simple connects through the proxy with the simple protocol (constants inlined, as pgbench -M simple and
// legacy code send them) and sets the token.
func (f *preparedFixture) simple(t *testing.T, token string) *pgx.Conn {
	t.Helper()
	c := connect(t, f.p.DSN(pgtest.SuperUser, "", pgtest.TestDB)+"&default_query_exec_mode=simple_protocol")
	fxExec(t, c, "SET fence.token = "+token)
	return c
}

// wantRows fails the test unless the table holds want (fxSnapshot's form), read directly.
func (f *preparedFixture) wantRows(t *testing.T, want string) {
	t.Helper()
	if got := fxSnapshot(t, f.d, "public."+f.name); got != want {
		t.Fatalf("rows %s, want %s", got, want)
	}
}

// serverStatement is a statement the proxy prepared on an upstream connection, as the server lists it
// (pg_prepared_statements), with runs, the number of times the server ran it: generic_plans + custom_plans,
// which PostgreSQL counts each time EXECUTE runs the statement (an execution that then fails too). A PREPARE
// alone counts nothing, nor does a statement sent as SQL. The proxy's own counter
// (fenceproxy_prepared_fence_executions_total) is no proof: it counts before the text is chosen.
type serverStatement struct {
	name, prepared, text string // prepared: prepare_time, which tells a statement prepared again under its name
	runs                 int64
}

// serverStatementsSQL lists the proxy's statements on the session's upstream connection, one text column per
// statement (so that a raw client reads it as easily as pgx), the statement's text last: it may hold '|'.
const serverStatementsSQL = "SELECT name || '|' || (generic_plans + custom_plans) || '|' || prepare_time || '|' || statement " +
	"FROM pg_catalog.pg_prepared_statements WHERE pg_catalog.starts_with(name, 'fenceproxy_p') ORDER BY name"

// serverStatements reads the proxy's statements on c's upstream connection, through the proxy.
func serverStatements(t *testing.T, c *pgx.Conn) []serverStatement {
	t.Helper()
	rows, err := c.Query(ctxT(t), serverStatementsSQL)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return parseServerStatements(t, lines)
}

// rawServerStatements is serverStatements for a raw client (which must be idle).
func rawServerStatements(t *testing.T, c *rawClient) []serverStatement {
	t.Helper()
	c.send(t, &pgproto3.Query{String: serverStatementsSQL})
	var lines []string
	for _, m := range transcript(t, c) {
		if v, ok := strings.CutPrefix(m, "D "); ok {
			lines = append(lines, v)
		} else if strings.HasPrefix(m, "E ") {
			t.Fatalf("%s: %s", serverStatementsSQL, m)
		}
	}
	return parseServerStatements(t, lines)
}

func parseServerStatements(t *testing.T, lines []string) []serverStatement {
	t.Helper()
	out := make([]serverStatement, len(lines))
	for i, l := range lines {
		f := strings.SplitN(l, "|", 4)
		if len(f) != 4 {
			t.Fatalf("pg_prepared_statements row %q", l)
		}
		runs, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			t.Fatalf("pg_prepared_statements row %q: %v", l, err)
		}
		out[i] = serverStatement{name: f[0], runs: runs, prepared: f[2], text: f[3]}
	}
	return out
}

// runsSince is how many times the server ran statements of now since before (both of one connection): a
// statement prepared since counts all its runs; one deallocated since counts nothing.
func runsSince(before, now []serverStatement) int64 {
	var n int64
	for _, s := range now {
		n += s.runs
		for _, b := range before {
			if b.name == s.name && b.prepared == s.prepared {
				n -= b.runs
			}
		}
	}
	return n
}

// runsOfNew is how many times the server ran statements of now that were not in before (prepared since, or
// prepared again under a name they had): re-preparation that served executions.
func runsOfNew(before, now []serverStatement) int64 {
	var n int64
	for _, s := range now {
		if !slices.ContainsFunc(before, func(b serverStatement) bool { return b.name == s.name && b.prepared == s.prepared }) {
			n += s.runs
		}
	}
	return n
}

// executions is how many times the server ran the proxy's statements on c's upstream connection (those it still
// holds).
func executions(t *testing.T, c *pgx.Conn) int64 {
	t.Helper()
	return runsSince(nil, serverStatements(t, c))
}

// transaction runs BEGIN; UPDATE ... balance + delta ...; COMMIT, each a Query of its own, as pgbench does.
func (f *preparedFixture) transaction(t *testing.T, c *pgx.Conn, id, delta int) error {
	ctx := ctxT(t)
	for _, q := range []string{"BEGIN", fmt.Sprintf("UPDATE public.%s SET balance = balance + %d WHERE id = %d", f.name, delta, id), "COMMIT"} {
		if _, err := c.Exec(ctx, q); err != nil {
			c.Exec(ctx, "ROLLBACK")
			return err
		}
	}
	return nil
}

func forTransports(t *testing.T, run func(t *testing.T, tr preparedTransport)) {
	t.Run("loop", func(t *testing.T) { run(t, loopTransport) })
	t.Run("goroutines", func(t *testing.T) { run(t, goroutineTransport) })
	t.Run("pooled", func(t *testing.T) { run(t, pooledTransport) })
}

// TestPreparedFencesRunAndFence: after the first transactions, the proxy prepares the shape when the session is
// idle and sends later statements as EXECUTE; they write the same rows, and a stale holder still gets 55F01 from
// the prepared statement.
func TestPreparedFencesRunAndFence(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		c := f.simple(t, "5")
		sum := 0
		for i := 1; i <= 10; i++ {
			if err := f.transaction(t, c, 1, i); err != nil {
				t.Fatalf("transaction %d: %v", i, err)
			}
			sum += i
		}
		n := executions(t, c)
		if n < 6 {
			t.Fatalf("the server ran %v of 10 statements as EXECUTE, want at least 6 (the first ones are sent as SQL while the shape is prepared and verified)", n)
		}
		if m := fxCounter(t, f.p.Registry, "fenceproxy_prepared_fence_executions_total", nil); m != float64(n) {
			t.Fatalf("fenceproxy_prepared_fence_executions_total is %v, the server ran %v EXECUTEs", m, n)
		}
		var names string
		if err := c.QueryRow(ctxT(t), "SELECT string_agg(name, ',') FROM pg_prepared_statements").Scan(&names); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(names, "fenceproxy_p") {
			t.Fatalf("prepared statements on the upstream: %q", names)
		}
		f.wantRows(t, fmt.Sprintf("1:%d:5 2:0:1", sum))

		// A newer holder writes row 1; the stale one's next statement runs as EXECUTE and is refused.
		newer := f.simple(t, "9")
		if err := f.transaction(t, newer, 1, 100); err != nil {
			t.Fatal(err)
		}
		before := executions(t, c)
		err := f.transaction(t, c, 1, 1000)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55F01" {
			t.Fatalf("stale holder: %v, want 55F01", err)
		}
		if executions(t, c) <= before {
			t.Fatal("the stale statement was not sent as EXECUTE")
		}
		f.wantRows(t, fmt.Sprintf("1:%d:9 2:0:1", sum+100))
		// The newer holder's session runs its statements as EXECUTE too, and without a token the write is
		// refused by the prepared statement as by the SQL.
		// Its first transaction prepares the shape on its own connection; the next ones verify it and run it.
		for range 3 {
			if err := f.transaction(t, newer, 2, 7); err != nil {
				t.Fatal(err)
			}
		}
		if executions(t, newer) == 0 {
			t.Fatal("the newer holder's session ran no statement as EXECUTE")
		}
		fxExec(t, newer, "RESET fence.token")
		before = executions(t, newer)
		err = f.transaction(t, newer, 2, 7)
		if !errors.As(err, &pgErr) || pgErr.Code != "55F02" {
			t.Fatalf("no token: %v, want 55F02", err)
		}
		if executions(t, newer) <= before {
			t.Fatal("the statement without a token was not sent as EXECUTE")
		}
	})
}

// TestPreparedFencesDroppedByClient: DISCARD ALL and DEALLOCATE ALL from the client, and DEALLOCATE ALL run by a
// function where the proxy cannot see it, drop the proxy's statements; the proxy prepares again.
func TestPreparedFencesDroppedByClient(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		fn := fxName(t, "dealloc")
		fxExec(t, f.d, "CREATE FUNCTION public."+fn+"() RETURNS void LANGUAGE plpgsql AS $$ BEGIN EXECUTE 'DEALLOCATE ALL'; END $$")
		t.Cleanup(func() { f.d.Exec(ctxT(t), "DROP FUNCTION IF EXISTS public."+fn+"()") })
		c := f.simple(t, "5")
		// warm runs five transactions and fails unless the server ran a statement as EXECUTE that was not among
		// before (the statements before the drop): the proxy prepared again.
		warm := func(what string, before []serverStatement) {
			t.Helper()
			for i := range 5 {
				if err := f.transaction(t, c, 2, i+1); err != nil {
					t.Fatalf("%s, transaction %d: %v", what, i, err)
				}
			}
			if runsOfNew(before, serverStatements(t, c)) == 0 {
				t.Fatalf("%s: no statement prepared again ran as EXECUTE (before: %v, now: %v)", what, before, serverStatements(t, c))
			}
		}
		warm("at first", nil)
		for _, drop := range []string{"DISCARD ALL", "DEALLOCATE ALL", "deallocate all"} {
			before := serverStatements(t, c)
			fxExec(t, c, drop)
			if drop == "DISCARD ALL" {
				fxExec(t, c, "SET fence.token = 5")
			}
			warm("after "+drop, before)
		}
		// Behind the proxy's back: the verification before the next BEGIN finds the statements gone; the
		// proxy sends SQL and prepares again, and the client sees no error.
		before := serverStatements(t, c)
		fxExec(t, c, "SELECT public."+fn+"()")
		if err := f.transaction(t, c, 2, 5); err != nil {
			t.Fatalf("after a function's DEALLOCATE ALL: %v", err)
		}
		warm("after a function's DEALLOCATE ALL", before)
	})
}

// TestPreparedFencesRefused: a PREPARE the server refuses (here: the client already uses the name) costs the
// client nothing: its statements are sent as SQL, and it sees no error. A name clash is the connection's own: the
// next session prepares the same shape. (In a pool the client's own PREPARE gets a name of the pool's, so the
// clash is planted by code the server runs; every client of that connection then sends the shape as SQL.)
func TestPreparedFencesRefused(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		c := f.simple(t, "5")
		if tr == pooledTransport {
			fxExec(t, c, "DO $$BEGIN EXECUTE 'PREPARE fenceproxy_p1 AS SELECT 1'; END$$")
		} else {
			fxExec(t, c, "PREPARE fenceproxy_p1 AS SELECT 1")
		}
		for i := 1; i <= 6; i++ {
			if err := f.transaction(t, c, 1, i); err != nil {
				t.Fatalf("transaction %d: %v", i, err)
			}
		}
		f.wantRows(t, "1:21:5 2:0:1")
		if n := fxCounter(t, f.p.Registry, "fenceproxy_prepared_fences_total", map[string]string{"outcome": "failed"}); n != 1 {
			t.Fatalf("%v failed PREPAREs, want 1", n)
		}
		if n := executions(t, c); n != 0 {
			t.Fatalf("the server ran %v EXECUTEs", n)
		}
		other := f.simple(t, "5")
		for i := 1; i <= 4; i++ {
			if err := f.transaction(t, other, 2, i); err != nil {
				t.Fatalf("transaction %d: %v", i, err)
			}
		}
		if n := executions(t, other); (n == 0) != (tr == pooledTransport) {
			t.Fatalf("the next session ran the shape %d times as EXECUTE (in a pool it shares the connection with the clash)", n)
		}
	})
}

// TestPreparedFencesUnpreparable: a template the server cannot prepare anywhere (a type modifier written as a
// constant, numeric(10,2), becomes a parameter, which the grammar refuses there: 42601) fails its PREPARE once;
// its statements are sent as SQL, on every connection, and the client sees no error.
func TestPreparedFencesUnpreparable(t *testing.T) {
	f := newPreparedFixture(t, loopTransport, "")
	for _, token := range []string{"5", "6"} {
		c := f.simple(t, token)
		for i := range 6 {
			q := fmt.Sprintf("UPDATE public.%s SET balance = %d::numeric(10,2) WHERE id = %d", f.name, i, i%2+1)
			if _, err := c.Exec(ctxT(t), q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		if n := len(serverStatements(t, c)); n != 0 {
			t.Fatalf("%d statements of the proxy's on the server, of an unpreparable shape", n)
		}
	}
	f.wantRows(t, "1:4:6 2:5:6")
	if n := fxCounter(t, f.p.Registry, "fenceproxy_prepared_fences_total", map[string]string{"outcome": "failed"}); n != 1 {
		t.Fatalf("%v failed PREPAREs, want 1 (a template no connection can prepare is not offered again)", n)
	}
}

// TestPreparedFencesOff: upstream.prepared_fences: 0, and token.scope: transaction by default (behind a
// transaction pooler a later statement may reach a server connection that never saw the PREPARE), send the SQL.
func TestPreparedFencesOff(t *testing.T) {
	for _, c := range []struct{ name, upstream, yaml string }{
		{"prepared_fences 0", "  prepared_fences: 0\n", ""},
		{"token.scope transaction", "", "token:\n  scope: transaction\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := direct(t)
			name := preparedName(t)
			fxCreateTable(t, d, "public."+name)
			fxExec(t, d, fmt.Sprintf("INSERT INTO public.%s (id, balance, fence_token) VALUES (1, 0, 1)", name))
			p := startProxy(t, proxytest.Options{YAML: fxTables("public."+name) + c.yaml, Upstream: c.upstream})
			cl := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB)+"&default_query_exec_mode=simple_protocol")
			for i := range 6 {
				if _, err := cl.Exec(ctxT(t), fmt.Sprintf("BEGIN; SET LOCAL fence.token = 5; UPDATE public.%s SET balance = balance + %d WHERE id = 1; COMMIT", name, i)); err != nil {
					t.Fatal(err)
				}
				if _, err := cl.Exec(ctxT(t), fmt.Sprintf("UPDATE public.%s SET balance = balance + %d WHERE id = 1", name, i)); err == nil {
					t.Fatal("a write without a token succeeded")
				}
			}
			if n := fxCounter(t, p.Registry, "fenceproxy_prepared_fences_total", nil); n != 0 {
				t.Fatalf("%v PREPAREs sent", n)
			}
			if st := serverStatements(t, cl); len(st) != 0 {
				t.Fatalf("statements of the proxy's on the server: %v", st)
			}
		})
	}
}

// TestPreparedFencesAfterBeginWithModes: a transaction opened with transaction modes (BEGIN ISOLATION LEVEL ...,
// START TRANSACTION READ WRITE) runs no code, so the proxy verifies its statements before it as before a bare
// BEGIN and sends the fenced statement in it as EXECUTE (counted by the server); one opened with code after
// BEGIN in the same text does not.
func TestPreparedFencesAfterBeginWithModes(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		c := f.simple(t, "5")
		run := func(begin string, delta int) {
			t.Helper()
			for _, q := range []string{begin, fmt.Sprintf("UPDATE public.%s SET balance = balance + %d WHERE id = 1", f.name, delta), "COMMIT"} {
				if _, err := c.Exec(ctxT(t), q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
		}
		balance := 0
		for i := 1; i <= 3; i++ { // prepared after the first, verified before the next
			run("BEGIN", i)
			balance += i
		}
		for _, begin := range []string{"BEGIN ISOLATION LEVEL REPEATABLE READ", "START TRANSACTION READ WRITE, NOT DEFERRABLE"} {
			before := executions(t, c)
			for i := 1; i <= 3; i++ {
				run(begin, i)
				balance += i
			}
			if got := executions(t, c) - before; got != 3 {
				t.Fatalf("after %s: the server ran the proxy's statement %d times in 3 transactions, want 3", begin, got)
			}
		}
		before := executions(t, c)
		run("BEGIN; SELECT 1", 1)
		balance++
		if got := executions(t, c) - before; got != 0 {
			t.Fatalf("after BEGIN; SELECT 1: the server ran the proxy's statement %d times, want 0 (sent as SQL)", got)
		}
		f.wantRows(t, fmt.Sprintf("1:%d:5 2:0:1", balance))
	})
}
