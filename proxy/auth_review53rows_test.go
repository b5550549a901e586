package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/fenceproxy/fenceproxy/auth"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// TestAuthQuerySeveralRows: an auth query that answers several rows for a name does not say which secret is the
// user's: the proxy must not pick one (the first), which let a password matching any of the rows log in, and
// upstream, with a configured password, as the user. Several rows are no usable secret: no such user.
func TestAuthQuerySeveralRows(t *testing.T) {
	ctx := ctxT(t)
	d := direct(t)
	attacker, err := auth.NewSCRAMSecret("attacker", []byte("attacker's salt!"), 4096)
	if err != nil {
		t.Fatal(err)
	}
	setup := []string{
		"DROP SCHEMA IF EXISTS fenceproxy_authrows CASCADE", "DROP ROLE IF EXISTS fpauthrows",
		"CREATE ROLE fpauthrows LOGIN",
		"CREATE SCHEMA fenceproxy_authrows",
		// A lookup table where two rows match one name (say, names compared without case).
		"CREATE TABLE fenceproxy_authrows.users (name text, secret text)",
		"INSERT INTO fenceproxy_authrows.users VALUES ('" + strings.ToUpper(pgtest.ScramUser) + "', '" + attacker.String() + "'), ('" +
			pgtest.ScramUser + "', (SELECT rolpassword FROM pg_authid WHERE rolname = '" + pgtest.ScramUser + "'))",
		"GRANT USAGE ON SCHEMA fenceproxy_authrows TO fpauthrows",
		"GRANT SELECT ON fenceproxy_authrows.users TO fpauthrows",
	}
	for _, sql := range setup {
		if _, err := d.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		c := direct(t)
		for _, sql := range []string{"DROP SCHEMA IF EXISTS fenceproxy_authrows CASCADE", "DROP ROLE IF EXISTS fpauthrows"} {
			c.Exec(context.Background(), sql)
		}
	})
	p := startProxy(t, proxytest.Options{YAML: fmt.Sprintf(`auth:
  type: scram-sha-256
  query: SELECT name, secret FROM fenceproxy_authrows.users WHERE pg_catalog.lower(name) OPERATOR(pg_catalog.=) pg_catalog.lower($1) ORDER BY name
  user: fpauthrows
  database: %s
  upstream_passwords:
    %s: %s
`, pgtest.TestDB, pgtest.ScramUser, pgtest.ScramPassword)})
	for _, pw := range []string{"attacker", pgtest.ScramPassword} {
		if code := loginCode(t, p.DSN(pgtest.ScramUser, pw, pgtest.TestDB)); code != "28P01" {
			t.Errorf("password %q with two rows for the user: %q, want 28P01", pw, code)
		}
	}
}
