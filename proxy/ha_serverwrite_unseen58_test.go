package proxy_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A transaction that wrote a protected table through code inside the server (a function, a procedure, a
// trigger or a rule on an unprotected table, a DO block's dynamic SQL, a foreign key cascade) does not commit on
// a host the router no longer trusts, any more than one whose write the proxy planned. From unseen58
// (2026-12-06, attack: a write the proxy does not see): only the writes the proxy planned marked a transaction
// fenced (noteTxFenced, now fencedTxOut), so once the host was withdrawn (here: a split brain, then the old primary demoted while
// the barrier runs on the new one) the COMMIT of such a transaction reached the old primary and committed there,
// a write the new primary never sees, in both pool modes, with the in-database guard installed or not (the
// guard checks the token, not the host). Now the proxy asks such a host which relations the session's backend
// holds a write's lock on before a statement of the block goes (proxy/unplanned.go), and judges a text or batch
// that may write and commit with nothing to ask in between as one that wrote. A transaction that wrote only an
// unprotected table still commits there (docs/ha.md).
func TestServerSideFencedWriteOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		for _, guard := range []bool{true, false} {
			name := mode.name + "/guard"
			if !guard {
				name = mode.name + "/no-guard"
			}
			yaml := mode.yaml
			if mode.name == "transaction" {
				yaml = pooledYAML("size: 24") // one server connection for each transaction held open
			}
			t.Run(name, func(t *testing.T) {
				h, admin := startBarrierPair(t, yaml, nil)
				ctx := haCtx(t)
				serverSideWriters(ctx, t, admin, guard)
				type open struct {
					name string
					tx   pgx.Tx
					end  func(tx pgx.Tx) error // after the withdrawal: what may commit it
				}
				commit := func(tx pgx.Tx) error { return tx.Commit(ctx) }
				var opens []open
				for _, w := range []struct{ name, stmt string }{
					{"function", "SELECT w_insert(11)"},
					{"procedure", "CALL w_proc(12)"},
					{"trigger", "INSERT INTO notes_t VALUES (13)"},
					{"rule", "INSERT INTO notes_r VALUES (14)"},
					{"do", "DO $$BEGIN EXECUTE 'INSERT INTO accounts (id, v) VALUES (15, 1)'; END$$"},
					{"cascade", "UPDATE owners SET id = 2 WHERE id = 1"},
					// Names the planner does not know without catalog awareness: a view over accounts, and a
					// child of it (the server's lock is on the child, whose parent is protected).
					{"view", "INSERT INTO accounts_view (id, v) VALUES (32, 1)"},
					{"child", "INSERT INTO accounts_child (id, v) VALUES (33, 1)"},
					// A deferred constraint trigger: its write to accounts happens during the COMMIT itself.
					{"deferred", "INSERT INTO notes_d VALUES (34)"},
				} {
					c := tokenClient(ctx, t, h, 5)
					opens = append(opens, open{w.name, beginWith(ctx, t, c, w.stmt), commit})
				}
				// Transactions open before the change that write after it: a statement, then COMMIT; a Query
				// whose text writes, then commits (the proxy cannot ask in between); an extended-protocol batch
				// that does the same with two Executes before its Sync.
				opens = append(opens,
					open{"after", beginWith(ctx, t, tokenClient(ctx, t, h, 5)), func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, "SELECT w_insert(17)"); err != nil {
							return err
						}
						return tx.Commit(ctx)
					}},
					open{"multi", beginWith(ctx, t, tokenClient(ctx, t, h, 5)), func(tx pgx.Tx) error {
						_, err := tx.Conn().PgConn().Exec(ctx, "SELECT w_insert(18); COMMIT").ReadAll()
						return err
					}},
					open{"batch", beginWith(ctx, t, tokenClient(ctx, t, h, 5)), func(tx pgx.Tx) error {
						pipe := tx.Conn().PgConn().StartPipeline(ctx)
						pipe.SendQueryParams("SELECT w_insert(19)", nil, nil, nil, nil)
						pipe.SendQueryParams("COMMIT", nil, nil, nil, nil)
						if err := pipe.Sync(); err != nil {
							return err
						}
						for {
							res, err := pipe.GetResults()
							if err != nil {
								return err
							}
							switch res := res.(type) {
							case *pgconn.ResultReader:
								if _, err := res.Close(); err != nil {
									return err
								}
							case *pgconn.PipelineSync:
								return pipe.Close()
							}
						}
					}},
				)
				// A transaction that writes only an unprotected table; one that only locked a protected table's
				// row (FOR SHARE) and wrote one inside a savepoint it rolled back (which gives back that write's
				// lock with the write): both commit on the old host, as before.
				notes := beginWith(ctx, t, tokenClient(ctx, t, h, 5), "INSERT INTO notes VALUES (1)")
				undone := beginWith(ctx, t, tokenClient(ctx, t, h, 5), "SELECT v FROM accounts WHERE id = 1 FOR SHARE",
					"SAVEPOINT a", "SELECT w_insert(31)", "ROLLBACK TO a", "INSERT INTO notes VALUES (2)")
				// The open transactions' WAL may sit in the primary's buffers for seconds (nothing commits), and
				// the standby replays only what was flushed: the switch flushes it for the split brain's wait.
				if _, err := admin.Exec(ctx, "SELECT pg_catalog.pg_switch_wal()"); err != nil {
					t.Fatal(err)
				}
				h.splitBrain(ctx, t)
				hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
				errs := make([]error, len(opens))
				for i, o := range opens {
					errs[i] = o.end(o.tx)
				}
				notesErr := notes.Commit(ctx)
				undoneErr := undone.Commit(ctx)
				if err := hold.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
				for i, o := range opens {
					var n int
					q := "SELECT count(*) FROM accounts WHERE id = $1"
					arg := map[string]int{"function": 11, "procedure": 12, "trigger": 13, "rule": 14, "do": 15, "cascade": 16,
						"view": 32, "child": 33, "deferred": 34, "after": 17, "multi": 18, "batch": 19}[o.name]
					if o.name == "cascade" {
						q = "SELECT count(*) FROM accounts WHERE id = $1 AND owner = 2"
					}
					if err := admin.QueryRow(ctx, q, arg).Scan(&n); err != nil {
						t.Fatal(err)
					}
					t.Logf("%s: %v", o.name, errs[i])
					// The batch's COMMIT comes while its first Execute may still run: the proxy cannot say the
					// transaction did not commit (08007), as when a statement is still running.
					if code := sqlstate(errs[i]); n != 0 || code != "55F04" && (o.name != "batch" || code != "08007") {
						t.Errorf("%s: the transaction's end on the withdrawn primary: %v; rows committed there %d; want FATAL 55F04 and none", o.name, errs[i], n)
					}
				}
				var n int
				if err := admin.QueryRow(ctx, "SELECT count(*) FROM notes").Scan(&n); err != nil {
					t.Fatal(err)
				}
				if notesErr != nil || undoneErr != nil || n != 2 {
					t.Errorf("transactions writing only an unprotected table on the withdrawn primary (one after a protected write rolled back to a savepoint): COMMIT %v and %v, %d rows, want both committed", notesErr, undoneErr, n)
				}
				if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 31").Scan(&n); err != nil || n != 0 {
					t.Errorf("the write rolled back to a savepoint: %d rows (%v), want none", n, err)
				}
			})
		}
	}
}

// serverSideWriters makes, on the primary admin is connected to, the objects through which a statement that
// names no protected table writes accounts: a function w_insert and a procedure w_proc that insert the row of
// the id given; tables notes_t and notes_r whose trigger and rule insert the row of the value inserted; owners,
// which accounts row 16 references with ON UPDATE CASCADE; a view accounts_view over accounts and a child
// accounts_child of it; notes_d, whose deferred constraint trigger inserts the row at COMMIT; and notes, which
// nothing protected follows. Without
// guard the in-database guard's triggers are dropped from accounts.
func serverSideWriters(ctx context.Context, t *testing.T, admin *pgx.Conn, guard bool) {
	t.Helper()
	stmts := []string{
		"SET fence.token = 1", // the guard's, for the row below
		"CREATE TABLE notes (v int)",
		"CREATE FUNCTION w_insert(i int) RETURNS int LANGUAGE sql AS 'INSERT INTO accounts (id, v) VALUES (i, 1) RETURNING id'",
		// PL/pgSQL: the planner does not read its body (a SQL function's is analysed, which locks accounts).
		"CREATE FUNCTION w_insert_pl(i int) RETURNS int LANGUAGE plpgsql AS 'BEGIN INSERT INTO accounts (id, v) VALUES (i, 1); RETURN i; END'",
		"CREATE PROCEDURE w_proc(i int) LANGUAGE sql AS 'INSERT INTO accounts (id, v) VALUES (i, 1)'",
		"CREATE TABLE notes_t (v int)",
		"CREATE FUNCTION w_trig() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN INSERT INTO accounts (id, v) VALUES (NEW.v, 1); RETURN NEW; END'",
		"CREATE TRIGGER w AFTER INSERT ON notes_t FOR EACH ROW EXECUTE FUNCTION w_trig()",
		"CREATE TABLE notes_r (v int)",
		"CREATE RULE w AS ON INSERT TO notes_r DO ALSO INSERT INTO accounts (id, v) VALUES (NEW.v, 1)",
		"CREATE TABLE owners (id int PRIMARY KEY)",
		"INSERT INTO owners VALUES (1)",
		"ALTER TABLE accounts ADD COLUMN owner int REFERENCES owners ON UPDATE CASCADE",
		"INSERT INTO accounts VALUES (16, 0, 1, 1)",
		"CREATE VIEW accounts_view AS SELECT * FROM accounts",
		"CREATE TABLE accounts_child () INHERITS (accounts)",
		"CREATE TABLE notes_d (v int)",
		"CREATE CONSTRAINT TRIGGER w AFTER INSERT ON notes_d DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION w_trig()",
	}
	if !guard {
		for _, trg := range []string{"~fenceproxy_guard", "~fenceproxy_guard_truncate", "!fenceproxy_statement_start", "~fenceproxy_statement_end"} {
			stmts = append(stmts, fmt.Sprintf("DROP TRIGGER IF EXISTS %q ON accounts", trg))
		}
	}
	for _, q := range stmts {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// A COMMIT the client pipelined, while the host was still the only primary, behind a statement of a transaction
// that wrote a protected table inside the server does not commit there once the router stops trusting the host
// before the statement ahead of it ends. From unseen58 (2026-12-06), as TestQueuedCommitRefusedOnAWithdrawnPrimary
// for a write the proxy planned: nothing of the session was judged after the change (both messages were at the
// server already), so in session mode the COMMIT committed on the withdrawn primary when the statement ended.
// Transaction pooling holds the COMMIT until the statement is answered and judges it then.
func TestQueuedCommitOfAServerSideWriteOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			serverSideWriters(ctx, t, admin, true)
			c := tokenClient(ctx, t, h, 5)
			beginWith(ctx, t, c, "SELECT w_insert(41)")
			lock := beginWith(ctx, t, connect(t, h.primary.SuperDSN()), "LOCK TABLE notes IN ACCESS EXCLUSIVE MODE")
			tags, codes := commitQueuedAcrossAWithdrawal(ctx, t, h, admin, c, lock, "SELECT count(*) FROM notes", "%SELECT count(*) FROM notes")
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 41").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 || slices.Contains(tags, "COMMIT") || len(codes) == 0 {
				t.Errorf("a COMMIT queued behind a running statement of a transaction that wrote accounts inside the server, the host withdrawn meanwhile: tags %q, errors %q, rows committed on the old primary %d; want no COMMIT, a FATAL and none", tags, codes, n)
			}
		})
	}
}

// A cursor WITH HOLD declared in a transaction runs the rest of its query at the COMMIT (PostgreSQL keeps its rows
// past the transaction), after the proxy asked the host: a query that calls a function writing accounts writes
// then: the backend held no lock on accounts when it was asked, and the proxy cannot see a session's cursors from
// a connection of its own. From unseen58 (2026-12-06): it committed on the withdrawn primary in every mode; now a
// transaction that sent a text holding the letters hold is judged as one that wrote (unplanned.go: holdWords).
func TestHeldCursorWritesAtCommitOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			serverSideWriters(ctx, t, admin, true)
			tx := beginWith(ctx, t, tokenClient(ctx, t, h, 5), "DECLARE c CURSOR WITH HOLD FOR SELECT w_insert_pl(35)")
			h.splitBrain(ctx, t)
			hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
			err := tx.Commit(ctx)
			t.Logf("COMMIT: %v", err)
			if err := hold.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 35").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("the COMMIT of a transaction holding a cursor WITH HOLD whose query writes accounts, on the withdrawn primary: %v; rows committed there %d, want none", err, n)
			}
		})
	}
}
