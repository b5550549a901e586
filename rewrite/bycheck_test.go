package rewrite

import (
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// checkedBody returns the body of the i-th statement of sql when it is a DO block, else fails.
func checkedBody(t *testing.T, sql string, i int) string {
	t.Helper()
	tree, err := pg.Parse(sql)
	if err != nil {
		t.Fatalf("rewrite does not parse: %v\n%s", err, sql)
	}
	if i >= len(tree.Stmts) {
		t.Fatalf("rewrite has %d statements, want more than %d", len(tree.Stmts), i)
	}
	d := tree.Stmts[i].Stmt.GetDoStmt()
	if d == nil {
		t.Fatalf("statement %d of the rewrite is not a DO block: %s", i+1, sql)
	}
	for _, a := range d.Args {
		if de := a.GetDefElem(); de != nil && de.Defname == "as" {
			return de.Arg.GetString_().GetSval()
		}
	}
	t.Fatalf("DO block without a body: %s", sql)
	return ""
}

// TestDDLCheckedByResult: DDL that can reach a protected table without naming it is sent as a DO block that
// runs the client's statement (as deparsed, in an E” literal) between two readings of what protects the
// tables; the same DDL naming a protected table is refused as before.
func TestDDLCheckedByResult(t *testing.T) {
	r := testRewriter(t)
	for _, c := range []struct{ sql, stmt string }{
		{"DROP TABLE IF EXISTS scratch CASCADE", "DROP TABLE IF EXISTS scratch CASCADE"},
		{"drop schema public cascade", "DROP SCHEMA public CASCADE"},
		{"DROP FUNCTION app.guard() CASCADE", "DROP FUNCTION app.guard() CASCADE"}, // (fenceproxy.guard() is refused: TestDDLOnGuardRefused)
		{"DROP TYPE mood CASCADE", "DROP TYPE mood CASCADE"},
		{"DROP DOMAIN tok CASCADE", "DROP DOMAIN tok CASCADE"},
		{"TRUNCATE parent CASCADE", "TRUNCATE parent CASCADE"},
		{"TRUNCATE TABLE other, x RESTART IDENTITY CASCADE", "TRUNCATE other, x RESTART IDENTITY CASCADE"},
		{"DROP OWNED BY app", "DROP OWNED BY app"},
		{"DROP OWNED BY CURRENT_USER CASCADE", "DROP OWNED BY CURRENT_USER CASCADE"},
		{"REASSIGN OWNED BY app TO mallory", "REASSIGN OWNED BY app TO mallory"},
		{"ALTER SCHEMA public RENAME TO old_public", "ALTER SCHEMA public RENAME TO old_public"},
		{"ALTER TABLE parent DROP COLUMN fence_token", "ALTER TABLE parent DROP fence_token"},
		{"ALTER TABLE parent ALTER fence_token TYPE int", "ALTER TABLE parent ALTER COLUMN fence_token TYPE int"},
		{"ALTER TABLE parent RENAME fence_token TO t", "ALTER TABLE parent RENAME COLUMN fence_token TO t"},
		{"ALTER TABLE other DROP CONSTRAINT pk CASCADE", "ALTER TABLE other DROP CONSTRAINT pk CASCADE"},
		{"ALTER TABLE parent DISABLE TRIGGER ALL", "ALTER TABLE parent DISABLE TRIGGER ALL"},
		{"ALTER TABLE parent ALTER note TYPE text USING 'x'", "ALTER TABLE parent ALTER COLUMN note TYPE text USING 'x'"},
		{"create trigger t before update on top for each row execute function f()", "CREATE TRIGGER t BEFORE UPDATE ON top FOR EACH ROW EXECUTE FUNCTION f()"},
		{`DROP TABLE "a$$b", "$outer$", "c\d" CASCADE`, `DROP TABLE "a$$b", "$outer$", "c\d" CASCADE`},
	} {
		if !r.MayTouch([]byte(c.sql)) {
			t.Errorf("prefilter skips %q", c.sql)
			continue
		}
		p := r.Plan(c.sql)
		if p.Action != Rewrite {
			t.Errorf("%q: want a checking block, got %v %s", c.sql, p.Action, p.Message)
			continue
		}
		body := checkedBody(t, p.SQL, 0)
		if want := "EXECUTE " + sqlLiteral(c.stmt) + ";"; !strings.Contains(body, want) {
			t.Errorf("%q: the block does not run %s:\n%s", c.sql, want, body)
		}
		if !strings.Contains(body, "RAISE EXCEPTION USING ERRCODE = '55F04'") || strings.Count(body, "WITH RECURSIVE fenceproxy_prot") != 2 {
			t.Errorf("%q: the block does not read the fingerprint twice and refuse:\n%s", c.sql, body)
		}
	}
	// A text of several statements: only the checked one becomes a block; a protected write is fenced.
	p := r.Plan("SELECT 1; DROP TABLE x CASCADE; UPDATE accounts SET balance = 1 WHERE id = 2")
	if p.Action != Rewrite || !slicesHave(p.Tables, "accounts") {
		t.Fatalf("several statements: %v %v %s", p.Action, p.Tables, p.Message)
	}
	checkedBody(t, p.SQL, 1)
	if !strings.HasPrefix(p.SQL, "SELECT 1; DO ") || !strings.Contains(p.SQL, "UPDATE accounts SET") {
		t.Errorf("several statements: %s", p.SQL)
	}
	// Without CASCADE these reach nothing a DROP of their own object does not (PostgreSQL refuses to drop what
	// others depend on): unchanged.
	for _, sql := range []string{"DROP TABLE other", "DROP SCHEMA s", "DROP TYPE mood RESTRICT", "TRUNCATE other", "TRUNCATE ONLY other RESTRICT", "DROP INDEX CONCURRENTLY i",
		"ALTER TABLE other DROP COLUMN x", "ALTER TABLE other RENAME x TO y", "ALTER TABLE other ALTER x TYPE bigint",
		"ALTER TABLE other ALTER x TYPE varchar(9) USING x::varchar(9)", "CREATE TRIGGER t AFTER UPDATE ON top FOR EACH STATEMENT EXECUTE FUNCTION f()"} {
		if p := r.Plan(sql); p.Action != Pass {
			t.Errorf("%q: want pass, got %v %s", sql, p.Action, p.SQL)
		}
	}
	// With no protected table nothing is checked.
	none, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if p := none.Plan("DROP SCHEMA s CASCADE"); p.Action != Pass {
		t.Errorf("no tables: %v", p.Action)
	}
}

func slicesHave(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// The fingerprint is a function of the configured names, which reach the SQL only as E” literals.
func TestFingerprintQuotesNames(t *testing.T) {
	r, err := New(Config{Tables: []Table{{Schema: `o'k`, Name: `a\'b`, TokenColumn: "t"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.fingerprint, `(E'o''k'::pg_catalog.name, E'a\\''b'::pg_catalog.name, E't'::pg_catalog.name)`) {
		t.Fatalf("names not quoted as E'' literals:\n%s", r.fingerprint)
	}
	p := r.Plan("DROP SCHEMA x CASCADE")
	if p.Action != Rewrite {
		t.Fatalf("%v %s", p.Action, p.Message)
	}
	if body := checkedBody(t, p.SQL, 0); !strings.Contains(body, r.fingerprint) {
		t.Fatalf("the block does not hold the fingerprint as built:\n%s", body)
	}
}

// verifyChecked refuses a rewrite whose blocks do not read back with the bodies built, at their statements'
// places, in a text of as many statements (a deparser that ended a body early, or a client's own DO block with
// the same body standing in for a broken one).
func TestVerifyCheckedReadBack(t *testing.T) {
	a := &analysis{bodies: []checkedBlock{{index: 0, body: "BEGIN NULL; END"}}, stmtCount: 1}
	if err := a.verifyChecked("DO $$BEGIN NULL; END$$"); err != nil {
		t.Fatalf("the body as built: %v", err)
	}
	for _, out := range []string{"DO $$BEGIN NULL; END $$", "SELECT 1", "DO $$BEGIN NULL; END$$ $$; SELECT 1",
		"DO $$BEGIN NULL; END$$; SELECT 1"} {
		if err := a.verifyChecked(out); err == nil {
			t.Errorf("%q accepted", out)
		}
	}
	second := &analysis{bodies: []checkedBlock{{index: 1, body: "BEGIN NULL; END"}}, stmtCount: 2}
	if err := second.verifyChecked("SELECT 1; DO $$BEGIN NULL; END$$"); err != nil {
		t.Fatalf("the body as built, second: %v", err)
	}
	if err := second.verifyChecked("DO $$BEGIN NULL; END$$; DO $$BEGIN NULL; END $$"); err == nil {
		t.Errorf("a client's block with the body accepted in place of the broken checking block")
	}
}

// Only a top-level statement can be sent as a checking block: a DO block whose static SQL holds one is refused
// (it would run unchecked inside the body), naming why.
func TestDDLCheckedInsideDOIsRefused(t *testing.T) {
	r := testRewriter(t)
	for _, sql := range []string{
		"DO $$BEGIN TRUNCATE parent CASCADE; END$$",
		"DO $$BEGIN IF true THEN DROP SCHEMA public CASCADE; END IF; END$$",
		"DO $$BEGIN DROP OWNED BY CURRENT_USER; END$$",
		"DO $$BEGIN ALTER SCHEMA a RENAME TO b; END$$",
		"SELECT 1; DO $x$BEGIN REASSIGN OWNED BY app TO mallory; END$x$",
	} {
		p := r.Plan(sql)
		if p.Action != Refuse || p.Code != CodeUnfenceable || !strings.Contains(p.Message, "checked only as a statement of its own") {
			t.Errorf("%q: want a refusal of the block, got %v %s %q", sql, p.Action, p.Code, p.Message)
		}
	}
	if p := r.Plan("DO $$BEGIN EXECUTE 'SELECT 1'; PERFORM 1; END$$"); p.Action == Refuse {
		t.Errorf("a DO block without such statements is refused: %s", p.Message)
	}
}
