package rewrite

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/encoding/charmap"
	"golang.org/x/text/encoding/japanese"
)

var scsOff = Settings{ClientEncoding: "UTF8", ServerEncoding: "UTF8", StandardConformingStrings: false}

// TestLex: statement splits and literal values as PostgreSQL reads them (each
// case was checked against PostgreSQL 15; TestLexerMatchesServer in the proxy
// package checks generated ones against the running server).
func TestLex(t *testing.T) {
	cases := []struct {
		sql     string
		set     Settings
		stmts   int
		strings []string
	}{
		{`SELECT 1`, DefaultSettings, 1, nil},
		{`SELECT 1;; SELECT 2;`, DefaultSettings, 2, nil},
		{`SELECT 'a;b'; SELECT "x;y"`, DefaultSettings, 2, []string{"a;b"}},
		// The example: one statement with scs on, three with it off.
		{`SELECT 'a\' AS x, ' AS y; UPDATE accounts SET balance = 0 WHERE id = 1; SELECT ' --'`, DefaultSettings, 1, []string{`a\`, ` AS y; UPDATE accounts SET balance = 0 WHERE id = 1; SELECT `}},
		{`SELECT 'a\' AS x, ' AS y; UPDATE accounts SET balance = 0 WHERE id = 1; SELECT ' --'`, scsOff, 3, []string{`a' AS x, `, ` --`}},
		{`SELECT E'a\'b', E'\x41\101\u0042\U00000043', e'\n'`, DefaultSettings, 1, []string{"a'b", "AABC", "\n"}},
		{`SELECT 'it''s', E'it''s'`, DefaultSettings, 1, []string{"it's", "it's"}},
		{"SELECT 'a'\n'b', 'c' -- x\n 'd', 'e' 'f'", DefaultSettings, 1, []string{"ab", "cd", "e", "f"}},
		{"SELECT E'a'\n'\\'', 'x'", DefaultSettings, 1, []string{"a'", "x"}}, // a continuation keeps the escape mode
		{`SELECT $$a;'b$$, $t$ $$ ; $t$, $x$$y$ $x$`, DefaultSettings, 1, []string{"a;'b", " $$ ; ", "$y$ "}},
		{`SELECT U&'\0061\+000062', U&'!0063' UESCAPE '!', U&'d\\'`, DefaultSettings, 1, []string{"ab", "c", `d\`}},
		{`SELECT /* ; /* ; */ ; */ 1; -- ;` + "\n" + `SELECT 2`, DefaultSettings, 2, nil},
		{`SELECT N'a\'`, DefaultSettings, 1, []string{`a\`}},
		{`SELECT B'10', X'1F', 'x'`, DefaultSettings, 1, []string{"x"}},
		{`SELECT a$b$c, $1, 1.5e3, .5, 1..2`, DefaultSettings, 1, nil},
	}
	for _, c := range cases {
		got, err := Lex([]byte(c.sql), c.set)
		if err != nil {
			t.Errorf("Lex(%q, scs %v): %v", c.sql, c.set.StandardConformingStrings, err)
			continue
		}
		if got.Statements != c.stmts || !reflect.DeepEqual(got.Strings, c.strings) && !(len(got.Strings) == 0 && len(c.strings) == 0) {
			t.Errorf("Lex(%q, scs %v) = %d %q, want %d %q", c.sql, c.set.StandardConformingStrings, got.Statements, got.Strings, c.stmts, c.strings)
		}
	}
}

// TestLexErrors: texts the server rejects at lexing are errors for the lexer
// too.
func TestLexErrors(t *testing.T) {
	for _, c := range []struct {
		sql string
		set Settings
	}{
		{`SELECT 'a`, DefaultSettings},
		{`SELECT E'a\'`, DefaultSettings},
		{`SELECT 'a\'`, scsOff},
		{`SELECT "a`, DefaultSettings},
		{`SELECT ""`, DefaultSettings},
		{`SELECT /* /* */`, DefaultSettings},
		{`SELECT $a$ x`, DefaultSettings},
		{`SELECT U&'x'`, scsOff},
		{`SELECT U&'x' UESCAPE 'ab'`, DefaultSettings},
		{`SELECT U&'x' UESCAPE 'a'`, DefaultSettings},
		{`SELECT U&'\00'`, DefaultSettings},
		{`SELECT E'\u00'`, DefaultSettings},
		{`SELECT E'\xff'`, DefaultSettings},
		{`SELECT E'\0'`, DefaultSettings},
		{`SELECT 1abc`, DefaultSettings},
		{`SELECT $1a`, DefaultSettings},
	} {
		if got, err := Lex([]byte(c.sql), c.set); err == nil {
			t.Errorf("Lex(%q) = %+v, want an error", c.sql, got)
		}
	}
}

func TestLexIdentValues(t *testing.T) {
	long := strings.Repeat("é", 40) // 80 bytes: clipped at a character boundary
	for _, c := range []struct{ in, want string }{
		{`Accounts`, "accounts"},
		{`"Accounts"`, "Accounts"},
		{`"a""b"`, `a"b`},
		{`U&"\0061ccounts"`, "accounts"},
		{`U&"!0061ccounts" UESCAPE '!'`, "accounts"},
		{`U&"a\\b"`, `a\b`},
		{`U&"\+01F600"`, "\U0001F600"},
		{`U&"\D83D\DE00"`, "\U0001F600"},
		{strings.Repeat("x", 70), strings.Repeat("x", 63)},
		{long, strings.Repeat("é", 31)},
		{`ÉTÉ`, "ÉtÉ"}, // only ASCII letters are downcased
	} {
		l := newLexer([]byte(c.in), true)
		tok := l.next()
		v, ok := l.identValue(tok, nil)
		if !ok || string(v) != c.want || l.next().kind != tokEOF {
			t.Errorf("identValue(%q) = %q, %v; want %q", c.in, v, ok, c.want)
		}
	}
}

// TestNormalise: under standard_conforming_strings off, each '...' literal
// holding a backslash is respelled E'...' and nothing else changes.
func TestNormalise(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`SELECT 'a'`, `SELECT 'a'`},
		{`SELECT 'a\'b'`, `SELECT  E'a\'b'`},
		{`SELECT x'1'`, `SELECT x'1'`},
		{`SELECT n'\\'`, `SELECT  NCHAR E'\\'`},
		{`SELECT abc'\n'`, `SELECT abc E'\n'`},
		{"SELECT 'a'\n'\\''", "SELECT  E'a'\n'\\''"},
		{`SELECT $$\$$, E'\\'`, `SELECT $$\$$, E'\\'`},
	} {
		if got := normalise([]byte(c.in)); got != c.want {
			t.Errorf("normalise(%q) = %q, want %q", c.in, got, c.want)
		}
		a, errA := Lex([]byte(c.in), scsOff)
		b, errB := Lex([]byte(normalise([]byte(c.in))), DefaultSettings)
		if errA != nil || errB != nil || a.Statements != b.Statements || !reflect.DeepEqual(a.Strings, b.Strings) {
			t.Errorf("%q: scs off reads %+v (%v), normalised with scs on %+v (%v)", c.in, a, errA, b, errB)
		}
	}
}

// TestEncodings: client bytes are decoded exactly or refused; a 0x5C trail
// byte of SJIS is not a backslash.
func TestEncodings(t *testing.T) {
	sjis := Settings{ClientEncoding: "SJIS", ServerEncoding: "UTF8", StandardConformingStrings: true}
	so, _ := japanese.ShiftJIS.NewEncoder().String("ソ") // 0x83 0x5C
	if so != "\x83\x5c" {
		t.Fatalf("ソ in SJIS is %x", so)
	}
	raw := []byte("SELECT E'" + so + "'; UPDATE accounts SET balance = 0; SELECT ''")
	got, err := Lex(raw, sjis)
	if err != nil || got.Statements != 3 || len(got.Strings) != 2 || got.Strings[0] != "ソ" {
		t.Errorf("SJIS: %+v, %v", got, err)
	}
	// The same bytes read as UTF-8 are invalid: unreadable.
	if _, err := Lex(raw, DefaultSettings); !errors.Is(err, ErrUnreadable) {
		t.Errorf("SJIS bytes as UTF-8: %v", err)
	}
	latin1 := Settings{ClientEncoding: "LATIN1", ServerEncoding: "UTF8", StandardConformingStrings: true}
	e, _ := charmap.ISO8859_1.NewEncoder().String("SELECT 'café'")
	if got, err := Lex([]byte(e), latin1); err != nil || got.Strings[0] != "café" {
		t.Errorf("LATIN1: %+v, %v", got, err)
	}
	for _, enc := range []string{"JOHAB", "MULE_INTERNAL", "NOPE"} {
		s := Settings{ClientEncoding: enc, ServerEncoding: "UTF8", StandardConformingStrings: true}
		if _, err := Lex([]byte("SELECT '\xb0\xa1'"), s); !errors.Is(err, ErrUnreadable) {
			t.Errorf("%s: %v", enc, err)
		}
		if got, err := Lex([]byte("SELECT 'ascii'"), s); err != nil || got.Strings[0] != "ascii" {
			t.Errorf("%s, ASCII text: %+v %v", enc, got, err)
		}
	}
}

// TestPlanSettings: the planner reads a text under the session's settings.
func TestPlanSettings(t *testing.T) {
	r := testRewriter(t)
	c := NewCache(r, 64)
	attack := `SELECT 'a\' AS x, ' AS y; UPDATE accounts SET balance = 0 WHERE id = 1; SELECT ' --'`
	for name, set := range map[string]Settings{"scs off": scsOff, "unknown": {}, "unsettled": {ClientEncoding: "UTF8", ServerEncoding: "UTF8", StandardConformingStrings: true, Unsettled: true}} {
		p := r.PlanWith([]byte(attack), set)
		cp := c.Plan([]byte(attack), set)
		if p.Action == Pass || cp.Action == Pass {
			t.Errorf("%s: the hidden UPDATE passes: %+v / %+v", name, p, cp)
		}
	}
	if p := c.Plan([]byte(attack), scsOff); p.Action != Rewrite || !strings.Contains(p.SQL, "fence_token") || strings.Count(p.SQL, ";") < 2 {
		t.Errorf("scs off: %+v", p)
	}
	// With scs on it is one SELECT, and the cached plan for scs off is not reused.
	if p := c.Plan([]byte(attack), DefaultSettings); p.Action != Pass {
		t.Errorf("scs on: %+v", p)
	}
	// A rewrite for an SJIS client is sent back in SJIS.
	sjis := Settings{ClientEncoding: "SJIS", ServerEncoding: "UTF8", StandardConformingStrings: true}
	v, _ := japanese.ShiftJIS.NewEncoder().String("UPDATE accounts SET note = 'ソ表' WHERE id = 1")
	p := c.Plan([]byte(v), sjis)
	if p.Action != Rewrite || utf8.ValidString(p.SQL) {
		t.Errorf("SJIS rewrite: %+v", p)
	}
	if dec, _ := japanese.ShiftJIS.NewDecoder().String(p.SQL); !strings.Contains(dec, "'ソ表'") {
		t.Errorf("SJIS rewrite does not carry the value: %q", dec)
	}
	// ASCII text whose escapes make non-ASCII: the rewrite is written in the client's encoding too.
	latin1 := Settings{ClientEncoding: "LATIN1", ServerEncoding: "UTF8", StandardConformingStrings: true}
	p = c.Plan([]byte(`UPDATE accounts SET note = U&'caf\00e9' WHERE id = 1`), latin1)
	if p.Action != Rewrite || !strings.Contains(p.SQL, "'caf\xe9'") {
		t.Errorf("LATIN1 rewrite of an escape: %+v", p)
	}
	johab := Settings{ClientEncoding: "JOHAB", ServerEncoding: "UTF8", StandardConformingStrings: true}
	if p = c.Plan([]byte(`UPDATE accounts SET note = U&'caf\00e9' WHERE id = 1`), johab); p.Action != Refuse {
		t.Errorf("JOHAB rewrite of an escape: %+v", p)
	}
}

// TestDeparsedBackslashes: pg_query's deparser writes a string holding a
// backslash as E'...' with the backslash doubled, so a rewritten statement
// reads the same under either standard_conforming_strings.
func TestDeparsedBackslashes(t *testing.T) {
	r := testRewriter(t)
	in := `UPDATE accounts SET note = 'a\\b' WHERE id = 1`
	for _, set := range []Settings{DefaultSettings, scsOff} {
		p := r.PlanWith([]byte(in), set)
		if p.Action != Rewrite || !strings.Contains(p.SQL, "E'a\\\\") {
			t.Fatalf("scs %v: %s", set.StandardConformingStrings, p.SQL)
		}
		got, err := Lex([]byte(p.SQL), set)
		orig, _ := Lex([]byte(in), set)
		if err != nil || !slices.Contains(got.Strings, orig.Strings[0]) {
			t.Errorf("scs %v: the rewrite reads %q, the client's text %q (%v)", set.StandardConformingStrings, got.Strings, orig.Strings, err)
		}
	}
}

func TestShape(t *testing.T) {
	a, sa, err := shape([]byte(`UPDATE accounts SET balance = balance + 17 WHERE id = 4242 AND note = 'x''y'`), true)
	if err != nil {
		t.Fatal(err)
	}
	b, _, _ := shape([]byte(`UPDATE accounts SET balance = balance + 5 WHERE id = 1 AND note = $$z$$`), true)
	if !bytes.Equal(a, b) || len(sa) != 3 {
		t.Errorf("shapes differ: %q %q %v", a, b, sa)
	}
	c, _, _ := shape([]byte(`UPDATE accounts SET balance = balance - 5 WHERE id = 1 AND note = 'z'`), true)
	if bytes.Equal(a, c) {
		t.Errorf("different statements, same shape %q", a)
	}
}

// FuzzLexer checks the lexer's invariants: tokens are ordered, disjoint and
// inside the text, and each reads alone as itself; the raw fast path
// (rawMayTouch) never rules out what the token prefilter lets through; the scs=off reading of a
// text equals the scs=on reading of its normalisation (what pg_query is given);
// a shape and its spans give back the text. The seed corpus is in
// testdata/fuzz/FuzzLexer and below.
func FuzzLexer(f *testing.F) {
	for _, s := range []string{
		`SELECT 'a\' AS x, ' AS y; UPDATE accounts SET balance = 0 WHERE id = 1; SELECT ' --'`,
		`SELECT E'a\'b', E'\x41\101\u0042\U00000043', e'\n'`,
		"SELECT 'a'\n'b', 'c' -- x\n 'd', 'e' 'f'",
		"SELECT E'a'\n'\\'', 'x'",
		`SELECT $$a;'b$$, $t$ $$ ; $t$, $x$$y$ $x$`,
		`SELECT U&'\0061\+000062', U&'!0063' UESCAPE '!', U&"d\\"`,
		`SELECT /* ; /* ; */ ; */ 1; -- ;` + "\n" + `SELECT 2`,
		`SELECT N'a\'`, `SELECT n'\\' ||abc'\'`, `DO E'BEGIN UPDATE acc\x6funts SET b = 0; END'`,
		`UPDATE U&"!0061ccounts" UESCAPE '!' SET balance = 0`, `SELECT 1update "accounts"`, `SELECT "éfence"`,
		`SELECT U&"set\005fconfig"('fence.token', '1', false)`, `do $$ $$`, `SELECT a$b$c, $1, 1.5e3, .5, 1..2, 0x1F, 1_000`,
		`SELECT 1 +-/* c */2 ---x` + "\n", `SELECT 'x' --c` + "\n" + `'y'`,
	} {
		f.Add(s)
	}
	r := testRewriter(f)
	f.Fuzz(func(t *testing.T, sql string) {
		if !utf8.ValidString(sql) || strings.ContainsRune(sql, 0) {
			t.Skip()
		}
		text := []byte(sql)
		for _, scs := range []bool{true, false} {
			// The raw fast path never rules out a text the token-level prefilter lets through.
			if sc := r.scan(text, scs); sc.touch && !r.rawMayTouch(text) {
				t.Errorf("scs %v: rawMayTouch false, scan touches: %q", scs, sql)
			}
			l := newLexer(text, scs)
			prev := 0
			for tok := l.next(); tok.kind != tokEOF; tok = l.next() {
				if tok.start < prev || tok.end <= tok.start || tok.end > len(text) {
					t.Fatalf("scs %v: token %+v after %d in %q", scs, tok, prev, sql)
				}
				prev = tok.end
				alone := newLexer(text[tok.start:tok.end], scs)
				if a := alone.next(); alone.err == nil && (a.kind != tok.kind || a.end != tok.end-tok.start) {
					t.Errorf("scs %v: %q lexes alone as %+v, in the text as %+v", scs, text[tok.start:tok.end], a, tok)
				}
			}
			if l.err != nil {
				continue
			}
			key, spans, err := shape(text, scs)
			if err != nil {
				t.Fatalf("shape: %v", err)
			}
			var back []byte
			last := 0
			for i, sp := range spans {
				mark := []byte{0}
				mark = append(append(mark, []byte(strconvItoa(i))...), 0)
				j := bytes.Index(key[last:], mark)
				if j < 0 {
					t.Fatalf("placeholder %d missing from %q", i, key)
				}
				back = append(append(back, key[last:last+j]...), text[sp[0]:sp[1]]...)
				last += j + len(mark)
			}
			if back = append(back, key[last:]...); !bytes.Equal(back, text) {
				t.Errorf("shape %q does not give back %q", key, sql)
			}
		}
		off, errOff := Lex(text, scsOff)
		on, errOn := Lex([]byte(normalise(text)), DefaultSettings)
		if errOff == nil && (errOn != nil || off.Statements != on.Statements || !reflect.DeepEqual(off.Strings, on.Strings)) {
			t.Errorf("%q: scs off reads %+v, its normalisation with scs on %+v (%v)", sql, off, on, errOn)
		}
	})
}

func strconvItoa(i int) string {
	var b []byte
	if i == 0 {
		return "0"
	}
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

// TestLexOperatorSigns: an operator's trailing + and - signs, as the server's scanner cuts them, checked at
// every token against the rule written out the plain way (operatorEnd) over every text of up to seven of
// + - / * ~ = (comments, the signs' qualifying character, runs cut by -- and /*). Then a run of three
// million signs: lexed again from each sign, as the server's scanner does, it takes hours (a pass per sign,
// and the old lexer checked the run again per lost sign); the lexer takes one pass, far inside the time limit.
func TestLexOperatorSigns(t *testing.T) {
	check := func(src []byte) {
		l := newLexer(src, true)
		for tok := l.next(); tok.kind != tokEOF; tok = l.next() {
			if (tok.kind == tokOp || tok.kind == tokSelf) && isOpChar(src[tok.start]) {
				if want := operatorEnd(src, tok.start); tok.end != want {
					t.Fatalf("%q: operator at %d ends at %d, want %d", src, tok.start, tok.end, want)
				}
			}
		}
	}
	texts := 0
	var walk func(text []byte, alphabet string, max int)
	walk = func(text []byte, alphabet string, max int) {
		if len(text) > 1 {
			texts++
			check(text)
		}
		if len(text) == max {
			return
		}
		for i := range len(alphabet) {
			walk(append(text, alphabet[i]), alphabet, max)
		}
	}
	walk([]byte("0"), "+-/*~=", 8)            // the signs, comments and a qualifying character, long
	walk([]byte("0"), "~!@#^&|`?+-*/%<>=", 5) // every operator character, short
	if texts != 335922+88740 {
		t.Fatalf("%d texts", texts)
	}

	src := []byte("0''0E00" + strings.Repeat("+", 3000000) + " 0")
	l := newLexer(src, true)
	signs := 0
	for tok := l.next(); tok.kind != tokEOF; tok = l.next() {
		if tok.kind == tokSelf && src[tok.start] == '+' {
			signs++
		}
	}
	if l.err != nil || signs != 3000000 {
		t.Fatalf("%d signs, err %v", signs, l.err)
	}
}

// operatorEnd is where the operator that starts at start ends, by the server's rule written out the plain way:
// the longest run of operator characters, cut before a /* or -- in it; then, while it is longer than one
// character and ends in + or -, it loses that sign unless one of ~!@#^&|`?% is among the characters before.
func operatorEnd(s []byte, start int) int {
	i := start
	for i < len(s) && isOpChar(s[i]) {
		if i > start && (s[i] == '*' && s[i-1] == '/' || s[i] == '-' && s[i-1] == '-') {
			i--
			break
		}
		i++
	}
	for i-start > 1 && (s[i-1] == '+' || s[i-1] == '-') && !strings.ContainsAny(string(s[start:i-1]), "~!@#^&|`?%") {
		i--
	}
	return i
}
