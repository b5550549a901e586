package rewrite

import (
	"slices"
	"strings"
	"testing"
)

// TestDDLRefused lists DDL that could change tokens or a protected table's
// identity: each must be refused 55F04 with the advice to run it directly.
// Every one passes on a Rewriter without the DDL rule.
func TestDDLRefused(t *testing.T) {
	r := testRewriter(t)
	for _, sql := range []string{
		// the token column
		"ALTER TABLE accounts ALTER COLUMN fence_token TYPE bigint USING 0",
		"ALTER TABLE accounts ALTER fence_token TYPE numeric",
		"ALTER TABLE accounts DROP COLUMN fence_token",
		"ALTER TABLE accounts DROP fence_token, ADD COLUMN fence_token bigint",
		"ALTER TABLE accounts ADD COLUMN fence_token bigint DEFAULT 999999",
		"ALTER TABLE accounts ADD COLUMN IF NOT EXISTS fence_token bigint NOT NULL DEFAULT 0",
		"ALTER TABLE accounts ADD COLUMN fence_token bigint GENERATED ALWAYS AS (id) STORED",
		"ALTER TABLE accounts ALTER COLUMN fence_token SET DEFAULT 999999",
		"ALTER TABLE accounts ALTER COLUMN fence_token DROP DEFAULT",
		"ALTER TABLE accounts ALTER COLUMN fence_token ADD GENERATED ALWAYS AS IDENTITY",
		"ALTER TABLE accounts ALTER COLUMN fence_token SET NOT NULL",
		"ALTER TABLE accounts RENAME COLUMN fence_token TO old_token",
		"ALTER TABLE accounts RENAME fence_token TO x",
		"ALTER TABLE accounts RENAME COLUMN balance TO fence_token",
		"ALTER TABLE public.ledger ALTER fence TYPE bigint USING fence - 1",
		// data rewrite with USING on another column
		"ALTER TABLE accounts ALTER COLUMN balance TYPE bigint USING balance * 0",
		"ALTER TABLE accounts ALTER COLUMN balance TYPE bigint USING note::bigint",
		"ALTER TABLE accounts ALTER COLUMN fence_token TYPE bigint USING fence_token::bigint",
		// identity
		"DROP TABLE accounts",
		"DROP TABLE IF EXISTS public.accounts",
		"DROP TABLE accounts CASCADE",
		"DROP TABLE IF EXISTS other, archive.accounts CASCADE",
		"drop table ACCOUNTS, other",
		`DROP TABLE "Audit"`,
		"ALTER TABLE accounts RENAME TO accounts_old",
		"ALTER TABLE other RENAME TO accounts",
		"ALTER TABLE accounts SET SCHEMA archive",
		// partitions and inheritance
		"CREATE TABLE accounts_p1 PARTITION OF accounts FOR VALUES FROM (1) TO (100)",
		"CREATE TABLE child () INHERITS (accounts)",
		"CREATE TABLE accounts (id int) INHERITS (other)",
		"ALTER TABLE accounts ATTACH PARTITION p FOR VALUES IN (1)",
		"ALTER TABLE parent ATTACH PARTITION accounts FOR VALUES IN (1)",
		"ALTER TABLE parent DETACH PARTITION accounts",
		"ALTER TABLE accounts DETACH PARTITION p CONCURRENTLY",
		"ALTER TABLE child INHERIT accounts",
		"ALTER TABLE accounts NO INHERIT parent",
		"ALTER TABLE accounts INHERIT parent",
		// triggers, rules, views
		"ALTER TABLE accounts DISABLE TRIGGER ALL",
		"ALTER TABLE accounts DISABLE TRIGGER USER",
		"ALTER TABLE accounts DISABLE TRIGGER fenceproxy_guard",
		"ALTER TABLE accounts ENABLE REPLICA TRIGGER fenceproxy_guard",
		"ALTER TABLE accounts DISABLE RULE r",
		"DROP TRIGGER fenceproxy_guard ON accounts",
		"CREATE TRIGGER t BEFORE UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION f()",
		"CREATE OR REPLACE RULE r AS ON UPDATE TO accounts DO INSTEAD NOTHING",
		"CREATE RULE r AS ON INSERT TO other DO ALSO UPDATE accounts SET balance = 0",
		"CREATE VIEW v AS SELECT * FROM accounts",
		"CREATE OR REPLACE VIEW v AS SELECT id, balance FROM public.accounts WHERE id > 0",
		"DROP RULE r ON accounts",
		// ownership, policies, and kinds not on the allowlist
		"ALTER TABLE accounts OWNER TO mallory",
		"CREATE POLICY p ON accounts USING (true)",
		"SECURITY LABEL ON TABLE accounts IS 'x'",
		"CREATE FUNCTION f() RETURNS void LANGUAGE sql BEGIN ATOMIC UPDATE accounts SET balance = 0; END",
		"ALTER TABLE accounts SET UNLOGGED",
		"ALTER TABLE accounts ADD CONSTRAINT fk FOREIGN KEY (p) REFERENCES parent (id) ON DELETE CASCADE",
		"ALTER TABLE accounts ADD COLUMN p int REFERENCES parent (id) ON UPDATE SET NULL",
		"CREATE TABLE accounts (id int, p int REFERENCES parent ON DELETE SET DEFAULT, fence_token bigint)",
		"ALTER TABLE accounts DROP COLUMN note CASCADE",
		"CREATE SCHEMA s CREATE VIEW v AS SELECT * FROM accounts",
		// several statements: one refused refuses the text
		"SELECT 1; ALTER TABLE accounts DROP COLUMN fence_token",
	} {
		if !r.MayTouch([]byte(sql)) && !strings.HasPrefix(sql, "SECURITY LABEL") {
			t.Errorf("prefilter skips %q", sql)
			continue
		}
		p := r.plan(sql, false, false)
		if p.Action != Refuse || p.Code != CodeUnfenceable {
			t.Errorf("%q: want refusal 55F04, got %v %s %s", sql, p.Action, p.Code, p.Message)
			continue
		}
		if !strings.HasPrefix(p.Message, "unfenceable write: ") {
			t.Errorf("%q: message %q", sql, p.Message)
		}
		if !strings.Contains(p.Message, "PostgreSQL") {
			t.Errorf("%q: message gives no advice: %q", sql, p.Message)
		}
	}
}

// TestDDLPasses lists additive DDL that ordinary migrations issue: it must
// pass unchanged.
func TestDDLPasses(t *testing.T) {
	r := testRewriter(t)
	for _, sql := range []string{
		"ALTER TABLE accounts ADD COLUMN note text",
		"ALTER TABLE accounts ADD COLUMN fence_token bigint", // setting the table up, as fenceproxy check suggests
		`ALTER TABLE "public"."accounts" ADD COLUMN IF NOT EXISTS "fence_token" bigint`,
		"ALTER TABLE accounts ADD COLUMN note text NOT NULL DEFAULT ''",
		"ALTER TABLE accounts ADD COLUMN IF NOT EXISTS n int, ADD COLUMN m int",
		"ALTER TABLE accounts ADD COLUMN p int REFERENCES parent (id)",
		"ALTER TABLE accounts ADD CONSTRAINT fk FOREIGN KEY (p) REFERENCES parent (id) ON DELETE RESTRICT",
		"ALTER TABLE accounts ADD CONSTRAINT pos CHECK (balance >= 0) NOT VALID",
		"ALTER TABLE accounts VALIDATE CONSTRAINT pos",
		"ALTER TABLE accounts DROP CONSTRAINT pos",
		"ALTER TABLE accounts ALTER COLUMN balance TYPE bigint",
		`ALTER TABLE "accounts" ALTER COLUMN "balance" TYPE bigint USING "balance"::bigint`,
		"ALTER TABLE accounts ALTER COLUMN balance TYPE numeric USING CAST(balance AS numeric)",
		"ALTER TABLE accounts ALTER COLUMN balance SET DEFAULT 0",
		"ALTER TABLE accounts ALTER COLUMN balance DROP NOT NULL",
		"ALTER TABLE accounts ALTER COLUMN balance SET STATISTICS 500",
		"ALTER TABLE accounts DROP COLUMN note",
		"ALTER TABLE accounts RENAME COLUMN note TO remark",
		"ALTER TABLE accounts RENAME CONSTRAINT pos TO positive",
		"ALTER TABLE accounts SET (fillfactor = 90)",
		"ALTER TABLE accounts ADD PRIMARY KEY (id)",
		"CREATE INDEX accounts_balance ON accounts (balance)",
		"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS accounts_x ON public.accounts (id)",
		"DROP INDEX accounts_balance",
		"COMMENT ON TABLE accounts IS 'money'",
		"COMMENT ON COLUMN accounts.fence_token IS 'written by fenceproxy'",
		"GRANT SELECT, UPDATE ON accounts TO app",
		"REVOKE ALL ON accounts FROM PUBLIC",
		"CREATE STATISTICS s ON id, balance FROM accounts",
		"VACUUM ANALYZE accounts",
		"ANALYZE accounts",
		"CLUSTER accounts USING accounts_pkey",
		"REINDEX TABLE accounts",
		"LOCK TABLE accounts IN SHARE MODE",
		"CREATE TABLE payments (id int, account_id int REFERENCES accounts (id) ON DELETE CASCADE)",
		"ALTER TABLE payments ADD FOREIGN KEY (account_id) REFERENCES accounts ON DELETE CASCADE",
		"CREATE TABLE accounts_copy (LIKE accounts INCLUDING ALL)",
		"CREATE TABLE other (id int)",
		"DROP TABLE other",
		"ALTER TABLE other DROP COLUMN x",
		"CREATE SEQUENCE accounts_id_seq OWNED BY accounts.id",
		"ALTER SEQUENCE accounts_id_seq OWNED BY accounts.id",
		"CREATE TABLE snapshot AS SELECT * FROM accounts",
		"TRUNCATE other",
		"TRUNCATE other RESTRICT",
		"DROP TABLE other RESTRICT",
		"ALTER ROLE app SET statement_timeout = '5s'",
		"CREATE FUNCTION full_name(a accounts) RETURNS text LANGUAGE sql AS 'SELECT a.note'",
		"CREATE FUNCTION total() RETURNS SETOF accounts LANGUAGE sql STABLE RETURN NULL",
	} {
		p := r.Plan(sql)
		if p.Action != Pass {
			t.Errorf("%q: want pass, got %v %s %s", sql, p.Action, p.Code, p.Message)
		}
	}
}

// TestTokenScope checks what the analysis reports about the scope of the
// token settings a text makes, and that it lists every token literal.
func TestTokenScope(t *testing.T) {
	r := testRewriter(t)
	cases := []struct {
		sql                 string
		session, persistent bool
		tokens              []int64
	}{
		{"SET fence.token = 5", true, false, []int64{5}},
		{"SET SESSION fence.token = 5", true, false, []int64{5}},
		{"SET LOCAL fence.token = 5", false, false, []int64{5}},
		{"SET LOCAL fence.token = 5; SET fence.token = 6", true, false, []int64{5, 6}},
		{"RESET fence.token", false, false, nil},
		{"SET fence.token TO DEFAULT", false, false, nil},
		{"SELECT set_config('fence.token', '7', true)", false, false, []int64{7}},
		{"SELECT set_config('fence.token', '7', 'on')", false, false, []int64{7}},
		{"SELECT set_config('fence.token', '7', false)", true, false, []int64{7}},
		{"SELECT set_config('fence.token', '7', $1)", true, false, []int64{7}},
		{"SELECT set_config('fence.token', NULL, false)", false, false, nil},
		{"SELECT set_config($1, '7', false)", true, false, nil},
		{"SELECT set_config($1, '7', true)", false, false, nil},
		{"SELECT set_config('fence.token', '7', true), set_config('fence.token', '999', true)", false, false, []int64{7, 999}},
		{"UPDATE accounts SET balance = length(set_config('fence.token', '3', true)) WHERE id = 1", false, false, []int64{3}},
		{"ALTER ROLE bob SET fence.token = '999999999'", true, true, []int64{999999999}},
		{"ALTER ROLE bob IN DATABASE d SET fence.token TO 9", true, true, []int64{9}},
		{"ALTER ROLE bob SET fence.token FROM CURRENT", true, true, nil},
		{"ALTER ROLE bob RESET fence.token", false, false, nil},
		{"ALTER DATABASE d SET fence.token = 9", true, true, []int64{9}},
		{"ALTER SYSTEM SET fence.token = 9", true, true, []int64{9}},
		{"CREATE FUNCTION f() RETURNS int LANGUAGE sql SET fence.token = 77 AS 'SELECT 1'", false, false, []int64{77}},
		{"ALTER FUNCTION f() SET fence.token = 78", false, false, []int64{78}},
		{"SET search_path = public", false, false, nil},
	}
	for _, c := range cases {
		p := r.Plan(c.sql)
		if p.Action == Refuse {
			t.Errorf("%q refused: %s", c.sql, p.Message)
			continue
		}
		if p.TokenSession != c.session || p.TokenPersistent != c.persistent || !slices.Equal(p.Tokens, c.tokens) {
			t.Errorf("%q: session %v persistent %v tokens %v; want %v %v %v", c.sql, p.TokenSession, p.TokenPersistent, p.Tokens, c.session, c.persistent, c.tokens)
		}
	}
	// The form of a persistent default is validated whatever the proxy's mode.
	if p := r.Plan("ALTER ROLE bob SET fence.token = 'abc'"); p.Action != Refuse || p.Code != CodeInvalid {
		t.Errorf("ALTER ROLE with an invalid token: %+v", p)
	}
}

// TestSessionEffects checks what a text may do to the token and lock settings' session values (the transaction
// pooler reads an empty value found after a transaction by them: a reset and a set to the empty string both
// leave one on its connections).
func TestSessionEffects(t *testing.T) {
	cfg := testConfig()
	cfg.LockSetting = "fence.lock"
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	all := SessionEffects{Effect{Set: true, Reset: true}, Effect{Set: true, Reset: true}, Effect{Set: true, Reset: true}}
	// anywhere is what the texts may do anywhere in them (the table's column); the net, what they leave, is below.
	anywhere := func(e SessionEffects) SessionEffects {
		for _, x := range []*Effect{&e.Token, &e.Lock, &e.App} {
			*x = Effect{Set: x.Set, Reset: x.Reset}
		}
		return e
	}
	for _, c := range []struct {
		sql  string
		want SessionEffects
	}{
		{"SELECT 1", SessionEffects{}},
		{"SELECT set_config('FENCE.TOKEN', '14', false)", SessionEffects{Token: Effect{Set: true}}},
		{"SELECT set_config('fence.lock', 'k', false)", SessionEffects{Lock: Effect{Set: true}}},
		{"SELECT set_config('fence.lock', '', false)", SessionEffects{Lock: Effect{Set: true}}},
		{"SELECT set_config('fence.lock', NULL, false)", SessionEffects{Lock: Effect{Reset: true}}},
		{"SELECT set_config('fence.lock', $1, false)", SessionEffects{Lock: Effect{Set: true, Reset: true}}},
		{"SELECT set_config('fence.lock', 'k', true)", SessionEffects{}},
		{"SELECT set_config('fence.token', '14', $1)", SessionEffects{Token: Effect{Set: true}}},
		{"SELECT set_config($1, 'x', false)", SessionEffects{Token: Effect{Set: true}, Lock: Effect{Set: true}, App: Effect{Set: true}}},
		{"SELECT set_config($1, NULL, false)", SessionEffects{Token: Effect{Reset: true}, Lock: Effect{Reset: true}, App: Effect{Reset: true}}},
		{"SELECT set_config($1, 'x', true)", SessionEffects{}},
		{"SELECT set_config('work_mem', '64MB', false)", SessionEffects{}},
		{"DO $$ BEGIN PERFORM set_config('fence.lock', '', false); END $$", SessionEffects{Lock: Effect{Set: true}}},
		{"DO $$ BEGIN SET fence.lock = 'other'; END $$", SessionEffects{Lock: Effect{Set: true}}},
		{"SET fence.lock = ''", SessionEffects{Lock: Effect{Set: true}}},
		{"SET SESSION FENCE.LOCK TO 'k'", SessionEffects{Lock: Effect{Set: true}}},
		{"SET LOCAL fence.lock = 'k'", SessionEffects{}},
		{"SET fence.lock TO DEFAULT", SessionEffects{Lock: Effect{Reset: true}}},
		{"SET LOCAL fence.lock TO DEFAULT", SessionEffects{}},
		{"RESET fence.lock; SET fence.token = 5", SessionEffects{Token: Effect{Set: true}, Lock: Effect{Reset: true}}},
		{"SET fence.lock = 'k'; RESET ALL", SessionEffects{Token: Effect{Reset: true}, Lock: Effect{Set: true, Reset: true}, App: Effect{Reset: true}}},
		{"RESET ALL", SessionEffects{Token: Effect{Reset: true}, Lock: Effect{Reset: true}, App: Effect{Reset: true}}},
		{"discard all", SessionEffects{Token: Effect{Reset: true}, Lock: Effect{Reset: true}, App: Effect{Reset: true}}},
		// application_name, whose startup value a pooled client keeps: a SET LOCAL leaves its session value alone,
		// so a RESET with one after it (or before) only resets it (TestPooledResetThenSetLocalStartupValues).
		{"RESET ALL; SET LOCAL application_name = 'x'", SessionEffects{Token: Effect{Reset: true}, Lock: Effect{Reset: true}, App: Effect{Reset: true}}},
		{"SET LOCAL Application_Name = 'x'; RESET application_name", SessionEffects{App: Effect{Reset: true}}},
		{"SET application_name TO DEFAULT; SELECT set_config('application_name', 'x', true)", SessionEffects{App: Effect{Reset: true}}},
		{"SET application_name = ''", SessionEffects{App: Effect{Set: true}}},
		{"SELECT set_config('application_name', '', false)", SessionEffects{App: Effect{Set: true}}},
		{"SELECT set_config('application_name', NULL, false)", SessionEffects{App: Effect{Reset: true}}},
		{"DO $$ BEGIN RESET ALL; END $$", SessionEffects{Token: Effect{Reset: true}, Lock: Effect{Reset: true}, App: Effect{Reset: true}}},
		{"DO $$ BEGIN SET application_name = ''; END $$", SessionEffects{App: Effect{Set: true}}},
		{"DO $$ BEGIN SET LOCAL application_name = 'x'; PERFORM 1; END $$", SessionEffects{}},
		{"SET application_name = 'y'; RESET ALL; SET LOCAL application_name = 'x'", SessionEffects{Token: Effect{Reset: true}, Lock: Effect{Reset: true}, App: Effect{Set: true, Reset: true}}},
		{"RESET work_mem", SessionEffects{}},
		{"DISCARD PLANS", SessionEffects{}},
		{"EXECUTE clr('')", all},
		{"RESET fence.token", SessionEffects{Token: Effect{Reset: true}}},
		{"CREATE FUNCTION f() RETURNS int LANGUAGE sql SET fence.lock = 'k' AS 'SELECT 1'", SessionEffects{}},
		{"SELECT 'unterminated", all},
		// A cast that may change the name (varchar(n) cuts it) names any setting (constArg).
		{"SELECT set_config('fence.token.x'::varchar(11), '', false)", SessionEffects{Token: Effect{Set: true}, Lock: Effect{Set: true}, App: Effect{Set: true}}},
		{"SELECT set_config('fence.token'::text, NULL::varchar(3), false)", SessionEffects{Token: Effect{Reset: true}}},
		{"SELECT set_config('fence.lock', 'k', 't'::varchar(1))", SessionEffects{Lock: Effect{Set: true}}},
		{"SELECT set_config('fence.lock', 'k', 't'::bool)", SessionEffects{}},
	} {
		if got := anywhere(r.SessionEffects([]byte(c.sql), DefaultSettings)); got != c.want {
			t.Errorf("%q: %+v, want %+v", c.sql, got, c.want)
		}
	}
	// What application_name's texts leave when nothing rolls back (NetResetOnly): a top-level SET or RESET
	// replaces what came before it, a set_config or a DO block's statement may not run, and texts compose in
	// order (Then).
	for _, c := range []struct {
		sqls []string
		want bool
	}{
		{[]string{"SET application_name = 'y'; RESET ALL; SET LOCAL application_name = 'x'"}, true},
		{[]string{"SET application_name = 'y'", "RESET application_name", "SET LOCAL application_name = 'x'"}, true},
		{[]string{"RESET ALL; SET application_name = ''"}, false},
		{[]string{"RESET ALL", "SET application_name = ''"}, false},
		{[]string{"SELECT set_config('application_name', '', false); RESET ALL"}, true},
		{[]string{"RESET ALL; SELECT set_config('application_name', '', false)"}, false},
		{[]string{"RESET ALL; DO $$ BEGIN SET application_name = ''; END $$"}, false},
		{[]string{"SET application_name = ''; DO $$ BEGIN RESET application_name; END $$"}, false},
		{[]string{"RESET ALL; EXECUTE p"}, false},
		{[]string{"RESET ALL", "SELECT 1"}, true},
		{[]string{"SET LOCAL application_name = 'x'"}, false},
		// What may run after the statements that follow it is never replaced (Effect.LaterSet): a cursor's
		// query, a view's, a cursor a DO block opens, a Parse's or Bind's text (bound: below).
		{[]string{"DECLARE c CURSOR FOR SELECT set_config('application_name', '', false); RESET ALL"}, false},
		{[]string{"DECLARE c CURSOR FOR SELECT set_config('application_name', '', false)", "RESET application_name", "FETCH c"}, false},
		{[]string{"CREATE VIEW v AS SELECT set_config('application_name', '', false); RESET ALL"}, false},
		{[]string{"EXPLAIN ANALYZE CREATE MATERIALIZED VIEW v AS SELECT set_config('application_name', '', false); RESET ALL"}, false},
		{[]string{"DO $$DECLARE c refcursor := 'c'; BEGIN OPEN c FOR SELECT set_config('application_name', '', false); END$$; RESET ALL"}, false},
		{[]string{"bound: SELECT set_config('application_name', '', false)", "RESET ALL"}, false},
		{[]string{"DO $$BEGIN PERFORM set_config('application_name', '', false); END$$; RESET ALL"}, true},
		{[]string{"EXPLAIN ANALYZE SELECT set_config('application_name', '', false); RESET ALL"}, true},
		{[]string{"CREATE TABLE t AS SELECT set_config('application_name', '', false); RESET ALL"}, true},
		{[]string{"DECLARE c CURSOR FOR SELECT 1; RESET ALL"}, true},
		{[]string{"DECLARE c CURSOR FOR SELECT set_config('application_name', 'x', true); RESET ALL"}, true},
		{[]string{"DECLARE c CURSOR FOR SELECT set_config('application_name', NULL, false); RESET ALL"}, true},
		{[]string{"RESET ALL; SELECT set_config('application_name.x'::varchar(16), '', false)"}, false},
	} {
		var e SessionEffects
		for _, sql := range c.sqls {
			if b, ok := strings.CutPrefix(sql, "bound: "); ok {
				e = e.Then(r.SessionEffects([]byte(b), DefaultSettings).Later())
				continue
			}
			e = e.Then(r.SessionEffects([]byte(sql), DefaultSettings))
		}
		if got := e.App.NetResetOnly(); got != c.want {
			t.Errorf("%q: application_name NetResetOnly %v, want %v (%+v)", c.sqls, got, c.want, e.App)
		}
	}
	// A lock setting of another first part than the token's.
	cfg.LockSetting = "app.lock"
	if r, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	if got := anywhere(r.SessionEffects([]byte("SET app.lock = ''"), DefaultSettings)); got != (SessionEffects{Lock: Effect{Set: true}}) {
		t.Errorf("SET app.lock with lock setting app.lock: %+v", got)
	}
}

// TestDDLOnGuardRefused: the in-database guard's objects (the fenceproxy and fenceproxy_ddl schemas that
// fenceproxy install creates) are treated like a protected table by the DDL rule: DDL naming them is refused
// unless on the allowlist. Replacing the guard's trigger function undoes the guard as surely as disabling its
// trigger, which is refused. The token setting here shares no part with "fenceproxy".
func TestDDLOnGuardRefused(t *testing.T) {
	r, err := New(Config{Tables: []Table{{Name: "accounts", TokenColumn: "fence_token"}}, TokenSetting: "app.token"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"CREATE OR REPLACE FUNCTION fenceproxy.guard_0123456789abcdef() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$",
		`CREATE OR REPLACE FUNCTION "fenceproxy".guard_truncate() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'`,
		"ALTER FUNCTION fenceproxy.guard_statement() RENAME TO old",
		"ALTER FUNCTION fenceproxy.lock_accept(text) SECURITY INVOKER",
		"ALTER FUNCTION fenceproxy.lock_accept(text) OWNER TO mallory",
		"ALTER ROUTINE fenceproxy.guard_truncate() SET SCHEMA public",
		"ALTER TABLE fenceproxy.token_ceiling RENAME TO old_ceiling",
		"ALTER TABLE FenceProxy.lock_marks DROP CONSTRAINT lock_marks_mark_check",
		"CREATE RULE r AS ON UPDATE TO fenceproxy.token_ceiling DO INSTEAD NOTHING",
		"CREATE TRIGGER t BEFORE UPDATE ON fenceproxy.lock_marks FOR EACH STATEMENT EXECUTE FUNCTION f()",
		"CREATE POLICY p ON fenceproxy.token_ceiling USING (false)",
		"ALTER SCHEMA fenceproxy OWNER TO mallory",
		"CREATE SCHEMA fenceproxy",
		"CREATE SCHEMA IF NOT EXISTS fenceproxy_ddl",
		"CREATE FUNCTION fenceproxy_ddl.ddl_guard_check() RETURNS event_trigger LANGUAGE plpgsql AS 'BEGIN END'",
		"DROP FUNCTION fenceproxy.lock_accept(text)",
		"DROP FUNCTION fenceproxy.guard() CASCADE",
		"DROP TABLE fenceproxy.token_ceiling",
	} {
		if !r.MayTouch([]byte(sql)) {
			t.Errorf("prefilter skips %q", sql)
			continue
		}
		p := r.Plan(sql)
		if p.Action != Refuse || p.Code != CodeUnfenceable || !strings.HasPrefix(p.Message, "unfenceable write: ") ||
			!strings.Contains(p.Message, "fenceproxy guard") {
			t.Errorf("%q: want refusal 55F04 naming the fenceproxy guard, got %v %s %s", sql, p.Action, p.Code, p.Message)
		}
	}
	for _, sql := range []string{
		"GRANT INSERT, UPDATE ON fenceproxy.token_ceiling TO fenceproxy_catalog", // docs/verification.md
		"REVOKE UPDATE ON fenceproxy.token_ceiling FROM app",
		"COMMENT ON TABLE fenceproxy.lock_marks IS 'lock fences'",
		"SELECT * FROM fenceproxy.lock_marks",
		"CREATE OR REPLACE FUNCTION public.audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$",
	} {
		if p := r.Plan(sql); p.Action != Pass {
			t.Errorf("%q: want pass, got %v %s %s", sql, p.Action, p.Code, p.Message)
		}
	}
}
