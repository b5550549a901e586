package schema_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/rewrite"
	"github.com/fenceproxy/fenceproxy/schema"
)

// TestGuardDDLAroundTheProxyRule: which layer refuses DDL on the guard's own objects that the proxy's rule
// cannot see. Through the proxy a guard schema never enters the search_path (rewrite/guardpath.go), but a DO
// block's dynamic SQL, a search_path put there by dynamic SQL or by a role default set directly, and
// unqualified DDL after it, reach the server as texts that name no guard schema: the DDL guard refuses them
// there, from any connection, the proxy's included, and the guard stays as install made it.
func TestGuardDDLAroundTheProxyRule(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, "CREATE TABLE accounts (id int PRIMARY KEY, balance int, fence_token bigint)")
	cfg := guardConfig(table("accounts", "fence_token"))
	cfg.DDLGuard = true
	install(t, su, cfg)
	p := proxytest.Start(t, pg.Addr(), proxytest.Options{YAML: "tables:\n  - name: accounts\n    token_column: fence_token\n"})
	proxyConn := func(user string) *pgx.Conn {
		c, err := pgx.ConnectConfig(context.Background(), mustParse(t, p.DSN(user, "", db)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	c := proxyConn(pgtest.SuperUser)
	const replace = "CREATE OR REPLACE FUNCTION guard_truncate() RETURNS trigger LANGUAGE plpgsql AS $b$ BEGIN RETURN NULL; END $b$"
	// The proxy's rule.
	wantCode(t, "SET search_path naming the guard through the proxy", execErr(c, "SET search_path = public, fenceproxy"),
		rewrite.CodeUnfenceable, "unfenceable write: SET search_path naming")
	// The DDL guard's: dynamic SQL, a search_path set by dynamic SQL, then unqualified DDL in later messages.
	for _, sql := range []string{
		"DO $$ BEGIN EXECUTE 'CREATE OR REPLACE FUNCTION fenceproxy.guard_truncate() RETURNS trigger LANGUAGE plpgsql AS $b$ BEGIN RETURN NULL; END $b$'; END $$",
		"DO $$ BEGIN EXECUTE 'ALTER TABLE fenceproxy.token_ceiling RENAME TO ceiling_off'; END $$",
	} {
		wantCode(t, sql, execErr(c, sql), rewrite.CodeUnfenceable, "unfenceable write: ")
	}
	exec(t, c, "DO $$ BEGIN EXECUTE 'SET search_path = fenceproxy, public'; END $$")
	wantCode(t, "unqualified CREATE OR REPLACE after a dynamic SET", execErr(c, replace), rewrite.CodeUnfenceable, "unfenceable write: ")
	// A role default set directly, around the proxy.
	exec(t, su, "ALTER ROLE "+pgtest.SuperUser+" IN DATABASE "+db+" SET search_path = fenceproxy, public")
	t.Cleanup(func() { _ = execErr(su, "ALTER ROLE "+pgtest.SuperUser+" IN DATABASE "+db+" RESET search_path") })
	wantCode(t, "unqualified CREATE OR REPLACE under a role default", execErr(proxyConn(pgtest.SuperUser), replace),
		rewrite.CodeUnfenceable, "unfenceable write: ")
	st, err := schema.Inspect(context.Background(), su, cfg)
	if err != nil || len(st.Findings) > 0 {
		t.Fatalf("after the refused DDL: %+v %v", st.Findings, err)
	}
}

func mustParse(t *testing.T, dsn string) *pgx.ConnConfig {
	t.Helper()
	c, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
