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
