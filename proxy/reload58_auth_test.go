package proxy_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fenceproxy/fenceproxy/auth"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// auth.file changed under a running proxy (RELOAD, SIGHUP, or the next login, which reads a changed file): a
// user removed from it, or whose secret changed, no longer logs in with what worked before, though the proxy
// holds an upstream connection logged in as that user (kept for reuse in session mode, idle in the pool of
// transaction mode, which logs in with the client's ClientKey); a client already connected goes on, as with
// pgbouncer. A broken file keeps the users it had.
func TestReload58AuthFileChangedUnderConnectedUsers(t *testing.T) {
	secret := rolpassword(t, pgtest.ScramUser)
	other, err := auth.NewSCRAMSecret("another password", []byte("0123456789abcdef"), 4096)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []struct{ name, yaml string }{
		{"session", ""},
		{"transaction", "pool:\n  mode: transaction\n  size: 2\n"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			file := writeUserlist(t, filepath.Join(t.TempDir(), "userlist.txt"), pgtest.ScramUser, secret)
			p := startProxy(t, proxytest.Options{YAML: "auth:\n  type: scram-sha-256\n  file: " + file + "\n" + mode.yaml})
			dsn := p.DSN(pgtest.ScramUser, pgtest.ScramPassword, pgtest.TestDB)
			if code := loginCode(t, dsn); code != "" { // leaves an upstream connection of the user behind
				t.Fatalf("login before the change: %s", code)
			}
			held := connect(t, dsn)
			fxExec(t, held, "SELECT 1")

			writeUserlist(t, file, pgtest.ScramUser+"_not", secret)
			if err := p.Server.ReloadAuth(); err != nil {
				t.Fatal(err)
			}
			if code := loginCode(t, dsn); code != "28P01" {
				t.Fatalf("a user removed from auth.file logged in: %q, want 28P01", code)
			}
			fxExec(t, held, "SELECT 1") // connected before: goes on

			writeUserlist(t, file, pgtest.ScramUser, other.String()) // the next login reads it, without a reload
			if code := loginCode(t, dsn); code != "28P01" {
				t.Fatalf("the old password after the secret changed: %q, want 28P01", code)
			}

			writeUserlist(t, file, pgtest.ScramUser, secret)
			if err := p.Server.ReloadAuth(); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, []byte("\"unterminated\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := p.Server.ReloadAuth(); err == nil {
				t.Fatal("RELOAD of a broken auth.file: no error")
			}
			if code := loginCode(t, dsn); code != "" {
				t.Fatalf("after a broken auth.file, the users it had: %q", code)
			}
		})
	}
}
