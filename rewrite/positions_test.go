package rewrite

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// charPos is the position (characters from 1) of the n-th (from 1) occurrence of sub in text; 0 when none.
func charPos(text, sub string, n int) int {
	at := 0
	for ; n > 0; n-- {
		i := strings.Index(text[at:], sub)
		if i < 0 {
			return 0
		}
		at += i
		if n > 1 {
			at += len(sub)
		}
	}
	return utf8.RuneCountInString(text[:at]) + 1
}

// TestClientPosition maps the position of the token an error points at in the rewritten text (where the
// server counts) to that token in the client's text, for the shapes of statement whose errors carry one.
func TestClientPosition(t *testing.T) {
	r := testRewriter(t)
	for _, tc := range []struct {
		name, sql string
		at        string // the token the server points at: its occurrence n in the sent text
		n         int    // occurrence in the sent text
		want      string // and in the client's text (occurrence 1), "" for the statement's start
		wantN     int
	}{
		{"insert bad literal", "INSERT INTO accounts (id, n) VALUES (1, 'x')", "'x'", 1, "'x'", 1},
		{"insert select", "INSERT INTO accounts (id, n) SELECT 1, 'x' FROM other WHERE flag", "flag", 1, "flag", 1},
		{"update type error", "UPDATE accounts SET n = 'abc', m = 2 WHERE id = 1", "'abc'", 1, "'abc'", 1},
		{"update where", "UPDATE accounts SET n = 1 WHERE nosuch = 1", "nosuch", 1, "nosuch", 1},
		{"delete unknown column", "DELETE FROM accounts WHERE nosuch = 1", "nosuch", 1, "nosuch", 1},
		{"delete repeated condition", "DELETE FROM accounts WHERE nosuch = 1", "nosuch", 2, "nosuch", 1},
		{"second statement", "SELECT 1; UPDATE accounts SET n = 'abc' WHERE id = 1", "'abc'", 1, "'abc'", 1},
		{"first statement", "SELECT nosuch; UPDATE accounts SET n = 1 WHERE id = 1", "nosuch", 1, "nosuch", 1},
		{"non-ASCII before", "UPDATE accounts SET note = 'été ☃', n = 'abc' WHERE id = 1", "'abc'", 1, "'abc'", 1},
		{"non-ASCII statement before", "SELECT 'ü☃'; DELETE FROM accounts WHERE nosuch = 1", "nosuch", 1, "nosuch", 1},
		{"fence's CTE", "SELECT 1;\n  UPDATE accounts SET n = 1 WHERE id = 1", "fenceproxy_stmt", 1, "", 0},
		{"fence's guard", "UPDATE accounts SET n = 1 WHERE id = 1", "COALESCE", 1, "", 0},
		{"on conflict", "INSERT INTO accounts (id, n) VALUES (1, 2) ON CONFLICT (id) DO UPDATE SET n = 'y'", "'y'", 1, "'y'", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := r.Plan(tc.sql)
			if p.Action != Rewrite {
				t.Fatalf("%s: %v", tc.sql, p.Action)
			}
			sentPos := charPos(p.SQL, tc.at, tc.n)
			if sentPos == 0 {
				t.Fatalf("%q not in %s", tc.at, p.SQL)
			}
			want := 0
			if tc.want == "" {
				// The client's statement that holds the write: its first character.
				i := strings.LastIndex(tc.sql, ";")
				want = utf8.RuneCountInString(tc.sql[:i+1]) + 1
				for tc.sql[i+1] == ' ' || tc.sql[i+1] == '\n' {
					i++
					want++
				}
			} else {
				want = charPos(tc.sql, tc.want, tc.wantN)
			}
			got, ok := r.ClientPosition([]byte(tc.sql), DefaultSettings, []byte(p.SQL), sentPos)
			if !ok || got != want {
				t.Errorf("%s\nsent %s\nposition %d: got %d %v, want %d", tc.sql, p.SQL, sentPos, got, ok, want)
			}
		})
	}
}

// TestClientPositionEncodedInline maps a position in an inline-token rewrite sent in LATIN1: the token's digits
// and the client's encoding change bytes, not the characters the server counts.
func TestClientPositionEncodedInline(t *testing.T) {
	r := testRewriter(t)
	set := DefaultSettings
	set.ClientEncoding = "LATIN1"
	set.InlineToken = true
	client := "UPDATE accounts SET note = 'caf\xe9', n = 'abc' WHERE id = 1"
	p := r.PlanWith([]byte(client), set)
	if p.TokenSegs == nil {
		t.Fatalf("not inline: %+v", p)
	}
	sent := p.WithToken("1234567")
	sentPos := strings.Index(sent, "'abc'") + 1 // LATIN1: one byte a character
	want := strings.Index(client, "'abc'") + 1
	if got, ok := r.ClientPosition([]byte(client), set, []byte(sent), sentPos); !ok || got != want {
		t.Errorf("position %d: got %d %v, want %d", sentPos, got, ok, want)
	}
}

// TestClientPositionDropped: a position that cannot be mapped is dropped, not left pointing at the rewrite.
func TestClientPositionDropped(t *testing.T) {
	r := testRewriter(t)
	client := "UPDATE accounts SET n = 1 WHERE id = 1"
	p := r.Plan(client)
	for _, pos := range []int{0, -1, utf8.RuneCountInString(p.SQL) + 2} {
		if got, ok := r.ClientPosition([]byte(client), DefaultSettings, []byte(p.SQL), pos); ok {
			t.Errorf("position %d: got %d, want dropped", pos, got)
		}
	}
	if got, ok := r.ClientPosition([]byte(client), DefaultSettings, []byte("SELECT 1; SELECT 2"), 12); ok {
		t.Errorf("another text: got %d, want dropped", got)
	}
}

// TestPositionsGolden: testdata/positions at the repository root shows, for each file's text, every place in
// the rewritten text where a node starts (where the server may point) and the place in the client's text it
// maps to (-> statement: the start of the client's statement, for the fence's own nodes).
func TestPositionsGolden(t *testing.T) {
	r := testRewriter(t)
	paths, err := filepath.Glob(filepath.Join("../testdata/positions", "*.sql"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, path := range paths {
		g := readGolden(t, path)
		t.Run(strings.TrimSuffix(filepath.Base(path), ".sql"), func(t *testing.T) {
			got := formatPositions(t, r, g.input)
			if *update {
				if err := os.WriteFile(path, []byte(g.head+"-- input:\n"+g.input+"\n-- output:\n"+got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if got != g.output {
				t.Errorf("input:\n%s\ngot:\n%s\nwant:\n%s", g.input, got, g.output)
			}
		})
	}
}

// formatPositions lists each node location of the rewrite of sql (characters from 1) with the text there, and
// where ClientPosition maps it, with the client's text there.
func formatPositions(t *testing.T, r *Rewriter, sql string) string {
	t.Helper()
	p := r.Plan(sql)
	if p.Action != Rewrite {
		t.Fatalf("%v: %s", p.Action, p.Message)
	}
	tree, err := pg.Parse(p.SQL)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	eachMessage(tree.ProtoReflect(), func(m protoreflect.Message) {
		if fd := m.Descriptor().Fields().ByName("location"); fd != nil && m.Get(fd).Int() >= 0 {
			seen[int(m.Get(fd).Int())] = true
		}
	})
	var locs []int
	for l := range seen {
		locs = append(locs, l)
	}
	sort.Ints(locs)
	snippet := func(s string, b int) string {
		s = s[b:]
		if i := strings.IndexAny(s, ",;\n"); i > 0 {
			s = s[:i]
		}
		if n := 24; utf8.RuneCountInString(s) > n {
			s = string([]rune(s)[:n])
		}
		return fmt.Sprintf("%q", s)
	}
	var b strings.Builder
	for _, l := range locs {
		pos := utf8.RuneCountInString(p.SQL[:l]) + 1
		got, ok := r.ClientPosition([]byte(sql), DefaultSettings, []byte(p.SQL), pos)
		to := "dropped"
		if ok {
			cb, _ := byteOffset(sql, got)
			to = fmt.Sprintf("%d %s", got, snippet(sql, cb))
		}
		fmt.Fprintf(&b, "%4d %-28s -> %s\n", pos, snippet(p.SQL, l), to)
	}
	return b.String()
}

// A SQL_ASCII server counts a position in bytes (every byte is a character to it), not in UTF-8 characters:
// read as characters, a position after non-ASCII text landed that many bytes further on, here in the next
// statement, and came back in the wrong statement of the client's text. It is mapped in bytes (or dropped).
func TestClientPositionSQLASCIIServer(t *testing.T) {
	r := testRewriter(t)
	s := Settings{ClientEncoding: "UTF8", ServerEncoding: "SQL_ASCII", StandardConformingStrings: true}
	for _, enc := range []string{"UTF8", "SQL_ASCII"} {
		s.ClientEncoding = enc
		sql := "SELECT 'ééééééééééééééééééééééééééééééééééééééé☃', nosuch; UPDATE accounts SET n = 1 WHERE id = 1"
		p := r.PlanWith([]byte(sql), s)
		if p.Action != Rewrite {
			t.Fatalf("%s: %v", sql, p.Action)
		}
		sentPos := strings.Index(p.SQL, "nosuch") + 1 // bytes, as the server counts
		got, ok := r.ClientPosition([]byte(sql), s, []byte(p.SQL), sentPos)
		if want := strings.Index(sql, "nosuch") + 1; ok && got != want {
			t.Errorf("client encoding %s: sent %s\nposition %d: got %d, want %d (or dropped)", enc, p.SQL, sentPos, got, want)
		}
	}
}
