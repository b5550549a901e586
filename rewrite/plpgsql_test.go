package rewrite

import (
	"slices"
	"testing"
)

// TestPLpgSQLWrites: a function's static SQL is read as a DO block's is (assignments and expressions
// included); dynamic SQL is reported, not guessed.
func TestPLpgSQLWrites(t *testing.T) {
	r := testRewriter(t)
	for _, c := range []struct {
		def     string
		tables  []string
		dynamic bool
	}{
		{`CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $$BEGIN UPDATE accounts SET balance = 0; END$$`, []string{"accounts"}, false},
		{`CREATE FUNCTION f(n int) RETURNS int LANGUAGE plpgsql AS $$DECLARE x int; BEGIN x := (SELECT count(*) FROM accounts); RETURN x; END$$`, nil, false},
		{`CREATE PROCEDURE p() LANGUAGE plpgsql AS $$BEGIN EXECUTE 'DELETE FROM ' || 'accounts'; END$$`, nil, true},
		{`CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $$DECLARE r record; BEGIN FOR r IN EXECUTE 'SELECT 1' LOOP END LOOP; INSERT INTO accounts (id) VALUES (1); END$$`, []string{"accounts"}, true},
	} {
		tables, dynamic, err := r.PLpgSQLWrites(c.def)
		if err != nil || !slices.Equal(tables, c.tables) || dynamic != c.dynamic {
			t.Errorf("%s: tables %v dynamic %v (%v), want %v %v", c.def, tables, dynamic, err, c.tables, c.dynamic)
		}
	}
}
