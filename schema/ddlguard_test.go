package schema_test

import (
	"context"
	"testing"

	"github.com/fenceproxy/fenceproxy/rewrite"
	"github.com/fenceproxy/fenceproxy/schema"
)

// TestDDLGuard: with install --ddl-guard, DDL from any connection that would drop, rename, move or rewrite a
// protected table (or a partition), change or drop its token column, or disable or drop its guard, is refused
// with 55F04 and changes nothing; additive DDL passes; uninstall removes the DDL guard with the rest.
func TestDDLGuard(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, `CREATE TABLE accounts (id int PRIMARY KEY, balance int, fence_token bigint);
CREATE TABLE ledger (id int, fence_token bigint) PARTITION BY RANGE (id);
CREATE TABLE ledger_1 PARTITION OF ledger FOR VALUES FROM (0) TO (100);
CREATE TABLE unrelated (id int);
CREATE TABLE loose (id int PRIMARY KEY, balance int, fence_token bigint);
CREATE FUNCTION lower_token() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.fence_token := 1; RETURN NEW; END $$;
CREATE FUNCTION set_token() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM set_config('fence.token', '1', false); RETURN NULL; END $$;
CREATE SCHEMA elsewhere;`)
	cfg := guardConfig(table("accounts", "fence_token"), table("ledger", "fence_token"))
	cfg.DDLGuard = true
	install(t, su, cfg)
	ensureRole(t, "ddl_app")

	refused := []string{
		"DROP TABLE accounts",
		"DROP TABLE accounts CASCADE",
		"DROP TABLE ledger_1",
		"ALTER TABLE accounts RENAME TO accounts_old",
		"ALTER TABLE accounts SET SCHEMA elsewhere",
		"ALTER TABLE accounts RENAME COLUMN fence_token TO ft",
		"ALTER TABLE accounts DROP COLUMN fence_token",
		"ALTER TABLE accounts ALTER COLUMN fence_token TYPE numeric",
		"ALTER TABLE accounts ALTER COLUMN fence_token TYPE bigint USING 0",
		"ALTER TABLE accounts ALTER COLUMN balance TYPE bigint",
		`ALTER TABLE accounts DISABLE TRIGGER "~fenceproxy_guard"`,
		"ALTER TABLE accounts DISABLE TRIGGER ALL",
		"ALTER TABLE accounts DISABLE TRIGGER USER",
		`ALTER TABLE accounts ENABLE TRIGGER "~fenceproxy_guard"`, // back to origin-only: replica role would skip it
		`ALTER TABLE accounts ENABLE REPLICA TRIGGER "~fenceproxy_guard_truncate"`,
		`DROP TRIGGER "~fenceproxy_guard" ON accounts`,
		`DROP TRIGGER "~fenceproxy_statement_end" ON accounts`,
		`ALTER TABLE accounts DISABLE TRIGGER "!fenceproxy_statement_start"`,
		`ALTER TABLE ledger DISABLE TRIGGER "~fenceproxy_guard"`,
		`ALTER TABLE ledger DETACH PARTITION ledger_1`,
		"DROP FUNCTION fenceproxy.guard_truncate() CASCADE",
		// A BEFORE ROW trigger that fires after the guard (its name sorts after the guard's) could change the
		// token the guard stamped; a BEFORE STATEMENT trigger that fires before the statement's token is kept
		// could change it.
		`CREATE TRIGGER "~~late" BEFORE INSERT OR UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION lower_token()`,
		`CREATE TRIGGER "~~late" BEFORE UPDATE ON ledger FOR EACH ROW EXECUTE FUNCTION lower_token()`,
		`CREATE TRIGGER "é late" BEFORE UPDATE ON ledger_1 FOR EACH ROW EXECUTE FUNCTION lower_token()`,
		`CREATE TRIGGER " early" BEFORE UPDATE ON accounts FOR EACH STATEMENT EXECUTE FUNCTION set_token()`,
		// The guard's code and tables: replacing a function (what a trigger runs) undoes the guard as surely
		// as dropping its trigger.
		`CREATE OR REPLACE FUNCTION fenceproxy.guard_truncate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`,
		`CREATE OR REPLACE FUNCTION fenceproxy.guard_statement() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`,
		"ALTER FUNCTION fenceproxy.lock_accept(text) OWNER TO ddl_app",
		"ALTER FUNCTION fenceproxy.lock_accept(text) SECURITY INVOKER",
		"ALTER TABLE fenceproxy.token_ceiling OWNER TO ddl_app",
		"ALTER TABLE fenceproxy.token_ceiling ADD COLUMN note text",
		"CREATE TABLE fenceproxy.extra (id int)",
		"CREATE FUNCTION fenceproxy.extra() RETURNS int LANGUAGE sql AS 'SELECT 1'",
		"CREATE RULE ceiling_off AS ON UPDATE TO fenceproxy.token_ceiling DO INSTEAD NOTHING",
		"CREATE TRIGGER ceiling_off BEFORE UPDATE ON fenceproxy.token_ceiling FOR EACH ROW EXECUTE FUNCTION fenceproxy.guard_truncate()",
		"CREATE POLICY ceiling_off ON fenceproxy.token_ceiling USING (false)",
		"ALTER SCHEMA fenceproxy OWNER TO ddl_app",
		"ALTER SCHEMA fenceproxy RENAME TO fenceproxy_old",
		// (Not the DDL guard's own check: replaced, its new body is what runs at the end of the command.)
		`CREATE OR REPLACE FUNCTION fenceproxy_ddl.ddl_guard_drop() RETURNS event_trigger LANGUAGE plpgsql AS $$ BEGIN END $$`,
		"ALTER SCHEMA fenceproxy_ddl RENAME TO fenceproxy_ddl_old",
		"DROP TABLE fenceproxy.lock_marks",
		"DROP SCHEMA fenceproxy CASCADE",
	}
	for _, sql := range refused {
		wantCode(t, sql, execErr(su, sql), rewrite.CodeUnfenceable, "unfenceable write: ")
	}
	st, err := schema.Inspect(context.Background(), su, cfg)
	if err != nil || len(st.Findings) > 0 || !st.DDLGuard {
		t.Fatalf("after refused DDL: %+v %v", st, err)
	}
	for _, sql := range []string{
		"GRANT INSERT, UPDATE ON fenceproxy.token_ceiling TO ddl_app", // docs/verification.md: the catalog role's right
		// Triggers that fire where the guard still sees their effect: before its row trigger, after its start.
		"CREATE TRIGGER audit BEFORE UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION lower_token()",
		`CREATE TRIGGER "~~after" AFTER UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION lower_token()`,
		"CREATE TRIGGER stmt BEFORE UPDATE ON accounts FOR EACH STATEMENT EXECUTE FUNCTION set_token()",
		"REVOKE INSERT, UPDATE ON fenceproxy.token_ceiling FROM ddl_app",
		"ALTER TABLE accounts ADD COLUMN note text",
		"CREATE INDEX ON accounts (balance)",
		"COMMENT ON TABLE accounts IS 'fenced'",
		"CREATE VIEW marks AS SELECT name, mark FROM fenceproxy.lock_marks", // reading the guard's tables is no change to them
		"CREATE TRIGGER mine BEFORE UPDATE ON unrelated FOR EACH ROW EXECUTE FUNCTION fenceproxy.guard_truncate()",
		"CREATE TABLE ledger_2 PARTITION OF ledger FOR VALUES FROM (100) TO (200)",
		// An inheritance child gets no trigger of its parent's, a partition only the row guard: the DDL guard
		// gives each the whole guard (TestGuardLaterPartition).
		"CREATE TABLE kid () INHERITS (accounts)",
		"ALTER TABLE loose ADD COLUMN note text; ALTER TABLE loose INHERIT accounts",
		"DROP TABLE unrelated",
	} {
		exec(t, su, sql)
	}
	for _, rel := range []string{"ledger_2", "kid", "loose"} {
		wantCode(t, "TRUNCATE "+rel, execErr(su, "TRUNCATE "+rel), rewrite.CodeUnfenceable, "unfenceable write: TRUNCATE of")
	}
	// The order is checked on the result, whatever command made it: a rename too.
	wantCode(t, "rename a trigger to fire after the guard", execErr(su, `ALTER TRIGGER audit ON accounts RENAME TO "~~audit"`),
		rewrite.CodeUnfenceable, "unfenceable write: ")
	// An ordinary role's DDL on its own tables is not disturbed (the DDL guard's checks run as that role).
	exec(t, su, "GRANT CREATE ON SCHEMA public TO ddl_app")
	app := connect(t, db, "ddl_app", "")
	exec(t, app, "CREATE TABLE mine (id int); ALTER TABLE mine ADD COLUMN v text; ALTER TABLE mine ALTER COLUMN id TYPE bigint; DROP TABLE mine")
	wantCode(t, "ordinary role drops a protected table", execErr(app, "DROP TABLE accounts"), "42501", "must be owner")

	// Re-running install keeps the DDL guard (and guards the new partition's TRUNCATE) without --ddl-guard.
	cfg.DDLGuard = false
	install(t, su, cfg)
	wantCode(t, "after re-install", execErr(su, "DROP TABLE ledger_2"), rewrite.CodeUnfenceable, "unfenceable write: ")

	if err := schema.Uninstall(context.Background(), su); err != nil {
		t.Fatal(err)
	}
	exec(t, su, "ALTER TABLE accounts RENAME TO accounts_old; DROP TABLE ledger_1")
}
