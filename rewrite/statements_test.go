package rewrite

import "testing"

func TestStatements(t *testing.T) {
	set := Settings{StandardConformingStrings: true}
	for _, c := range []struct {
		text string
		n    int
		ok   bool
	}{
		{"COMMIT", 1, true},
		{" COMMIT ;; ", 1, true},
		{"", 0, true},
		{"SELECT f(); COMMIT", 2, true},
		{"SELECT ';'", 1, true},
		{"SELECT 1 -- ; COMMIT", 1, true},
		{"SELECT 1 /* ; */ ; /* c */", 1, true},
		{`SELECT "a;b" FROM t`, 1, true},
		{"SELECT $$;$$; COMMIT", 2, true},
		{"SELECT 'unterminated", 0, false},
	} {
		n, ok := Statements([]byte(c.text), set)
		if ok != c.ok || ok && n != c.n {
			t.Errorf("Statements(%q) = %d, %v; want %d, %v", c.text, n, ok, c.n, c.ok)
		}
	}
}

// TestCommitsPrepared is the hostile corpus of the rule that finds a text ending a prepared transaction: the
// keywords in any case, with comments or lines between, after other statements; and the texts that only hold the
// letters (a column, a string, a quoted identifier, a comment, a dollar-quoted body), which are not.
func TestCommitsPrepared(t *testing.T) {
	on := Settings{StandardConformingStrings: true}
	off := Settings{StandardConformingStrings: false}
	for _, c := range []struct {
		text string
		set  Settings
		want bool
	}{
		{"COMMIT PREPARED 'fp'", on, true},
		{"rollback prepared 'fp'", on, true},
		{"/* two-phase */ Commit\n\tPrepared 'fp58'", on, true},
		{"COMMIT/**/PREPARED 'fp'", on, true},
		{"COMMIT /* a /* nested */ comment */ PREPARED 'fp'", on, true},
		{"COMMIT -- a line comment\nPREPARED 'fp'", on, true},
		{"SELECT 1; COMMIT PREPARED 'fp'", on, true},
		{"SELECT 'unterminated", on, true},
		{"/* unterminated comment COMMIT", on, true},
		{"SELECT prepared_at FROM orders", on, false},
		{"SELECT gid FROM pg_prepared_xacts", on, false},
		{"SELECT 'COMMIT PREPARED x'", on, false},
		{`SELECT 'it''s' AS "COMMIT", 1 AS prepared`, on, false},
		{`"COMMIT" PREPARED 'fp'`, on, false},
		{"SELECT $$COMMIT PREPARED 'fp'$$", on, false},
		{"/* COMMIT PREPARED 'fp' */ SELECT 1", on, false},
		{"COMMIT; PREPARED", on, false},
		{"COMMIT", on, false},
		{"PREPARE TRANSACTION 'fp'", on, false},
		{`SELECT 'a\' COMMIT PREPARED '`, off, false},
		{`SELECT 'a\' COMMIT PREPARED '`, on, true},
		{"COMMIT_PREPARED", on, false},
		{"COMMIT prepared_x 'fp'", on, false},
	} {
		if got := CommitsPrepared([]byte(c.text), c.set); got != c.want {
			t.Errorf("CommitsPrepared(%q, scs=%v) = %v; want %v", c.text, c.set.StandardConformingStrings, got, c.want)
		}
	}
}
