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

// PreparedRefsAs reads a text as the server does under the session's settings: a string with escapes under
// standard_conforming_strings off, a Shift JIS character whose second byte is a backslash, swallow or expose an
// EXECUTE exactly as the server's lexer does; a text it cannot read exactly is an error, never a guess.
func TestPreparedRefsAs(t *testing.T) {
	on := Settings{ClientEncoding: "UTF8", ServerEncoding: "UTF8", StandardConformingStrings: true}
	off := on
	off.StandardConformingStrings = false
	sjis := on
	sjis.ClientEncoding = "SJIS"
	unsettled := on
	unsettled.Unsettled = true
	so := []byte{0x83, 0x5c} // ソ in Shift JIS: its second byte is a backslash
	cases := []struct {
		text string
		s    Settings
		refs int // -1: an error
	}{
		{`SELECT 'a\'; EXECUTE q; --'`, off, 0},
		{`SELECT 'a\'; EXECUTE q; --'`, on, 1},
		{`SELECT 'a\\'; EXECUTE q`, off, 1},
		// The other way: an EXECUTE the server runs that a reading with standard_conforming_strings on puts in a
		// string (mapped, never sent as it is).
		{`SELECT 'a\''; EXECUTE q; --'`, off, 1},
		{`SELECT 'a\''; EXECUTE q; --'`, on, 0},
		{`SELECT E'a\'; EXECUTE q; --'`, on, 0},
		{"SELECT '" + string(so) + "'; EXECUTE q", sjis, 1},
		{"SELECT '" + string(so) + "; EXECUTE q'", sjis, 0},
		{"SELECT '\xff'; EXECUTE q", on, -1},
		{`SELECT 'a\'; EXECUTE q; --'`, unsettled, -1},
		{"SELECT 'é'; EXECUTE q", unsettled, -1},
		{`SELECT 'a\'; EXECUTE q`, off, -1}, // the string never ends: the server refuses the text
	}
	for _, c := range cases {
		refs, err := PreparedRefsAs([]byte(c.text), c.s)
		switch {
		case c.refs < 0 && err == nil:
			t.Errorf("%q under %+v: %v, want an error", c.text, c.s, refs)
		case c.refs >= 0 && (err != nil || len(refs) != c.refs):
			t.Errorf("%q under %+v: %v %v, want %d uses", c.text, c.s, refs, err, c.refs)
		}
	}
}
