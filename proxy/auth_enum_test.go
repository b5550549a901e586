package proxy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/auth"
	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// Against user enumeration, found by a review on 2026-12-03: what an unknown user is asked must not tell it from
// the users the proxy knows.

// With auth.type md5 an unknown user is asked for md5, as the md5 users are (it was asked for SCRAM, so one
// StartupMessage told which users exist), and any answer gets 28P01 with nothing sent upstream.
func TestAuthMD5ModeUnknownUserAskedMD5(t *testing.T) {
	up, accepted := countingUpstream(t)
	file := writeUserlist(t, filepath.Join(t.TempDir(), "userlist.txt"), pgtest.MD5User, rolpassword(t, pgtest.MD5User))
	p := proxytest.Start(t, up, proxytest.Options{YAML: "auth:\n  type: md5\n  file: " + file + "\n"})
	for _, user := range []string{pgtest.MD5User, "no_such_user"} {
		m, fe, _ := firstAuthRequest(t, p.Addr, user)
		if _, ok := m.(*pgproto3.AuthenticationMD5Password); !ok {
			t.Fatalf("%s is asked %T, want AuthenticationMD5Password", user, m)
		}
		fe.Send(&pgproto3.PasswordMessage{Password: "md5" + strings.Repeat("0", 32)})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		m, err := fe.Receive()
		if e, ok := m.(*pgproto3.ErrorResponse); err != nil || !ok || e.Code != "28P01" || e.Message != fmt.Sprintf("password authentication failed for user %q", user) {
			t.Fatalf("%s, a wrong md5 answer: %#v %v", user, m, err)
		}
	}
	if code := loginCode(t, p.DSN("no_such_user", pgtest.MD5Password, pgtest.TestDB)); code != "28P01" {
		t.Fatalf("unknown user by pgx: %q, want 28P01", code)
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("refused logins made %d upstream connections", n)
	}
}

// A mock SCRAM secret shows the iteration count most of auth.file's secrets have: PostgreSQL's default 4096
// would tell an unknown user from the real ones where the server was set to another (scram_iterations).
func TestAuthMockIterationsFollowTheFile(t *testing.T) {
	up, _ := countingUpstream(t)
	var pairs []string
	for i, it := range []int{10000, 10000, 4096} {
		sec, err := auth.NewSCRAMSecret("pw", []byte(fmt.Sprintf("salt of user %04d", i)), it)
		if err != nil {
			t.Fatal(err)
		}
		pairs = append(pairs, fmt.Sprintf("u%d", i), sec.String())
	}
	file := writeUserlist(t, filepath.Join(t.TempDir(), "userlist.txt"), pairs...)
	p := proxytest.Start(t, up, proxytest.Options{YAML: "auth:\n  type: scram-sha-256\n  file: " + file + "\n"})
	if real, mock := scramServerFirst(t, p.Addr, "u0"), scramServerFirst(t, p.Addr, "nobody"); !strings.HasSuffix(real, ",i=10000") || !strings.HasSuffix(mock, ",i=10000") {
		t.Fatalf("a real user's challenge %q, an unknown user's %q: want both i=10000", real, mock)
	}
}

// auth.mock_key_file keeps an unknown user's mock salt across restarts and between proxies that share the file
// (without it the key is drawn at each start, and a salt that changes tells an unknown user from a real one,
// whose salt stays); a file shorter than config.MinMockKey stops the proxy at start.
func TestAuthMockKeyFile(t *testing.T) {
	up, _ := countingUpstream(t)
	dir := t.TempDir()
	file := writeUserlist(t, filepath.Join(dir, "userlist.txt"), pgtest.ScramUser, rolpassword(t, pgtest.ScramUser))
	key := filepath.Join(dir, "mock.key")
	if err := os.WriteFile(key, []byte(strings.Repeat("k", config.MinMockKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := "auth:\n  type: scram-sha-256\n  file: " + file + "\n"
	withKey := yaml + "  mock_key_file: " + key + "\n"
	first := scramServerFirst(t, proxytest.Start(t, up, proxytest.Options{YAML: withKey}).Addr, "nobody")
	if again := scramServerFirst(t, proxytest.Start(t, up, proxytest.Options{YAML: withKey}).Addr, "nobody"); again != first {
		t.Fatalf("two proxies with one mock key: %q and %q", first, again)
	}
	if drawn := scramServerFirst(t, proxytest.Start(t, up, proxytest.Options{YAML: yaml}).Addr, "nobody"); drawn == first {
		t.Fatal("a proxy without auth.mock_key_file shows the key file's salt")
	}
	if err := os.WriteFile(key, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("test.yaml", []byte("upstream:\n  address: "+up+"\n"+withKey))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proxy.New(proxy.Options{Config: cfg}); err == nil || !strings.Contains(err.Error(), "auth.mock_key_file") {
		t.Fatalf("a 5-byte mock key: %v, want an error naming auth.mock_key_file", err)
	}
}

// A mock SCRAM secret shows the iteration count of the secrets auth.query returned, where there is no auth.file
// (from a review on 2026-12-03: it showed 4096 beside real secrets of 10000).
func TestAuthQueryMockIterationsFollowTheSecrets(t *testing.T) {
	ctx := ctxT(t)
	d := direct(t)
	// A secret made with scram_iterations = 10000 (PostgreSQL 16+), set pre-hashed so that 15 takes it too.
	sec, err := auth.NewSCRAMSecret("pw", []byte("revq user salt!!"), 10000)
	if err != nil {
		t.Fatal(err)
	}
	setup := []string{
		"DROP SCHEMA IF EXISTS revq CASCADE", "DROP ROLE IF EXISTS revq_auth", "DROP ROLE IF EXISTS revq_user",
		"CREATE ROLE revq_auth LOGIN",
		"CREATE ROLE revq_user LOGIN PASSWORD '" + sec.String() + "'",
		"CREATE SCHEMA revq",
		`CREATE FUNCTION revq.get_auth(p_user text) RETURNS TABLE (usename name, passwd text)
		 LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$ SELECT rolname, rolpassword FROM pg_catalog.pg_authid WHERE rolname = p_user $$`,
		"GRANT USAGE ON SCHEMA revq TO revq_auth",
		"GRANT EXECUTE ON FUNCTION revq.get_auth(text) TO revq_auth",
	}
	for _, sql := range setup {
		if _, err := d.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		c := direct(t)
		for _, sql := range []string{"DROP SCHEMA IF EXISTS revq CASCADE", "DROP ROLE IF EXISTS revq_auth", "DROP ROLE IF EXISTS revq_user"} {
			c.Exec(context.Background(), sql)
		}
	})
	p := startProxy(t, proxytest.Options{YAML: fmt.Sprintf("auth:\n  type: scram-sha-256\n  query: SELECT usename, passwd FROM revq.get_auth($1)\n  user: revq_auth\n  database: %s\n", pgtest.TestDB)})
	// The real user's lookup first: before the query returned any secret, a mock one shows 4096 (docs/auth.md).
	real, mock := scramServerFirst(t, p.Addr, "revq_user"), scramServerFirst(t, p.Addr, "revq_nobody")
	ri, mi := real[strings.LastIndex(real, ",i="):], mock[strings.LastIndex(mock, ",i="):]
	if ri != mi {
		t.Fatalf("a real user's server-first ends %q, an unknown user's %q: told apart", ri, mi)
	}
}
