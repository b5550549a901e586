package schema_test

import (
	"context"
	"strings"
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/rewrite"
	"github.com/fenceproxy/fenceproxy/schema"
)

const lockSetup = `
CREATE TABLE invoices (id int PRIMARY KEY, settled bool NOT NULL DEFAULT false, fence_token bigint);
CREATE TABLE transfers (id int PRIMARY KEY, amount int, fence_token bigint);
CREATE TABLE strict (id int PRIMARY KEY, fence_token bigint);
INSERT INTO invoices SELECT g, false, NULL FROM generate_series(1, 10) g;
`

func lockTables(t *testing.T) (db string) {
	db = newDB(t)
	su := superConn(t, db)
	exec(t, su, lockSetup)
	strict := table("strict", "fence_token")
	strict.RequireLock = true
	install(t, su, guardConfig(table("invoices", "fence_token"), table("transfers", "fence_token"), strict))
	return db
}

func mark(t *testing.T, db, lock string) int64 {
	return queryInt(t, superConn(t, db), "SELECT mark FROM fenceproxy.lock_marks WHERE name = '"+lock+"'")
}

// TestLockFenceStaleHolder is issue 13's story: holders A (41) and B (42) of lock "settle"; B writes first;
// A's INSERT of new rows, and its UPDATE and DELETE of rows B never wrote, all fail 55F01 naming the lock.
func TestLockFenceStaleHolder(t *testing.T) {
	db := lockTables(t)
	a := connect(t, db, pgtest.SuperUser, "-c fence.token=41 -c fence.lock=settle")
	b := connect(t, db, pgtest.SuperUser, "-c fence.token=42 -c fence.lock=settle")

	exec(t, a, "UPDATE invoices SET settled = true WHERE id = 1") // A writes first: accepted, mark 41
	if m := mark(t, db, "settle"); m != 41 {
		t.Fatalf("mark after A's write: %d, want 41", m)
	}
	exec(t, b, "UPDATE invoices SET settled = true WHERE id = 2; INSERT INTO transfers VALUES (1, 10)")
	if m := mark(t, db, "settle"); m != 42 {
		t.Fatalf("mark after B's write: %d, want 42", m)
	}
	for _, sql := range []string{
		"INSERT INTO transfers VALUES (2, 10)",            // new rows
		"UPDATE invoices SET settled = true WHERE id = 3", // a row B never wrote
		"DELETE FROM invoices WHERE id = 4",
		"UPDATE invoices SET settled = false WHERE id = 1", // a row A itself wrote
	} {
		pe := wantCode(t, sql, execErr(a, sql), rewrite.CodeStale, "stale fencing token: lock settle has accepted a newer token")
		if pe.Detail != "Lock settle has accepted fencing token 42; this session presented token 41." || pe.Hint == "" ||
			!strings.Contains(pe.Message, "invoices") && !strings.Contains(pe.Message, "transfers") {
			t.Errorf("%s: message %q detail %q hint %q", sql, pe.Message, pe.Detail, pe.Hint)
		}
	}
	su := superConn(t, db)
	if n := queryInt(t, su, "SELECT count(*) FROM invoices WHERE settled OR id = 4") + queryInt(t, su, "SELECT count(*) FROM transfers"); n != 3+1 {
		t.Fatalf("A's stale writes changed rows (%d)", n)
	}
	// B goes on; a lock never accepts an older token again, also for a new session.
	exec(t, b, "UPDATE invoices SET settled = true WHERE id = 5")
	a2 := connect(t, db, pgtest.SuperUser, "-c fence.token=41 -c fence.lock=settle")
	wantCode(t, "new session with the old token", execErr(a2, "INSERT INTO transfers VALUES (3, 1)"), rewrite.CodeStale, "stale fencing token: lock settle")

	if m, err := schema.Marks(context.Background(), superConn(t, db)); err != nil || m["settle"] != 42 || len(m) != 1 {
		t.Fatalf("Marks: %v %v", m, err)
	}
	// Another lock does not interfere: a low token on lock "report" writes rows of the same tables.
	other := connect(t, db, pgtest.SuperUser, "-c fence.token=7 -c fence.lock=report")
	exec(t, other, "INSERT INTO transfers VALUES (4, 1); UPDATE invoices SET settled = true WHERE id = 6")
	if m := mark(t, db, "report"); m != 7 {
		t.Fatalf("mark of report: %d", m)
	}
	if m := mark(t, db, "settle"); m != 42 {
		t.Fatalf("mark of settle moved to %d", m)
	}
	// Without a lock: row fencing only, exactly as before (rows written with 42 refuse 41; others accept it).
	none := connect(t, db, pgtest.SuperUser, "-c fence.token=41")
	exec(t, none, "INSERT INTO transfers VALUES (5, 1); UPDATE invoices SET settled = true WHERE id = 7")
	wantCode(t, "row fencing without a lock", execErr(none, "UPDATE invoices SET settled = false WHERE id = 2"), rewrite.CodeStale,
		"stale fencing token: a newer lock holder has already written to invoices")

	// require_lock: a token without a lock is refused 55F02 naming the lock setting.
	pe := wantCode(t, "require_lock", execErr(none, "INSERT INTO strict VALUES (1)"), rewrite.CodeMissing, "missing fencing token: writes to strict need fence.lock")
	if !strings.Contains(pe.Hint, "fence.lock") {
		t.Errorf("require_lock hint %q", pe.Hint)
	}
	exec(t, b, "INSERT INTO strict VALUES (1)")

	// A direct call of lock_accept is only a write with the session's own token: it cannot raise a mark
	// beyond that token, and writers cannot change lock_marks otherwise.
	plain := connect(t, db, pgtest.SuperUser, "")
	exec(t, plain, "CREATE ROLE lockuser LOGIN")
	lu := connect(t, db, "lockuser", "-c fence.token=43 -c fence.lock=settle")
	if err := execErr(lu, "UPDATE fenceproxy.lock_marks SET mark = 1"); err == nil {
		t.Fatal("an ordinary role changed lock_marks directly")
	}
	exec(t, lu, "SELECT fenceproxy.lock_accept('invoices')")
	if m := mark(t, db, "settle"); m != 43 {
		t.Fatalf("mark after lock_accept with token 43: %d", m)
	}
}

// TestLockFencePoolPlaceholderIsNoLock: a lock setting that holds a transaction pool's placeholder names no
// lock, whatever the token: every write that meets it is refused 55F03 (require_lock or not) and no lock of
// that name is ever marked. A transaction the proxy gave no values (one after a COMMIT in the same Query) may
// set a token of its own; with the placeholder taken for a lock its writes went through under a lock every
// such transaction of every client shared, instead of the client's own lock (the fenced wire oracle).
func TestLockFencePoolPlaceholderIsNoLock(t *testing.T) {
	db := lockTables(t)
	c := connect(t, db, pgtest.SuperUser, "-c fence.token=5 -c fence.lock="+rewrite.PoolPlaceholder)
	for _, sql := range []string{
		"INSERT INTO transfers VALUES (1, 10)",
		"UPDATE invoices SET settled = true WHERE id = 1",
		"DELETE FROM invoices WHERE id = 2",
		"INSERT INTO strict VALUES (1)",
		"SELECT fenceproxy.lock_accept('transfers')",
		"BEGIN; SET LOCAL fence.token = 6; INSERT INTO transfers VALUES (2, 10); COMMIT", // last: leaves the block aborted
	} {
		pe := wantCode(t, sql, execErr(c, sql), rewrite.CodeInvalid,
			"no fencing lock for a write to ")
		if !strings.Contains(pe.Message, "fence.lock holds "+rewrite.PoolPlaceholder) || pe.Detail == "" || pe.Hint == "" {
			t.Errorf("%s: message %q detail %q hint %q", sql, pe.Message, pe.Detail, pe.Hint)
		}
	}
	su := superConn(t, db)
	if n := queryInt(t, su, "SELECT count(*) FROM transfers") + queryInt(t, su, "SELECT count(*) FROM strict") +
		queryInt(t, su, "SELECT count(*) FROM invoices WHERE settled OR id = 2"); n != 1 {
		t.Fatalf("writes under the placeholder lock changed rows (%d; the one is invoice 2)", n)
	}
	if m, err := schema.Marks(context.Background(), su); err != nil || len(m) != 0 {
		t.Fatalf("marks after writes under the placeholder: %v %v", m, err)
	}
	// The placeholder as a token is refused as before (not a number), before the lock is looked at.
	ph := connect(t, db, pgtest.SuperUser, "-c fence.token="+rewrite.PoolPlaceholder+" -c fence.lock=settle")
	wantCode(t, "placeholder token", execErr(ph, "INSERT INTO transfers VALUES (3, 1)"), rewrite.CodeInvalid, "invalid fencing token")
}

// TestLockFenceNewerWaitsForOlderInFlight: the first write with a newer token waits for transactions of older
// holders on the lock that are in flight, then raises the mark; the older holder's next write fails.
func TestLockFenceNewerWaitsForOlderInFlight(t *testing.T) {
	db := lockTables(t)
	a := connect(t, db, pgtest.SuperUser, "-c fence.token=41 -c fence.lock=settle")
	b := connect(t, db, pgtest.SuperUser, "-c fence.token=42 -c fence.lock=settle")
	obs := superConn(t, db)

	exec(t, a, "INSERT INTO transfers VALUES (0, 0)") // the mark exists (41), committed: A's next write shares it
	exec(t, a, "BEGIN; INSERT INTO transfers VALUES (1, 1)")
	done := async(b, "INSERT INTO transfers VALUES (2, 2)")
	waitBlocked(t, obs, b.PgConn().PID())
	exec(t, a, "INSERT INTO transfers VALUES (3, 3)") // A's transaction is still accepted while B waits
	exec(t, a, "COMMIT")
	if err := mustFinish(t, done); err != nil {
		t.Fatalf("B after A committed: %v", err)
	}
	if m := mark(t, db, "settle"); m != 42 {
		t.Fatalf("mark: %d, want 42", m)
	}
	wantCode(t, "A after B", execErr(a, "INSERT INTO transfers VALUES (4, 4)"), rewrite.CodeStale, "stale fencing token: lock settle")
	if n := queryInt(t, obs, "SELECT count(*) FROM transfers"); n != 4 {
		t.Fatalf("transfers: %d rows, want 4", n)
	}
}

// TestLockFenceOlderWaitsForNewerInFlight: the other order. B (42) has raised the mark in an open transaction;
// A's (41) write waits for it and fails when B commits, or goes through when B rolls back.
func TestLockFenceOlderWaitsForNewerInFlight(t *testing.T) {
	db := lockTables(t)
	a := connect(t, db, pgtest.SuperUser, "-c fence.token=41 -c fence.lock=settle")
	b := connect(t, db, pgtest.SuperUser, "-c fence.token=42 -c fence.lock=settle")
	obs := superConn(t, db)
	exec(t, a, "INSERT INTO transfers VALUES (1, 1)") // mark 41

	// B rolls back: A's write goes through with the old mark.
	exec(t, b, "BEGIN; UPDATE invoices SET settled = true WHERE id = 1")
	done := async(a, "INSERT INTO transfers VALUES (2, 2)")
	waitBlocked(t, obs, a.PgConn().PID())
	exec(t, b, "ROLLBACK")
	if err := mustFinish(t, done); err != nil {
		t.Fatalf("A after B rolled back: %v", err)
	}
	if m := mark(t, db, "settle"); m != 41 {
		t.Fatalf("mark after B's rollback: %d, want 41", m)
	}

	// B commits: A's waiting write fails 55F01 and changes nothing.
	exec(t, b, "BEGIN; UPDATE invoices SET settled = true WHERE id = 1")
	done = async(a, "INSERT INTO transfers VALUES (3, 3)")
	waitBlocked(t, obs, a.PgConn().PID())
	exec(t, b, "COMMIT")
	wantCode(t, "A after B committed", mustFinish(t, done), rewrite.CodeStale, "stale fencing token: lock settle")
	if n := queryInt(t, obs, "SELECT count(*) FROM transfers"); n != 2 {
		t.Fatalf("transfers: %d rows, want 2", n)
	}

	// Different locks never interfere: while B raises settle's mark in an open transaction, a writer of
	// another lock (and one without a lock) writes the same table without waiting.
	exec(t, b, "SET fence.token = 43; BEGIN; INSERT INTO transfers VALUES (10, 10)")
	other := connect(t, db, pgtest.SuperUser, "-c fence.token=7 -c fence.lock=report")
	exec(t, other, "INSERT INTO transfers VALUES (11, 11); UPDATE transfers SET amount = 0 WHERE id = 11")
	exec(t, connect(t, db, pgtest.SuperUser, "-c fence.token=1"), "INSERT INTO transfers VALUES (12, 12)")
	exec(t, b, "COMMIT")
}

// TestLockFenceSameTokenDoesNotSerialize: writers with the same token and lock run concurrently: the second
// writes while the first's transaction is open. Two writers that both find the mark below their token queue
// on its raise but do not deadlock.
func TestLockFenceSameTokenDoesNotSerialize(t *testing.T) {
	db := lockTables(t)
	obs := superConn(t, db)
	w1 := connect(t, db, pgtest.SuperUser, "-c fence.token=41 -c fence.lock=settle")
	w2 := connect(t, db, pgtest.SuperUser, "-c fence.token=41 -c fence.lock=settle")
	exec(t, w1, "INSERT INTO transfers VALUES (100, 1)") // the mark exists at 41

	exec(t, w1, "BEGIN; INSERT INTO transfers VALUES (1, 1)")
	exec(t, w2, "BEGIN; INSERT INTO transfers VALUES (2, 2); UPDATE invoices SET settled = true WHERE id = 2") // does not wait
	exec(t, w1, "UPDATE invoices SET settled = true WHERE id = 1")
	exec(t, w1, "COMMIT")
	exec(t, w2, "COMMIT")

	// Both find mark 41 < 43: the first raises it, the second waits for it and then shares the mark.
	v1 := connect(t, db, pgtest.SuperUser, "-c fence.token=43 -c fence.lock=settle")
	v2 := connect(t, db, pgtest.SuperUser, "-c fence.token=43 -c fence.lock=settle")
	exec(t, v1, "BEGIN; INSERT INTO transfers VALUES (3, 3)")
	done := async(v2, "BEGIN; INSERT INTO transfers VALUES (4, 4)")
	waitBlocked(t, obs, v2.PgConn().PID())
	exec(t, v1, "COMMIT")
	if err := mustFinish(t, done); err != nil {
		t.Fatalf("second writer with the new token: %v", err)
	}
	exec(t, v2, "COMMIT")
	if m := mark(t, db, "settle"); m != 43 {
		t.Fatalf("mark: %d", m)
	}

	// The first ever write on a lock, by two same-token writers at once: the second waits for the first's
	// insert of the mark, then shares it.
	n1 := connect(t, db, pgtest.SuperUser, "-c fence.token=5 -c fence.lock=fresh")
	n2 := connect(t, db, pgtest.SuperUser, "-c fence.token=5 -c fence.lock=fresh")
	exec(t, n1, "BEGIN; INSERT INTO transfers VALUES (5, 5)")
	done = async(n2, "INSERT INTO transfers VALUES (6, 6)")
	waitBlocked(t, obs, n2.PgConn().PID())
	exec(t, n1, "COMMIT")
	if err := mustFinish(t, done); err != nil {
		t.Fatalf("second first writer: %v", err)
	}
	_ = context.Background
}

// TestLockFenceSavepointRollback: a write's acceptance by the lock lasts as long as the row lock on the mark
// that backs it. A savepoint rolled back releases both, so a newer holder can raise the mark meanwhile and the
// older transaction's next write is refused (it must not rely on an acceptance that was rolled back).
func TestLockFenceSavepointRollback(t *testing.T) {
	db := lockTables(t)
	a := connect(t, db, pgtest.SuperUser, "-c fence.token=41 -c fence.lock=settle")
	b := connect(t, db, pgtest.SuperUser, "-c fence.token=42 -c fence.lock=settle")
	exec(t, a, "INSERT INTO transfers VALUES (1, 1)") // mark 41
	exec(t, a, "BEGIN; SAVEPOINT s; INSERT INTO transfers VALUES (2, 2); INSERT INTO transfers VALUES (3, 3); ROLLBACK TO SAVEPOINT s")
	exec(t, b, "INSERT INTO transfers VALUES (4, 4)") // does not wait: A holds nothing on the mark any more
	wantCode(t, "A after its savepoint rolled back", execErr(a, "INSERT INTO transfers VALUES (5, 5)"), rewrite.CodeStale, "stale fencing token: lock settle")
	exec(t, a, "ROLLBACK")
	// Within one transaction, writes after the first one rely on it (one lock_accept per transaction).
	c := connect(t, db, pgtest.SuperUser, "-c fence.token=42 -c fence.lock=settle")
	exec(t, c, "BEGIN; INSERT INTO transfers SELECT g, g FROM generate_series(10, 200) g; UPDATE transfers SET amount = 0; COMMIT")
	if m := mark(t, db, "settle"); m != 42 {
		t.Fatalf("mark: %d", m)
	}
}

// TestLockFenceRepeatableRead: a REPEATABLE READ transaction whose snapshot predates a newer holder's raise of
// the mark must not accept its write on that old snapshot: PostgreSQL's serialization failure (40001).
func TestLockFenceRepeatableRead(t *testing.T) {
	db := lockTables(t)
	a := connect(t, db, pgtest.SuperUser, "-c fence.token=41 -c fence.lock=settle")
	b := connect(t, db, pgtest.SuperUser, "-c fence.token=42 -c fence.lock=settle")
	exec(t, a, "INSERT INTO transfers VALUES (1, 1)") // mark 41
	exec(t, a, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM invoices")
	exec(t, b, "INSERT INTO transfers VALUES (2, 2)") // mark 42, committed after A's snapshot
	wantCode(t, "A on its old snapshot", execErr(a, "INSERT INTO transfers VALUES (3, 3)"), "40001", "")
	exec(t, a, "ROLLBACK")
	if n := queryInt(t, superConn(t, db), "SELECT count(*) FROM transfers"); n != 2 {
		t.Fatalf("transfers: %d rows, want 2", n)
	}
}

// TestRaiseMarks: the failover barrier's step raises marks to at least the tokens given (GREATEST: never
// lowers one), inserts the marks of locks the database has not seen, is idempotent, and a raised mark refuses an
// older holder (55F01) while the token it was raised to still writes.
func TestRaiseMarks(t *testing.T) {
	db := lockTables(t)
	ctx := context.Background()
	su := superConn(t, db)
	exec(t, su, "INSERT INTO fenceproxy.lock_marks (name, mark) VALUES ('settle', 5), ('other', 10)")
	want := map[string]int64{"settle": 7, "other": 3, "fresh": 4}
	raised, err := schema.RaiseMarks(ctx, su, want)
	if err != nil {
		t.Fatal(err)
	}
	if raised != 2 || mark(t, db, "settle") != 7 || mark(t, db, "other") != 10 || mark(t, db, "fresh") != 4 {
		t.Errorf("raised %d; marks settle %d other %d fresh %d, want 2; 7 10 4", raised, mark(t, db, "settle"), mark(t, db, "other"), mark(t, db, "fresh"))
	}
	if raised, err := schema.RaiseMarks(ctx, su, want); err != nil || raised != 0 {
		t.Errorf("a second run raised %d (%v), want 0", raised, err)
	}
	old := connect(t, db, pgtest.SuperUser, "-c fence.token=6 -c fence.lock=settle")
	wantCode(t, "older holder", execErr(old, "UPDATE invoices SET settled = true WHERE id = 1"), rewrite.CodeStale, "stale fencing token: lock settle")
	current := connect(t, db, pgtest.SuperUser, "-c fence.token=7 -c fence.lock=settle")
	exec(t, current, "UPDATE invoices SET settled = true WHERE id = 1")
}
