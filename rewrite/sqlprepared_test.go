package rewrite

import (
	"fmt"
	"strings"
	"testing"
)

// The names of PREPARE, EXECUTE (also under EXPLAIN and CREATE TABLE AS) and DEALLOCATE are found in order, with
// their statements' indexes, and replaced in the tree; the rest of the text means what it meant.
func TestPreparedRefsAndRename(t *testing.T) {
	sql := `PREPARE a (int) AS UPDATE t SET x = $1; EXECUTE a(1); EXPLAIN EXECUTE a(2); CREATE TABLE c AS EXECUTE a(3);
		DEALLOCATE a; DEALLOCATE PREPARE ALL; SELECT 'PREPARE b AS SELECT 1'`
	refs, err := PreparedRefs(sql)
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(refs)
	want := "[{0 0 a PREPARE p(int) AS UPDATE t SET x = $1} {1 1 a } {2 1 a } {3 1 a } {4 2 a } {5 3  }]"
	if got != want {
		t.Fatalf("refs\n%s, want\n%s", got, want)
	}
	out, prepares, err := RenamePrepared(sql, []string{"s1", "s2", "s3", "s4", "s5", ""})
	if err != nil {
		t.Fatal(err)
	}
	wantOut := "PREPARE s1(int) AS UPDATE t SET x = $1; EXECUTE s2(1); EXPLAIN EXECUTE s3(2); CREATE TABLE c AS EXECUTE s4(3); DEALLOCATE s5; DEALLOCATE ALL; SELECT 'PREPARE b AS SELECT 1'"
	if out != wantOut {
		t.Fatalf("renamed\n%s, want\n%s", out, wantOut)
	}
	if prepares[0] != "PREPARE s1(int) AS UPDATE t SET x = $1" || prepares[1] != "" {
		t.Fatalf("prepares %q", prepares)
	}
	if _, _, err := RenamePrepared(sql, []string{"s1"}); err == nil {
		t.Fatal("too few names accepted")
	}
	if _, err := PreparedRefs("PREPARE a AS SELEC 1"); err == nil {
		t.Fatal("a syntax error gave uses")
	}
}

// The statements a failed block would refuse in front of a text go after its first statement when that one
// ends the failed state, and only then.
func TestAfterBlockExit(t *testing.T) {
	front := []string{"PREPARE q1 AS SELECT 'a;b'", "PREPARE q2(int) AS SELECT $1"}
	for _, c := range []struct{ sql, want string }{
		{"ROLLBACK; EXECUTE q1", "ROLLBACK; PREPARE q1 AS SELECT 'a;b'; PREPARE q2(int) AS SELECT $1; EXECUTE q1"},
		{`ROLLBACK TO SAVEPOINT "s;p"; EXECUTE q2(1)`, `ROLLBACK TO SAVEPOINT "s;p"; PREPARE q1 AS SELECT 'a;b'; PREPARE q2(int) AS SELECT $1; EXECUTE q2(1)`},
		{"COMMIT; EXECUTE q1", "COMMIT; PREPARE q1 AS SELECT 'a;b'; PREPARE q2(int) AS SELECT $1; EXECUTE q1"},
		{"ROLLBACK", ""},
		{"BEGIN; EXECUTE q1", ""},
		{"SELECT 1; ROLLBACK; EXECUTE q1", ""},
		{"SAVEPOINT s; EXECUTE q1", ""},
	} {
		got, at, ok := AfterBlockExit(c.sql, front)
		if ok != (c.want != "") || got != c.want {
			t.Errorf("%s:\n got  %q %v\n want %q", c.sql, got, ok, c.want)
		}
		if ok && !strings.HasPrefix(got[at:], front[0]+"; ") {
			t.Errorf("%s: at %d is not where the first PREPARE starts in %q", c.sql, at, got)
		}
	}
}
