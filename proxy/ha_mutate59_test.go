package proxy_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
)

// A cursor WITH HOLD declared by a statement the client prepared (Parse) runs the rest of its query at the COMMIT,
// as one declared by a Query (TestHeldCursorWritesAtCommitOnAWithdrawnPrimary): the transaction is judged as one
// that wrote (holdWords, holdKept: for the rest of the session, the server keeping the statement). From mutate59
// (2026-12-06): with a Parse's text not counted, every unseen58 and review58 test passed, their DECLAREs sent by
// Query (pgx sends a statement without arguments so), and the write at the COMMIT committed on the withdrawn
// primary.
func TestHeldCursorPreparedWritesAtCommitOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			serverSideWriters(ctx, t, admin, true)
			tx := beginWith(ctx, t, tokenClient(ctx, t, h, 5))
			// An argument: pgx parses the statement (the extended protocol).
			if _, err := tx.Exec(ctx, "DECLARE c CURSOR WITH HOLD FOR SELECT w_insert_pl($1::int)", pgx.QueryExecModeCacheStatement, 36); err != nil {
				t.Fatal(err)
			}
			h.splitBrain(ctx, t)
			hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
			err := tx.Commit(ctx)
			t.Logf("COMMIT: %v", err)
			if err := hold.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if n := countAccountsRow(ctx, t, admin, 36); n != 0 {
				t.Errorf("the COMMIT of a transaction holding a cursor WITH HOLD it prepared, whose query writes accounts, on the withdrawn primary: %v; rows committed there %d, want none", err, n)
			}
		})
	}
}

// A fenced write refused during a split brain marks nothing: the client's block goes on to its ROLLBACK and the
// session serves it after (fencedWriteRefusal takes back the note it made before its judgement, race58). From
// mutate59 (2026-12-06): with the take-back dropped, every race58 and review57 test passed; the refused write
// left the transaction noted as a fenced one, and the ROLLBACK ended the session (FATAL 55F04).
func TestRefusedFencedWriteLeavesItsBlockFreeToRollBack(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, _ := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			c := tokenClient(ctx, t, h, 5)
			tx := beginWith(ctx, t, c, "SELECT 1")
			h.splitBrain(ctx, t)
			_, err := tx.Exec(ctx, "UPDATE accounts SET v = 8 WHERE id = 1")
			if sqlstate(err) != "55F04" {
				t.Fatalf("a fenced write during a split brain: %v, want 55F04", err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Errorf("the ROLLBACK of the block whose fenced write was refused: %v, want it answered", err)
			}
			var one int
			if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
				t.Errorf("a read after that ROLLBACK: %v", err)
			}
		})
	}
}

// A table made a child of a protected one (ALTER TABLE ... INHERIT, as ATTACH PARTITION) adds its rows to the
// parent, and takes only ShareUpdateExclusiveLock on it: that mode counts as a write's in the lock question
// (readLockModes, review58); the child's pg_inherits row is not visible to the question's connection. From
// mutate59 (2026-12-06): with ShareUpdateExclusiveLock counted as a read's, every unseen58 and review58 test
// passed, and the rows the child brought into accounts committed on the withdrawn primary.
func TestChildAttachedInsideTheServerOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			tx := beginWith(ctx, t, tokenClient(ctx, t, h, 5), "CREATE TABLE more_rows (id int NOT NULL, v int NOT NULL, fence_token bigint)",
				"INSERT INTO more_rows VALUES (61, 1, 1)",
				// Dynamic SQL: the proxy reads no protected table's name in what it plans.
				"DO $$BEGIN EXECUTE 'ALTER TABLE more_rows INHERIT ' || 'accounts'; END$$")
			h.splitBrain(ctx, t)
			hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
			err := tx.Commit(ctx)
			t.Logf("COMMIT: %v", err)
			if err := hold.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if n := countAccountsRow(ctx, t, admin, 61); n != 0 {
				t.Errorf("the COMMIT of a transaction that made a table with rows a child of accounts, on the withdrawn primary: %v; rows of accounts committed there %d, want none", err, n)
			}
		})
	}
}

// A transaction outside any block (a unit that commits as one) is not asked about: during a split brain a
// Query of two reads is answered (unplannedWrites.free). From mutate59 (2026-12-06): with free never set,
// every unseen58 and review58 test passed, and that Query was refused (FATAL 55F04: more than one statement,
// nothing asked in between), a read ended by a rule meant for open blocks.
func TestReadsOutsideABlockDuringASplitBrain(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, _ := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			c := tokenClient(ctx, t, h, 5)
			h.splitBrain(ctx, t)
			if _, err := c.PgConn().Exec(ctx, "SELECT count(*) FROM accounts; SELECT 2").ReadAll(); err != nil {
				t.Errorf("a Query of two reads outside a block, during a split brain: %v; want it answered", err)
			}
		})
	}
}
