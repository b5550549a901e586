package schema_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/rewrite"
	"github.com/fenceproxy/fenceproxy/schema"
)

// ensureRole creates a login role (roles are cluster-wide: another test may have made it already).
func ensureRole(t *testing.T, name string) {
	t.Helper()
	if err := pg.ExecIn("postgres", fmt.Sprintf(
		"DO $$ BEGIN CREATE ROLE %s LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$", name)); err != nil {
		t.Fatal(err)
	}
}

// TestInstallRefusesSchemaOwnedByAnother: a role that may create schemas in the database (its owner, often the
// application's role) creates the schema fenceproxy, and a table token_ceiling in it, before a superuser runs
// install. Install must not put the guard into a schema another ordinary role owns: the schema's owner may drop
// or change anything in it, here empty the token ceiling and write with a forged token.
func TestInstallRefusesSchemaOwnedByAnother(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	ensureRole(t, "r53_squatter")
	exec(t, su, `CREATE TABLE accounts (id int PRIMARY KEY, balance int, fence_token bigint);
INSERT INTO accounts VALUES (1, 100, 42);
GRANT CREATE ON DATABASE `+db+` TO r53_squatter;
GRANT ALL ON accounts TO r53_squatter`)
	app := connect(t, db, "r53_squatter", "")
	exec(t, app, `CREATE SCHEMA fenceproxy;
CREATE TABLE fenceproxy.token_ceiling (store text PRIMARY KEY, ceiling bigint NOT NULL CHECK (ceiling > 0))`)

	cfg := guardConfig(table("accounts", "fence_token"))
	cfg.Settings.Ceiling = true
	ctx := context.Background()
	if _, err := schema.BuildPlan(ctx, su, cfg); err == nil || !strings.Contains(err.Error(), "r53_squatter") {
		t.Errorf("install --print into a schema owned by r53_squatter: %v", err)
	}
	err := schema.Install(ctx, su, cfg)
	if err == nil {
		// What the schema's owner can do with it.
		exec(t, su, "INSERT INTO fenceproxy.token_ceiling VALUES ('etcd', 50)")
		werr := execErr(app, "DELETE FROM fenceproxy.token_ceiling; SET fence.token = 1000; UPDATE accounts SET balance = 0")
		t.Fatalf("install into a schema owned by r53_squatter succeeded; then r53_squatter emptied the token ceiling and wrote with token 1000 (error: %v, row token now %d)",
			werr, queryInt(t, su, "SELECT fence_token FROM accounts"))
	}
	for _, want := range []string{"schema fenceproxy", "table fenceproxy.token_ceiling", "r53_squatter"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("install's refusal does not name %q: %v", want, err)
		}
	}
	if n := queryInt(t, su, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE '%fenceproxy%'"); n != 0 {
		t.Fatalf("refused install left %d guard triggers", n)
	}
	// Once the installing role owns what is there, install goes ahead.
	exec(t, su, "ALTER SCHEMA fenceproxy OWNER TO "+pgtest.SuperUser+"; ALTER TABLE fenceproxy.token_ceiling OWNER TO "+pgtest.SuperUser)
	install(t, su, cfg)
}

// TestGuardTokenSpellings: for every spelling of the token, the guard decides as the proxy's rule
// (rewrite.ValidToken) does, with the proxy's message: missing, invalid (55F03, the value quoted as the proxy
// quotes it) or accepted with exactly that value. Equal to the row's token is accepted.
func TestGuardTokenSpellings(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, "CREATE TABLE accounts (id int PRIMARY KEY, fence_token bigint); INSERT INTO accounts VALUES (1, 50)")
	install(t, su, guardConfig(table("accounts", "fence_token")))
	c := connect(t, db, pgtest.SuperUser, "")
	for _, v := range []string{"", " ", "  50", "50 ", "50.0", "+50", "0x10", "99999999999999999999999", "-1", "NaN", "0",
		"\u0665\u0660", "\uff15\uff10", "0050", "0000000000000000050", "00000000000000000050", "5e1", "1_000",
		"9223372036854775807", "9223372036854775808", "18446744073709551616", "50", "49", "51"} {
		exec(t, c, "BEGIN; SELECT set_config('fence.token', "+quoteLit(v)+", false)")
		err := execErr(c, "UPDATE accounts SET id = 1")
		k, ok := rewrite.ValidToken(v)
		switch {
		case v == "":
			wantCode(t, fmt.Sprintf("token %q", v), err, rewrite.CodeMissing, "missing fencing token")
		case !ok:
			pe := wantCode(t, fmt.Sprintf("token %q", v), err, rewrite.CodeInvalid, "invalid fencing token")
			msg, _, _ := rewrite.Marker{Code: rewrite.CodeInvalid, Table: "accounts", Setting: "fence.token", Token: v}.Describe()
			if pe.Message != msg {
				t.Errorf("token %q: guard says %q, proxy %q", v, pe.Message, msg)
			}
		case k < 50:
			wantCode(t, fmt.Sprintf("token %q", v), err, rewrite.CodeStale, "stale fencing token")
		default:
			if err != nil {
				t.Fatalf("token %q (%d, not older than the row's 50): %v", v, k, err)
			}
			if got := queryInt(t, c, "SELECT fence_token FROM accounts"); got != k {
				t.Fatalf("token %q: row stamped %d, want %d", v, got, k)
			}
		}
		exec(t, c, "ROLLBACK") // the row keeps 50
	}
}

func quoteLit(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// hostileOperators puts, into the schema evil, an operator for every comparison (and + and -) on the types the
// guard computes with. Each counts its calls in evil.calls and answers what a forger would like (comparisons
// true, arithmetic 0): a session that puts evil before pg_catalog on its search_path would change what any
// operator the guard resolves by name means.
func hostileOperators() string {
	var b strings.Builder
	b.WriteString("CREATE SCHEMA evil; CREATE SEQUENCE evil.calls; GRANT USAGE ON SCHEMA evil TO PUBLIC; GRANT ALL ON evil.calls TO PUBLIC;\n")
	for _, typ := range []string{"text", "int4", "int8", "bool", "name", "oid"} {
		fmt.Fprintf(&b, "CREATE FUNCTION evil.yes_%[1]s(%[1]s, %[1]s) RETURNS bool LANGUAGE sql AS 'SELECT pg_catalog.nextval(''evil.calls'') IS NOT NULL';\n", typ)
		for _, op := range []string{"=", "<>", "<", ">", "<=", ">="} {
			fmt.Fprintf(&b, "CREATE OPERATOR evil.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = evil.yes_%s);\n", op, typ, typ, typ)
		}
	}
	for _, typ := range []string{"int4", "int8"} {
		fmt.Fprintf(&b, "CREATE FUNCTION evil.zero_%[1]s(%[1]s, %[1]s) RETURNS %[1]s LANGUAGE sql AS 'SELECT (pg_catalog.nextval(''evil.calls'') OPERATOR(pg_catalog.*) 0)::%[1]s';\n", typ)
		for _, op := range []string{"+", "-"} {
			fmt.Fprintf(&b, "CREATE OPERATOR evil.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = evil.zero_%s);\n", op, typ, typ, typ)
		}
	}
	return b.String()
}

// TestGuardIgnoresSearchPathOperators: with user operators shadowing every built-in comparison the guard could
// resolve by name (evil before pg_catalog on the writer's search_path), the guard still refuses a stale lock
// holder, keeps one token per statement and checks the ceiling, and never calls a user operator.
// (TestGuardSearchPathCannotRedefine shadows > on bigint only.)
func TestGuardIgnoresSearchPathOperators(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, `CREATE TABLE t (id int PRIMARY KEY, note text, fence_token bigint);
CREATE FUNCTION inner_write(i int) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.set_config('fence.token', '1', false);
	INSERT INTO public.t (id, note) VALUES (i, 'inner');
	RETURN 'outer';
END $$;`)
	cfg := guardConfig(table("t", "fence_token"))
	cfg.Settings.Ceiling = true
	install(t, su, cfg)
	exec(t, su, "INSERT INTO fenceproxy.token_ceiling VALUES ('etcd', 100)")
	exec(t, su, hostileOperators())
	const evilPath = "SET search_path = evil, pg_catalog, public"

	// The older holder of L writes first (so its session has the lock fence's transaction-local record, empty
	// after the commit), then the newer one.
	stale := connect(t, db, pgtest.SuperUser, "-c fence.token=40 -c fence.lock=L")
	exec(t, stale, evilPath)
	exec(t, stale, "INSERT INTO t VALUES (2, 'older', 0)")
	newer := connect(t, db, pgtest.SuperUser, "-c fence.token=43 -c fence.lock=L")
	exec(t, newer, "INSERT INTO t VALUES (1, 'newer', 0)") // lock L accepts 43
	wantCode(t, "stale holder of L, new row", execErr(stale, "INSERT INTO t VALUES (3, 'stale', 0)"), rewrite.CodeStale,
		"stale fencing token: lock L has accepted a newer token")
	wantCode(t, "stale holder of L, newer row", execErr(stale, "UPDATE t SET note = 'stale' WHERE id OPERATOR(pg_catalog.=) 1"),
		rewrite.CodeStale, "stale fencing token")

	// One token per statement: the inner write of a statement started with 44 is stamped 44 too.
	cur := connect(t, db, pgtest.SuperUser, "-c fence.token=44 -c fence.lock=L")
	exec(t, cur, evilPath)
	if err := execErr(cur, "INSERT INTO t (id, note) VALUES (5, inner_write(6))"); err != nil {
		t.Errorf("statement with an inner write: %v", err)
	} else if n := queryInt(t, su, "SELECT count(*) FROM t WHERE id IN (5, 6) AND fence_token = 44"); n != 2 {
		t.Errorf("statement with an inner write: %d of its 2 rows stamped 44", n)
	}

	forged := connect(t, db, pgtest.SuperUser, "-c fence.token=1000")
	exec(t, forged, evilPath)
	wantCode(t, "token above the ceiling", execErr(forged, "INSERT INTO t VALUES (7, 'forged', 0)"), rewrite.CodeInvalid, "invalid fencing token")

	var called bool
	if err := su.QueryRow(context.Background(), "SELECT is_called FROM evil.calls").Scan(&called); err != nil {
		t.Fatal(err)
	}
	if called {
		t.Errorf("the guard called a user operator (it resolves an operator through search_path)")
	}
}

// TestDDLGuardInstallOverTableOwnersSchema: the table owner (an ordinary role) installs the guard, with the
// token ceiling; later a superuser adds the DDL guard, which is to stop that owner from undoing the guard. The
// owner still owns the schema and its tables and functions (CREATE ... IF NOT EXISTS and CREATE OR REPLACE keep
// the owner), and the DDL guard sees no DML: it could empty the token ceiling and write with a forged token.
// Install refuses until the installing role owns them.
func TestDDLGuardInstallOverTableOwnersSchema(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	ensureRole(t, "r53_owner")
	exec(t, su, "GRANT CREATE ON DATABASE "+db+" TO r53_owner; GRANT CREATE ON SCHEMA public TO r53_owner")
	owner := connect(t, db, "r53_owner", "")
	exec(t, owner, "CREATE TABLE accounts (id int PRIMARY KEY, balance int, fence_token bigint)")
	exec(t, su, "INSERT INTO accounts VALUES (1, 100, 42)")
	cfg := guardConfig(table("accounts", "fence_token"))
	cfg.Settings.Ceiling = true
	install(t, owner, cfg)

	cfg.DDLGuard = true
	err := schema.Install(context.Background(), su, cfg)
	if err == nil {
		exec(t, su, "INSERT INTO fenceproxy.token_ceiling VALUES ('etcd', 50)")
		werr := execErr(owner, "DELETE FROM fenceproxy.token_ceiling; SET fence.token = 1000; UPDATE accounts SET balance = 0")
		t.Fatalf("install --ddl-guard over a schema r53_owner owns succeeded; r53_owner then emptied the token ceiling and wrote with token 1000 (error: %v, row token %d)",
			werr, queryInt(t, su, "SELECT fence_token FROM accounts"))
	}
	for _, want := range []string{"schema fenceproxy (owner r53_owner)", "table fenceproxy.token_ceiling (owner r53_owner)",
		"function fenceproxy.lock_accept(text) (owner r53_owner)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("install --ddl-guard over r53_owner's schema does not name %q: %v", want, err)
		}
	}
}

// TestInstallConcurrently: installs started at once into a fresh database serialize (install's advisory
// lock): all succeed, each step is applied once, and the guard is complete.
func TestInstallConcurrently(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, "CREATE TABLE accounts (id int PRIMARY KEY, fence_token bigint)")
	cfg := guardConfig(table("accounts", "fence_token"))
	const n = 3
	conns := make([]*pgx.Conn, n)
	for i := range conns {
		conns[i] = superConn(t, db)
	}
	errs := make(chan error, n)
	start := make(chan struct{})
	for _, c := range conns {
		go func() {
			<-start
			errs <- schema.Install(context.Background(), c, cfg)
		}()
	}
	close(start)
	for range conns {
		if err := <-errs; err != nil {
			t.Errorf("concurrent install: %v", err)
		}
	}
	if got, want := queryInt(t, su, "SELECT count(*) FROM fenceproxy.version"), int64(len(schema.Steps())); got != want {
		t.Fatalf("version rows after concurrent installs: %d, want %d", got, want)
	}
	st, err := schema.Inspect(context.Background(), su, cfg)
	if err != nil || len(st.Findings) > 0 {
		t.Fatalf("after concurrent installs: %+v %v", st, err)
	}
}

// TestInstallRefusesHalfInstalledSchema: a table of an applied step dropped by hand (here lock_marks) makes
// every lock-fenced write fail with an error that is not the contract's. Install must not report the guard as
// in place, and check must report what is missing.
func TestInstallRefusesHalfInstalledSchema(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, "CREATE TABLE accounts (id int PRIMARY KEY, fence_token bigint)")
	cfg := guardConfig(table("accounts", "fence_token"))
	install(t, su, cfg)
	gone := []string{"fenceproxy.lock_marks", "fenceproxy.lock_token_seq", "fenceproxy.token_ceiling"}
	exec(t, su, "DROP TABLE fenceproxy.lock_marks; DROP SEQUENCE fenceproxy.lock_token_seq; DROP TABLE fenceproxy.token_ceiling")
	ctx := context.Background()
	err := schema.Install(ctx, su, cfg)
	st, ierr := schema.Inspect(ctx, su, cfg)
	if ierr != nil {
		t.Fatal(ierr)
	}
	for _, rel := range gone {
		if err == nil || !strings.Contains(err.Error(), rel+" (step") {
			t.Errorf("install over a schema missing %s: %v", rel, err)
		}
		found := false
		for _, f := range st.Findings {
			found = found || strings.HasPrefix(f.Object, rel+" (step")
		}
		if !found {
			t.Errorf("check of a schema missing %s: %+v", rel, st.Findings)
		}
	}
	// All of them, named with their steps, in step order, in install's refusal and in check's findings.
	want := []string{"fenceproxy.lock_marks (step 1, lock marks)", "fenceproxy.lock_token_seq (step 3, lock store)",
		"fenceproxy.token_ceiling (step 4, token ceiling)"}
	if err == nil || !strings.Contains(err.Error(), "(dropped by hand?): "+strings.Join(want, ", ")+"; ") {
		t.Errorf("install over a schema missing %d relations: %v, want them listed as %q", len(want), err, strings.Join(want, ", "))
	}
	var objects []string
	for _, f := range st.Findings {
		if strings.Contains(f.Object, " (step ") {
			objects = append(objects, f.Object)
		}
	}
	if !slices.Equal(objects, want) {
		t.Errorf("check's findings of missing relations: %q, want %q", objects, want)
	}
}

// TestGuardMoreInServerPaths: write paths TestGuardRefusesEveryInServerPath does not list, each refused for a
// stale session (55F01) and one without a token (55F02), and applied, stamped, for the newest token; and a
// non-superuser granted SET on session_replication_role (PostgreSQL 15) still meets the guard.
func TestGuardMoreInServerPaths(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, `CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL DEFAULT 0, fence_token bigint);
INSERT INTO accounts VALUES (1, 100, 42), (2, 100, 42);
CREATE TABLE owners (id int PRIMARY KEY);
INSERT INTO owners VALUES (1);
CREATE TABLE cards (id int PRIMARY KEY, owner int REFERENCES owners ON UPDATE CASCADE, fence_token bigint);
INSERT INTO cards VALUES (1, 1, 42);
CREATE VIEW v_io AS SELECT id, balance FROM accounts;
CREATE FUNCTION v_io_upd() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN UPDATE accounts SET balance = NEW.balance WHERE id = OLD.id; RETURN NEW; END $$;
CREATE TRIGGER v_io_upd INSTEAD OF UPDATE ON v_io FOR EACH ROW EXECUTE FUNCTION v_io_upd();
CREATE VIEW v_rule AS SELECT id, balance FROM accounts;
CREATE RULE v_rule_del AS ON DELETE TO v_rule DO INSTEAD DELETE FROM accounts WHERE id = OLD.id;`)
	install(t, su, guardConfig(table("accounts", "fence_token"), table("cards", "fence_token")))
	paths := []struct{ name, sql string }{
		{"MERGE UPDATE", "MERGE INTO accounts a USING (VALUES (1)) s(id) ON a.id = s.id WHEN MATCHED THEN UPDATE SET balance = 1"},
		{"MERGE DELETE", "MERGE INTO accounts a USING (VALUES (2)) s(id) ON a.id = s.id WHEN MATCHED THEN DELETE"},
		{"writable CTE", "WITH w AS (UPDATE accounts SET balance = 2 WHERE id = 1 RETURNING id) SELECT count(*) FROM w"},
		{"view with INSTEAD OF trigger", "UPDATE v_io SET balance = 3 WHERE id = 1"},
		{"view with DO INSTEAD rule", "DELETE FROM v_rule WHERE id = 2"},
		{"FK ON UPDATE CASCADE", "UPDATE owners SET id = 10 WHERE id = 1"},
	}
	stale := connect(t, db, pgtest.SuperUser, "-c fence.token=41")
	none := connect(t, db, pgtest.SuperUser, "")
	for _, p := range paths {
		wantCode(t, p.name+" (stale)", execErr(stale, p.sql), rewrite.CodeStale, "stale fencing token")
		wantCode(t, p.name+" (no token)", execErr(none, p.sql), rewrite.CodeMissing, "missing fencing token")
	}
	ensureRole(t, "r53_replica")
	exec(t, su, "GRANT ALL ON accounts TO r53_replica; GRANT SET ON PARAMETER session_replication_role TO r53_replica")
	repl := connect(t, db, "r53_replica", "-c fence.token=41")
	exec(t, repl, "SET session_replication_role = replica")
	wantCode(t, "replica role granted by SET privilege", execErr(repl, "UPDATE accounts SET balance = 0"), rewrite.CodeStale, "stale fencing token")

	fresh := connect(t, db, pgtest.SuperUser, "-c fence.token=43")
	for _, p := range paths {
		if err := execErr(fresh, p.sql); err != nil {
			t.Fatalf("%s with the newest token: %v", p.name, err)
		}
	}
	if n := queryInt(t, su, "SELECT count(*) FROM accounts WHERE fence_token <> 43"); n != 0 {
		t.Errorf("%d accounts rows not stamped 43", n)
	}
	if n := queryInt(t, su, "SELECT fence_token FROM cards WHERE owner = 10"); n != 43 {
		t.Errorf("card after the cascade: token %d, want 43", n)
	}
}
