package proxy_test

// Issue 11, classes 2 and 3, and issue 18: the fence cannot be redefined by search_path and user objects, one
// token per statement whatever runs inside it, and writes naming the token column are fenced (override) or refused.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lib/pq"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// hostileOps shadows, in schema %[1]s, every operator and function the fence could use if it were not
// schema-qualified: operators that always say yes, functions that return a forged token or an empty/valid-looking
// string. hostileTypes shadows the types (as domains over text) and the collation. They live in two schemas so that
// each set can come first in search_path alone (a type that breaks the old fence's casts would turn its silent
// pass into an error) as well as together.
const hostileOps = `
CREATE FUNCTION %[1]s.yes(bigint, bigint) RETURNS bool LANGUAGE sql AS 'SELECT true';
CREATE FUNCTION %[1]s.yes(bigint, integer) RETURNS bool LANGUAGE sql AS 'SELECT true';
CREATE FUNCTION %[1]s.yes(integer, integer) RETURNS bool LANGUAGE sql AS 'SELECT true';
CREATE FUNCTION %[1]s.yes(text, text) RETURNS bool LANGUAGE sql AS 'SELECT true';
CREATE FUNCTION %[1]s.one(text, text) RETURNS text LANGUAGE sql AS 'SELECT ''1''';
CREATE OPERATOR %[1]s.<= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = %[1]s.yes);
CREATE OPERATOR %[1]s.<= (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = %[1]s.yes);
CREATE OPERATOR %[1]s.<= (LEFTARG = text, RIGHTARG = text, FUNCTION = %[1]s.yes);
CREATE OPERATOR %[1]s.< (LEFTARG = integer, RIGHTARG = integer, FUNCTION = %[1]s.yes);
CREATE OPERATOR %[1]s.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = %[1]s.yes);
CREATE OPERATOR %[1]s.= (LEFTARG = text, RIGHTARG = text, FUNCTION = %[1]s.yes);
CREATE OPERATOR %[1]s.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = %[1]s.yes);
CREATE OPERATOR %[1]s.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = %[1]s.one);
CREATE FUNCTION %[1]s.ltrim(text, text) RETURNS text LANGUAGE sql AS 'SELECT ''''';
CREATE FUNCTION %[1]s.length(text) RETURNS integer LANGUAGE sql AS 'SELECT 1';
CREATE FUNCTION %[1]s.current_setting(text) RETURNS text LANGUAGE sql AS 'SELECT ''1''';
CREATE FUNCTION %[1]s.current_setting(text, boolean) RETURNS text LANGUAGE sql AS 'SELECT ''99999''';
CREATE FUNCTION %[1]s.encode(bytea, text) RETURNS text LANGUAGE sql AS 'SELECT ''''';
CREATE FUNCTION %[1]s.convert_to(text, name) RETURNS bytea LANGUAGE sql AS 'SELECT ''''::bytea';
CREATE FUNCTION %[1]s.concat(VARIADIC text[]) RETURNS text LANGUAGE sql AS 'SELECT ''1''';
CREATE FUNCTION %[1]s.textcat(text, text) RETURNS text LANGUAGE sql AS 'SELECT ''1''';
CREATE FUNCTION %[1]s.int8(text) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint';
CREATE FUNCTION %[1]s.text(bigint) RETURNS text LANGUAGE sql AS 'SELECT ''1''';
CREATE FUNCTION %[1]s.coalesce(bigint, integer) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';
`

const hostileTypes = `
CREATE DOMAIN %[1]s.int8 AS text;
CREATE DOMAIN %[1]s.text AS varchar;
CREATE DOMAIN %[1]s.bool AS text;
CREATE COLLATION %[1]s."C" FROM pg_catalog."POSIX";
`

// hostileSetup is a protected table, a non-superuser role that owns a schema full of hostile objects and may write
// the table, and a proxy.
type hostileSetup struct {
	*fenced
	role, ops, types string // the role, its schema of operators and functions, its schema of types
}

func newHostile(t *testing.T) *hostileSetup {
	t.Helper()
	f := newFenced(t)
	h := &hostileSetup{fenced: f, role: fxName(t, "r"), ops: fxName(t, "evilops"), types: fxName(t, "eviltypes")}
	fxExec(t, f.d, fmt.Sprintf("CREATE ROLE %s LOGIN", h.role))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, q := range []string{"DROP SCHEMA IF EXISTS " + h.ops + ", " + h.types + " CASCADE", "DROP OWNED BY " + h.role, "DROP ROLE " + h.role} {
			if _, err := f.d.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	// Upstream connections are not reused, so that a new login sees ALTER ROLE SET.
	h.p = startProxy(t, proxytest.Options{YAML: fxTables(f.label), Upstream: "  reuse:\n    max_idle: 0\n"})
	fxExec(t, f.d, fmt.Sprintf("CREATE SCHEMA %s AUTHORIZATION %s", h.ops, h.role))
	fxExec(t, f.d, fmt.Sprintf("CREATE SCHEMA %s AUTHORIZATION %s", h.types, h.role))
	fxExec(t, f.d, fmt.Sprintf("GRANT ALL ON public.%s TO %s", f.name, h.role))
	fxExec(t, f.d, fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s", pgtest.TestDB, h.role))
	// The role creates its objects itself, directly: no superuser power is needed for any of them.
	own := connect(t, proxytest.DSN(pg.Addr(), h.role, "", pgtest.TestDB))
	fxExec(t, own, fmt.Sprintf(hostileOps, h.ops))
	fxExec(t, own, fmt.Sprintf(hostileTypes, h.types))
	// Prove the objects bite: unqualified, the old fence's comparison says yes to a stale token.
	var yes bool
	fxExec(t, own, fmt.Sprintf("SET search_path = %s, pg_catalog, public", h.ops))
	if err := own.QueryRow(ctxT(t), "SELECT COALESCE(50::bigint, 0) <= 5::bigint").Scan(&yes); err != nil || !yes {
		t.Fatalf("the hostile <= is not in force: %v %v", yes, err)
	}
	return h
}

// conn connects through the proxy as the hostile role, with search_path = schemas, pg_catalog, public set the given
// way.
func (h *hostileSetup) conn(t *testing.T, how, schemas string) *pgx.Conn {
	t.Helper()
	path := schemas + ", pg_catalog, public"
	dsn := h.p.DSN(h.role, "", pgtest.TestDB)
	switch how {
	case "set":
		c := connect(t, dsn)
		fxExec(t, c, "SET search_path = "+path)
		return c
	case "startup":
		return connect(t, dsn+"&options="+strings.ReplaceAll(url.QueryEscape("-c search_path="+strings.ReplaceAll(path, " ", "")), "+", "%20"))
	case "alter role":
		fxExec(t, h.d, fmt.Sprintf("ALTER ROLE %s SET search_path = %s", h.role, path))
		t.Cleanup(func() { h.d.Exec(context.Background(), fmt.Sprintf("ALTER ROLE %s RESET search_path", h.role)) })
		return connect(t, dsn)
	}
	t.Fatalf("unknown way %q", how)
	return nil
}

// Class 2: with every operator, function, type and collation the fence uses shadowed in a schema first in
// search_path (by SET, startup option and ALTER ROLE SET), stale writes still get 55F01, missing tokens 55F02,
// invalid ones 55F03, fresh writes write the session's real token, and no row's token is ever lowered.
func TestFencingHostileSearchPath(t *testing.T) {
	h := newHostile(t)
	ctx := ctxT(t)
	for _, run := range []struct{ how, set, schemas string }{
		{"set", "ops", h.ops}, {"set", "types", h.types}, {"set", "both", h.ops + ", " + h.types},
		{"startup", "ops", h.ops}, {"startup", "both", h.types + ", " + h.ops},
		{"alter role", "ops", h.ops}, {"alter role", "both", h.ops + ", " + h.types},
	} {
		t.Run(strings.ReplaceAll(run.how, " ", "_")+"/"+run.set, func(t *testing.T) {
			c := h.conn(t, run.how, run.schemas)
			var path string
			nospace := func(s string) string { return strings.ReplaceAll(s, " ", "") }
			if err := c.QueryRow(ctx, "SHOW search_path").Scan(&path); err != nil || !strings.HasPrefix(nospace(path), nospace(run.schemas)) {
				t.Fatalf("search_path %q (%v), want the hostile schema first", path, err)
			}
			h.reset(t, "(1, 100, 50), (2, 100, 50)")
			before := h.snapshot(t)
			fxExec(t, c, "SET fence.token = 5")
			stale := []string{
				"UPDATE %[1]s SET balance = 0 WHERE id = 1",
				"UPDATE %[1]s SET balance = 0",
				"DELETE FROM %[1]s WHERE id = 1",
				"INSERT INTO %[1]s (id, balance) VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance",
				"INSERT INTO %[1]s (id, balance) VALUES (7, 0), (1, 0) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance",
				"INSERT INTO %[1]s (id, balance) SELECT 1, 0 ON CONFLICT (id) DO UPDATE SET balance = 0",
				"WITH u AS (UPDATE %[1]s SET balance = 0 WHERE id = 1 RETURNING 1) SELECT count(*) FROM u",
				"UPDATE %[1]s SET balance = 0, fence_token = 1 WHERE id = 1",
			}
			for _, q := range stale {
				q = h.sql(q)
				_, err := c.Exec(ctx, q, pgx.QueryExecModeSimpleProtocol)
				wantStale(t, err, h.label, 50, 5)
				_, err = execExtended(ctx, c, q)
				wantStale(t, err, h.label, 50, 5)
				h.wantUnchanged(t, before)
			}
			// Prepared: SQL-level PREPARE/EXECUTE and a named extended-protocol statement with parameters.
			fxExec(t, c, h.sql("PREPARE hostile_upd(int) AS UPDATE %[1]s SET balance = 0 WHERE id = $1"))
			_, err := c.Exec(ctx, "EXECUTE hostile_upd(1)", pgx.QueryExecModeSimpleProtocol)
			wantStale(t, err, h.label, 50, 5)
			fxExec(t, c, "DEALLOCATE hostile_upd")
			_, err = c.Exec(ctx, h.sql("UPDATE %[1]s SET balance = $1 WHERE id = $2"), pgx.QueryExecModeCacheStatement, 0, 1)
			wantStale(t, err, h.label, 50, 5)
			h.wantUnchanged(t, before)

			// Missing and invalid tokens, the invalid one set at execution time where the proxy cannot see it.
			fxExec(t, c, "RESET fence.token")
			_, err = c.Exec(ctx, h.sql("UPDATE %[1]s SET balance = 0 WHERE id = 1"))
			wantFenceErr(t, err, "55F02", "missing fencing token", h.label)
			for _, bad := range []string{"abc", "0", "99999999999999999999", "-5", ""} {
				fxExec(t, c, "SELECT pg_catalog.set_config('fence.token', $1::pg_catalog.text, false)", bad)
				for _, q := range []string{"UPDATE %[1]s SET balance = 0 WHERE id = 1", "INSERT INTO %[1]s (id, balance) VALUES (9, 0)", "DELETE FROM %[1]s WHERE id = 1"} {
					_, err = c.Exec(ctx, h.sql(q))
					code := "55F03"
					if bad == "" {
						code = "55F02"
					}
					var pe *pgconn.PgError
					if !errors.As(err, &pe) || pe.Code != code {
						t.Fatalf("token %q, %s: want %s, got %v", bad, h.sql(q), code, err)
					}
				}
			}
			h.wantUnchanged(t, before)

			// Fresh writes work and write the real token, not the hostile current_setting's.
			fxExec(t, c, "SET fence.token = 60")
			fxExec(t, c, h.sql("UPDATE %[1]s SET balance = 1 WHERE id = 1"))
			fxExec(t, c, h.sql("INSERT INTO %[1]s (id, balance) VALUES (3, 1), (4, 1)"))
			fxExec(t, c, h.sql("INSERT INTO %[1]s DEFAULT VALUES"))
			fxExec(t, c, h.sql("INSERT INTO %[1]s (id, balance) SELECT 5, 1"))
			fxExec(t, c, h.sql("INSERT INTO %[1]s (id, balance) VALUES (2, 1) ON CONFLICT (id) DO UPDATE SET balance = 2"))
			var n, bad int
			if err := h.d.QueryRow(ctx, h.sql("SELECT count(*), count(*) FILTER (WHERE fence_token IS DISTINCT FROM 60) FROM public.%[1]s")).Scan(&n, &bad); err != nil || n != 6 || bad != 0 {
				t.Fatalf("after fresh writes under 60: %d rows, %d without token 60 (%v): %s", n, bad, err, h.snapshot(t))
			}
		})
	}
}

// Class 3: with token 10, nothing inside a statement changes the token it checks and writes: a set_config in the
// SET list, in the WHERE, in a later VALUES row, in ON CONFLICT DO UPDATE, or inside a SQL function.
func TestFencingOneTokenPerStatement(t *testing.T) {
	f := newFenced(t)
	ctx := ctxT(t)
	fn := f.name + "_lower"
	fxExec(t, f.d, fmt.Sprintf("CREATE FUNCTION public.%s() RETURNS int LANGUAGE sql AS $$SELECT length(set_config('fence.token', '1', false)) - 1$$", fn))
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION public."+fn) })
	lower := "length(set_config('fence.token', '1', false)) - 1" // 0, and the session's token becomes 1
	cases := []string{
		"UPDATE %[1]s SET balance = balance + " + lower + " WHERE id = 1",
		"UPDATE %[1]s SET balance = balance + %[2]s() WHERE id = 1",
		"UPDATE %[1]s SET balance = 7 WHERE id = 1 AND balance + " + lower + " = 100",
		"UPDATE %[1]s SET balance = 7 WHERE balance + %[2]s() = 100",
		"INSERT INTO %[1]s (id, balance) VALUES (1, " + lower + ") ON CONFLICT (id) DO UPDATE SET balance = excluded.balance + " + lower,
		"INSERT INTO %[1]s (id, balance) VALUES (5, 0), (6, " + lower + "), (1, 0) ON CONFLICT (id) DO UPDATE SET balance = 7",
		"INSERT INTO %[1]s (id, balance) VALUES (1, " + lower + "), (5, 0) ON CONFLICT (id) DO UPDATE SET balance = 7",
		"INSERT INTO %[1]s (id, balance) SELECT 1, %[2]s() ON CONFLICT (id) DO UPDATE SET balance = 7",
		"INSERT INTO %[1]s (id, balance) VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET balance = %[2]s() WHERE %[2]s() = 0",
		"INSERT INTO %[1]s (id, balance) VALUES (5, 0), (6, %[2]s()), (7, 0)",
		"INSERT INTO %[1]s (id, balance) SELECT g, %[2]s() FROM generate_series(5, 7) g",
		"WITH u AS (UPDATE %[1]s SET balance = balance + %[2]s() RETURNING 1) SELECT count(*) FROM u",
		"UPDATE %[1]s SET balance = 7, fence_token = %[2]s() WHERE id = 1",
		"DELETE FROM %[1]s WHERE id = 2 AND %[2]s() = 0",
	}
	for _, q := range cases {
		q = fmt.Sprintf(q, f.name, "public."+fn)
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
			f.reset(t, "(1, 100, 10), (2, 100, 3)")
			before := f.snapshot(t)
			c := f.conn(t, "10")
			if _, err := c.Exec(ctx, q, mode); err != nil {
				// Only a single-row VALUES may build the set_config's column before the token column: then the
				// statement checks and writes 1 throughout, and is stale. Everywhere else the token is read first.
				if !strings.Contains(q, "VALUES (1, "+lower+") ON CONFLICT") {
					t.Fatalf("%s (%v): %v", q, mode, err)
				}
				wantStale(t, err, f.label, 10, 1)
				f.wantUnchanged(t, before)
				continue
			}
			var tok string
			// (A value supplied for the token column is never evaluated: see TestFencingTokenColumnOverride.)
			if err := c.QueryRow(ctx, "SHOW fence.token").Scan(&tok); err != nil || tok != "1" && !strings.Contains(q, "fence_token =") {
				t.Fatalf("%s: the statement did not run its set_config (token %q, %v)", q, tok, err)
			}
			var bad int
			if err := f.d.QueryRow(ctx, f.sql("SELECT count(*) FILTER (WHERE fence_token < 10 AND id <> 2) FROM public.%[1]s")).Scan(&bad); err != nil || bad != 0 {
				t.Fatalf("%s (%v): rows with a token lowered below 10 (%v): %s", q, mode, err, f.snapshot(t))
			}
		}
	}
	// The statement's token is checked as well as written: with the row at 10, a writer whose token is 5 and who
	// raises it to 20 inside the statement is still stale.
	f.reset(t, "(1, 100, 10)")
	before := f.snapshot(t)
	c := f.conn(t, "5")
	_, err := c.Exec(ctx, f.sql("UPDATE %[1]s SET balance = balance + length(set_config('fence.token', '20', false)) WHERE id = 1"))
	wantStale(t, err, f.label, 10, 5)
	f.wantUnchanged(t, before)
}

// Issue 18: writes naming the token column are fenced as if it were not named: it is written as the session's
// token whatever the statement supplies, the row check is unchanged, parameters keep their types.
func TestFencingTokenColumnOverride(t *testing.T) {
	f := newFenced(t)
	ctx := ctxT(t)
	c := f.conn(t, "42")
	for _, q := range []string{
		"UPDATE %[1]s SET fence_token = 5 WHERE id = 1",
		"UPDATE %[1]s SET balance = 1, \"fence_token\" = NULL WHERE id = 1",
		"UPDATE %[1]s SET FENCE_TOKEN = DEFAULT WHERE id = 1",
		"UPDATE %[1]s AS a SET fence_token = a.fence_token - 1000 WHERE id = 1",
		"INSERT INTO %[1]s (id, balance, fence_token) VALUES (3, 1, 1), (4, 1, NULL), (5, 1, DEFAULT)",
		"INSERT INTO %[1]s (id, balance, fence_token) VALUES (3, 1, 1), (4, 1, now()::text::int8)",
		"INSERT INTO %[1]s (fence_token, id) SELECT 1, 6",
		"INSERT INTO %[1]s (id, balance, fence_token) VALUES (1, 1, 1) ON CONFLICT (id) DO UPDATE SET fence_token = excluded.fence_token",
		"INSERT INTO %[1]s (id, fence_token) VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET fence_token = 1, balance = 3",
		"WITH u AS (UPDATE %[1]s SET fence_token = 1 WHERE id = 1 RETURNING 1) SELECT count(*) FROM u",
	} {
		for _, extended := range []bool{false, true} {
			f.reset(t, "(1, 100, 10), (2, 100, 50)")
			var err error
			if extended {
				_, err = execExtended(ctx, c, f.sql(q))
			} else {
				_, err = c.Exec(ctx, f.sql(q))
			}
			if err != nil {
				t.Fatalf("%s (extended %v): %v", f.sql(q), extended, err)
			}
			// Rows 1 (10) and 2 (50) may be left alone; every row written has 42.
			var bad, written int
			if err := f.d.QueryRow(ctx, f.sql("SELECT count(*) FILTER (WHERE fence_token IS NULL OR fence_token NOT IN (10, 50, 42)), count(*) FILTER (WHERE fence_token = 42) FROM public.%[1]s")).Scan(&bad, &written); err != nil || bad != 0 || written == 0 {
				t.Fatalf("%s (extended %v): rows written without token 42: %s", f.sql(q), extended, f.snapshot(t))
			}
		}
	}
	f.reset(t, "(1, 100, 10), (2, 100, 50)")
	// Parameters, with pgx (Describe decides the types) and lib/pq (types left to the server).
	if _, err := c.Exec(ctx, f.sql("UPDATE %[1]s SET balance = $1, fence_token = $2 WHERE id = $3"), 9, 1, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, f.sql("INSERT INTO %[1]s (id, balance, fence_token) VALUES ($1, $2, $3) ON CONFLICT (id) DO UPDATE SET fence_token = excluded.fence_token"), 7, 1, int64(1)); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("postgres", f.dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	pc, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if _, err := pc.ExecContext(ctx, "SET fence.token = 42"); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.ExecContext(ctx, f.sql("INSERT INTO %[1]s (id, balance, fence_token) VALUES ($1, $2, $3)"), 8, 1, 1); err != nil {
		t.Fatalf("lib/pq INSERT naming the token column: %v", err)
	}
	if _, err := pc.ExecContext(ctx, f.sql("UPDATE %[1]s SET fence_token = $1 WHERE id = $2"), "3", 8); err != nil {
		t.Fatalf("lib/pq UPDATE of the token column: %v", err)
	}
	var n, bad int
	if err := f.d.QueryRow(ctx, f.sql("SELECT count(*), count(*) FILTER (WHERE fence_token IS DISTINCT FROM 42 AND id <> 2) FROM public.%[1]s")).Scan(&n, &bad); err != nil || n != 4 || bad != 0 {
		t.Fatalf("rows (want 4, all but row 2 with token 42): %d, %d wrong (%v): %s", n, bad, err, f.snapshot(t))
	}
	// The row check is unchanged: row 2 holds 50.
	before := f.snapshot(t)
	for _, q := range []string{
		"UPDATE %[1]s SET fence_token = 99 WHERE id = 2",
		"INSERT INTO %[1]s (id, fence_token) VALUES (2, 99) ON CONFLICT (id) DO UPDATE SET fence_token = excluded.fence_token",
	} {
		_, err := c.Exec(ctx, f.sql(q))
		wantStale(t, err, f.label, 50, 42)
	}
	_, err = pc.ExecContext(ctx, f.sql("UPDATE %[1]s SET fence_token = $1 WHERE id = $2"), 99, 2)
	var pe *pq.Error
	if !errors.As(err, &pe) || pe.Code != "55F01" {
		t.Fatalf("lib/pq stale UPDATE naming the token column: want 55F01, got %v", err)
	}
	f.wantUnchanged(t, before)

	// Describe: the parameters and columns are the client's own, as on an unprotected twin.
	plain := f.name + "_plain"
	fxCreateTable(t, f.d, "public."+plain)
	for _, q := range []string{
		"UPDATE %s SET balance = $1, fence_token = $2 WHERE id = $3",
		"UPDATE %s SET fence_token = $1::int4 WHERE id = $2 RETURNING fence_token",
		"INSERT INTO %s (id, balance, fence_token) VALUES ($1, $2, $3) RETURNING *",
		"INSERT INTO %s (id, fence_token) VALUES ($1, $2), ($3, $4)",
		"INSERT INTO %s (id, fence_token) SELECT $1, $2",
		"INSERT INTO %s (id, fence_token) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET fence_token = $3",
	} {
		want, werr := c.PgConn().Prepare(ctx, "", fmt.Sprintf(q, plain), nil)
		got, err := c.PgConn().Prepare(ctx, "", fmt.Sprintf(q, f.name), nil)
		if werr != nil || err != nil {
			t.Fatalf("prepare %s: %v; unprotected: %v", fmt.Sprintf(q, f.name), err, werr)
		}
		if fmt.Sprint(got.ParamOIDs) != fmt.Sprint(want.ParamOIDs) || len(got.Fields) != len(want.Fields) {
			t.Errorf("%s: parameters %v columns %d, want %v and %d", fmt.Sprintf(q, f.name), got.ParamOIDs, len(got.Fields), want.ParamOIDs, len(want.Fields))
		}
	}
	// A client-declared parameter type is kept (int4 here, where the server would infer int8).
	got, err := c.PgConn().Prepare(ctx, "", f.sql("UPDATE %[1]s SET fence_token = $1 WHERE id = $2"), []uint32{23, 23})
	if err != nil || fmt.Sprint(got.ParamOIDs) != "[23 23]" {
		t.Fatalf("declared int4 parameter: %v %v", got, err)
	}
}

// token_column_writes: refuse keeps the 55F04 refusal; INSERT without a column list is refused in both modes.
func TestFencingTokenColumnRefuse(t *testing.T) {
	d := direct(t)
	name := fxName(t, "fr")
	fxCreateTable(t, d, "public."+name)
	p := startProxy(t, proxytest.Options{YAML: fmt.Sprintf("tables:\n  - name: public.%s\n    token_column: fence_token\n    token_column_writes: refuse\n", name)})
	f := &fenced{p: p, d: d, name: name, label: "public." + name}
	ctx := ctxT(t)
	f.reset(t, "(1, 100, 10)")
	before := f.snapshot(t)
	c := f.conn(t, "42")
	for _, q := range []string{
		"UPDATE %[1]s SET fence_token = 5 WHERE id = 1",
		"INSERT INTO %[1]s (id, fence_token) VALUES (2, 1)",
		"INSERT INTO %[1]s (id, balance) VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET fence_token = excluded.fence_token",
	} {
		_, err := c.Exec(ctx, f.sql(q))
		wantFenceErr(t, err, "55F04", "unfenceable write", f.label)
	}
	f.wantUnchanged(t, before)
	if _, err := c.Exec(ctx, f.sql("UPDATE %[1]s SET balance = 1 WHERE id = 1")); err != nil {
		t.Fatal(err)
	}
	for _, g := range []*fenced{f, newFenced(t)} {
		cc := g.conn(t, "42")
		_, err := cc.Exec(ctx, g.sql("INSERT INTO %[1]s VALUES (40, 1)"))
		wantFenceErr(t, err, "55F04", "unfenceable write", g.label)
		if _, ok := g.lookup(t, 40); ok {
			t.Fatalf("INSERT without a column list wrote row 40")
		}
	}
}
