package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// TestCheckRevision: `fenceproxy check` with etcd warns, and exits non-zero, when rows hold tokens above etcd's
// current revision plus token.offset (an etcd restored from an older snapshot), and prints both cures with the
// numbers that work.
func TestCheckRevision(t *testing.T) {
	t.Parallel()
	cl := pgtest.MustStart(t, pgtest.Options{})
	e := etcdtest.Start(t)
	admin := e.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 10 {
		if _, err := admin.Put(ctx, "/check-test/noise", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := admin.Get(ctx, "/check-test/noise", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	rev := resp.Header.Revision // nothing writes to etcd from here on, so the check sees this revision

	const high = 1_000_000_000
	if err := cl.Exec(fmt.Sprintf(`
CREATE TABLE payouts (id int PRIMARY KEY, fence_token bigint);
INSERT INTO payouts VALUES (1, 5), (2, %d), (3, NULL);
CREATE TABLE ledger (id int PRIMARY KEY, fence_token bigint);
INSERT INTO ledger VALUES (1, %d), (2, NULL);
CREATE TABLE empty (id int PRIMARY KEY, fence_token bigint);
CREATE TABLE wrongtype (id int PRIMARY KEY, fence_token int);
INSERT INTO wrongtype VALUES (1, 2000000000);`, high, rev)); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	dsn := cl.SuperDSN()
	endpoints := strings.Join(e.Endpoints(), ",")
	// config writes a configuration protecting the tables, with etcd endpoints and offset when given.
	config := func(name, endpoints string, offset int64, tables ...string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "upstream:\n  address: %s\ntables:\n", cl.Addr())
		for _, tb := range tables {
			fmt.Fprintf(&b, "  - name: %s\n    token_column: fence_token\n", tb)
		}
		fmt.Fprintf(&b, "token:\n  offset: %d\n", offset)
		if endpoints != "" {
			fmt.Fprintf(&b, "  verify:\n    etcd:\n      endpoints: [%s]\n", endpoints)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	check := func(args ...string) (int, string) {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"check", "--dsn", dsn}, args...), &stdout, &stderr)
		return code, stdout.String() + stderr.String()
	}
	wantLines := func(out string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("check output lacks %q:\n%s", w, out)
			}
		}
	}

	// Endpoints from the configuration; payouts holds a token etcd never reached.
	cure := high - rev + 1
	restored := config("restored.yaml", endpoints, 0, "public.payouts", "ledger", "empty")
	code, out := check("--config", restored)
	if code == 0 {
		t.Fatalf("check with a row token above the revision exited 0:\n%s", out)
	}
	t.Logf("check output:\n%s", out)
	wantLines(out,
		fmt.Sprintf("WARN  public.payouts: rows hold tokens up to %d, above etcd's current revision %d + token.offset 0 = %d", high, rev, rev),
		"restored from a snapshot with smaller revisions",
		fmt.Sprintf("set token.offset to at least %d (= %d - %d + 1)", cure, high, rev),
		fmt.Sprintf("etcdutl snapshot restore SNAPSHOT --bump-revision %d --mark-compacted", high+1),
		fmt.Sprintf("ok    public.ledger: highest fence_token %d is within etcd revision %d", rev, rev),
		"ok    public.empty: no tokens yet",
		"1 problem(s)",
	)
	if strings.Contains(out, "WARN  public.ledger") || strings.Contains(out, "WARN  public.empty") {
		t.Errorf("warning for a table whose tokens are fine:\n%s", out)
	}

	// The first cure: the printed offset is enough, one less is not.
	if code, out := check("--config", config("offset.yaml", endpoints, cure, "public.payouts", "ledger")); code != 0 {
		t.Errorf("check with token.offset %d: exit %d\n%s", cure, code, out)
	} else {
		wantLines(out, fmt.Sprintf("ok    public.payouts: highest fence_token %d is within etcd revision %d + token.offset %d", high, rev, cure))
	}
	if code, out := check("--config", config("offset-short.yaml", endpoints, cure-2, "public.payouts")); code == 0 {
		t.Errorf("check with token.offset %d (short of %d) exited 0:\n%s", cure-2, cure, out)
	} else {
		// The offset in force counts: the remedy is the same offset, the bump smaller.
		wantLines(out, fmt.Sprintf("token.offset to at least %d", cure), fmt.Sprintf("--bump-revision %d", high-(cure-2)+1))
	}

	// Rows below the revision: fine, with etcd from --etcd instead of the configuration.
	if code, out := check("--config", config("noetcd.yaml", "", 0, "ledger", "empty"), "--etcd", endpoints); code != 0 {
		t.Errorf("check of tokens within the revision: exit %d\n%s", code, out)
	} else {
		wantLines(out, fmt.Sprintf("ok    public.ledger: highest fence_token %d is within", rev))
	}

	// --etcd "" turns the check off; without endpoints there is none (TestCheck covers that too).
	for _, args := range [][]string{
		{"--config", restored, "--etcd", ""},
		{"--config", config("none.yaml", "", 0, "public.payouts")},
	} {
		code, out := check(args...)
		if code != 0 || strings.Contains(out, "etcd") {
			t.Errorf("check %v without etcd: exit %d, output mentions etcd:\n%s", args, code, out)
		}
	}

	// A table whose column is not bigint is reported as such, not read for tokens.
	if code, out := check("--config", config("wrongtype.yaml", endpoints, 0, "wrongtype")); code == 0 || strings.Contains(out, "WARN") {
		t.Errorf("wrongtype: exit %d\n%s", code, out)
	}
}

// TestCheckRevisionEtcdUnreachable: etcd configured but not answering is a problem, not a silent skip.
func TestCheckRevisionEtcdUnreachable(t *testing.T) {
	t.Parallel()
	cl := pgtest.MustStart(t, pgtest.Options{})
	if err := cl.Exec("CREATE TABLE payouts (id int PRIMARY KEY, fence_token bigint); INSERT INTO payouts VALUES (1, 5)"); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	path := filepath.Join(t.TempDir(), "c.yaml")
	yaml := fmt.Sprintf("upstream:\n  address: %s\ntables:\n  - name: payouts\n    token_column: fence_token\ntoken:\n  verify:\n    etcd:\n      endpoints: [%s]\n", cl.Addr(), dead)
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	exited := make(chan int, 1)
	go func() { exited <- run([]string{"check", "--config", path, "--dsn", cl.SuperDSN()}, &stdout, &stderr) }()
	// check must give up on etcd rather than wait for it. The bound is far above its etcd timeout, so that only
	// a hang (no timeout applied) fails it, not a slow machine.
	var code int
	select {
	case code = <-exited:
	case <-time.After(2 * time.Minute):
		t.Fatal("check still running 2 minutes after it started, with etcd unreachable: it waits for etcd without a timeout")
	}
	if code == 0 || !strings.Contains(stdout.String(), "FAIL  etcd "+dead) || !strings.Contains(stdout.String(), "unreachable") {
		t.Fatalf("check with etcd unreachable: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}
