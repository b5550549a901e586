package schema_test

import (
	"fmt"
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

// TestLockFenceFastPath: a session whose previous transaction was accepted with the same lock and token
// checks the mark in the guard itself (a shared advisory lock and one read of the mark by its id and name)
// without calling lock_accept; anything else goes through lock_accept. The session-level hint it relies on
// (fenceproxy.lock_last, fenceproxy.lock_last_id) cannot let a forged value skip the check: the guard reads
// the mark of the session's own lock, whatever id the hint names. (That the fast path's shared lock makes a
// newer writer wait is TestLockFenceNewerWaitsForOlderInFlight: A's second transaction takes the fast path.)
func TestLockFenceFastPath(t *testing.T) {
	db := lockTables(t)
	lockAcceptCalls := "SELECT coalesce(pg_stat_get_xact_function_calls('fenceproxy.lock_accept(text)'::regprocedure), 0)"

	a := connect(t, db, pgtest.SuperUser, "-c fence.token=41 -c fence.lock=settle -c track_functions=pl")
	exec(t, a, "BEGIN; INSERT INTO transfers VALUES (1, 1)")
	if n := queryInt(t, a, lockAcceptCalls); n != 1 {
		t.Fatalf("first transaction of the session: %d lock_accept calls, want 1", n)
	}
	exec(t, a, "COMMIT")
	// Pending function statistics count earlier transactions' calls until they are flushed (at idle).
	exec(t, a, "SELECT pg_stat_force_next_flush()")
	exec(t, a, "BEGIN; INSERT INTO transfers VALUES (2, 2); UPDATE invoices SET settled = true WHERE id = 1")
	if n := queryInt(t, a, lockAcceptCalls); n != 0 {
		t.Fatalf("next transaction with the same lock and token: %d lock_accept calls, want 0 (the fast path)", n)
	}
	exec(t, a, "COMMIT")
	// A new token in the same session: lock_accept raises the mark.
	exec(t, a, "SELECT pg_stat_force_next_flush()")
	exec(t, a, "SET fence.token = 42; BEGIN; INSERT INTO transfers VALUES (3, 3)")
	if n := queryInt(t, a, lockAcceptCalls); n != 1 {
		t.Fatalf("a newer token: %d lock_accept calls, want 1", n)
	}
	exec(t, a, "COMMIT")
	if m := mark(t, db, "settle"); m != 42 {
		t.Fatalf("mark: %d, want 42", m)
	}

	// Forged hints: a session with token 20 on lock settle (mark 42) names in the hint its own lock and token
	// with the id of another lock whose mark is 20, its own lock's id, or garbage: refused every time.
	low := connect(t, db, pgtest.SuperUser, "-c fence.token=20 -c fence.lock=low")
	exec(t, low, "INSERT INTO transfers VALUES (4, 4)")
	lowID := queryInt(t, superConn(t, db), "SELECT id FROM fenceproxy.lock_marks WHERE name = 'low'")
	settleID := queryInt(t, superConn(t, db), "SELECT id FROM fenceproxy.lock_marks WHERE name = 'settle'")
	s := connect(t, db, pgtest.SuperUser, "-c fence.token=20 -c fence.lock=settle")
	for _, id := range []string{fmt.Sprint(lowID), fmt.Sprint(settleID), "x", ""} {
		exec(t, s, fmt.Sprintf("SET fenceproxy.lock_last = '20|settle'; SET fenceproxy.lock_last_id = '%s'", id))
		wantCode(t, "forged hint with id "+id, execErr(s, "INSERT INTO transfers VALUES (5, 5)"), rewrite.CodeStale,
			"stale fencing token: lock settle has accepted a newer token")
	}
	if n := queryInt(t, superConn(t, db), "SELECT count(*) FROM transfers WHERE id = 5"); n != 0 {
		t.Fatalf("a forged hint let a stale write through")
	}
}
