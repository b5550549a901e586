package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// With upstream.hosts, check reports each host's role and replication lag, and fails when no host or more than
// one is primary (here: the standby promoted while the old primary still runs).
func TestCheckReportsHostRoles(t *testing.T) {
	primary := pgtest.MustStart(t, pgtest.Options{})
	if err := primary.Exec("CREATE TABLE accounts(id int, fence_token bigint)"); err != nil {
		t.Fatal(err)
	}
	standby := pgtest.MustStartStandby(t, primary, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := standby.WaitReplayed(ctx, primary); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "c.yaml")
	yaml := fmt.Sprintf("upstream:\n  hosts: [%s, %s]\ntables:\n  - name: public.accounts\n    token_column: fence_token\n", primary.Addr(), standby.Addr())
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	dsn := primary.DSN(pgtest.SuperUser, "", pgtest.TestDB)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"check", "--config", path, "--dsn", dsn}, &stdout, &stderr); code != 0 {
		t.Fatalf("check: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"ok    host " + primary.Addr() + ": primary (1 standby(s), 0 synchronous, ",
		"ok    host " + standby.Addr() + ": standby (received, not replayed: "} {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}

	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	if code := run([]string{"check", "--config", path, "--dsn", dsn, "--json"}, &stdout, &stderr); code != 1 {
		t.Fatalf("check with two primaries: exit %d, want 1\n%s%s", code, stdout.String(), stderr.String())
	}
	var report checkReport
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
		t.Fatal(err)
	}
	if len(report.Hosts) != 2 || report.Hosts[0].Role != "primary" || report.Hosts[1].Role != "primary" || report.Problems == 0 {
		t.Errorf("check --json with two primaries: %+v", report)
	}
}
