package rewrite

import (
	"fmt"
	"strings"
	"testing"
)

func inlineSettings() Settings {
	s := DefaultSettings
	s.InlineToken = true
	return s
}

// Every write form gets the inline fence: no statement-token CTE, the token in TokenSegs' cuts, and the text
// with the token in place is fenced as the inline verifier requires. The template of a shape gives what the full
// plan gives.
func TestInlineForms(t *testing.T) {
	r, err := New(Config{Tables: []Table{{Name: "accounts", TokenColumn: "fence_token"}}, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"UPDATE accounts SET balance = balance + 17 WHERE id = 4242",
		"UPDATE accounts SET balance = 1, fence_token = 99 WHERE id = 1",
		"DELETE FROM accounts WHERE id = 5",
		"INSERT INTO accounts (id, balance) VALUES (1, 2)",
		"INSERT INTO accounts (id, balance) VALUES (1, 2), (3, 4), (5, 6)",
		"INSERT INTO accounts (id, balance) VALUES (1, now()::text::int), (3, 4)",
		"INSERT INTO accounts (id, balance) SELECT 1, 2",
		"INSERT INTO accounts (id, balance) SELECT 1, 2 UNION SELECT 3, 4",
		"INSERT INTO accounts DEFAULT VALUES",
		"INSERT INTO accounts (id, balance) VALUES (1, 2) ON CONFLICT (id) DO UPDATE SET balance = 3",
		"WITH moved AS (UPDATE accounts SET balance = 0 WHERE id = 1 RETURNING id) SELECT * FROM moved",
		"UPDATE accounts SET balance = 1 WHERE id = 1; DELETE FROM accounts WHERE id = 2",
		"UPDATE accounts SET note = 'it costs 5 dollars' WHERE id = 7",
		"UPDATE accounts SET note = '$999999' WHERE id = 7",
		"UPDATE accounts SET note = $x$ $999999 $x$, balance = $1 WHERE id = $2",
	} {
		c := NewCache(r, 64)
		full := r.PlanWith([]byte(sql), inlineSettings())
		if full.Action != Rewrite || len(full.TokenSegs) < 2 || full.Prepared != nil {
			t.Fatalf("%s: %v, %d cuts, prepared %v: %s", sql, full.Action, len(full.TokenSegs), full.Prepared != nil, full.Message)
		}
		text := full.WithToken("0042")
		if strings.Contains(text, stmtTokenName) || strings.Count(text, inlineSlotText) != strings.Count(sql, inlineSlotText) || !strings.Contains(text, "'0042'::bigint") {
			t.Fatalf("%s: not the inline form: %s", sql, text)
		}
		if err := r.verifyText(full.SQL, true); err != nil {
			t.Fatalf("%s: %v\n%s", sql, err, full.SQL)
		}
		if err := r.verifyText(full.SQL, false); err == nil {
			t.Fatalf("%s: the usual verifier accepts the inline form", sql)
		}
		for i := 0; i < 4; i++ { // the first two are planned in full, then the shape's template serves
			p := c.Plan([]byte(sql), inlineSettings())
			if same, err := sameParse(p.WithToken("0042"), text); err != nil || !same {
				t.Fatalf("%s: lookup %d gives\n%s\nnot\n%s (%v)", sql, i+1, p.WithToken("0042"), text, err)
			}
		}
	}
}

// A text with a parameter numbered like the token's place, or a PREPARE, whose body runs under a later token,
// gets the usual fence; so does every text planned without InlineToken.
func TestInlineNotFor(t *testing.T) {
	r := testRewriter(t)
	for _, c := range []struct {
		sql string
		set Settings
	}{
		{"UPDATE accounts SET balance = 1 WHERE id = 1", DefaultSettings},
		{"PREPARE p AS UPDATE accounts SET balance = 1 WHERE id = 1", inlineSettings()},
	} {
		p := r.PlanWith([]byte(c.sql), c.set)
		if p.Action != Rewrite || p.TokenSegs != nil || !strings.Contains(p.SQL, stmtTokenName) {
			t.Fatalf("%s: %v, %d cuts: %s", c.sql, p.Action, len(p.TokenSegs), p.SQL)
		}
		if p.WithToken("5") != p.SQL {
			t.Fatalf("%s: WithToken changed a plan without cuts", c.sql)
		}
	}
	// A client's parameter of the token's number never reaches the analysis: the lexer refuses numbers above
	// the protocol's 65535.
	for _, sql := range []string{"UPDATE accounts SET note = $999999 WHERE id = 1", "SELECT $999999; UPDATE accounts SET note = 'x' WHERE id = 1"} {
		if p := r.PlanWith([]byte(sql), inlineSettings()); p.Action != Refuse || p.TokenSegs != nil {
			t.Fatalf("%s: %v", sql, p.Action)
		}
	}
}

// Lock fences and synchronous_commit go into the inline check's valid arm as into the CTE's.
func TestInlineLockAndSyncCommit(t *testing.T) {
	r, err := New(Config{
		Tables:            []Table{{Name: "accounts", TokenColumn: "fence_token", RequireLock: true}},
		LockSetting:       "fence.lock",
		SynchronousCommit: "remote_apply",
		Verify:            true,
	})
	if err != nil {
		t.Fatal(err)
	}
	p := r.PlanWith([]byte("UPDATE accounts SET balance = 1 WHERE id = 1"), inlineSettings())
	text := p.WithToken("5")
	for _, want := range []string{"fenceproxy.lock_accept", "'synchronous_commit', 'remote_apply'", "current_setting('fence.lock', true)", "'5'::bigint"} {
		if !strings.Contains(text, want) {
			t.Fatalf("no %q in %s", want, text)
		}
	}
	if strings.Contains(text, stmtTokenName) {
		t.Fatalf("not inline: %s", text)
	}
}

// The inline verifier refuses an inline text without its one-time check, or with the check of another token
// setting.
func TestInlineVerifierCatches(t *testing.T) {
	r := testRewriter(t)
	p := r.PlanWith([]byte("UPDATE accounts SET balance = 1 WHERE id = 1"), inlineSettings())
	i := strings.Index(p.SQL, " AND CASE WHEN pg_catalog.current_setting")
	if i < 0 {
		t.Fatalf("no one-time check in %s", p.SQL)
	}
	for _, bad := range []string{
		p.SQL[:i],
		strings.ReplaceAll(p.SQL, "current_setting('fence.token'", "current_setting('fence.other'"),
		strings.Replace(p.SQL, "<=) "+inlineSlotText, "<=) 1", 1),
	} {
		if err := r.verifyText(bad, true); err == nil {
			t.Fatalf("the verifier accepts %s", bad)
		}
	}
}

// The cuts are in the client's encoding, as the text is.
func TestInlineClientEncoding(t *testing.T) {
	r := testRewriter(t)
	set := inlineSettings()
	set.ClientEncoding = "LATIN1"
	p := r.PlanWith([]byte("UPDATE accounts SET note = 'caf\xe9' WHERE id = 1"), set)
	text := p.WithToken("5")
	if p.TokenSegs == nil || !strings.Contains(text, "'caf\xe9'") || !strings.Contains(text, "'5'::bigint") {
		t.Fatalf("%q", text)
	}
}

// A 55F03 marker holding a valid token comes only from the inline check: its message says the token changed.
func TestInlineMarkerMessage(t *testing.T) {
	m, ok := DecodeMarker("invalid input syntax for type bigint: \"fenceproxy|55F03|fence.token|39|accounts|.\"")
	if !ok || m.Code != CodeInvalid || m.Token != "9" {
		t.Fatalf("%+v %v", m, ok)
	}
	msg, _, hint := m.Describe()
	if !strings.HasPrefix(msg, "fencing token changed behind the proxy for a write to accounts") || !strings.Contains(hint, "SET LOCAL") {
		t.Fatalf("%q %q", msg, hint)
	}
	m, _ = DecodeMarker("\"fenceproxy|55F03|fence.token|3961|accounts|.\"")
	if msg, _, _ := m.Describe(); !strings.HasPrefix(msg, "invalid fencing token") {
		t.Fatalf("%q", msg)
	}
}

// A shape's template serves the inline form too: texts differing only in their constants are cache hits.
func TestInlineTemplateHits(t *testing.T) {
	r := testRewriter(t)
	obs := &countingObserver{}
	c := NewCacheObserved(r, 64, obs)
	for i := 0; i < 10; i++ {
		sql := fmt.Sprintf("UPDATE accounts SET balance = balance + %d WHERE id = %d", i, 100+i)
		if p := c.Plan([]byte(sql), inlineSettings()); p.TokenSegs == nil {
			t.Fatalf("%s: not inline: %s", sql, p.SQL)
		}
	}
	if obs.hits.Load() < 8 {
		t.Fatalf("%d hits, %d misses", obs.hits.Load(), obs.misses.Load())
	}
}

// With fence.synchronous_commit the inline check holds set_config, which is volatile: it goes into a scalar
// subquery, so that PostgreSQL still runs it once, before any row (an InitPlan gating the scan), also when no row
// matches.
func TestInlineSyncCommitCheckedOnce(t *testing.T) {
	r, err := New(Config{Tables: []Table{{Name: "accounts", TokenColumn: "fence_token"}}, SynchronousCommit: "local", Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{"UPDATE accounts SET balance = 1 WHERE id = 1", "DELETE FROM accounts WHERE id = 1"} {
		text := r.PlanWith([]byte(sql), inlineSettings()).WithToken("5")
		if !strings.Contains(text, "AND (SELECT CASE WHEN pg_catalog.current_setting('fence.token', true)") {
			t.Fatalf("%s: the check is not a scalar subquery: %s", sql, text)
		}
	}
}

// Every INSERT form is fenced and verified in the inline form with lock fences and synchronous_commit, whose
// wrappers make the check's valid arm a CASE of its own.
func TestInlineInsertWithWrappedCheck(t *testing.T) {
	for _, cfg := range []Config{
		{SynchronousCommit: "local"},
		{LockSetting: "fence.lock"},
		{SynchronousCommit: "remote_apply", LockSetting: "fence.lock"},
	} {
		cfg.Tables = []Table{{Name: "accounts", TokenColumn: "fence_token", RequireLock: cfg.LockSetting != ""}}
		cfg.Verify = true
		r, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, sql := range []string{
			"INSERT INTO accounts (id, balance) VALUES (1, 2)",
			"INSERT INTO accounts (id, balance) VALUES (1, 2), (3, 4)",
			"INSERT INTO accounts (id, balance) VALUES (1, now()::text::int), (3, 4)",
			"INSERT INTO accounts DEFAULT VALUES",
			"INSERT INTO accounts (id, balance) VALUES (1, 2) ON CONFLICT (id) DO UPDATE SET balance = 3",
			"INSERT INTO accounts (id, balance, fence_token) VALUES (1, 2, 99)",
			"INSERT INTO accounts (id, balance) SELECT 1, 2",
		} {
			if p := r.PlanWith([]byte(sql), inlineSettings()); p.Action != Rewrite || p.TokenSegs == nil {
				t.Fatalf("%+v %s: %v %s", cfg, sql, p.Action, p.Message)
			}
		}
	}
}
