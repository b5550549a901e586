package rewrite

import (
	"strings"
	"testing"
)

// templatePlan plans the texts in order through one cache and returns the
// plan of the last (the first two build the shape's template).
func templatePlan(t *testing.T, set Settings, texts ...string) Plan {
	t.Helper()
	c := NewCache(testRewriter(t), 64)
	var p Plan
	for _, s := range texts {
		p = c.Plan([]byte(s), set)
	}
	return p
}

// TestPreparedTypes: each parameter of a prepared template is declared with
// the type the parser gives the constant it stands for, so EXECUTE's
// arguments need no coercion; shapes whose constants have no such type, or
// whose template is not one plain-ASCII statement, are not prepared.
func TestPreparedTypes(t *testing.T) {
	for _, c := range []struct {
		name, a, b, c string
		types         string // "" for not prepared
		args          string
	}{
		{"int4", `UPDATE accounts SET balance = balance + 5 WHERE id = 7`, `UPDATE accounts SET balance = balance + 6 WHERE id = 8`,
			`UPDATE accounts SET balance = balance + 17 WHERE id = 4242`, "(pg_catalog.int4,pg_catalog.int4)", "(17,4242)"},
		{"negative int4 limit", `UPDATE accounts SET balance = -5 WHERE id = 1`, `UPDATE accounts SET balance = -6 WHERE id = 2`,
			`UPDATE accounts SET balance = -2147483648 WHERE id = 3`, "(pg_catalog.int4,pg_catalog.int4)", "(-2147483648,3)"},
		{"int8", `UPDATE accounts SET balance = 2147483648 WHERE id = 1`, `UPDATE accounts SET balance = 9223372036854775807 WHERE id = 2`,
			`UPDATE accounts SET balance = 3000000000 WHERE id = 3`, "(pg_catalog.int8,pg_catalog.int4)", "(3000000000,3)"},
		{"negative int8", `UPDATE accounts SET balance = -2147483649 WHERE id = 1`, `UPDATE accounts SET balance = -9223372036854775808 WHERE id = 2`,
			`UPDATE accounts SET balance = - 3000000000 WHERE id = 3`, "(pg_catalog.int8,pg_catalog.int4)", "(- 3000000000,3)"},
		{"numeric", `UPDATE accounts SET balance = 1.5 WHERE id = 1e3`, `UPDATE accounts SET balance = 9223372036854775808 WHERE id = .5`,
			`UPDATE accounts SET balance = -2.25 WHERE id = 1.0`, "", ""}, // -2.25 is another class than 1.5: not the same shape
		{"numeric both", `UPDATE accounts SET balance = 1.5 WHERE id = 1e3`, `UPDATE accounts SET balance = 9223372036854775808 WHERE id = .5`,
			`UPDATE accounts SET balance = 2.25 WHERE id = 1.0`, "(pg_catalog.numeric,pg_catalog.numeric)", "(2.25,1.0)"},
		// Strings of every form: their type is their context's, which a parameter would not follow (prepared.go).
		{"strings", `UPDATE accounts SET note = 'a', memo = E'\n' WHERE id = 1 AND tag = $$x$$`,
			`UPDATE accounts SET note = 'b', memo = E'\t' WHERE id = 2 AND tag = $q$y$q$`,
			`UPDATE accounts SET note = 'it''s', memo = E'\\' WHERE id = 3 AND tag = $$z$$`, "", ""},
		{"plain string", `UPDATE accounts SET note = 'a' WHERE id = 1`, `UPDATE accounts SET note = 'b' WHERE id = 2`,
			`UPDATE accounts SET note = 'c' WHERE id = 3`, "", ""},
		{"string compared", `UPDATE accounts SET balance = 1 WHERE note = 'a'`, `UPDATE accounts SET balance = 2 WHERE note = 'b'`,
			`UPDATE accounts SET balance = 3 WHERE note = 'c'`, "", ""},
		{"unicode string", `UPDATE accounts SET note = U&'a' WHERE id = 1`, `UPDATE accounts SET note = U&'b' WHERE id = 2`,
			`UPDATE accounts SET note = U&'\0063' WHERE id = 3`, "", ""},
		{"insert", `INSERT INTO accounts (id, balance) VALUES (1, 5)`, `INSERT INTO accounts (id, balance) VALUES (2, 6)`,
			`INSERT INTO accounts (id, balance) VALUES (3, 7.5)`, "", ""}, // 7.5 is another class than 5
		{"insert numbers", `INSERT INTO accounts (id, balance) VALUES (1, 5)`, `INSERT INTO accounts (id, balance) VALUES (2, 6)`,
			`INSERT INTO accounts (id, balance) VALUES (3, 7)`, "(pg_catalog.int4,pg_catalog.int4)", "(3,7)"},
		{"tpcb history", `INSERT INTO accounts (id, balance, created) VALUES (1, -5, CURRENT_TIMESTAMP)`,
			`INSERT INTO accounts (id, balance, created) VALUES (2, -6, CURRENT_TIMESTAMP)`,
			`INSERT INTO accounts (id, balance, created) VALUES (3, -7, CURRENT_TIMESTAMP)`, "(pg_catalog.int4,pg_catalog.int4)", "(3,-7)"},
		{"insert string", `INSERT INTO accounts (id, note) VALUES (1, 'a')`, `INSERT INTO accounts (id, note) VALUES (2, 'b')`,
			`INSERT INTO accounts (id, note) VALUES (3, 'c')`, "", ""},
		// Statements returning rows: a prepared one fails once its result columns change (prepared.go).
		{"returning", `UPDATE accounts SET balance = 1 WHERE id = 1 RETURNING id`, `UPDATE accounts SET balance = 2 WHERE id = 2 RETURNING id`,
			`UPDATE accounts SET balance = 3 WHERE id = 3 RETURNING id`, "", ""},
		{"insert returning", `INSERT INTO accounts (id, balance) VALUES (1, 5) RETURNING *`,
			`INSERT INTO accounts (id, balance) VALUES (2, 6) RETURNING *`, `INSERT INTO accounts (id, balance) VALUES (3, 7) RETURNING *`, "", ""},
		{"delete returning", `DELETE FROM accounts WHERE id = 1 RETURNING 1`, `DELETE FROM accounts WHERE id = 2 RETURNING 2`,
			`DELETE FROM accounts WHERE id = 3 RETURNING 3`, "", ""},
		{"select over a write", `WITH u AS (UPDATE accounts SET balance = 1 WHERE id = 1 RETURNING id) SELECT * FROM u`,
			`WITH u AS (UPDATE accounts SET balance = 2 WHERE id = 2 RETURNING id) SELECT * FROM u`,
			`WITH u AS (UPDATE accounts SET balance = 3 WHERE id = 3 RETURNING id) SELECT * FROM u`, "", ""},
		{"write over a write", `WITH u AS (UPDATE accounts SET balance = 1 WHERE id = 1 RETURNING id) DELETE FROM accounts WHERE id IN (SELECT id FROM u)`,
			`WITH u AS (UPDATE accounts SET balance = 2 WHERE id = 2 RETURNING id) DELETE FROM accounts WHERE id IN (SELECT id FROM u)`,
			`WITH u AS (UPDATE accounts SET balance = 3 WHERE id = 3 RETURNING id) DELETE FROM accounts WHERE id IN (SELECT id FROM u)`,
			"(pg_catalog.int4,pg_catalog.int4)", "(3,3)"},
		{"delete", `DELETE FROM accounts WHERE id = 1`, `DELETE FROM accounts WHERE id = 2`, `DELETE FROM accounts WHERE id = 3`,
			"(pg_catalog.int4)", "(3)"},
		// A unary minus before parentheses is folded into the constant inside, typed as the value it makes.
		{"minus before parentheses", `UPDATE accounts SET balance = -(3000000000) WHERE id = 1`,
			`UPDATE accounts SET balance = -(3000000001) WHERE id = 2`,
			`UPDATE accounts SET balance = -(2147483648) WHERE id = 3`, "", ""},
		{"minus before parentheses, negative", `UPDATE accounts SET balance = -((-1)) WHERE id = 1`,
			`UPDATE accounts SET balance = -((-2)) WHERE id = 2`, `UPDATE accounts SET balance = -((-2147483648)) WHERE id = 3`, "", ""},
		{"binary minus before parentheses", `UPDATE accounts SET balance = balance -(1) WHERE id = 1`,
			`UPDATE accounts SET balance = balance -(2) WHERE id = 2`, `UPDATE accounts SET balance = balance -(3) WHERE id = 3`,
			"(pg_catalog.int4,pg_catalog.int4)", "(3,3)"},
		// Analysed with the settings of the moment: typed literals kept as written, = NULL (prepared.go).
		{"typed literal", `UPDATE accounts SET balance = 1 WHERE id = 1 AND created < DATE '01/02/2024'`,
			`UPDATE accounts SET balance = 2 WHERE id = 2 AND created < DATE '01/02/2024'`,
			`UPDATE accounts SET balance = 3 WHERE id = 3 AND created < DATE '01/02/2024'`, "", ""},
		{"interval literal", `UPDATE accounts SET balance = 1 WHERE id = 1 AND age > INTERVAL '1' DAY`,
			`UPDATE accounts SET balance = 2 WHERE id = 2 AND age > INTERVAL '1' DAY`,
			`UPDATE accounts SET balance = 3 WHERE id = 3 AND age > INTERVAL '1' DAY`, "", ""},
		{"equals null", `UPDATE accounts SET balance = 1 WHERE id = 1 AND note = NULL`,
			`UPDATE accounts SET balance = 2 WHERE id = 2 AND note = NULL`, `UPDATE accounts SET balance = 3 WHERE id = 3 AND note = NULL`, "", ""},
		{"null equals", `UPDATE accounts SET balance = 1 WHERE id = 1 AND ((NULL)) = note`,
			`UPDATE accounts SET balance = 2 WHERE id = 2 AND ((NULL)) = note`,
			`UPDATE accounts SET balance = 3 WHERE id = 3 AND ((NULL)) = note`, "", ""},
		{"null elsewhere", `UPDATE accounts SET balance = 1, note = NULL WHERE id = 1 AND memo IS NULL`,
			`UPDATE accounts SET balance = 2, note = NULL WHERE id = 2 AND memo IS NULL`,
			`UPDATE accounts SET balance = 3, note = NULL WHERE id = 3 AND memo IS NULL`, "(pg_catalog.int4,pg_catalog.int4)", "(3,3)"},
		// Constants read as more than values: output column numbers, ON CONFLICT targets (prepared.go).
		{"order by column number", `DELETE FROM accounts WHERE id IN (SELECT id FROM accounts ORDER BY balance, 1 LIMIT 1)`,
			`DELETE FROM accounts WHERE id IN (SELECT id FROM accounts ORDER BY balance, 1 LIMIT 2)`,
			`DELETE FROM accounts WHERE id IN (SELECT id FROM accounts ORDER BY balance, 1 LIMIT 3)`, "", ""},
		{"order by negative", `DELETE FROM accounts WHERE id IN (SELECT id FROM accounts ORDER BY balance, -1 LIMIT 1)`,
			`DELETE FROM accounts WHERE id IN (SELECT id FROM accounts ORDER BY balance, -2 LIMIT 1)`,
			`DELETE FROM accounts WHERE id IN (SELECT id FROM accounts ORDER BY balance, -3 LIMIT 1)`, "", ""},
		{"order by expression", `DELETE FROM accounts WHERE id IN (SELECT id FROM accounts ORDER BY balance + 1 LIMIT 1)`,
			`DELETE FROM accounts WHERE id IN (SELECT id FROM accounts ORDER BY balance + 2 LIMIT 1)`,
			`DELETE FROM accounts WHERE id IN (SELECT id FROM accounts ORDER BY balance + 3 LIMIT 1)`,
			"(pg_catalog.int4,pg_catalog.int4)", "(3,1)"},
		{"group by column number", `DELETE FROM accounts WHERE id IN (SELECT max(id) FROM accounts GROUP BY balance, 1)`,
			`DELETE FROM accounts WHERE id IN (SELECT max(id) FROM accounts GROUP BY balance, 2)`,
			`DELETE FROM accounts WHERE id IN (SELECT max(id) FROM accounts GROUP BY balance, 3)`, "", ""},
		{"grouping set", `DELETE FROM accounts WHERE id IN (SELECT max(id) FROM accounts GROUP BY ROLLUP (balance, 1))`,
			`DELETE FROM accounts WHERE id IN (SELECT max(id) FROM accounts GROUP BY ROLLUP (balance, 2))`,
			`DELETE FROM accounts WHERE id IN (SELECT max(id) FROM accounts GROUP BY ROLLUP (balance, 3))`, "", ""},
		{"distinct on", `DELETE FROM accounts WHERE id IN (SELECT DISTINCT ON (balance, 1) id FROM accounts)`,
			`DELETE FROM accounts WHERE id IN (SELECT DISTINCT ON (balance, 2) id FROM accounts)`,
			`DELETE FROM accounts WHERE id IN (SELECT DISTINCT ON (balance, 3) id FROM accounts)`, "", ""},
		{"on conflict predicate", `INSERT INTO accounts (id, balance) VALUES (1, 5) ON CONFLICT (balance) WHERE balance > 0 DO NOTHING`,
			`INSERT INTO accounts (id, balance) VALUES (2, 6) ON CONFLICT (balance) WHERE balance > 1 DO NOTHING`,
			`INSERT INTO accounts (id, balance) VALUES (3, 7) ON CONFLICT (balance) WHERE balance > 2 DO NOTHING`, "", ""},
		{"on conflict expression", `INSERT INTO accounts (id, balance) VALUES (1, 5) ON CONFLICT ((balance + 1)) DO NOTHING`,
			`INSERT INTO accounts (id, balance) VALUES (2, 6) ON CONFLICT ((balance + 2)) DO NOTHING`,
			`INSERT INTO accounts (id, balance) VALUES (3, 7) ON CONFLICT ((balance + 3)) DO NOTHING`, "", ""},
		{"on conflict update", `INSERT INTO accounts (id, balance) VALUES (1, 5) ON CONFLICT (id) DO UPDATE SET balance = 1 WHERE accounts.balance > 0`,
			`INSERT INTO accounts (id, balance) VALUES (2, 6) ON CONFLICT (id) DO UPDATE SET balance = 2 WHERE accounts.balance > 1`,
			`INSERT INTO accounts (id, balance) VALUES (3, 7) ON CONFLICT (id) DO UPDATE SET balance = 3 WHERE accounts.balance > 2`,
			"(pg_catalog.int4,pg_catalog.int4,pg_catalog.int4,pg_catalog.int4)", "(3,7,3,2)"},
		{"national string", `UPDATE accounts SET note = N'a' WHERE id = 1`, `UPDATE accounts SET note = N'b' WHERE id = 2`,
			`UPDATE accounts SET note = N'c' WHERE id = 3`, "", ""},
		{"bit string", `UPDATE accounts SET bits = B'1' WHERE id = 1`, `UPDATE accounts SET bits = B'0' WHERE id = 2`,
			`UPDATE accounts SET bits = B'11' WHERE id = 3`, "", ""},
		{"two statements", `UPDATE accounts SET balance = 1 WHERE id = 1; SELECT 1`, `UPDATE accounts SET balance = 2 WHERE id = 2; SELECT 2`,
			`UPDATE accounts SET balance = 3 WHERE id = 3; SELECT 3`, "", ""},
		{"typed literal", `UPDATE accounts SET note = (TIMESTAMPTZ '2024-01-01')::text WHERE id = 1`,
			`UPDATE accounts SET note = (TIMESTAMPTZ '2024-01-01')::text WHERE id = 2`,
			`UPDATE accounts SET note = (TIMESTAMPTZ '2024-01-01')::text WHERE id = 3`, "", ""}, // converted at the PREPARE
		{"date today", `UPDATE accounts SET due = DATE 'today' WHERE id = 1`, `UPDATE accounts SET due = DATE 'today' WHERE id = 2`,
			`UPDATE accounts SET due = DATE 'today' WHERE id = 3`, "", ""},
		{"cast of a string constant", `UPDATE accounts SET due = 'today'::date WHERE id = 1`, `UPDATE accounts SET due = 'now'::date WHERE id = 2`,
			`UPDATE accounts SET due = '2024-01-01'::date WHERE id = 3`, "", ""}, // strings are not prepared
		{"cast of a number", `UPDATE accounts SET balance = 1::int8 WHERE id = 1`, `UPDATE accounts SET balance = 2::int8 WHERE id = 2`,
			`UPDATE accounts SET balance = 5::int8 WHERE id = 3`, "(pg_catalog.int4,pg_catalog.int4)", "(5,3)"},
		{"read", `SELECT * FROM accounts WHERE id = 1`, `SELECT * FROM accounts WHERE id = 2`, `SELECT * FROM accounts WHERE id = 3`, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := templatePlan(t, DefaultSettings, c.a, c.b, c.c)
			if c.types == "" {
				if p.Prepared != nil {
					t.Fatalf("prepared: %s", p.Prepared.Body)
				}
				return
			}
			if p.Prepared == nil {
				t.Fatalf("not prepared: %v %s", p.Action, p.SQL)
			}
			types, stmt, ok := strings.Cut(p.Prepared.Body, ") AS ")
			if !ok || types+")" != c.types || p.Args != c.args {
				t.Fatalf("body %s\nargs %s\nwant types %s args %s", p.Prepared.Body, p.Args, c.types, c.args)
			}
			if err := testRewriter(t).verifyText(stmt, false); err != nil {
				t.Fatalf("prepared statement not fenced: %v\n%s", err, stmt)
			}
		})
	}
}

// TestPreparedArgsInClientEncoding: EXECUTE's arguments are numbers, in ASCII in every client encoding; a text
// in another encoding is prepared when its template is ASCII, and a string constant, in whatever encoding, is
// never an argument.
func TestPreparedArgsInClientEncoding(t *testing.T) {
	set := Settings{ClientEncoding: "LATIN1", ServerEncoding: "UTF8", StandardConformingStrings: true}
	p := templatePlan(t, set, "UPDATE accounts SET balance = 1 WHERE id = 1", "UPDATE accounts SET balance = 2 WHERE id = 2",
		"UPDATE accounts SET balance = 3 WHERE id = 3")
	if p.Prepared == nil || p.Args != "(3,3)" {
		t.Fatalf("prepared %v, args %q", p.Prepared != nil, p.Args)
	}
	p = templatePlan(t, set, "UPDATE accounts SET note = 'a' WHERE id = 1", "UPDATE accounts SET note = 'b' WHERE id = 2",
		"UPDATE accounts SET note = 'caf\xe9' WHERE id = 3")
	if p.Prepared != nil || p.Action != Rewrite {
		t.Fatalf("a string prepared: %v %q", p.Action, p.Args)
	}
}

// TestPreparedFailedIsNotOffered: once a PREPARE of a template failed, its texts are sent as SQL.
func TestPreparedFailedIsNotOffered(t *testing.T) {
	c := NewCache(testRewriter(t), 64)
	var p Plan
	for i := range 3 {
		p = c.Plan([]byte("DELETE FROM accounts WHERE id = "+string(rune('1'+i))), DefaultSettings)
	}
	if p.Prepared == nil {
		t.Fatal("not prepared")
	}
	p.Prepared.MarkFailed()
	p = c.Plan([]byte("DELETE FROM accounts WHERE id = 9"), DefaultSettings)
	if p.Prepared != nil || p.Action != Rewrite || p.SQL == "" {
		t.Fatalf("after a failure: prepared %v, %v %q", p.Prepared != nil, p.Action, p.SQL)
	}
}

// TestPreparedSameText: a text sent again unchanged reaches its shape's template too (a fenced text is not cached
// as a text), so a statement without varying constants is prepared as well.
func TestPreparedSameText(t *testing.T) {
	const sql = "UPDATE accounts SET balance = balance + 1 WHERE id = 1"
	p := templatePlan(t, DefaultSettings, sql, sql, sql)
	if p.Prepared == nil || p.Args != "(1,1)" {
		t.Fatalf("prepared %v, args %q", p.Prepared != nil, p.Args)
	}
	// Texts that need no fence stay cached as texts (a read that locks rows passes the prefilter).
	c := NewCache(testRewriter(t), 64)
	for range 3 {
		if p := c.Plan([]byte("SELECT * FROM accounts WHERE id = 1 FOR UPDATE"), DefaultSettings); p.Action != Pass {
			t.Fatalf("%v", p.Action)
		}
	}
	if n := c.Len(); n != 2 {
		t.Fatalf("%d cache entries for a locking read sent three times, want 2 (its text and its shape)", n)
	}
}

// TestDeallocatesAnother: only one plain DEALLOCATE of a name that is not the proxy's leaves the proxy's
// statements known; anything else holding the word makes the proxy forget them.
func TestDeallocatesAnother(t *testing.T) {
	for text, want := range map[string]bool{
		"DEALLOCATE mine":                    true,
		"  deallocate prepare _pg3_12 ;  ":   true,
		`DEALLOCATE "Mine Too"`:              false, // a space: not read, forgotten
		`DEALLOCATE "FenceProxy_p1"`:         true,  // quoted: another name than fenceproxy_p1
		`DEALLOCATE "fenceproxy_p1"`:         false,
		"DEALLOCATE FENCEPROXY_P1":           false, // folded: the proxy's
		"DEALLOCATE ALL":                     false,
		"DEALLOCATE PREPARE all":             false,
		"DEALLOCATE /* x */ mine":            false,
		"DEALLOCATE mine; DEALLOCATE ALL":    false,
		"DEALLOCATE mine; SELECT 1":          false,
		"SELECT 'deallocate mine'":           false,
		"DEALLOCATE 1x":                      false,
		"DEALLOCATE \"a\"\"b\"":              false,
		"DEALLOCATE PREPARE":                 false,
		"EXECUTE 'DEALLOCATE fenceproxy_p1'": false,
	} {
		if got := deallocatesAnother([]byte(text), "fenceproxy_p"); got != want {
			t.Errorf("deallocatesAnother(%q) = %v, want %v", text, got, want)
		}
	}
}

// TestMayDropPrepared: the words that make the proxy forget its prepared statements, whole words only, anywhere
// in the text.
func TestMayDropPrepared(t *testing.T) {
	for text, want := range map[string]bool{
		"DISCARD ALL":                         true,
		"discard plans":                       true,
		"CREATE TEMP TABLE accounts (x int)":  true,
		"ALTER TABLE t RENAME TO accounts":    true,
		"SET transform_null_equals = on":      true,
		"SELECT 'x'; deallocate all":          true,
		"DEALLOCATE mine":                     false,
		"UPDATE t SET note = 'discarded'":     false,
		"UPDATE t SET created_at = now()":     false,
		"SELECT altered, deallocated FROM t":  false,
		"UPDATE t SET n = n + 1 WHERE id = 1": false,
	} {
		if got := MayDropPrepared([]byte(text), "fenceproxy_p"); got != want {
			t.Errorf("MayDropPrepared(%q) = %v, want %v", text, got, want)
		}
	}
}
