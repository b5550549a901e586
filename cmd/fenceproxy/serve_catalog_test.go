package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// `fenceproxy serve` with a catalog section: partitions of a protected table are fenced from the start, and a
// partition created later (directly on the server) is fenced after SIGHUP.
func TestServeCatalogSIGHUP(t *testing.T) {
	cl := pgtest.MustStart(t, pgtest.Options{})
	if err := cl.Exec(`CREATE TABLE accounts (id int, region text, balance int, fence_token bigint) PARTITION BY LIST (region);
CREATE TABLE accounts_eu PARTITION OF accounts FOR VALUES IN ('eu')`); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := proxytest.Binary(t, dir)
	addr := freeAddr(t)
	configPath := filepath.Join(dir, "fenceproxy.yaml")
	pw := filepath.Join(dir, "pw")
	os.WriteFile(pw, []byte("unused-with-trust\n"), 0o600)
	cfg := fmt.Sprintf("listen: %s\nupstream:\n  address: %s\ntables:\n  - name: public.accounts\n    token_column: fence_token\n"+
		"catalog:\n  user: %s\n  database: %s\n  password_file: %s\n  refresh: 1h\n", addr, cl.Addr(), pgtest.SuperUser, pgtest.TestDB, pw)
	if err := os.WriteFile(configPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	pp := startServe(t, bin, configPath, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, proxytest.DSN(addr, pgtest.SuperUser, "", pgtest.TestDB))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	code := func(sql string) string {
		_, err := c.Exec(ctx, sql)
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return pe.Code
		}
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return ""
	}
	if got := code("UPDATE accounts_eu SET balance = 1"); got != "55F02" {
		t.Fatalf("partition of a protected table, no token: want 55F02, got %q\n%s", got, pp.stderr.String())
	}
	if err := cl.Exec("CREATE TABLE accounts_us PARTITION OF accounts FOR VALUES IN ('us')"); err != nil {
		t.Fatal(err)
	}
	if got := code("UPDATE accounts_us SET balance = 1"); got != "" {
		t.Fatalf("a partition created after the last read is not known yet (refresh: 1h): got %q", got)
	}
	if err := pp.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for code("UPDATE accounts_us SET balance = 1") != "55F02" {
		if time.Now().After(deadline) {
			t.Fatalf("the new partition is not fenced after SIGHUP:\n%s", pp.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A catalog that cannot be read at start stops the start, with the reason.
func TestServeCatalogUnreadable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte(fmt.Sprintf("listen: %s\nupstream:\n  address: %s\n  connect_timeout: 2s\ntables:\n  - name: accounts\n    token_column: fence_token\ncatalog:\n  user: nobody\n", freeAddr(t), dead)), 0o644)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"serve", "--config", path}, &stdout, &stderr); code != 1 {
		t.Fatalf("serve with an unreadable catalog: exit %d, want 1\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "catalog: connect") || !strings.Contains(stderr.String(), "the first catalog read must succeed") {
		t.Fatalf("stderr does not say why: %s", stderr.String())
	}
}
