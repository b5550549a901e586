package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// Without --dsn, check takes credentials from the PG* variables and the host and port from upstream.address, as
// the README's Quickstart does, against a server without TLS: libpq's default sslmode=prefer must fall back to
// plain TCP (check once dropped that fallback and failed with "server refused TLS connection").
func TestCheckWithoutDSNUsesPGVariables(t *testing.T) {
	cl := pgtest.MustStart(t, pgtest.Options{})
	if err := cl.Exec("CREATE TABLE accounts(id int, fence_token bigint)"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "c.yaml")
	yaml := fmt.Sprintf("upstream:\n  address: %s\ntables:\n  - name: public.accounts\n    token_column: fence_token\n", cl.Addr())
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"PGSSLMODE", "PGPASSWORD", "PGSERVICE"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	// As the Quickstart exports them: a TCP host, so sslmode=prefer tries TLS first.
	t.Setenv("PGHOST", cl.Host())
	t.Setenv("PGPORT", strconv.Itoa(cl.Port()))
	t.Setenv("PGUSER", pgtest.SuperUser)
	t.Setenv("PGDATABASE", pgtest.TestDB)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"check", "--config", path}, &stdout, &stderr); code != 0 {
		t.Fatalf("check: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "ok    public.accounts: token column fence_token bigint") {
		t.Fatalf("check output:\n%s", stdout.String())
	}
}

// Run by hand with neither --dsn nor PGUSER and PGPASSWORD, check logs in as the OS user with no password; its
// error then says where the credentials come from (an operator's pass, 2026-12-03).
func TestCheckWithoutCredentialsSaysWhereTheyComeFrom(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	// A port nothing listens on: the login fails, whatever the machine runs.
	yaml := "upstream:\n  address: 127.0.0.1:1\ntables:\n  - name: public.accounts\n    token_column: fence_token\n"
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"PGUSER", "PGPASSWORD", "PGSERVICE", "PGSSLMODE"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"check", "--config", path}, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), "--dsn or the PG* environment variables") {
		t.Fatalf("check without credentials: exit %d\n%s", code, stderr.String())
	}
}
