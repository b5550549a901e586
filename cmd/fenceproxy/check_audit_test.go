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

// `fenceproxy check` prints the audit's findings with their fixes, exits non-zero on an error finding, and
// gives the same report as JSON with --json.
func TestCheckAudit(t *testing.T) {
	cl := pgtest.MustStart(t, pgtest.Options{})
	if err := cl.Exec(`CREATE TABLE accounts (id int PRIMARY KEY, balance int, fence_token bigint);
CREATE VIEW accounts_v AS SELECT id, balance FROM accounts;`); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte(fmt.Sprintf("upstream:\n  address: %s\ntables:\n  - name: public.accounts\n    token_column: fence_token\n", cl.Addr())), 0o644)
	args := []string{"check", "--config", path, "--dsn", cl.SuperDSN(), "--proxy-address", "127.0.0.1"}
	var stdout, stderr bytes.Buffer
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("warnings only: exit %d, want 0\n%s%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{
		"ok    public.accounts: token column fence_token bigint",
		"warning public.accounts [guard-missing]",
		"warning public.accounts_v [view]",
		"warning role postgres [role-bypass]",
		"      fix: fenceproxy install --config FILE",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("check output lacks %q:\n%s", want, stdout.String())
		}
	}

	if err := cl.Exec(`CREATE FUNCTION settle() RETURNS void LANGUAGE sql AS $$UPDATE accounts SET balance = 0$$`); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	if code := run(args, &stdout, &stderr); code != 1 {
		t.Fatalf("an error finding: exit %d, want 1\n%s", code, stdout.String())
	}
	for _, want := range []string{
		"error   settle() [function]: function settle() writes public.accounts",
		"      fix: REVOKE EXECUTE ON FUNCTION settle() FROM PUBLIC",
		"1 problem(s)",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("check output lacks %q:\n%s", want, stdout.String())
		}
	}

	stdout.Reset()
	if code := run(append(args, "--json"), &stdout, &stderr); code != 1 {
		t.Fatalf("--json with an error finding: exit %d, want 1\n%s", code, stdout.String())
	}
	var report struct {
		Tables   []map[string]any  `json:"tables"`
		Findings []catalog.Finding `json:"findings"`
		Errors   int               `json:"errors"`
		Problems int               `json:"problems"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
		t.Fatalf("--json output is not one JSON object: %v\n%s", err, stdout.String())
	}
	if len(report.Tables) != 1 || report.Tables[0]["ok"] != true || report.Errors != 1 || report.Problems != 1 ||
		len(report.Findings) == 0 || report.Findings[0].Kind != catalog.KindFunction || report.Findings[0].Fix == "" {
		t.Fatalf("--json report: %s", stdout.String())
	}
}
