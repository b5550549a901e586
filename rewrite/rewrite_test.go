package rewrite

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestValidToken(t *testing.T) {
	cases := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"1", 1, true},
		{"42", 42, true},
		{"0042", 42, true},
		{"9223372036854775807", 9223372036854775807, true},
		{"0000000000000000001", 1, true}, // 19 characters
		{"00000000000000000001", 0, false},
		{"9223372036854775808", 0, false},
		{"9999999999999999999", 0, false},
		{"0", 0, false},
		{"000", 0, false},
		{"", 0, false},
		{"-1", 0, false},
		{"+1", 0, false},
		{" 1", 0, false},
		{"1 ", 0, false},
		{"1\n", 0, false},
		{"1e3", 0, false},
		{"1.0", 0, false},
		{"0x10", 0, false},
		{"١", 0, false}, // a non-ASCII digit
	}
	for _, c := range cases {
		got, ok := ValidToken(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("ValidToken(%q) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
		if sqlRuleValid(c.in) != c.ok {
			t.Errorf("SQL rule disagrees with ValidToken on %q", c.in)
		}
	}
}

// sqlRuleValid transcribes the SQL check of tmplToken, s ~ tokenPattern()
// (NULL does not match). Go's regexp has no lookahead: the pattern's (?!0+$)
// is "not all zeros" here, and its tokenDigits part, written in the syntax
// the two engines share, is matched by Go's.
func sqlRuleValid(s string) bool {
	return tokenDigitsRE.MatchString(s) && strings.Trim(s, "0") != ""
}

var tokenDigitsRE = regexp.MustCompile("^" + tokenDigits() + "$")

func TestTokenTemplateMatchesRule(t *testing.T) {
	// Guard against the template and sqlRuleValid drifting apart; every
	// operator, type and collation in it is pg_catalog's.
	k := deparseExpr(t, testRewriter(t).tables[0].token)
	for _, frag := range []string{
		`CASE WHEN s COLLATE pg_catalog."C" OPERATOR(pg_catalog.~) '` + tokenPattern() + `' THEN s::bigint ELSE `,
		`^(?!0+$)(`,
	} {
		if !strings.Contains(k, frag) {
			t.Errorf("the token check lacks %s:\n%s", frag, k)
		}
	}
}

func FuzzValidToken(f *testing.F) {
	for _, s := range []string{"1", "0", "9223372036854775807", "9223372036854775808", "0001", "-1", "abc", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := ValidToken(s)
		if ok != sqlRuleValid(s) {
			t.Fatalf("ValidToken(%q) = %v, SQL rule says %v", s, ok, !ok)
		}
		if ok && (v < 1 || strconv.FormatInt(v, 10) != strings.TrimLeft(s, "0")) {
			t.Fatalf("ValidToken(%q) = %d", s, v)
		}
	})
}

func TestNewValidates(t *testing.T) {
	bad := []Config{
		{Tables: []Table{{Name: "", TokenColumn: "c"}}},
		{Tables: []Table{{Name: "t", TokenColumn: ""}}},
		{Tables: []Table{{Name: "t", TokenColumn: "c"}, {Name: "t", TokenColumn: "d"}}},
		{Tables: []Table{{Name: "t\x00", TokenColumn: "c"}}},
		{TokenSetting: "token"},
		{TokenSetting: "fence..token"},
		{TokenSetting: "fence.to|ken"},
		{TokenSetting: "fence.1token"},
	}
	for _, cfg := range bad {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	r, err := New(Config{Tables: []Table{{Name: "t", TokenColumn: "c"}}, TokenSetting: "app.fence_token"})
	if err != nil {
		t.Fatal(err)
	}
	if r.TokenSetting() != "app.fence_token" {
		t.Errorf("TokenSetting = %q", r.TokenSetting())
	}
	p := r.Plan("SET app.fence_token = 9")
	if !p.TokenSet || p.Token != 9 {
		t.Errorf("custom setting: %+v", p)
	}
	if p := r.Plan("SET fence.token = 'x'"); p.Action != Pass {
		t.Errorf("the default setting is not the token setting here: %+v", p)
	}
	p = r.Plan("UPDATE t SET a = 1")
	if p.Action != Rewrite || !strings.Contains(p.SQL, "current_setting('app.fence_token', true)") {
		t.Errorf("custom setting not used: %+v", p)
	}
	if p := r.Plan("SELECT 1"); p.Action != Pass || p.SQL != "SELECT 1" {
		t.Errorf("empty plan: %+v", p)
	}
}

func TestMayTouch(t *testing.T) {
	r := testRewriter(t)
	yes := []string{
		"UPDATE accounts SET x = 1",
		"update ACCOUNTS set x = 1",
		`UPDATE "Audit" SET x = 1`,
		"ALTER TABLE accounts DROP COLUMN fence_token", "DROP TABLE accounts", "CREATE RULE r AS ON UPDATE TO accounts DO INSTEAD NOTHING",
		"SET fence.token = 1",
		`SET "fence"."token" = 1`,
		"SET FENCE . token = 1",
		"SELECT set_config($1, $2, false)",
		`UPDATE U&"\0061ccounts" SET x = 1`,
		`delete from u&"`,
		"INSERT INTO x SELECT * FROM accounts",
		"COPY accounts FROM STDIN",
		"TRUNCATE accounts",
		"MERGE INTO ledger USING s ON true WHEN MATCHED THEN DO NOTHING",
		"DO $$BEGIN UPDATE accounts SET x = 1; END$$",
		"SELECT * FROM accounts FOR UPDATE", // errs toward parsing
	}
	no := []string{
		"",
		"SELECT 1",
		"UPDATE users SET name = $1 WHERE id = $2",
		"account",
		"ledge",
		"a",
		"SELECT 'menu&more'",
		// Reads of a protected table cannot write it: no parse.
		"select * from public.LEDGER",
		"SELECT abalance FROM accounts WHERE aid = 42",
		"x accounts",
		"accounts",
		`u&`,
	}
	for _, s := range yes {
		if !r.MayTouch([]byte(s)) {
			t.Errorf("MayTouch(%q) = false", s)
		}
	}
	for _, s := range no {
		if r.MayTouch([]byte(s)) {
			t.Errorf("MayTouch(%q) = true", s)
		}
	}
	// A one-character table name.
	r1, err := New(Config{Tables: []Table{{Name: "t", TokenColumn: "c"}}})
	if err != nil {
		t.Fatal(err)
	}
	if r1.MayTouch([]byte("T")) || !r1.MayTouch([]byte("update t set a=1")) || r1.MayTouch([]byte("UPDATE tt SET a = 1")) || r1.MayTouch([]byte("values (1)")) {
		t.Error("one-character name")
	}
	// Quoted identifiers double their quotes.
	r2, err := New(Config{Tables: []Table{{Name: `we"ird`, TokenColumn: "c"}}})
	if err != nil {
		t.Fatal(err)
	}
	if p := r2.Plan(`UPDATE "we""ird" SET a = 1`); p.Action != Rewrite {
		t.Errorf("quoted name with a quote: %+v", p)
	}
}

func TestMarkerRoundTrip(t *testing.T) {
	cases := []struct {
		msg  string
		want Marker
	}{
		{`invalid input syntax for type bigint: "fenceproxy|55F01|7|5|public.accounts|."`,
			Marker{Code: CodeStale, Table: "public.accounts", RowToken: "7", Token: "5"}},
		{`invalid input syntax for type bigint: "fenceproxy|55F02|fence.token||accounts|."`,
			Marker{Code: CodeMissing, Table: "accounts", Setting: "fence.token"}},
		{`invalid input syntax for type bigint: "fenceproxy|55F03|fence.token|617c622263|accounts|."`,
			Marker{Code: CodeInvalid, Table: "accounts", Setting: "fence.token", Token: `a|b"c`}},
		// What the token check raises for an unset or empty setting.
		{`invalid input syntax for type bigint: "fenceproxy|55F03|fence.token||accounts|."`,
			Marker{Code: CodeMissing, Table: "accounts", Setting: "fence.token"}},
		// Another language, and a table name with the separator in it.
		{`ungültige Eingabesyntax für Typ bigint: »fenceproxy|55F01|9|8|we|ird|.«`,
			Marker{Code: CodeStale, Table: "we|ird", RowToken: "9", Token: "8"}},
	}
	for _, c := range cases {
		m, ok := DecodeMarker(c.msg)
		if !ok || m != c.want {
			t.Errorf("DecodeMarker(%q) = %+v, %v; want %+v", c.msg, m, ok, c.want)
		}
		msg, detail, hint := m.Describe()
		if !strings.Contains(msg, m.Table) {
			t.Errorf("message %q does not name the table", msg)
		}
		prefix := map[string]string{CodeStale: "stale fencing token", CodeMissing: "missing fencing token", CodeInvalid: "invalid fencing token"}[m.Code]
		if !strings.HasPrefix(msg, prefix) {
			t.Errorf("message %q does not start with %q", msg, prefix)
		}
		if m.Code == CodeStale && (!strings.Contains(detail, m.RowToken) || !strings.Contains(detail, m.Token) || !strings.Contains(hint, "do not retry")) {
			t.Errorf("55F01 detail/hint: %q / %q", detail, hint)
		}
	}
	bad := []string{
		"",
		"invalid input syntax for type bigint: \"abc\"",
		`"fenceproxy|55F01|x|5|t|."`,
		`"fenceproxy|55F01|7|5||."`,
		`"fenceproxy|55F02|fence.token|1|t|."`,
		`"fenceproxy|55F03|fence.token|zz|t|."`,
		`"fenceproxy|55F09|1|2|t|."`,
		`"fenceproxy|55F01|7|5|t"`,
		`|."fenceproxy|55F01|7|5|t"`,
	}
	for _, s := range bad {
		if m, ok := DecodeMarker(s); ok {
			t.Errorf("DecodeMarker(%q) = %+v", s, m)
		}
	}
}

// TestMarkerTemplates checks that the marker strings the templates build
// decode, for each table label.
func TestMarkerTemplates(t *testing.T) {
	r := testRewriter(t)
	for _, e := range r.tables {
		sql := deparseExpr(t, e.token) + deparseExpr(t, e.checkFor([]string{"x"}, e.ref))
		for _, want := range []string{
			// concat makes a NULL (unset) value empty: the 55F02 marker.
			"pg_catalog.concat('fenceproxy|55F03|fence.token|', pg_catalog.encode(pg_catalog.convert_to(s, 'UTF8'), 'hex'), ",
			"'fenceproxy|55F01|'",
			"'|" + e.label + "|.'",
		} {
			if !strings.Contains(sql, want) {
				t.Errorf("%s: fragments lack %s", e.label, want)
			}
		}
		for _, m := range []string{
			"fenceproxy|55F01|12|3|" + e.label + "|.",
			"fenceproxy|55F02|fence.token||" + e.label + "|.",
			"fenceproxy|55F03|fence.token||" + e.label + "|.",
			"fenceproxy|55F03|fence.token|2d31|" + e.label + "|.",
		} {
			got, ok := DecodeMarker(`invalid input syntax for type bigint: "` + m + `"`)
			if !ok || got.Table != e.label {
				t.Errorf("DecodeMarker(%q) = %+v, %v", m, got, ok)
			}
		}
	}
}

func TestCacheLRU(t *testing.T) {
	r := testRewriter(t)
	c := NewCache(r, 2)
	// Texts without constants: each is its own entry (texts that differ in
	// constants share a shape entry, TestShapeCacheHitRatio).
	q := func(i int) []byte { return []byte(fmt.Sprintf("UPDATE accounts SET n = m%d", i)) }
	c.Plan(q(1), DefaultSettings)
	c.Plan(q(2), DefaultSettings)
	c.Plan(q(1), DefaultSettings) // 1 is now the most recent
	c.Plan(q(3), DefaultSettings) // evicts 2
	if c.Len() != 2 {
		t.Fatalf("Len = %d", c.Len())
	}
	s := &c.shards[0]
	if _, ok := s.m[cacheKey{sql: string(q(2)), set: DefaultSettings}]; ok {
		t.Error("least recently used entry not evicted")
	}
	if _, ok := s.m[cacheKey{sql: string(q(1)), set: DefaultSettings}]; !ok {
		t.Error("recently used entry evicted")
	}
	if p := c.Plan([]byte("SELECT 1"), DefaultSettings); p.Action != Pass || c.Len() != 2 {
		t.Errorf("prefiltered text touched the cache: %+v, Len %d", p, c.Len())
	}
	// A read whose literal holds a keyword is lexed, passed and not cached;
	// so is a write of another table with a constant (which may differ each
	// time).
	for _, text := range []string{
		"SELECT * FROM accounts WHERE note = 'do not update'",
		"UPDATE other SET note = $tag$accounts$tag$",
		"UPDATE other SET n = 12",
		"UPDATE other SET n = $1 + 1",
		"UPDATE other SET note = E'\\x'",
	} {
		if p := c.Plan([]byte(text), DefaultSettings); p.Action != Pass || c.Len() != 2 {
			t.Errorf("%s: a passed text was cached: %+v, Len %d", text, p, c.Len())
		}
	}
	// A passed text of no constants (the extended protocol's) is kept:
	// lexing it again would give the same.
	fixed := []byte("UPDATE other SET note = $1 WHERE n = $12")
	if p := c.Plan(fixed, DefaultSettings); p.Action != Pass {
		t.Errorf("fixed text: %+v", p)
	}
	if _, ok := c.shards[0].m[cacheKey{sql: string(fixed), set: DefaultSettings}]; !ok {
		t.Error("a passed text of no constants was not cached")
	}
	c.Plan(q(1), DefaultSettings)
	c.Plan(q(3), DefaultSettings)
	big := []byte("UPDATE accounts SET x = 1 WHERE y = '" + strings.Repeat("x", maxCachedSQL) + "'")
	if p := c.Plan(big, DefaultSettings); p.Action != Rewrite {
		t.Errorf("long text: %v", p.Action)
	}
	if c.Len() != 2 {
		t.Error("long text was cached")
	}
	if NewCache(r, 0).Plan(q(1), DefaultSettings).Action != Rewrite {
		t.Error("size 0 cache")
	}
}

func TestCacheConcurrent(t *testing.T) {
	r := testRewriter(t)
	c := NewCache(r, 4096)
	if len(c.shards) != 16 {
		t.Fatalf("%d shards", len(c.shards))
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				sql := fmt.Sprintf("UPDATE accounts SET n = %d WHERE id = $1", i%50)
				p := c.Plan([]byte(sql), DefaultSettings)
				if p.Action != Rewrite || !strings.Contains(p.SQL, fmt.Sprintf("n = %d,", i%50)) {
					t.Errorf("%s: %+v", sql, p)
					return
				}
			}
		}()
	}
	wg.Wait()
	if c.Len() != 50 {
		t.Errorf("Len = %d, want 50", c.Len())
	}
}

func TestPlanTokenAndWrite(t *testing.T) {
	r := testRewriter(t)
	p := r.Plan("SET fence.token = 1; SET fence.token = 2; UPDATE accounts SET x = 1 WHERE id = 1; SELECT set_config('fence.token', '3', true)")
	if p.Action != Rewrite || !p.TokenSet || p.Token != 3 {
		t.Errorf("%+v", p)
	}
	p = r.Plan("SET fence.token = 1; SET fence.token = 'bad'")
	if p.Action != Refuse || p.Code != CodeInvalid {
		t.Errorf("%+v", p)
	}
	p = r.Plan("ALTER ROLE app SET fence.token = '0'")
	if p.Action != Refuse || p.Code != CodeInvalid {
		t.Errorf("ALTER ROLE SET with an invalid token: %+v", p)
	}
	p = r.Plan("ALTER ROLE app SET fence.token = '5'")
	if p.Action != Pass || p.TokenSet {
		t.Errorf("ALTER ROLE SET does not set the session token: %+v", p)
	}
	p = r.Plan("SELECT set_config(name, '1', false) FROM settings")
	if p.Action != Pass || !p.TokenDynamic {
		t.Errorf("set_config with a variable name: %+v", p)
	}
	p = r.Plan("SELECT set_config('fence.token', NULL, false)")
	if p.Action != Pass || p.TokenSet {
		t.Errorf("set_config(..., NULL): %+v", p)
	}
	// A cast that may change a constant (varchar(n) cuts it) leaves an argument no one can read in the text:
	// '12345'::varchar(1) sets the token to 1, and 'fence.token.x'::varchar(11) names the token.
	for _, sql := range []string{
		"SELECT set_config('fence.token', '12345'::varchar(1), false)",
		"SELECT set_config('fence.token.x'::varchar(11), '7', false)",
		"SELECT set_config('fence.token '::bpchar, '7', false)",
		"SELECT set_config('fence.token'::public.text, '7', false)",
	} {
		if p = r.Plan(sql); p.Action != Pass || !p.TokenDynamic || p.TokenSet {
			t.Errorf("%s: %+v", sql, p)
		}
	}
	for _, sql := range []string{
		"SELECT set_config('fence.token'::text, '7'::pg_catalog.varchar, false)",
		"SELECT set_config(CAST('fence.token' AS character varying), text '7', 'false'::bool)",
	} {
		if p = r.Plan(sql); p.Action != Pass || p.TokenDynamic || !p.TokenSet || p.Token != 7 {
			t.Errorf("%s: %+v", sql, p)
		}
	}
}
