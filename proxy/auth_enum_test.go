package proxy_test

import (
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
