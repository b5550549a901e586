package rewrite

import (
	"fmt"
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
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

// Statements put before a text's statements go right before the ones named, the rest of the text as deparsed;
// the spans are where they went, so that the text with them taken off is the text deparsed.
func TestPutBefore(t *testing.T) {
	q1, q2 := "PREPARE q1 AS SELECT 'a;b'", "PREPARE q2(int) AS SELECT $1 || 'é'"
	for _, c := range []struct {
		sql  string
		put  []Put
		want string
	}{
		{"EXECUTE q1", []Put{{0, q1}}, "PREPARE q1 AS SELECT 'a;b'; EXECUTE q1"},
		{"ROLLBACK; EXECUTE q1", []Put{{1, q1}, {1, q2}}, "ROLLBACK; PREPARE q1 AS SELECT 'a;b'; PREPARE q2(int) AS SELECT $1 || 'é'; EXECUTE q1"},
		{`ROLLBACK TO SAVEPOINT "s;p"; EXECUTE q2(1)`, []Put{{1, q2}}, `ROLLBACK TO SAVEPOINT "s;p"; PREPARE q2(int) AS SELECT $1 || 'é'; EXECUTE q2(1)`},
		{"create table t0 (a int); commit; execute q1; select 'ü'; explain execute q2(2)", []Put{{2, q1}, {4, q2}},
			"CREATE TABLE t0 (a int); COMMIT; PREPARE q1 AS SELECT 'a;b'; EXECUTE q1; SELECT 'ü'; PREPARE q2(int) AS SELECT $1 || 'é'; EXPLAIN EXECUTE q2(2)"},
		{"SELECT 1; EXECUTE q1", []Put{{0, q1}}, "PREPARE q1 AS SELECT 'a;b'; SELECT 1; EXECUTE q1"},
		{"SELECT 1", nil, "SELECT 1"},
	} {
		got, spans, err := PutBefore(c.sql, c.put)
		if err != nil || got != c.want {
			t.Errorf("%s:\n got  %q %v\n want %q", c.sql, got, err, c.want)
			continue
		}
		tree, err := pg.Parse(c.sql)
		if err != nil {
			t.Fatal(err)
		}
		plain, _ := deparse(tree)
		var rest strings.Builder
		from := 0
		var held []string
		for _, s := range spans {
			rest.WriteString(got[from:s.At])
			held = append(held, got[s.At:s.At+s.Len])
			from = s.At + s.Len
		}
		rest.WriteString(got[from:])
		// Where the puts go, grouped by the statement they go before, each group followed by its separator.
		var want []string
		for k, p := range c.put {
			if k > 0 && c.put[k-1].Before == p.Before {
				want[len(want)-1] += p.SQL + "; "
			} else {
				want = append(want, p.SQL+"; ")
			}
		}
		if rest.String() != plain || fmt.Sprint(held) != fmt.Sprint(want) {
			t.Errorf("%s: spans %v hold %q, want %q; the rest %q, want %q", c.sql, spans, held, want, rest.String(), plain)
		}
	}
	for _, bad := range [][]Put{{{2, q1}}, {{-1, q1}}, {{0, "SELECT 1; SELECT 2"}}, {{0, "SELEC 1"}}} {
		if _, _, err := PutBefore("SELECT 1; SELECT 2", bad); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}
