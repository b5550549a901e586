package rewrite

import (
	"strings"
	"testing"
)

// TestGuardSchemaOnSearchPathRefused: DDL naming the in-database guard's schemas is refused (TestDDLOnGuardRefused),
// but a name left unqualified resolves through the search_path: after SET search_path = fenceproxy, CREATE OR
// REPLACE FUNCTION guard_truncate() replaces the guard's own function, in a text (or a later message) that names
// no guard schema at all. So a guard schema never enters the search_path through the proxy: every SET of it (at
// session or transaction level, in ALTER ROLE/DATABASE ... SET, in a function's SET clause) and every set_config
// of it whose value names fenceproxy or fenceproxy_ddl, or whose value cannot be read, is refused.
func TestGuardSchemaOnSearchPathRefused(t *testing.T) {
	r, err := New(Config{Tables: []Table{{Name: "accounts", TokenColumn: "fence_token"}}, TokenSetting: "app.token"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"SET search_path = fenceproxy",
		"SET search_path = fenceproxy; CREATE OR REPLACE FUNCTION guard_truncate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$",
		"set SEARCH_PATH to public, FenceProxy_DDL",
		`SET "search_path" = "fenceproxy"`,
		"SET LOCAL search_path = 'public, fenceproxy'",
		"SET search_path = '\"fenceproxy\"'",
		"SET SESSION search_path TO 'fenceproxy'",
		"SELECT set_config('search_path', 'fenceproxy', false)",
		"SELECT pg_catalog.set_config('SEARCH_PATH', 'public,fenceproxy', true)",
		"SELECT set_config('search_path', $1, false)",
		"SELECT set_config('search_path', current_setting('search_path') || ',fence' || 'proxy', false)",
		"ALTER ROLE app SET search_path = fenceproxy",
		"ALTER DATABASE app SET search_path TO public, fenceproxy",
		"ALTER ROLE app IN DATABASE app SET search_path = 'fenceproxy'",
		"CREATE FUNCTION f() RETURNS void LANGUAGE sql SET search_path = fenceproxy AS 'SELECT 1'",
		"DO $$ BEGIN SET search_path = fenceproxy; END $$",
	} {
		if !r.MayTouch([]byte(sql)) {
			t.Errorf("prefilter skips %q", sql)
			continue
		}
		p := r.Plan(sql)
		if p.Action != Refuse || p.Code != CodeUnfenceable || !strings.HasPrefix(p.Message, "unfenceable write: ") ||
			!strings.Contains(p.Message, "search_path") {
			t.Errorf("%q: want refusal 55F04 naming search_path, got %v %s %s", sql, p.Action, p.Code, p.Message)
		}
	}
	for _, sql := range []string{
		"SET search_path = public, app",
		"SET search_path TO DEFAULT",
		"RESET search_path",
		"SET LOCAL search_path = '\"$user\", public'",
		"SELECT set_config('search_path', 'public', false)",
		"SELECT set_config('application_name', 'fenceproxy', false)",
		"ALTER ROLE app SET search_path = app, public",
		"SELECT current_setting('search_path')",
	} {
		if p := r.Plan(sql); p.Action == Refuse {
			t.Errorf("%q: want no refusal, got %v %s %s", sql, p.Action, p.Code, p.Message)
		}
	}
}

// TestDDLGuardNameNotLiteral: the DDL rule looks for the guard's schemas where a statement names something (a
// relation's schema, a qualified function, type, operator or object name), not in its string constants: a
// default, a check or a view that holds the word fenceproxy changes no guard.
func TestDDLGuardNameNotLiteral(t *testing.T) {
	r, err := New(Config{Tables: []Table{{Name: "accounts", TokenColumn: "fence_token"}}, TokenSetting: "app.token"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"COMMENT ON TABLE accounts IS 'fenceproxy'",
		"ALTER TABLE accounts ALTER COLUMN note SET DEFAULT 'fenceproxy'",
		"ALTER TABLE accounts ADD CONSTRAINT not_us CHECK (note <> 'fenceproxy_ddl')",
		"CREATE TABLE notes (id int, who text DEFAULT 'fenceproxy')",
		"CREATE VIEW who AS SELECT 'fenceproxy'::text AS name",
		"ALTER ROLE app SET application_name = 'fenceproxy'",
		"CREATE TABLE fenced (fenceproxy int)",
	} {
		if p := r.Plan(sql); p.Action == Refuse {
			t.Errorf("%q: want no refusal, got %v %s %s", sql, p.Action, p.Code, p.Message)
		}
	}
	// Names stay names, however they are spelled.
	for _, sql := range []string{
		"ALTER TABLE accounts ALTER COLUMN note SET DEFAULT fenceproxy.f()",
		"CREATE TABLE notes (id int, who fenceproxy.t)",
		"ALTER TABLE accounts ADD CONSTRAINT c CHECK (note OPERATOR(fenceproxy.<>) 'x')",
		"CREATE VIEW v AS SELECT * FROM fenceproxy.lock_marks",
		"ALTER EXTENSION x SET SCHEMA fenceproxy",
		"CREATE EXTENSION x SCHEMA fenceproxy",
		"DROP SCHEMA fenceproxy_ddl",
		"CREATE SCHEMA AUTHORIZATION fenceproxy",
		"IMPORT FOREIGN SCHEMA remote FROM SERVER s INTO fenceproxy",
		// Static SQL of a DO block is held to the same rule (its dynamic SQL is the DDL guard's).
		"DO $$ BEGIN CREATE OR REPLACE FUNCTION fenceproxy.guard_truncate() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'; END $$",
	} {
		p := r.Plan(sql)
		if p.Action != Refuse || p.Code != CodeUnfenceable || !strings.Contains(p.Message, "fenceproxy guard") {
			t.Errorf("%q: want refusal naming the fenceproxy guard, got %v %s %s", sql, p.Action, p.Code, p.Message)
		}
	}
}
