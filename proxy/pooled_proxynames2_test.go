package proxy_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// More spellings of the proxy's settings statement (fenceproxy_c) in a readable text: under CREATE TABLE AS
// and under EXPLAIN of one, behind nested comments, in a second statement after a dollar-quoted string with a
// tag, and a client PREPARE of that name followed by its EXECUTE. None runs the proxy's statement: the
// client's token stays what it set (none), and the statement stays on the connection for its owner.
func TestPooledProxyNameMoreSpellings(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	other := pooledPgConn(t, f, "")
	hostile := pooledPgConn(t, f, "")
	step := func(c *pgconn.PgConn, sql, want string) {
		t.Helper()
		if got := simpleOutcome(ctx, c, sql); got != want {
			t.Fatalf("%s\n got  %s\n want %s", sql, got, want)
		}
	}
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP TABLE IF EXISTS pooled_pn2_t") })
	step(other, "SET work_mem = '5MB'", "SET; ")
	args := `(ARRAY[concat('fen', 'ce.token')], ARRAY['95'])`
	for _, sql := range []string{
		`CREATE TABLE pooled_pn2_t AS EXECUTE fenceproxy_c` + args,
		`EXPLAIN (COSTS OFF) CREATE TABLE pooled_pn2_t AS EXECUTE fenceproxy_c` + args,
		`EXECUTE /* a /* nested */ comment */ fenceproxy_c` + args,
		`SELECT $x$ ' $$ $x$; EXECUTE fenceproxy_c` + args,
		`SELECT E'\\'; EXECUTE fenceproxy_c` + args,
	} {
		step(other, "SELECT 1", `SELECT 1 "1"; `) // the connection's settings are the other client's again
		got := simpleOutcome(ctx, hostile, sql)
		if got != "ERROR 26000" && got != `SELECT 1 " ' $$ "; ERROR 26000` && got != `SELECT 1 "\\"; ERROR 26000` {
			t.Errorf("%s: %s", sql, got)
		}
		step(hostile, "SHOW fence.token", `SHOW ""; `)
	}
	step(hostile, `PREPARE fenceproxy_c(text[], text[]) AS SELECT 1`, "PREPARE; ")
	step(other, "SELECT 1", `SELECT 1 "1"; `)
	step(hostile, `EXECUTE fenceproxy_c`+args, `SELECT 1 "1"; `)
	step(hostile, "SHOW fence.token", `SHOW ""; `)
	step(other, "SELECT count(*) FROM pg_prepared_statements WHERE name = 'fenceproxy_c' AND statement LIKE '%set_config%'", `SELECT 1 "1"; `)
}
