package schema_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/rewrite"
	"github.com/fenceproxy/fenceproxy/schema"
)

// inServerSetup makes protected tables of every kind, each holding rows written with token 42, and the
// in-server write paths into them.
const inServerSetup = `
CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL DEFAULT 0, fence_token bigint);
INSERT INTO accounts VALUES (1, 100, 42), (2, 100, 42);
CREATE TABLE ledger (id int PRIMARY KEY, account int, fence_token bigint) PARTITION BY RANGE (id);
CREATE TABLE ledger_1 PARTITION OF ledger FOR VALUES FROM (0) TO (100);
CREATE TABLE ledger_2 PARTITION OF ledger FOR VALUES FROM (100) TO (200) PARTITION BY RANGE (id);
CREATE TABLE ledger_2a PARTITION OF ledger_2 FOR VALUES FROM (100) TO (200);
INSERT INTO ledger VALUES (1, 1, 42), (150, 1, 42);
CREATE TABLE events (id int PRIMARY KEY, fence_token bigint);
CREATE TABLE events_child (extra text) INHERITS (events);
INSERT INTO events_child VALUES (1, 42, 'x');
CREATE TABLE owners (id int PRIMARY KEY);
INSERT INTO owners VALUES (1), (2);
CREATE TABLE cards (id int PRIMARY KEY, owner int REFERENCES owners ON DELETE CASCADE, fence_token bigint);
CREATE TABLE cards2 (id int PRIMARY KEY, owner int REFERENCES owners ON DELETE SET NULL, fence_token bigint);
INSERT INTO cards VALUES (1, 1, 42);
INSERT INTO cards2 VALUES (1, 2, 42);

CREATE FUNCTION f_sql() RETURNS void LANGUAGE sql AS $$ UPDATE accounts SET balance = balance + 1 $$;
CREATE FUNCTION f_plpgsql() RETURNS int LANGUAGE plpgsql AS $$ BEGIN UPDATE accounts SET balance = balance + 1; RETURN 1; END $$;
CREATE FUNCTION f_atomic() RETURNS void LANGUAGE sql BEGIN ATOMIC UPDATE accounts SET balance = balance + 1; END;
CREATE PROCEDURE p_settle() LANGUAGE plpgsql AS $$ BEGIN DELETE FROM accounts WHERE id = 2; END $$;
CREATE TABLE t_other (id int);
CREATE FUNCTION t_other_trg() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN UPDATE accounts SET balance = 0; RETURN NEW; END $$;
CREATE TRIGGER t_other_writes AFTER INSERT ON t_other FOR EACH ROW EXECUTE FUNCTION t_other_trg();
CREATE TABLE r_other (id int);
CREATE RULE r_other_writes AS ON INSERT TO r_other DO ALSO DELETE FROM accounts;
CREATE VIEW v_accounts AS SELECT id, balance FROM accounts;
`

// inServerPaths are writes to protected rows (all holding token 42) that run inside the server.
var inServerPaths = []struct{ name, sql string }{
	{"SQL function", "SELECT f_sql()"},
	{"PL/pgSQL function", "SELECT f_plpgsql()"},
	{"BEGIN ATOMIC function", "SELECT f_atomic()"},
	{"procedure", "CALL p_settle()"},
	{"DO with dynamic SQL", "DO $$ BEGIN EXECUTE 'DELETE FROM ' || quote_ident('accounts'); END $$"},
	{"trigger on another table", "INSERT INTO t_other VALUES (1)"},
	{"rule on another table", "INSERT INTO r_other VALUES (1)"},
	{"view", "UPDATE v_accounts SET balance = 7"},
	{"FK ON DELETE CASCADE", "DELETE FROM owners WHERE id = 1"},
	{"FK ON DELETE SET NULL", "DELETE FROM owners WHERE id = 2"},
	{"partition", "UPDATE ledger_1 SET account = 2"},
	{"sub-partition", "DELETE FROM ledger_2a"},
	{"partitioned parent", "UPDATE ledger SET account = 2"},
	{"inheritance child", "UPDATE events_child SET extra = 'y'"},
	{"inheritance parent", "DELETE FROM events"},
	{"plain UPDATE", "UPDATE accounts SET balance = 1"},
	{"plain DELETE", "DELETE FROM accounts"},
	{"INSERT ON CONFLICT DO UPDATE", "INSERT INTO accounts (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET balance = 5"},
}

var guardTables = guardConfig(table("accounts", "fence_token"), table("ledger", "fence_token"), table("events", "fence_token"),
	table("cards", "fence_token"), table("cards2", "fence_token"))

func TestGuardRefusesEveryInServerPath(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, inServerSetup)
	install(t, su, guardTables)
	totals := func() string {
		var s string
		if err := su.QueryRow(context.Background(), `SELECT concat_ws(' ',
			(SELECT string_agg(id || ':' || balance || ':' || fence_token, ',' ORDER BY id) FROM accounts),
			(SELECT string_agg(id || ':' || account || ':' || fence_token, ',' ORDER BY id) FROM ledger),
			(SELECT string_agg(id || ':' || fence_token, ',' ORDER BY id) FROM events),
			(SELECT string_agg(id || ':' || coalesce(owner, 0) || ':' || fence_token, ',' ORDER BY id) FROM cards),
			(SELECT string_agg(id || ':' || coalesce(owner, 0) || ':' || fence_token, ',' ORDER BY id) FROM cards2))`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := totals()

	stale := connect(t, db, pgtest.SuperUser, "-c fence.token=41")
	noToken := connect(t, db, pgtest.SuperUser, "")
	invalid := connect(t, db, pgtest.SuperUser, "-c fence.token=4x2")
	for _, p := range inServerPaths {
		pe := wantCode(t, p.name+" (stale)", execErr(stale, p.sql), rewrite.CodeStale, "stale fencing token")
		if !strings.Contains(pe.Detail, "holds fencing token 42; this session presented token 41") || pe.Hint == "" {
			t.Errorf("%s: detail %q hint %q", p.name, pe.Detail, pe.Hint)
		}
		wantCode(t, p.name+" (no token)", execErr(noToken, p.sql), rewrite.CodeMissing, "missing fencing token")
		wantCode(t, p.name+" (invalid token)", execErr(invalid, p.sql), rewrite.CodeInvalid, `invalid fencing token for a write to `)
	}
	// Replication role does not switch the guard off: its triggers fire ALWAYS.
	exec(t, stale, "SET session_replication_role = replica")
	wantCode(t, "replica role", execErr(stale, "UPDATE accounts SET balance = 3"), rewrite.CodeStale, "stale fencing token")
	exec(t, stale, "RESET session_replication_role")

	for _, tbl := range []string{"accounts", "ledger", "ledger_1", "ledger_2a", "events", "events_child", "cards"} {
		wantCode(t, "TRUNCATE "+tbl, execErr(stale, "TRUNCATE "+tbl), rewrite.CodeUnfenceable, "unfenceable write: TRUNCATE of ")
	}
	wantCode(t, "TRUNCATE CASCADE", execErr(stale, "TRUNCATE owners CASCADE"), rewrite.CodeUnfenceable, "unfenceable write: TRUNCATE of cards")
	// The same message as the proxy's refusal of TRUNCATE.
	rw, err := rewrite.New(rewrite.Config{Tables: []rewrite.Table{{Name: "accounts", TokenColumn: "fence_token"}}})
	if err != nil {
		t.Fatal(err)
	}
	if plan, pe := rw.Plan("TRUNCATE accounts"), wantCode(t, "TRUNCATE", execErr(stale, "TRUNCATE accounts"), rewrite.CodeUnfenceable, ""); plan.Message != pe.Message || plan.Code != pe.Code {
		t.Errorf("TRUNCATE: proxy %s %q, guard %s %q", plan.Code, plan.Message, pe.Code, pe.Message)
	}

	// A FunctionCall message (the protocol's fast path) runs the function inside the server.
	var oid uint32
	if err := su.QueryRow(context.Background(), "SELECT 'f_plpgsql'::regproc::oid").Scan(&oid); err != nil {
		t.Fatal(err)
	}
	fc := connect(t, db, pgtest.SuperUser, "-c fence.token=41")
	hj, err := fc.PgConn().Hijack()
	if err != nil {
		t.Fatal(err)
	}
	defer hj.Conn.Close()
	hj.Frontend.Send(&pgproto3.FunctionCall{Function: oid})
	if err := hj.Frontend.Flush(); err != nil {
		t.Fatal(err)
	}
	hj.Conn.SetDeadline(time.Now().Add(20 * time.Second))
	var fcErr *pgproto3.ErrorResponse
	for {
		msg, err := hj.Frontend.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			fcErr = &pgproto3.ErrorResponse{Code: e.Code, Message: e.Message}
		}
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	if fcErr == nil || fcErr.Code != rewrite.CodeStale {
		t.Fatalf("FunctionCall: want 55F01, got %+v", fcErr)
	}

	if after := totals(); after != before {
		t.Fatalf("refused writes changed rows:\nbefore %s\nafter  %s", before, after)
	}

	// The holder of the newest token writes through every path; each new or updated row carries its token,
	// whatever value the statement gave the token column.
	fresh := connect(t, db, pgtest.SuperUser, "-c fence.token=43")
	for _, p := range inServerPaths {
		if err := execErr(fresh, p.sql); err != nil {
			t.Fatalf("%s with the newest token: %v", p.name, err)
		}
	}
	exec(t, fresh, "INSERT INTO accounts (id, fence_token) VALUES (10, 99999); INSERT INTO ledger VALUES (160, 1, 0); INSERT INTO events_child VALUES (5, NULL, 'z')")
	exec(t, fresh, "UPDATE ledger SET fence_token = 5")
	for _, q := range []string{"SELECT max(fence_token) FROM accounts", "SELECT min(fence_token) FROM accounts",
		"SELECT min(fence_token) FROM ledger", "SELECT max(fence_token) FROM events"} {
		if v := queryInt(t, su, q); v != 43 {
			t.Errorf("%s = %d, want 43", q, v)
		}
	}
}

// TestGuardInstallIdempotentAndUpgrades: re-running install changes nothing; a database behind the binary is
// upgraded in place by the missing steps only; one ahead of it is refused; uninstall removes everything.
func TestGuardInstallIdempotentAndUpgrades(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, "CREATE SCHEMA s1; CREATE SCHEMA s2; CREATE TABLE s1.acc (id int, ft bigint); CREATE TABLE s2.acc (id int, ft bigint); CREATE TABLE other (id int, ft bigint)")
	cfg := guardConfig(table("acc", "ft"), table("public.other", "ft"))
	install(t, su, cfg)
	ctx := context.Background()
	stamp := func() string {
		var s string
		if err := su.QueryRow(ctx, `SELECT concat((SELECT string_agg(step || name || applied_at, ',') FROM fenceproxy.version), '|',
			(SELECT string_agg(t.oid::text, ',' ORDER BY t.oid) FROM pg_trigger t WHERE tgname LIKE '~fenceproxy%'))`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := stamp()
	install(t, su, cfg)
	if again := stamp(); again != first {
		t.Fatalf("re-install changed the version table or the triggers:\n%s\n%s", first, again)
	}
	p, err := schema.BuildPlan(ctx, su, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(p.SQL(), "INSERT INTO fenceproxy.version") {
		t.Fatal("plan of an up-to-date database applies steps again")
	}
	// Both schemas' acc (a bare name) and public.other are guarded.
	if n := queryInt(t, su, "SELECT count(*) FROM fenceproxy.guarded"); n != 3 {
		t.Fatalf("guarded relations: %d, want 3", n)
	}

	// A database one step behind: install applies that step and nothing else. (The last step, the lock
	// store's, is idempotent DDL, so forgetting that it was applied is enough to be one step behind.)
	steps := schema.Steps()
	last := steps[len(steps)-1]
	exec(t, su, fmt.Sprintf("DELETE FROM fenceproxy.version WHERE step = %d", len(steps)))
	st, err := schema.Inspect(ctx, su, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st.Applied != len(steps)-1 || len(st.Findings) == 0 || !strings.Contains(st.Findings[0].Problem, "at step") {
		t.Fatalf("inspect of a database behind: %+v", st)
	}
	install(t, su, cfg)
	if n := queryInt(t, su, fmt.Sprintf("SELECT count(*) FROM fenceproxy.version WHERE name = '%s'", last.Name)); n != 1 {
		t.Fatalf("step %q applied %d times", last.Name, n)
	}

	// Removing a table from the configuration removes its guard.
	install(t, su, guardConfig(table("s1.acc", "ft")))
	if n := queryInt(t, su, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE '~fenceproxy%' OR tgname LIKE '!fenceproxy%'"); n != 4 {
		t.Fatalf("guard triggers after shrinking the configuration: %d, want 4 (row, truncate, statement start and end)", n)
	}
	// An outdated guard is reported: a trigger disabled by hand, a function edited by hand.
	exec(t, su, `ALTER TABLE s1.acc DISABLE TRIGGER "~fenceproxy_guard"`)
	st, err = schema.Inspect(ctx, su, guardConfig(table("s1.acc", "ft")))
	if err != nil || len(st.Findings) != 1 || !strings.Contains(st.Findings[0].Problem, "not enabled ALWAYS") {
		t.Fatalf("inspect of a disabled trigger: %+v %v", st, err)
	}
	exec(t, su, `CREATE OR REPLACE FUNCTION fenceproxy.guard_truncate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`)
	st, err = schema.Inspect(ctx, su, guardConfig(table("s1.acc", "ft")))
	if err != nil || len(st.Findings) != 2 || !strings.Contains(st.Findings[0].Problem, "outdated") {
		t.Fatalf("inspect of an edited function: %+v %v", st, err)
	}

	// A database ahead of the binary is refused.
	exec(t, su, fmt.Sprintf("INSERT INTO fenceproxy.version (step, name) VALUES (%d, 'from the future')", len(steps)+1))
	if err := schema.Install(ctx, su, cfg); err == nil || !strings.Contains(err.Error(), "newer than this binary") {
		t.Fatalf("install over a newer schema: %v", err)
	}
	// A database that holds none of the configured tables is refused (the wrong database, most likely), and
	// its guard is left as it was.
	exec(t, su, fmt.Sprintf("DELETE FROM fenceproxy.version WHERE step = %d", len(steps)+1))
	if err := schema.Install(ctx, su, guardConfig(table("nosuch", "ft"))); err == nil || !strings.Contains(err.Error(), "holds none of the protected tables (nosuch): no such table") {
		t.Fatalf("install for a missing table: %v", err)
	}
	if n := queryInt(t, su, "SELECT count(*) FROM pg_trigger WHERE tgname = '~fenceproxy_guard' AND tgrelid = 's1.acc'::regclass"); n != 1 {
		t.Fatalf("a refused install changed the guard: %d row triggers on s1.acc", n)
	}

	if err := schema.Uninstall(ctx, su); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, su, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE '~fenceproxy%'") +
		queryInt(t, su, "SELECT count(*) FROM pg_namespace WHERE nspname = 'fenceproxy'"); n != 0 {
		t.Fatalf("uninstall left %d objects", n)
	}
	exec(t, su, "INSERT INTO s1.acc VALUES (1, 1); TRUNCATE s1.acc")
}

// TestGuardSearchPathCannotRedefine: a user operator and function shadowing the built-ins through search_path
// do not change what the guard checks.
func TestGuardSearchPathCannotRedefine(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, `CREATE TABLE accounts (id int PRIMARY KEY, fence_token bigint); INSERT INTO accounts VALUES (1, 42);
CREATE SCHEMA evil;
CREATE FUNCTION evil.never(bigint, bigint) RETURNS bool LANGUAGE sql AS 'SELECT false';
CREATE OPERATOR evil.> (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.never);
CREATE FUNCTION evil.current_setting(text, bool) RETURNS text LANGUAGE sql AS 'SELECT ''99''';`)
	install(t, su, guardConfig(table("accounts", "fence_token")))
	c := connect(t, db, pgtest.SuperUser, "-c fence.token=41")
	exec(t, c, "SET search_path = evil, pg_catalog, public")
	wantCode(t, "shadowed >", execErr(c, "UPDATE public.accounts SET id = 1"), rewrite.CodeStale, "stale fencing token")
}
