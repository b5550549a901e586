package main

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// A reload applies all it reads or nothing: a configuration file that adds a table, with an auth.file that does
// not validate, fails RELOAD and leaves the table list as it was (until 2026-12-05 the table was protected while
// RELOAD said it failed); once auth.file is mended, RELOAD applies both.
func TestServeAdminReloadAllOrNothing(t *testing.T) {
	cl := pgtest.MustStart(t, pgtest.Options{})
	if err := cl.Exec("CREATE TABLE accounts(id int PRIMARY KEY, fence_token bigint); CREATE TABLE ledger(id int PRIMARY KEY, fence_token bigint); INSERT INTO ledger VALUES (1, NULL)"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := proxytest.Binary(t, dir)
	addr := freeAddr(t)
	configPath, authPath := filepath.Join(dir, "fenceproxy.yaml"), filepath.Join(dir, "userlist.txt")
	md5Secret := func(user, password string) string {
		h := md5.Sum([]byte(password + user))
		return "md5" + hex.EncodeToString(h[:])
	}
	writeAuth := func(extra string) {
		text := fmt.Sprintf("%q %q\n%q %q\n%s", "admin", md5Secret("admin", "adminpw"), pgtest.SuperUser, md5Secret(pgtest.SuperUser, "pw"), extra)
		if err := os.WriteFile(authPath, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeConfig := func(tables ...string) {
		var b strings.Builder
		fmt.Fprintf(&b, "listen: %s\nupstream:\n  address: %s\npool:\n  mode: transaction\n  size: 2\n  admin_users: [admin]\nauth:\n  type: md5\n  file: %s\ntables:\n", addr, cl.Addr(), authPath)
		for _, tb := range tables {
			fmt.Fprintf(&b, "  - name: %s\n    token_column: fence_token\n", tb)
		}
		if err := os.WriteFile(configPath, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeAuth("")
	writeConfig("public.accounts")
	pp := startServe(t, bin, configPath, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, proxytest.DSN(addr, pgtest.SuperUser, "pw", pgtest.TestDB))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	adm, err := pgx.Connect(ctx, proxytest.DSN(addr, "admin", "adminpw", "fenceproxy")+"&default_query_exec_mode=simple_protocol")
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close(ctx)
	write := "UPDATE ledger SET id = 1 WHERE id = 1"
	if _, err := c.Exec(ctx, write); err != nil {
		t.Fatalf("ledger is not protected yet: %v", err)
	}

	writeConfig("public.accounts", "ledger")
	writeAuth(`"someone" "a plaintext password"` + "\n") // refused: the proxy keeps no password in plain text
	var pgErr *pgconn.PgError
	if _, err := adm.Exec(ctx, "RELOAD"); !errors.As(err, &pgErr) || pgErr.Code != "55000" || !strings.Contains(pgErr.Message, "auth.file") {
		t.Fatalf("RELOAD with a broken auth.file: %v, want 55000 naming auth.file", err)
	}
	if _, err := c.Exec(ctx, write); err != nil {
		t.Fatalf("after a RELOAD that failed, the table list changed: %v\n%s", err, pp.stderr.String())
	}

	writeAuth("")
	if _, err := adm.Exec(ctx, "RELOAD"); err != nil {
		t.Fatalf("RELOAD: %v", err)
	}
	if _, err := c.Exec(ctx, write); !errors.As(err, &pgErr) || pgErr.Code != "55F02" {
		t.Fatalf("after RELOAD, a write to ledger without a token: want 55F02, got %v", err)
	}
}
