package schema_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/rewrite"
	"github.com/fenceproxy/fenceproxy/schema"
)

// TestGuardLaterPartition: a partition made (CREATE TABLE ... PARTITION OF) or attached (ATTACH PARTITION, rows
// and all) after install, and an inheritance child made after it, get the row guard as a clone or not at all,
// but never the TRUNCATE guard nor the statement triggers: PostgreSQL clones only row triggers. A stale holder,
// or a session with no token, could then empty protected rows with TRUNCATE of the partition itself, directly
// or through the proxy (which knows no partition without a catalog).
//
//   - With the DDL guard, its event trigger gives every new descendant of a guarded relation the whole guard at
//     the end of the command that made it: TRUNCATE of it is refused (55F04), writes to it are fenced.
//   - Without it, no trigger can run when a partition is made, so the row guard refuses (55F04) every write that
//     would put a row into (or change one in) a relation without its TRUNCATE and statement triggers: no fenced
//     row lands where TRUNCATE could remove it unseen, until install runs again.
func TestGuardLaterPartition(t *testing.T) {
	for _, ddlGuard := range []bool{true, false} {
		name := "without DDL guard"
		if ddlGuard {
			name = "with DDL guard"
		}
		t.Run(name, func(t *testing.T) {
			db := newDB(t)
			su := superConn(t, db)
			exec(t, su, `CREATE TABLE accounts (id int, balance int, fence_token bigint) PARTITION BY RANGE (id);
CREATE TABLE accounts_1 PARTITION OF accounts FOR VALUES FROM (0) TO (100);
CREATE TABLE ledger (id int PRIMARY KEY, fence_token bigint);`)
			cfg := guardConfig(table("accounts", "fence_token"), table("ledger", "fence_token"))
			cfg.DDLGuard = ddlGuard
			install(t, su, cfg)
			p := proxytest.Start(t, pg.Addr(), proxytest.Options{YAML: "tables:\n  - name: accounts\n    token_column: fence_token\n" +
				"  - name: ledger\n    token_column: fence_token\n"})
			proxyConn := func(options string) *pgx.Conn {
				c, err := pgx.ParseConfig(p.DSN(pgtest.SuperUser, "", db))
				if err != nil {
					t.Fatal(err)
				}
				c.RuntimeParams["options"] = options
				conn, err := pgx.ConnectConfig(context.Background(), c)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { conn.Close(context.Background()) })
				return conn
			}

			// Made after install, directly (the proxy refuses such DDL): a new partition, a table attached with
			// a row in it, a sub-partitioned partition attached with its own partition, an inheritance child.
			exec(t, su, `CREATE TABLE accounts_2 PARTITION OF accounts FOR VALUES FROM (100) TO (200);
CREATE TABLE accounts_3 (id int, balance int, fence_token bigint);
INSERT INTO accounts_3 VALUES (250, 0, 50);
CREATE TABLE accounts_4 (id int, balance int, fence_token bigint) PARTITION BY RANGE (id);
CREATE TABLE accounts_4a PARTITION OF accounts_4 FOR VALUES FROM (300) TO (400);`)
			exec(t, su, `ALTER TABLE accounts ATTACH PARTITION accounts_3 FOR VALUES FROM (200) TO (300);
ALTER TABLE accounts ATTACH PARTITION accounts_4 FOR VALUES FROM (300) TO (400)`)
			kid := execErr(su, "CREATE TABLE ledger_kid () INHERITS (ledger)")

			writer := connect(t, db, pgtest.SuperUser, "-c fence.token=50")
			if ddlGuard {
				if kid != nil {
					t.Fatalf("inheritance child under the DDL guard: %v", kid)
				}
				// Fenced rows go into the new partitions through the parent and into them directly.
				exec(t, writer, `INSERT INTO accounts VALUES (150, 0, 1), (350, 0, 1); INSERT INTO accounts_2 VALUES (151, 0, 1);
INSERT INTO ledger_kid VALUES (1, 1); UPDATE accounts SET balance = 1`)
				if n := queryInt(t, su, "SELECT count(*) FROM accounts WHERE fence_token = 50"); n != 4 {
					t.Fatalf("rows stamped 50 in accounts: %d, want 4", n)
				}
				if n := queryInt(t, su, "SELECT count(*) FROM ledger_kid WHERE fence_token = 50"); n != 1 {
					t.Fatalf("rows stamped 50 in ledger_kid: %d, want 1", n)
				}
				stale := connect(t, db, pgtest.SuperUser, "-c fence.token=49")
				wantCode(t, "stale UPDATE of an attached row", execErr(stale, "UPDATE accounts_3 SET balance = 2"), rewrite.CodeStale, "stale fencing token")
				wantCode(t, "stale UPDATE of an inheritance child", execErr(stale, "UPDATE ledger SET fence_token = 1"), rewrite.CodeStale, "stale fencing token")
				for _, rel := range []string{"accounts_2", "accounts_3", "accounts_4", "accounts_4a", "ledger_kid"} {
					for _, c := range []struct{ who, options string }{{"stale token", "-c fence.token=49"}, {"no token", ""}} {
						wantCode(t, "TRUNCATE "+rel+" directly, "+c.who, execErr(connect(t, db, pgtest.SuperUser, c.options), "TRUNCATE "+rel),
							rewrite.CodeUnfenceable, "unfenceable write: TRUNCATE of")
						wantCode(t, "TRUNCATE "+rel+" through the proxy, "+c.who, execErr(proxyConn(c.options), "TRUNCATE "+rel),
							rewrite.CodeUnfenceable, "unfenceable write: TRUNCATE of")
					}
				}
				// The guard made on a new partition is the DDL guard's to keep: disabling or dropping it is
				// refused like on a relation install guarded.
				for _, sql := range []string{`ALTER TABLE accounts_2 DISABLE TRIGGER "~fenceproxy_guard_truncate"`,
					`DROP TRIGGER "~fenceproxy_guard_truncate" ON accounts_2`, `ALTER TABLE ledger_kid DISABLE TRIGGER "~fenceproxy_guard"`,
					`ALTER TABLE accounts_4a ENABLE TRIGGER "~fenceproxy_statement_end"`,
					"DROP TABLE accounts_2", "ALTER TABLE accounts DETACH PARTITION accounts_3", "ALTER TABLE accounts_4a RENAME TO old",
					"DROP TABLE ledger_kid"} {
					wantCode(t, sql, execErr(su, sql), rewrite.CodeUnfenceable, "unfenceable write: ")
				}
				if n := queryInt(t, su, "SELECT count(*) FROM accounts"); n != 4 {
					t.Fatalf("rows in accounts: %d, want 4", n)
				}
				// A table that comes with triggers named like the guard's, calling something else, and with
				// conditions, gets the guard's own when attached.
				exec(t, su, `CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TABLE accounts_5 (id int, balance int, fence_token bigint);
CREATE TRIGGER "~fenceproxy_guard_truncate" BEFORE TRUNCATE ON accounts_5 FOR EACH STATEMENT EXECUTE FUNCTION noop();
CREATE TRIGGER "!fenceproxy_statement_start" BEFORE INSERT OR UPDATE OR DELETE ON accounts_5 FOR EACH STATEMENT WHEN (false) EXECUTE FUNCTION fenceproxy.guard_statement();
ALTER TABLE accounts_5 ENABLE ALWAYS TRIGGER "~fenceproxy_guard_truncate";
ALTER TABLE accounts ATTACH PARTITION accounts_5 FOR VALUES FROM (500) TO (600)`)
				wantCode(t, "TRUNCATE of a partition attached with a look-alike trigger", execErr(writer, "TRUNCATE accounts_5"),
					rewrite.CodeUnfenceable, "unfenceable write: TRUNCATE of accounts")
				if n := queryInt(t, su, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'accounts_5'::regclass AND tgqual IS NULL AND tgenabled = 'A'
	AND tgfoid IN ('fenceproxy.guard_truncate()'::regprocedure, 'fenceproxy.guard_statement()'::regprocedure)`); n != 3 {
					t.Fatalf("guard triggers on accounts_5: %d, want 3", n)
				}
			} else {
				if kid != nil {
					t.Fatal(kid)
				}
				// No fenced row lands where the TRUNCATE guard is missing, through the parent or directly, by the
				// proxy's fence or not; and the attached row cannot be changed under the fence either.
				for _, sql := range []string{"INSERT INTO accounts (id, balance) VALUES (150, 0)", "INSERT INTO accounts_2 (id, balance) VALUES (150, 0)",
					"INSERT INTO accounts (id, balance) VALUES (350, 0)", "UPDATE accounts SET balance = 1", "DELETE FROM accounts_3"} {
					for _, c := range []struct {
						how  string
						conn *pgx.Conn
					}{{"directly", writer}, {"through the proxy", proxyConn("-c fence.token=50")}} {
						pe := wantCode(t, sql+" "+c.how, execErr(c.conn, sql), rewrite.CodeUnfenceable, "unfenceable write: ")
						if !strings.Contains(pe.Message, "lacks the guard of its TRUNCATE") {
							t.Fatalf("%s %s: refused, but not by the guard: %s", sql, c.how, pe.Message)
						}
					}
				}
				// Look-alikes of the guard's triggers do not count: one that calls something else, and one with a
				// condition.
				exec(t, su, `CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TABLE accounts_5 (id int, balance int, fence_token bigint);
CREATE TRIGGER "~fenceproxy_guard_truncate" BEFORE TRUNCATE ON accounts_5 FOR EACH STATEMENT EXECUTE FUNCTION noop();
CREATE TRIGGER "!fenceproxy_statement_start" BEFORE INSERT OR UPDATE OR DELETE ON accounts_5 FOR EACH STATEMENT EXECUTE FUNCTION fenceproxy.guard_statement();
CREATE TRIGGER "~fenceproxy_statement_end" AFTER INSERT OR UPDATE OR DELETE ON accounts_5 FOR EACH STATEMENT EXECUTE FUNCTION fenceproxy.guard_statement();
ALTER TABLE accounts_5 ENABLE ALWAYS TRIGGER "~fenceproxy_guard_truncate", ENABLE ALWAYS TRIGGER "!fenceproxy_statement_start", ENABLE ALWAYS TRIGGER "~fenceproxy_statement_end";
CREATE TABLE accounts_6 (LIKE accounts_5);
CREATE TRIGGER "~fenceproxy_guard_truncate" BEFORE TRUNCATE ON accounts_6 FOR EACH STATEMENT WHEN (false) EXECUTE FUNCTION fenceproxy.guard_truncate('accounts');
CREATE TRIGGER "!fenceproxy_statement_start" BEFORE INSERT OR UPDATE OR DELETE ON accounts_6 FOR EACH STATEMENT EXECUTE FUNCTION fenceproxy.guard_statement();
CREATE TRIGGER "~fenceproxy_statement_end" AFTER INSERT OR UPDATE OR DELETE ON accounts_6 FOR EACH STATEMENT EXECUTE FUNCTION fenceproxy.guard_statement();
ALTER TABLE accounts_6 ENABLE ALWAYS TRIGGER "~fenceproxy_guard_truncate", ENABLE ALWAYS TRIGGER "!fenceproxy_statement_start", ENABLE ALWAYS TRIGGER "~fenceproxy_statement_end";
ALTER TABLE accounts ATTACH PARTITION accounts_5 FOR VALUES FROM (500) TO (600);
ALTER TABLE accounts ATTACH PARTITION accounts_6 FOR VALUES FROM (600) TO (700)`)
				for _, sql := range []string{"INSERT INTO accounts VALUES (550, 0, 1)", "INSERT INTO accounts VALUES (650, 0, 1)"} {
					wantCode(t, sql+" (look-alike triggers)", execErr(writer, sql), rewrite.CodeUnfenceable, "unfenceable write: public.accounts_")
				}
				exec(t, writer, "INSERT INTO accounts VALUES (50, 0, 1); UPDATE accounts_1 SET balance = 1") // install's partition
				if n := queryInt(t, su, "SELECT count(*) FROM accounts"); n != 2 {
					t.Fatalf("rows in accounts: %d, want 2 (accounts_1's and the attached one)", n)
				}
				// check names what is missing, and install guards the new relations like the others.
				if st, err := schema.Inspect(context.Background(), su, cfg); err != nil || len(st.Findings) == 0 {
					t.Fatalf("check before the re-run: %+v %v, want findings", st.Findings, err)
				}
				cfg.DDLGuard = false
				install(t, su, cfg)
				exec(t, writer, "INSERT INTO accounts VALUES (150, 0, 1), (350, 0, 1); INSERT INTO ledger_kid VALUES (1, 1); UPDATE accounts SET balance = 2")
				for _, rel := range []string{"accounts_2", "accounts_3", "accounts_4a", "accounts_5", "accounts_6", "ledger_kid"} {
					wantCode(t, "TRUNCATE "+rel+" after install, stale token", execErr(connect(t, db, pgtest.SuperUser, "-c fence.token=49"), "TRUNCATE "+rel),
						rewrite.CodeUnfenceable, "unfenceable write: TRUNCATE of")
				}
				if n := queryInt(t, su, "SELECT count(*) FROM accounts WHERE fence_token = 50"); n != 4 {
					t.Fatalf("rows stamped 50 in accounts: %d, want 4", n)
				}
			}
		})
	}
}
