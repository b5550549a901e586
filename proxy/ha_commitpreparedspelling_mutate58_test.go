package proxy_test

import (
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// The rule that judges a text that may commit a prepared transaction as a fenced write (commitsPrepared,
// 93a7d02; by its keywords since prep59) reads the whole text, not a spelling at its start: a COMMIT PREPARED led by a
// comment, in mixed case across a line break, is the same statement to the server. From mutate58 (2026-12-06):
// with the rule reduced to a check that the text starts with COMMIT PREPARED, every test passed (they send it
// plain), and this one failed in both session modes: the Execute of the comment-led COMMIT PREPARED parsed
// while the host was the primary committed it on the withdrawn primary, and the Query reached the server too
// (42704, nothing left to commit).
func TestCommitPreparedBehindACommentRefusedOnAWithdrawnPrimary(t *testing.T) {
	const commit = "/* two-phase */ Commit\n\tPrepared 'fp58'"
	for _, mode := range barrierModes {
		if mode.name == "transaction" {
			continue // a pooled COMMIT PREPARED waits for the next primary (TestCommitPreparedRefusedOnAWithdrawnPrimary)
		}
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, map[string]string{"max_prepared_transactions": "5"})
			ctx := haCtx(t)
			c := connect(t, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
			for _, q := range []string{"SET fence.token = 5", "BEGIN", "UPDATE accounts SET v = 8 WHERE id = 1", "PREPARE TRANSACTION 'fp58'"} {
				if _, err := c.Exec(ctx, q); err != nil {
					t.Fatalf("%s on the published primary: %v", q, err)
				}
			}
			parsed := connect(t, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
			if _, err := parsed.Prepare(ctx, "cp", commit); err != nil {
				t.Fatal(err)
			}
			h.splitBrain(ctx, t)
			hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
			_, parsedErr := parsed.Exec(ctx, "cp")
			_, commitErr := c.Exec(ctx, commit)
			if err := hold.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 1 AND v = 8").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("a comment-led COMMIT PREPARED through a session on the withdrawn primary committed there (Parse before: %v; Query: %v)", parsedErr, commitErr)
			}
			if sqlstate(parsedErr) != "55F04" || sqlstate(commitErr) != "55F04" {
				t.Errorf("a comment-led COMMIT PREPARED on the withdrawn primary: prepared by Parse before: %v; Query: %v; want 55F04 for both", parsedErr, commitErr)
			}
		})
	}
}
