package rewrite

import (
	"strings"
	"testing"
)

// TestVerifierRejects makes sure verifyFenced fails on texts that are not
// fully fenced, including rewrites with one piece of the fence removed.
func TestVerifierRejects(t *testing.T) {
	r := testRewriter(t)
	update := r.Plan("UPDATE accounts SET balance = 1 WHERE id = $1").SQL
	del := r.Plan("DELETE FROM accounts WHERE id = $1").SQL
	insert := r.Plan("INSERT INTO accounts (id) VALUES (1), (2) ON CONFLICT (id) DO UPDATE SET balance = 0").SQL
	tok := deparseExpr(t, r.tables[0].ref)
	chk := deparseExpr(t, r.tables[0].setCheckFor([]string{"accounts"}))
	light := deparseExpr(t, r.tables[0].light)
	// The CREATE RULE passes the verifier: its action is stored, not run (the DDL rule refuses rules on a
	// protected table; the in-database guard fences what a rule elsewhere runs).
	cte := "WITH fenceproxy_stmt AS MATERIALIZED (SELECT " + deparseExpr(t, r.tables[0].token) + " AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) "
	for _, ok := range []string{update, del, insert, "SELECT * FROM accounts", "UPDATE other SET x = 1", "CREATE RULE r AS ON INSERT TO q DO ALSO DELETE FROM accounts"} {
		if err := r.verifyText(ok, false); err != nil {
			t.Errorf("verifyText(%.80q): %v", ok, err)
		}
	}
	bad := map[string]string{
		"unfenced update":         "UPDATE accounts SET balance = 1 WHERE id = 1",
		"unfenced cte delete":     "WITH d AS (DELETE FROM accounts RETURNING *) SELECT * FROM d",
		"unfenced insert":         "INSERT INTO accounts (id) VALUES (1)",
		"merge":                   "MERGE INTO accounts a USING s ON a.id = s.id WHEN MATCHED THEN DELETE",
		"truncate":                "TRUNCATE public.accounts",
		"copy from":               "COPY accounts FROM STDIN",
		"no one-time filter":      strings.Replace(update, " AND "+tok+" IS NOT NULL", "", 1),
		"no token assignment":     strings.Replace(update, ", fence_token = "+chk, "", 1),
		"token assigned twice":    strings.Replace(update, ", fence_token = "+chk, ", fence_token = "+chk+", fence_token = "+chk, 1),
		"literal token set":       strings.Replace(update, ", fence_token = "+chk, ", fence_token = 5", 1),
		"light token set":         strings.Replace(update, ", fence_token = "+chk, ", fence_token = "+light, 1),
		"token set unchecked":     strings.Replace(update, ", fence_token = "+chk, ", fence_token = "+tok, 1),
		"ignored value taken":     strings.Replace(update, ", fence_token = "+chk, ", fence_token = CASE WHEN true THEN 5::bigint ELSE "+chk+" END", 1),
		"reversed comparison":     strings.Replace(update, "COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=)", "COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.>=)", 1),
		"unqualified comparison":  strings.Replace(update, "COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=)", "COALESCE(accounts.fence_token, 0) <=", 1),
		"wrong column in check":   strings.Replace(update, "COALESCE(accounts.fence_token, 0)", "COALESCE(accounts.balance, 0)", 1),
		"check is not guarded":    strings.Replace(del, "ELSE false END AND", "ELSE true END AND", 1),
		"delete without check":    del[:strings.Index(del, " AND CASE WHEN")] + del[strings.LastIndex(del, " AND "):],
		"check ORed":              strings.Replace(update, "WHERE id = $1 AND", "WHERE id = $1 OR", 1),
		"no statement token":      strings.Replace(update, cte, "", 1),
		"shadowed token":          strings.Replace(update, "SET balance = 1", "SET balance = (WITH fenceproxy_stmt AS (SELECT 1 AS token) SELECT token FROM fenceproxy_stmt)", 1),
		"literal token":           strings.Replace(insert, "VALUES ("+tok+", 1)", "VALUES (5, 1)", 1),
		"first row light":         strings.Replace(insert, "VALUES ("+tok+", 1)", "VALUES ("+light+", 1)", 1),
		"light after code":        strings.Replace(insert, "("+light+", 2)", "("+light+", length(set_config('fence.token', '1', false)))", 1),
		"on conflict unchecked":   insert[:strings.LastIndex(insert, " WHERE ")],
		"on conflict other token": strings.Replace(insert, "fence_token = excluded.fence_token", "fence_token = "+light, 1),
		"wrong table marker":      strings.Replace(update, "|accounts|.", "|ledger|.", 1),
	}
	for name, sql := range bad {
		if sql == update || sql == del || sql == insert {
			t.Errorf("%s: the mutation did not apply", name)
			continue
		}
		if err := r.verifyText(sql, false); err == nil {
			t.Errorf("%s: verifyText accepted %.200q", name, sql)
		}
	}
}

func TestVerifyOption(t *testing.T) {
	cfg := testConfig()
	cfg.Verify = true
	rv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := testRewriter(t)
	for _, path := range goldenFiles(t) {
		in := readGolden(t, path).input
		if a, b := r.Plan(in), rv.Plan(in); formatPlan(a, nil) != formatPlan(b, nil) {
			t.Errorf("%s: Verify changes the plan: %s vs %s", path, formatPlan(a, nil), formatPlan(b, nil))
		}
	}
}
