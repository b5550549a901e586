package proxy_test

import (
	"context"
	"os"
	"strings"
	"testing"
)

// TestAuthDocsFunction: the auth function docs/auth.md gives runs as written and refuses what PostgreSQL's login
// refuses: a NOLOGIN role and a password past VALID UNTIL get no row, a valid login role gets its secret. A
// kept or pooled server connection is lent without a server login, so these checks are the function's.
func TestAuthDocsFunction(t *testing.T) {
	doc, err := os.ReadFile("../docs/auth.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```sql\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 || !strings.Contains(block, "fenceproxy_auth.get_auth") {
		t.Fatal("docs/auth.md has no sql block with fenceproxy_auth.get_auth")
	}
	ctx := ctxT(t)
	d := direct(t)
	cleanup := []string{"DROP SCHEMA IF EXISTS fenceproxy_auth CASCADE", "DROP ROLE IF EXISTS fenceproxy_auth",
		"DROP ROLE IF EXISTS fp_doc_ok", "DROP ROLE IF EXISTS fp_doc_expired", "DROP ROLE IF EXISTS fp_doc_nologin"}
	for _, sql := range cleanup {
		if _, err := d.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		c := direct(t)
		for _, sql := range cleanup {
			c.Exec(context.Background(), sql)
		}
	})
	for _, sql := range []string{block,
		"CREATE ROLE fp_doc_ok LOGIN PASSWORD 'pw'",
		"CREATE ROLE fp_doc_expired LOGIN PASSWORD 'pw' VALID UNTIL '2000-01-01'",
		"CREATE ROLE fp_doc_nologin NOLOGIN PASSWORD 'pw'",
		"SET ROLE fenceproxy_auth"} {
		if _, err := d.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for role, want := range map[string]int{"fp_doc_ok": 1, "fp_doc_expired": 0, "fp_doc_nologin": 0} {
		var n int
		if err := d.QueryRow(ctx, "SELECT count(*) FROM fenceproxy_auth.get_auth($1)", role).Scan(&n); err != nil {
			t.Fatalf("get_auth(%s): %v", role, err)
		}
		if n != want {
			t.Errorf("get_auth(%s) gave %d rows, want %d", role, n, want)
		}
	}
	if _, err := d.Exec(ctx, "RESET ROLE"); err != nil {
		t.Fatal(err)
	}
}
