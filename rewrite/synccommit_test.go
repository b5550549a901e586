package rewrite

import (
	"strings"
	"testing"
)

// TestSyncCommitInFencedWrites: with a level, every fenced write sets synchronous_commit transaction-locally
// (and still verifies as fenced); statements that touch no protected table are not touched; without a level
// nothing is set; an unknown level is refused.
func TestSyncCommitInFencedWrites(t *testing.T) {
	const set = "set_config('synchronous_commit', 'remote_apply', true)"
	r, err := New(Config{Tables: []Table{{Name: "accounts", TokenColumn: "fence_token"}}, SynchronousCommit: "remote_apply", LockSetting: "fence.lock", Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"UPDATE accounts SET v = 1 WHERE id = 1",
		"INSERT INTO accounts (id, v) VALUES (1, 2)",
		"DELETE FROM accounts WHERE id = 3",
		"WITH x AS (UPDATE accounts SET v = 2 RETURNING id) SELECT * FROM x",
	} {
		p := r.Plan(sql)
		if p.Action != Rewrite || !strings.Contains(p.SQL, set) {
			t.Errorf("%s: %v %q, want a rewrite that sets synchronous_commit", sql, p.Action, p.SQL)
		}
	}
	if p := r.Plan("UPDATE other SET v = 1"); p.Action != Pass {
		t.Errorf("a write to an unprotected table: %v %q, want it passed unchanged", p.Action, p.SQL)
	}
	plain, err := New(Config{Tables: []Table{{Name: "accounts", TokenColumn: "fence_token"}}})
	if err != nil {
		t.Fatal(err)
	}
	if p := plain.Plan("UPDATE accounts SET v = 1"); strings.Contains(p.SQL, "synchronous_commit") {
		t.Errorf("without a level: %q sets synchronous_commit", p.SQL)
	}
	if _, err := New(Config{Tables: []Table{{Name: "accounts", TokenColumn: "fence_token"}}, SynchronousCommit: "off; DROP"}); err == nil {
		t.Error("an unknown synchronous_commit level was accepted")
	}
}
