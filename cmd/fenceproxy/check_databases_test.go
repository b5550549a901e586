package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fenceproxy/fenceproxy/catalog"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// One proxy, two databases, each holding one of the protected tables (the case): install guards what
// each database holds and names what it skips and what it un-guards, in which database; check after install
// shows no warning for a guarded table (role-bypass compares qualified names, whatever the search_path), and a
// run over both databases reports each on its own, the table that lives in the other one as a warning there.
func TestInstallAndCheckAcrossDatabases(t *testing.T) {
	cl := pgtest.MustStart(t, pgtest.Options{})
	if err := cl.Exec("CREATE DATABASE billing"); err != nil {
		t.Fatal(err)
	}
	if err := cl.Exec("CREATE TABLE accounts (id int PRIMARY KEY, fence_token bigint); CREATE TABLE ledger (id int PRIMARY KEY, fence_token bigint)"); err != nil {
		t.Fatal(err)
	}
	if err := cl.ExecIn("billing", "CREATE TABLE invoices (id int PRIMARY KEY, fence_token bigint)"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeConfig := func(name string, tables ...string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "upstream:\n  address: %s\ntables:\n", cl.Addr())
		for _, tb := range tables {
			fmt.Fprintf(&b, "  - name: %s\n    token_column: fence_token\n", tb)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	full := writeConfig("full.yaml", "public.accounts", "public.ledger", "public.invoices")
	app, billing := cl.SuperDSN(), cl.DSN(pgtest.SuperUser, "", "billing")
	cli := func(want int, args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != want {
			t.Fatalf("%v: exit %d, want %d\n%s%s", args, code, want, out.String(), errOut.String())
		}
		return out.String() + errOut.String()
	}
	wantLines := func(out string, lines ...string) {
		t.Helper()
		for _, l := range lines {
			if !strings.Contains(out, l) {
				t.Errorf("output lacks %q:\n%s", l, out)
			}
		}
	}

	app1 := pgtest.TestDB
	out := cli(0, "install", "--config", full, "--dsn", app)
	wantLines(out,
		"ok    database "+app1+`: guarded "public"."accounts" (protected as public.accounts)`,
		"ok    database "+app1+`: guarded "public"."ledger" (protected as public.ledger)`,
		"WARN  database "+app1+": public.invoices: no such table here, not guarded in this database",
		"ok    database "+app1+": fenceproxy schema at step",
		"guard on 2 of 3 protected table(s)")
	out = cli(0, "install", "--config", full, "--dsn", billing)
	wantLines(out, `ok    database billing: guarded "public"."invoices"`, "WARN  database billing: public.accounts: no such table here")
	if err := cl.ExecIn("billing", "INSERT INTO invoices VALUES (1, NULL)"); err == nil || !strings.Contains(err.Error(), "55F02") {
		t.Fatalf("invoices is not guarded in billing: %v", err)
	}

	// check after install: the guarded public tables get no warning; the audit's role-bypass line is info.
	out = cli(1, "check", "--config", full, "--dsn", app, "--proxy-address", "127.0.0.1")
	if strings.Contains(out, "warning") {
		t.Errorf("check after install warns:\n%s", out)
	}
	wantLines(out, "info    role "+pgtest.SuperUser+" [role-bypass]: role "+pgtest.SuperUser+" may write public.accounts, public.ledger",
		"error   public.invoices [table-missing]: no such table in database "+app1,
		`fix: CREATE TABLE "public"."invoices" (id bigint PRIMARY KEY, "fence_token" bigint);`)
	if strings.Contains(out, "guard-outdated") {
		t.Errorf("a missing table is reported as an outdated guard:\n%s", out)
	}

	// Both databases in one run: each reported on its own; a table in the other database is a warning.
	out = cli(0, "check", "--config", full, "--dsn", app, "--dsn", billing, "--proxy-address", "127.0.0.1")
	wantLines(out, "== database "+app1, "== database billing",
		"warning public.invoices [table-missing]: no such table in database "+app1+" (it is in database billing)",
		"warning public.accounts [table-missing]: no such table in database billing (it is in database "+app1+")")
	var report struct {
		Databases []string          `json:"databases"`
		Findings  []catalog.Finding `json:"findings"`
	}
	if err := json.Unmarshal([]byte(cli(0, "check", "--config", full, "--dsn", app, "--dsn", billing, "--json")), &report); err != nil {
		t.Fatal(err)
	}
	if len(report.Databases) != 2 || len(report.Findings) == 0 || report.Findings[0].Database == "" {
		t.Errorf("--json over two databases: %+v", report)
	}

	// A narrower configuration un-guards ledger, and says so.
	narrow := writeConfig("narrow.yaml", "public.accounts")
	out = cli(0, "install", "--config", narrow, "--dsn", app)
	wantLines(out, "WARN  database "+app1+`: un-guarded "public"."ledger": the configuration no longer protects it`)
}
