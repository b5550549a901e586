package proxy_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

// TestStartupSearchPathNamingGuardRefused: a schema of the in-database guard never enters the search_path through
// the proxy (rewrite/guardpath.go), where unqualified DDL (CREATE OR REPLACE FUNCTION guard_truncate() ...) would
// replace the guard's own code: not by SET, and not by the startup packet either, as a parameter of its own or as
// -c in options, in any of the spellings PostgreSQL reads. The session is refused (55F04) before any upstream
// work; a search_path that names no guard schema starts as before.
func TestStartupSearchPathNamingGuardRefused(t *testing.T) {
	p := startProxy(t, proxytest.Options{YAML: "tables:\n  - name: accounts\n    token_column: fence_token\n"})
	base := func(kv ...string) map[string]string {
		m := map[string]string{"user": pgtest.SuperUser, "database": pgtest.TestDB}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, params := range []map[string]string{
		base("search_path", "fenceproxy"),
		base("SEARCH_PATH", "public, \"fenceproxy_ddl\""),
		base("options", "-c search_path=public,fenceproxy"),
		base("options", "--search_path=FenceProxy"),
		base("options", "-csearch-path=fenceproxy"),
	} {
		m, ok := startupAnswer(t, p.Addr, params).(*pgproto3.ErrorResponse)
		if !ok || m.Code != rewrite.CodeUnfenceable {
			t.Errorf("startup %q: %#v, want %s", params, m, rewrite.CodeUnfenceable)
		}
	}
	for _, params := range []map[string]string{base("search_path", "public"), base("options", "-c search_path=app,public")} {
		if m, ok := startupAnswer(t, p.Addr, params).(*pgproto3.ErrorResponse); ok {
			t.Errorf("startup %q refused: %s %s", params, m.Code, m.Message)
		}
	}
}
