package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// TestInstallCLI drives fenceproxy install (--print, twice for idempotence, --ddl-guard) and uninstall against
// a real server.
func TestInstallCLI(t *testing.T) {
	pg := pgtest.MustStart(t, pgtest.Options{})
	if err := pg.Exec("CREATE TABLE accounts (id int PRIMARY KEY, fence_token bigint)"); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(t.TempDir(), "fenceproxy.yaml")
	os.WriteFile(cfgFile, []byte("upstream:\n  address: "+pg.Addr()+"\ntables:\n  - name: accounts\n    token_column: fence_token\n"), 0o644)
	dsn := pg.SuperDSN()
	cli := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := run(args, &out, &errOut)
		return code, out.String() + errOut.String()
	}
	// --print: the SQL on stdout, what it does to which table on stderr.
	var printed, summary bytes.Buffer
	code := run([]string{"install", "--config", cfgFile, "--dsn", dsn, "--print"}, &printed, &summary)
	out := printed.String()
	if code != 0 || !strings.HasPrefix(out, "BEGIN;") || !strings.HasSuffix(out, "COMMIT;\n") || !strings.Contains(out, `CREATE OR REPLACE TRIGGER "~fenceproxy_guard" BEFORE INSERT OR UPDATE OR DELETE ON "public"."accounts"`) ||
		!strings.Contains(out, "CREATE TABLE fenceproxy.lock_marks") || !strings.Contains(summary.String(), `guarded "public"."accounts" (protected as accounts)`) {
		t.Fatalf("install --print: %d\n%s\n--- stderr ---\n%s", code, out, summary.String())
	}
	if err := pg.Exec("SELECT 1 FROM fenceproxy.version"); err == nil {
		t.Fatal("install --print changed the database")
	}
	// The printed SQL is what a DBA applies by hand: psql runs it, and the result is a complete install.
	psql := pg.Psql("-q")
	psql.Stdin = strings.NewReader(out)
	if b, err := psql.CombinedOutput(); err != nil {
		t.Fatalf("psql < install --print: %v\n%s", err, b)
	}
	if code, out := cli("install", "--config", cfgFile, "--dsn", dsn, "--print"); code != 0 || strings.Contains(out, "INSERT INTO fenceproxy.version") {
		t.Fatalf("install --print after the printed install applies steps again: %d\n%s", code, out)
	}
	if err := pg.Exec("INSERT INTO accounts VALUES (1, 5)"); err == nil || !strings.Contains(err.Error(), "55F02") {
		t.Fatalf("write without a token after the printed install: %v", err)
	}
	for i := 0; i < 2; i++ {
		if code, out := cli("install", "--config", cfgFile, "--dsn", dsn); code != 0 || !strings.Contains(out, ": fenceproxy schema at step") {
			t.Fatalf("install #%d: %d\n%s", i+1, code, out)
		}
	}
	if err := pg.Exec("INSERT INTO accounts VALUES (1, 5)"); err == nil || !strings.Contains(err.Error(), "55F02") {
		t.Fatalf("write without a token after install: %v", err)
	}
	if code, out := cli("install", "--config", cfgFile, "--dsn", dsn, "--ddl-guard"); code != 0 || !strings.Contains(out, "DDL guard on") {
		t.Fatalf("install --ddl-guard: %d\n%s", code, out)
	}
	if err := pg.Exec("DROP TABLE accounts"); err == nil || !strings.Contains(err.Error(), "55F04") {
		t.Fatalf("DROP TABLE under the DDL guard: %v", err)
	}
	if code, out := cli("uninstall", "--config", cfgFile, "--dsn", dsn); code != 0 {
		t.Fatalf("uninstall: %d\n%s", code, out)
	}
	if err := pg.Exec("INSERT INTO accounts VALUES (1, 5); DROP TABLE accounts"); err != nil {
		t.Fatalf("after uninstall: %v", err)
	}
	if code, out := cli("install", "--config", cfgFile, "--dsn", dsn); code != 1 || !strings.Contains(out, "database "+pgtest.TestDB+" holds none of the protected tables (accounts): no such table") {
		t.Fatalf("install for a missing table: %d\n%s", code, out)
	}
}

// TestLockOptionReachesServer: the PGOPTIONS fenceproxy lock gives CMD (tokens.PGOptionsLock) names the lock
// exactly, whatever characters the name has, and the token stays the token.
func TestLockOptionReachesServer(t *testing.T) {
	pg := pgtest.MustStart(t, pgtest.Options{})
	for _, name := range []string{"settle", "my lock", `back\slash`, "a -c fence.token=9"} {
		cfg, err := pgx.ParseConfig(pg.SuperDSN())
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["options"] = tokens.PGOptionsLock("", "", 7, "", name)
		c, err := pgx.ConnectConfig(context.Background(), cfg)
		if err != nil {
			t.Fatalf("%q: %v", name, err)
		}
		var got, tok string
		err = c.QueryRow(context.Background(), "SELECT current_setting('fence.lock'), coalesce(current_setting('fence.token', true), '')").Scan(&got, &tok)
		c.Close(context.Background())
		if err != nil || got != name || tok != "7" {
			t.Fatalf("lock %q: server has %q (token %q), %v", name, got, tok, err)
		}
	}
}

// TestCheckReportsChangedGuard: `fenceproxy check` runs install's inspection: a guard function changed by hand
// (or left by an older binary) is an error finding with its fix, and the check exits 1; after install again
// the finding is gone.
func TestCheckReportsChangedGuard(t *testing.T) {
	pg := pgtest.MustStart(t, pgtest.Options{})
	if err := pg.Exec("CREATE TABLE accounts (id int PRIMARY KEY, fence_token bigint)"); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(t.TempDir(), "fenceproxy.yaml")
	os.WriteFile(cfgFile, []byte("upstream:\n  address: "+pg.Addr()+"\ntables:\n  - name: accounts\n    token_column: fence_token\n"), 0o644)
	cli := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := run(args, &out, &errOut)
		return code, out.String() + errOut.String()
	}
	if code, out := cli("install", "--config", cfgFile, "--dsn", pg.SuperDSN()); code != 0 {
		t.Fatalf("install: %d\n%s", code, out)
	}
	if code, out := cli("check", "--config", cfgFile, "--dsn", pg.SuperDSN()); strings.Contains(out, "guard-outdated") {
		t.Fatalf("check right after install: %d\n%s", code, out)
	}
	if err := pg.Exec(`CREATE OR REPLACE FUNCTION fenceproxy.guard_truncate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`); err != nil {
		t.Fatal(err)
	}
	code, out := cli("check", "--config", cfgFile, "--dsn", pg.SuperDSN())
	if code != 1 || !strings.Contains(out, "[guard-outdated]") || !strings.Contains(out, "fenceproxy install") {
		t.Fatalf("check with a changed guard: exit %d\n%s", code, out)
	}
	if code, out := cli("install", "--config", cfgFile, "--dsn", pg.SuperDSN()); code != 0 {
		t.Fatalf("install again: %d\n%s", code, out)
	}
	if _, out := cli("check", "--config", cfgFile, "--dsn", pg.SuperDSN()); strings.Contains(out, "guard-outdated") {
		t.Fatalf("check after install again:\n%s", out)
	}
}
