package rewrite

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

// countingObserver counts cache hits and misses.
type countingObserver struct{ hits, misses atomic.Int64 }

func (o *countingObserver) CacheHit()                 { o.hits.Add(1) }
func (o *countingObserver) CacheMiss(_ time.Duration) { o.misses.Add(1) }

// samePlan fails t unless got (through the cache) and want (the full
// rewrite of the same text) agree: the same action, code and tables, and for
// a rewrite the same parse tree (locations aside), fenced.
func samePlan(t testing.TB, r *Rewriter, sql string, got, want Plan) {
	t.Helper()
	if got.Action != want.Action || got.Code != want.Code || strings.Join(got.Tables, ",") != strings.Join(want.Tables, ",") {
		t.Fatalf("%s\ncache: %v %s %v %s\nfull:  %v %s %v %s", sql, got.Action, got.Code, got.Tables, got.Message, want.Action, want.Code, want.Tables, want.Message)
	}
	if got.Action != Rewrite || got.SQL == want.SQL {
		return // the same text (a deparser fault that makes it unparsable, as for (-1)[1], is not the cache's)
	}
	same, err := sameParse(got.SQL, want.SQL)
	if err != nil || !same {
		t.Fatalf("%s\ncache: %s\nfull:  %s\n(%v)", sql, got.SQL, want.SQL, err)
	}
	if err := r.verifyText(got.SQL, false); err != nil {
		t.Fatalf("%s: cached rewrite not fenced: %v\n%s", sql, err, got.SQL)
	}
}

// variant is sql with every constant the shape replaces respelled as
// another constant of its class (so it has the same shape), chosen by rng.
func variant(r *Rewriter, sql string, rng *rand.Rand) string {
	text := []byte(sql)
	sh, ok := r.shapeOf(text)
	if !ok {
		return sql
	}
	var b strings.Builder
	last := 0
	classes := sh.classes()
	for k, sp := range sh.spans {
		b.Write(text[last:sp[0]])
		orig := text[sp[0]:sp[1]]
		var t token
		l := newLexer(orig, true)
		switch classes[k] {
		case 'j':
			b.WriteString(fmt.Sprintf("-%d", rng.IntN(1000000)))
			last = sp[1]
			continue
		case 'k':
			b.WriteString([]string{"-99999999999", "-2147483649", "-9223372036854775808"}[rng.IntN(3)])
			last = sp[1]
			continue
		case '-':
			b.WriteString([]string{"-2.5", "-1e3", "-99999999999999999999"}[rng.IntN(3)])
			last = sp[1]
			continue
		}
		t = l.next()
		switch constClass(t, orig) {
		case 'i':
			b.WriteString(fmt.Sprint(rng.IntN(1 << 31)))
		case 'l':
			b.WriteString([]string{"99999999999", "2147483648", "9223372036854775807"}[rng.IntN(3)])
		case 'f':
			b.WriteString([]string{"2.5", "1e3", ".5", "7.25e-2", "9223372036854775808"}[rng.IntN(5)])
		case 's':
			b.WriteString([]string{`'x''y'`, `''`, `'a\b'`, `'0'`, `'é'`}[rng.IntN(5)])
		case 'e':
			b.WriteString([]string{`E'a\nb'`, `E'\''`, `E'\\'`, `E'\x41'`}[rng.IntN(4)])
		case 'n':
			b.WriteString(`N'q'`)
		case 'u':
			b.WriteString([]string{`U&'\0041'`, `U&'!0042' UESCAPE '!'`}[rng.IntN(2)])
		case 'b':
			b.WriteString(`B'101'`)
		case 'x':
			b.WriteString(`X'1F'`)
		case 'd':
			b.WriteString([]string{`$$z$$`, `$q$it's$q$`, `$$$$`}[rng.IntN(3)])
		default:
			b.Write(orig)
		}
		last = sp[1]
	}
	b.Write(text[last:])
	return b.String()
}

// shapeCases are statements with constants of every form, in the places the
// fence handles; {i} is filled with a random integer, {s} with a random
// string of a random quoting form, {n} with a random number of any form.
var shapeCases = []string{
	`UPDATE accounts SET balance = balance + {n} WHERE id = {i}`,
	`UPDATE accounts SET balance = balance + -{i} WHERE id = {i}`,
	`UPDATE accounts SET balance = -{i}, note = {s} WHERE id = {i} AND note <> {s}`,
	`UPDATE accounts SET fence_token = {i} WHERE id = {i}`,
	`UPDATE accounts SET (balance, fence_token) = ({i}, {i}) WHERE id IN ({i}, {i}, {i})`,
	`UPDATE accounts a SET balance = a.balance - {i} FROM users u WHERE u.id = a.owner AND u.name = {s}`,
	`UPDATE accounts SET balance = {i}::numeric(10,2) WHERE id = {i}`,
	`UPDATE accounts SET balance = -{i}::int WHERE id = - {i}`,
	`UPDATE accounts SET opened = DATE {s}, span = INTERVAL {s} DAY WHERE id = {i}`,
	`UPDATE accounts SET note = {s} || {s} WHERE id BETWEEN {i} AND {i} RETURNING id, {s}`,
	`UPDATE accounts SET flag = true, note = NULL WHERE id = {i} AND {i} = {i}`,
	`UPDATE accounts SET arr = ARRAY[{i}, {i}], js = {s}::jsonb WHERE id = {i}`,
	`UPDATE accounts SET note = CASE WHEN balance > {n} THEN {s} ELSE {s} END WHERE id = {i}`,
	`DELETE FROM accounts WHERE id = {i}`,
	`DELETE FROM accounts WHERE note LIKE {s} ESCAPE {s} AND id NOT IN (SELECT {i} UNION SELECT {i})`,
	`DELETE FROM ledger WHERE amount < {n} RETURNING *`,
	`INSERT INTO accounts (id, balance) VALUES ({i}, {n})`,
	`INSERT INTO accounts (id, balance, note) VALUES ({i}, {n}, {s}), ({i}, -{i}, {s})`,
	`INSERT INTO accounts (id, fence_token) VALUES ({i}, {i})`,
	`INSERT INTO accounts (id, fence_token) VALUES ({i}, {i}), ({i}, {i})`,
	`INSERT INTO accounts (id, balance) VALUES ({i}, {n}) ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + {n} WHERE accounts.note <> {s}`,
	`INSERT INTO accounts (id, balance) VALUES ({i}, {n}) ON CONFLICT DO NOTHING`,
	`INSERT INTO accounts (id, balance) SELECT {i}, {n} FROM users WHERE name = {s} LIMIT {i}`,
	`INSERT INTO accounts (id, fence_token) SELECT id, {i} FROM users ORDER BY 1`,
	`INSERT INTO accounts (id, fence_token) SELECT id, {i} FROM users ORDER BY id, 2`,
	`INSERT INTO ledger (id, amount) VALUES ({i}, {n}); UPDATE accounts SET balance = balance - {n} WHERE id = {i}`,
	`WITH x AS (SELECT {i} AS id, {s} AS note) UPDATE accounts SET note = x.note FROM x WHERE accounts.id = x.id`,
	`WITH d AS (DELETE FROM accounts WHERE id = {i} RETURNING *) INSERT INTO ledger SELECT id, {n} FROM d`,
	`SELECT * FROM accounts WHERE id = {i}; UPDATE accounts SET balance = {n} WHERE id = {i}`,
	`UPDATE accounts SET balance = balance + {i} WHERE id = (SELECT id FROM users WHERE name = {s} OFFSET {i} LIMIT 1)`,
	`UPDATE accounts SET note = {s} COLLATE "C" WHERE id = {i}`,
	`UPDATE accounts SET ts = now() - {s}::interval, ts2 = TIMESTAMP WITH TIME ZONE {s} WHERE id = {i}`,
	`UPDATE accounts SET v = {i} ^ -{i}, w = 2 - -{i}, x = {i}-{i} WHERE id = {i}`,
	`UPDATE accounts SET v = (-{i})[1], w = @ -{i} WHERE id = {i}`,
	`UPDATE strict SET balance = {i} WHERE id = {i}`,
	`UPDATE strict SET fence_token = {i} WHERE id = {i}`,
	`UPDATE a.dup SET x = {i} WHERE y = {s}`,
	`UPDATE "Audit" SET x = {i}`,
	`UPDATE users SET x = {i} WHERE id = {i}`,
	`DELETE FROM accounts WHERE id = {i} AND "Audit" = {s}`,
	`UPDATE accounts SET x = (SELECT count(*) FROM t GROUP BY 1 LIMIT 1) WHERE id = {i} OFFSET {i}`,
	`UPDATE accounts SET balance = balance + {i} WHERE id = {i} AND note = U&'d\0061t\+000061' AND x = B'1010' AND y = X'FF'`,
	`UPDATE accounts SET x = 0x1F, y = 1_000 WHERE id = {i}`,
	`UPDATE accounts SET x = {i}.5 WHERE id = {i}`,
	`VALUES ({i}, {s})`,
	`SELECT {i}, {s} FROM accounts WHERE id = {i}; DELETE FROM users WHERE id = {i}`,
}

var stringForms = []string{`'plain'`, `'it''s'`, `''`, `E'tab\there'`, `E'\'q\''`, `e'\\'`, `N'nat'`, `$$dollar$$`, `$t$x$y$t$`, `U&'\0041'`, `U&'!0041' UESCAPE '!'`, `'with` + "\n" + `' 'continued'`, `'é'`,
	`U&'!' UESCAPE '!'`, `E'\xff'`, `E'\0'`, `U&'\D800'`} // the last four the server refuses
var numberForms = []string{"1", "0", "2147483647", "2147483648", "1.5", ".5", "1e10", "1E-3", "123456789012345"}

func fillCase(c string, rng *rand.Rand) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(c, '{')
		if i < 0 {
			b.WriteString(c)
			return b.String()
		}
		b.WriteString(c[:i])
		switch c[i+1] {
		case 'i':
			b.WriteString(fmt.Sprint(rng.IntN(100000)))
		case 's':
			b.WriteString(stringForms[rng.IntN(len(stringForms))])
		case 'n':
			b.WriteString(numberForms[rng.IntN(len(numberForms))])
		}
		c = c[i+3:]
	}
}

// TestShapeCacheEquivalence is the property: through the shape cache (a
// template built from one text, filled with the constants of another of the
// same shape) every statement gets the same action and the same parse tree as
// its full rewrite, and the filled text is fenced.
func TestShapeCacheEquivalence(t *testing.T) {
	r := testRewriter(t)
	rng := rand.New(rand.NewPCG(1, 2))
	templated := 0
	for _, c := range shapeCases {
		obs := &countingObserver{}
		cache := NewCacheObserved(r, 256, obs)
		for range 12 {
			sql := fillCase(c, rng)
			got := cache.Plan([]byte(sql), DefaultSettings)
			want := r.Plan(sql)
			if want.Action == Pass {
				want.SQL = ""
			}
			samePlan(t, r, sql, got, want)
			// The same shape with every constant respelled.
			v := variant(r, sql, rng)
			samePlan(t, r, v, cache.Plan([]byte(v), DefaultSettings), planFull(r, v))
		}
		if obs.hits.Load() > 0 {
			templated++
		} else {
			t.Logf("not templated: %s", c)
		}
	}
	if templated < len(shapeCases)/2 {
		t.Errorf("only %d of %d cases served by templates", templated, len(shapeCases))
	}
}

func planFull(r *Rewriter, sql string) Plan {
	p := r.Plan(sql)
	if p.Action == Pass {
		p.SQL = ""
	}
	return p
}

// TestShapeExcluded: texts whose analysis reads constants, or whose constants
// the grammar needs as literals, are not normalised (or their constants stay
// in the key), so that a template never serves them.
func TestShapeExcluded(t *testing.T) {
	r := testRewriter(t)
	for _, sql := range []string{
		`SET fence.token = '5'`,
		`SELECT set_config('fence.token', '5', true); UPDATE accounts SET x = 1`,
		`UPDATE accounts SET x = current_setting('fence.token')::int WHERE id = 1`,
		`DO $$BEGIN UPDATE accounts SET x = 1; END$$`,
		`COPY accounts FROM STDIN`,
		`ALTER TABLE accounts ALTER x SET DEFAULT 5`,
		`CREATE TABLE t (x numeric(10,2) DEFAULT 5)`,
		`UPDATE accounts SET x = $1 WHERE id = 5`,
		`EXPLAIN ANALYZE UPDATE accounts SET x = 1`,
		`PREPARE p AS UPDATE accounts SET x = 1`,
		`(SELECT 1); UPDATE accounts SET x = 1`,
		`UPDATE accounts SET x = 1; TRUNCATE accounts`,
		`UPDATE accounts SET x = 'unterminated`,
		`UPDATE accounts SET x = y`, // no constant: nothing to share
	} {
		if sh, ok := r.shapeOf([]byte(sql)); ok {
			t.Errorf("%s: normalised to %q", sql, sh.key)
		}
	}
	// Constants the grammar needs as written stay in the key.
	for _, c := range []struct{ a, b string }{
		{`UPDATE accounts SET d = DATE '2020-01-01' WHERE id = 1`, `UPDATE accounts SET d = DATE '2020-01-02' WHERE id = 1`},
		{`UPDATE accounts SET d = INTERVAL '1' DAY WHERE id = 1`, `UPDATE accounts SET d = INTERVAL '2' DAY WHERE id = 1`},
		{`UPDATE accounts SET d = now() AT TIME ZONE 'UTC' WHERE id = 1`, `UPDATE accounts SET d = now() AT TIME ZONE 'CET' WHERE id = 1`},
		{`UPDATE accounts SET d = "char" 'x' WHERE id = 1`, `UPDATE accounts SET d = "char" 'y' WHERE id = 1`},
		{`INSERT INTO accounts SELECT * FROM t ORDER BY 1`, `INSERT INTO accounts SELECT * FROM t ORDER BY 2`},
		{`INSERT INTO accounts SELECT * FROM t FETCH FIRST 1 ROWS ONLY`, `INSERT INTO accounts SELECT * FROM t FETCH FIRST 2 ROWS ONLY`},
		{`UPDATE accounts SET x = 0x1F WHERE id = 1`, `UPDATE accounts SET x = 0x2F WHERE id = 1`},
		{`UPDATE accounts SET x = 1 WHERE id = 1`, `UPDATE accounts SET x = 2147483648 WHERE id = 1`},                        // Integer vs Float
		{`UPDATE accounts SET x = 'a' WHERE id = 1`, `UPDATE accounts SET x = E'a' WHERE id = 1`},                            // string forms
		{`UPDATE accounts SET x = -1 WHERE id = 1`, `UPDATE accounts SET x = 1 WHERE id = 1`},                                // a folded sign
		{`UPDATE accounts SET x = x - 1 WHERE id = 1`, `UPDATE accounts SET x = x + 1 WHERE id = 1`},                         // operators
		{`UPDATE accounts SET x = true WHERE id = 1`, `UPDATE accounts SET x = false WHERE id = 1`},                          // keywords
		{`UPDATE accounts SET x = numeric(10,2) '1' WHERE id = 1`, `UPDATE accounts SET x = numeric(10,2) '2' WHERE id = 1`}, // after ')'
	} {
		a, okA := r.shapeOf([]byte(c.a))
		b, okB := r.shapeOf([]byte(c.b))
		if okA && okB && string(a.key) == string(b.key) {
			t.Errorf("same shape %q for\n%s\n%s", a.key, c.a, c.b)
		}
	}
	// Literal-only differences share a shape, whatever the quoting form.
	a, _ := r.shapeOf([]byte(`UPDATE accounts SET x = -5, y = 'a' WHERE id = 1 AND z = E'\n'`))
	b, _ := r.shapeOf([]byte(`UPDATE accounts SET x = -12, y = 'it''s' WHERE id = 99999 AND z = E'\\'`))
	if string(a.key) != string(b.key) || len(a.key) == 0 {
		t.Errorf("different shapes %q and %q", a.key, b.key)
	}
}

// TestShapeNotTemplated: a shape whose normalised text does not parse, or
// whose plan differs, is planned in full every time (and still right).
func TestShapeNotTemplated(t *testing.T) {
	r := testRewriter(t)
	for _, sql := range []string{
		`UPDATE accounts SET x = numeric '1' WHERE id = 1`, // typed literal with a keyword type name... after an identifier: kept
		`INSERT INTO accounts (id, fence_token) SELECT id, 5 FROM users ORDER BY id, 2`,
		`UPDATE accounts SET x = 1 WHERE id = 1 LIMIT 1`, // rejected by the parser either way
	} {
		obs := &countingObserver{}
		c := NewCacheObserved(r, 64, obs)
		for i := range 3 {
			v := strings.ReplaceAll(sql, "1", fmt.Sprint(i+3))
			samePlan(t, r, v, c.Plan([]byte(v), DefaultSettings), planFull(r, v))
		}
	}
}

// TestShapeCacheHitRatio: a workload of statements that differ only in
// their literals (pgbench's TPC-B in simple-query mode) hits the cache at
// least 99% of the time after the first statement of each shape, and
// shape hits count as hits.
func TestShapeCacheHitRatio(t *testing.T) {
	r, err := New(Config{Tables: []Table{
		{Name: "pgbench_accounts", TokenColumn: "fence_token"},
		{Name: "pgbench_tellers", TokenColumn: "fence_token"},
		{Name: "pgbench_branches", TokenColumn: "fence_token"},
		{Name: "pgbench_history", TokenColumn: "fence_token"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	obs := &countingObserver{}
	c := NewCacheObserved(r, 1024, obs)
	rng := rand.New(rand.NewPCG(3, 4))
	const txns = 2000
	for range txns {
		aid, bid, tid, delta := rng.IntN(1000000)+1, rng.IntN(10)+1, rng.IntN(100)+1, rng.IntN(10001)-5000
		for _, sql := range []string{
			fmt.Sprintf("UPDATE pgbench_accounts SET abalance = abalance + %d WHERE aid = %d;", delta, aid),
			fmt.Sprintf("SELECT abalance FROM pgbench_accounts WHERE aid = %d;", aid),
			fmt.Sprintf("UPDATE pgbench_tellers SET tbalance = tbalance + %d WHERE tid = %d;", delta, tid),
			fmt.Sprintf("UPDATE pgbench_branches SET bbalance = bbalance + %d WHERE bid = %d;", delta, bid),
			fmt.Sprintf("INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (%d, %d, %d, %d, CURRENT_TIMESTAMP);", tid, bid, aid, delta),
		} {
			if p := c.Plan([]byte(sql), DefaultSettings); p.Action == Refuse {
				t.Fatalf("%s: %s", sql, p.Message)
			}
		}
	}
	hits, misses := obs.hits.Load(), obs.misses.Load()
	// 4 writes per transaction reach the cache (the SELECT passes the
	// prefilter); the first of each shape and sign misses.
	if hits+misses != 4*txns {
		t.Fatalf("hits %d + misses %d != %d", hits, misses, 4*txns)
	}
	if ratio := float64(hits) / float64(hits+misses); ratio < 0.99 {
		t.Errorf("hit ratio %.4f (hits %d, misses %d), want >= 0.99", ratio, hits, misses)
	}
}

// TestShapeCacheEncodingAndSCS: under LATIN1 and standard_conforming_strings
// off the template is filled with the decoded, normalised constants and the
// rewrite re-encoded as the full path does.
func TestShapeCacheEncodingAndSCS(t *testing.T) {
	r := testRewriter(t)
	set := Settings{ClientEncoding: "LATIN1", ServerEncoding: "UTF8", StandardConformingStrings: false}
	if !set.known() {
		t.Fatalf("settings not known: %+v", set)
	}
	obs := &countingObserver{}
	c := NewCacheObserved(r, 64, obs)
	for i, note := range []string{"caf\xe9", `a\'b`, `x\\y`, "\xe9\xe8", `q`} {
		sql := []byte(fmt.Sprintf(`UPDATE accounts SET note = '%s' WHERE id = %d`, note, i+1))
		got := c.Plan(sql, set)
		want := r.PlanWith(sql, set)
		if got.Action != Rewrite || want.Action != Rewrite {
			t.Fatalf("%q: %v / %v %s", sql, got.Action, want.Action, got.Message)
		}
		// Compare in UTF-8.
		g, _ := decode([]byte(got.SQL), set)
		w, _ := decode([]byte(want.SQL), set)
		samePlan(t, r, string(sql), Plan{Action: Rewrite, SQL: string(g), Tables: got.Tables}, Plan{Action: Rewrite, SQL: string(w), Tables: want.Tables})
	}
	if obs.hits.Load() == 0 {
		t.Error("no shape hit")
	}
}

// FuzzShapeCache: for any text, the plan through a cache primed with two
// variants of the text of the same shape (every replaced constant respelled)
// agrees with the full rewrite of the text. The seeds run in go test.
func FuzzShapeCache(f *testing.F) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, c := range shapeCases {
		f.Add(fillCase(c, rng), uint64(1))
	}
	r := testRewriter(f)
	f.Fuzz(func(t *testing.T, sql string, seed uint64) {
		if !utf8.ValidString(sql) || strings.ContainsRune(sql, 0) {
			t.Skip()
		}
		c := NewCache(r, 16)
		rng := rand.New(rand.NewPCG(seed, 7))
		for range 2 { // a shape's template is built at its second text
			c.Plan([]byte(variant(r, sql, rng)), DefaultSettings)
		}
		samePlan(t, r, sql, c.Plan([]byte(sql), DefaultSettings), planFull(r, sql))
	})
}

// TestShapeBuiltOnSecondSighting: a shape seen once only marks it (building a
// template costs about two plans, wasted on one-off shapes); the second text
// of the shape builds it and the third is a hit.
func TestShapeBuiltOnSecondSighting(t *testing.T) {
	r := testRewriter(t)
	obs := &countingObserver{}
	c := NewCacheObserved(r, 64, obs)
	template := func() *shapeTemplate {
		for i := range c.shards {
			for _, e := range c.shards[i].m {
				if e.tmpl != nil {
					return e.tmpl
				}
			}
		}
		return nil
	}
	for i, want := range []struct {
		pending, ok bool
		hits        int64
	}{{true, false, 0}, {false, true, 0}, {false, true, 1}} {
		sql := fmt.Sprintf("UPDATE accounts SET balance = %d WHERE id = %d", i+10, i)
		samePlan(t, r, sql, c.Plan([]byte(sql), DefaultSettings), planFull(r, sql))
		tm := template()
		if tm == nil || tm.pending != want.pending || tm.ok != want.ok || obs.hits.Load() != want.hits {
			t.Fatalf("after text %d: template %+v, hits %d; want pending %v, ok %v, hits %d", i+1, tm, obs.hits.Load(), want.pending, want.ok, want.hits)
		}
	}
}

// TestShapeZeroByte: a text holding a zero byte is not normalised. The key delimits its placeholders with zero
// bytes, so "... WHERE y = \x00i1\x00" had the key of "... WHERE y = 2" and was filled from that shape's template
// with one constant where it has two (an index out of range).
func TestShapeZeroByte(t *testing.T) {
	r := testRewriter(t)
	c := NewCache(r, 64)
	for _, s := range []string{"UPDATE accounts SET x = 1 WHERE y = 2", "UPDATE accounts SET x = 1 WHERE y = 3", "UPDATE accounts SET x = 1 WHERE y = 4"} {
		c.Plan([]byte(s), DefaultSettings)
	}
	text := "UPDATE accounts SET x = 1 WHERE y = \x00i1\x00"
	if _, ok := r.shapeOf([]byte(text)); ok {
		t.Fatal("a text with a zero byte was normalised")
	}
	got := c.Plan([]byte(text), DefaultSettings)
	samePlan(t, r, text, got, planFull(r, text))
}

// TestSameRewrite: a template's fill and a full plan of one text are the same rewrite; another fence (a token
// column, a table), another constant or a text that does not parse is not.
func TestSameRewrite(t *testing.T) {
	r := testRewriter(t)
	c := NewCache(r, 64)
	var filled Plan
	for i := range 3 { // the third text of a shape is a template's fill
		filled = c.Plan(fmt.Appendf(nil, "INSERT INTO accounts (id, balance) VALUES (%d, 5)", i+7), DefaultSettings)
	}
	full := r.Plan("INSERT INTO accounts (id, balance) VALUES (9, 5)")
	if filled.SQL == full.SQL {
		t.Fatalf("the fill is spelled as the full plan; the test needs them to differ:\n%s", full.SQL)
	}
	if !SameRewrite(filled.SQL, full.SQL, DefaultSettings) {
		t.Errorf("a fill and a full plan of one text are not the same:\n%s\n%s", filled.SQL, full.SQL)
	}
	other := r.Plan("INSERT INTO accounts (id, balance) VALUES (9, 6)")
	strict := r.Plan("INSERT INTO strict (id, balance) VALUES (9, 5)")
	latin := Settings{ClientEncoding: "LATIN1", ServerEncoding: "UTF8", StandardConformingStrings: true}
	for _, c := range []struct {
		a, b string
		set  Settings
		want bool
	}{
		{full.SQL, other.SQL, DefaultSettings, false},
		{full.SQL, strict.SQL, DefaultSettings, false},
		{full.SQL, full.SQL + " garbage", DefaultSettings, false},
		{"SELECT 'caf\xe9'", "SELECT  'caf\xe9'", latin, true},
		{"SELECT 'caf\xe9'", "SELECT 'caf\xe8'", latin, false},
		{"SELECT 'caf\xe9'", "SELECT  'caf\xe9'", DefaultSettings, false}, // not UTF-8: cannot tell
	} {
		if got := SameRewrite(c.a, c.b, c.set); got != c.want {
			t.Errorf("SameRewrite(%q, %q, %s) = %v, want %v", c.a, c.b, c.set.ClientEncoding, got, c.want)
		}
	}
}
