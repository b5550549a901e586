package proxy_test

import (
	"slices"
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A deferrable trigger of the user's declared on a partitioned table is cloned onto each partition; a write
// straight into the partition locks the partition only. From review58 (attack on writeLockedSQL, which looks
// for the user's deferrable triggers by NOT tgisinternal on the relations locked): held, PostgreSQL 15 marks the
// clone as the user's (tgisinternal false), so the transaction is judged as one that wrote.
func TestDeferredPartitionTriggerWritesAtCommitOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			serverSideWriters(ctx, t, admin, true)
			for _, q := range []string{
				"CREATE TABLE notes_pd (v int) PARTITION BY LIST (v)",
				"CREATE TABLE notes_pd1 PARTITION OF notes_pd DEFAULT",
				"CREATE CONSTRAINT TRIGGER w AFTER INSERT ON notes_pd DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION w_trig()",
			} {
				if _, err := admin.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			var internal bool
			if err := admin.QueryRow(ctx, "SELECT tgisinternal FROM pg_trigger WHERE tgrelid = 'notes_pd1'::regclass AND tgname = 'w'").Scan(&internal); err != nil {
				t.Fatal(err)
			}
			t.Logf("the clone on the partition: tgisinternal %v", internal)
			tx := beginWith(ctx, t, tokenClient(ctx, t, h, 5), "INSERT INTO notes_pd1 VALUES (38)")
			h.splitBrain(ctx, t)
			hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
			err := tx.Commit(ctx)
			t.Logf("COMMIT: %v", err)
			if err := hold.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 38").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("the COMMIT of a transaction that wrote a partition whose deferred trigger writes accounts, on the withdrawn primary: %v; rows committed there %d, want none", err, n)
			}
		})
	}
}

// The lock question runs on a connection of the health role in the session's database, so that database's
// settings are the question's too. From review58 (attack: the question's text names its operators without
// pg_catalog): a database whose search_path puts a schema with an operator = on oid before pg_catalog makes
// the question find no lock, and a transaction that wrote accounts through a function commits on the withdrawn
// primary.
func TestLockQuestionUnderAUserOperatorOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			serverSideWriters(ctx, t, admin, false)
			for _, q := range []string{
				"CREATE SCHEMA evil",
				"CREATE FUNCTION evil.never(oid, oid) RETURNS bool LANGUAGE sql IMMUTABLE AS 'SELECT false'",
				"CREATE OPERATOR evil.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = evil.never)",
				"ALTER DATABASE " + pgtest.TestDB + " SET search_path = evil, pg_catalog, public",
			} {
				if _, err := admin.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			tx := beginWith(ctx, t, tokenClient(ctx, t, h, 5), "SELECT w_insert_pl(39)")
			h.splitBrain(ctx, t)
			hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
			err := tx.Commit(ctx)
			t.Logf("COMMIT: %v", err)
			if err := hold.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 39").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("the COMMIT of a transaction that wrote accounts through a function, asked about under a user operator =, on the withdrawn primary: %v; rows committed there %d, want none", err, n)
			}
		})
	}
}

// A statement sent before the router's change that writes a protected table only after the change, with a
// COMMIT pipelined behind it. From review58 (attack on unplannedWritersRefused, which asks the host at the
// change: what the statement writes later is not seen then, docs/ha.md says so): the statement waits for a
// lock on notes across the change, then calls a function that writes accounts, and the COMMIT already queued
// at the server commits it on the withdrawn primary in session mode; transaction pooling holds the COMMIT and
// judges it when it goes.
func TestQueuedCommitOfAWriteAfterTheChangeOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			serverSideWriters(ctx, t, admin, true)
			c := tokenClient(ctx, t, h, 5)
			beginWith(ctx, t, c, "SELECT 1")
			lock := beginWith(ctx, t, connect(t, h.primary.SuperDSN()), "LOCK TABLE notes IN ACCESS EXCLUSIVE MODE")
			tags, codes := commitQueuedAcrossAWithdrawal(ctx, t, h, admin, c, lock, "SELECT w_insert_pl(42) FROM (SELECT count(*) FROM notes) s", "%FROM notes) s")
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 42").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 || slices.Contains(tags, "COMMIT") {
				t.Errorf("a COMMIT queued behind a statement that wrote accounts inside the server after the router's change: tags %q, errors %q, rows committed on the old primary %d; want no COMMIT and none", tags, codes, n)
			}
		})
	}
}

// A read that locks a protected table against writers for a consistent view (LOCK TABLE ... IN SHARE MODE, as
// pg_dump-like tools do) writes nothing. From review58 (attack: false refusals on a host the router refuses):
// the question counted every lock above RowShareLock as a write's, so the next read of such a block ended the
// session (FATAL 55F04) during a split brain, where a transaction that only read goes on. (ANALYZE's
// ShareUpdateExclusiveLock still counts: ATTACH PARTITION takes that one on the parent it adds rows to.)
func TestShareLockedReadOnARefusedHost(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, _ := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			tx := beginWith(ctx, t, tokenClient(ctx, t, h, 5), "LOCK TABLE accounts IN SHARE MODE")
			h.splitBrain(ctx, t)
			var n int
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM accounts").Scan(&n); err != nil {
				t.Errorf("a read in a block that share-locked accounts, during a split brain: %v; want it answered", err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Errorf("the COMMIT of a block that only read accounts, during a split brain: %v", err)
			}
		})
	}
}
