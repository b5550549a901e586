package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
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

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// proxyProcess runs `fenceproxy serve` as a real process.
type proxyProcess struct {
	cmd    *exec.Cmd
	addr   string
	stderr *proxytest.SyncBuffer
	done   chan error
}

func startServe(t *testing.T, bin, configPath, addr string) *proxyProcess {
	t.Helper()
	pp := &proxyProcess{addr: addr, stderr: &proxytest.SyncBuffer{}, done: make(chan error, 1)}
	pp.cmd = exec.Command(bin, "serve", "--config", configPath)
	pp.cmd.Stderr = pp.stderr
	if err := pp.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { pp.done <- pp.cmd.Wait() }()
	t.Cleanup(func() {
		pp.cmd.Process.Kill()
		<-pp.done
		if t.Failed() {
			t.Logf("fenceproxy stderr:\n%s", pp.stderr.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return pp
		}
		select {
		case err := <-pp.done:
			pp.done <- err // for the cleanup
			t.Fatalf("fenceproxy exited at start: %v\n%s", err, pp.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("fenceproxy did not listen on %s:\n%s", addr, pp.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestServeReloadAndDrain(t *testing.T) {
	cl := pgtest.MustStart(t, pgtest.Options{})
	if err := cl.Exec("CREATE TABLE accounts(id int PRIMARY KEY, balance int, fence_token bigint); CREATE TABLE ledger(id int PRIMARY KEY, fence_token bigint); INSERT INTO accounts VALUES (1, 0, NULL); INSERT INTO ledger VALUES (1, NULL)"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := proxytest.Binary(t, dir)
	addr, metricsAddr := freeAddr(t), freeAddr(t)
	configPath := filepath.Join(dir, "fenceproxy.yaml")
	writeConfig := func(tables ...string) {
		var b strings.Builder
		fmt.Fprintf(&b, "listen: %s\nmetrics:\n  listen: %s\nupstream:\n  address: %s\ntables:\n", addr, metricsAddr, cl.Addr())
		for _, tb := range tables {
			fmt.Fprintf(&b, "  - name: %s\n    token_column: fence_token\n", tb)
		}
		if err := os.WriteFile(configPath, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeConfig("public.accounts")
	pp := startServe(t, bin, configPath, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, proxytest.DSN(addr, pgtest.SuperUser, "", pgtest.TestDB))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var pgErr *pgconn.PgError
	if _, err := c.Exec(ctx, "UPDATE accounts SET balance = 1 WHERE id = 1"); !errors.As(err, &pgErr) || pgErr.Code != "55F02" {
		t.Fatalf("write to a protected table without a token: want 55F02, got %v", err)
	}
	if _, err := c.Exec(ctx, "UPDATE ledger SET id = 1 WHERE id = 1"); err != nil {
		t.Fatalf("ledger is not protected yet: %v", err)
	}

	// A stale write moves the stale-rejection series on /metrics.
	for _, q := range []string{"SET fence.token = 2", "UPDATE accounts SET balance = 2 WHERE id = 1", "SET fence.token = 1"} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if _, err := c.Exec(ctx, "UPDATE accounts SET balance = 1 WHERE id = 1"); !errors.As(err, &pgErr) || pgErr.Code != "55F01" {
		t.Fatalf("stale write: want 55F01, got %v", err)
	}
	metrics := httpGet(t, "http://"+metricsAddr+"/metrics")
	for _, want := range []string{
		`fenceproxy_stale_rejections_total{table="public.accounts"} 1`,
		`fenceproxy_refusals_total{code="55F01",table="public.accounts"} 1`,
		`fenceproxy_refusals_total{code="55F02",table="public.accounts"} 1`,
		"fenceproxy_sessions_current 1",
		"fenceproxy_rewrite_cache_misses_total",
		`fenceproxy_messages_forwarded_total{direction="client_to_server"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if got := httpGet(t, "http://"+metricsAddr+"/healthz"); got != "ok\n" {
		t.Errorf("/healthz = %q", got)
	}
	// Profiles are not served unless metrics.pprof asks for them.
	if resp, err := http.Get("http://" + metricsAddr + "/debug/pprof/"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("/debug/pprof/ on a default config: %v %v, want 404", resp, err)
	} else {
		resp.Body.Close()
	}
	if _, err := c.Exec(ctx, "RESET fence.token"); err != nil {
		t.Fatal(err)
	}

	// SIGHUP: the new table list applies to the running session too.
	writeConfig("public.accounts", "ledger")
	pp.cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.Exec(ctx, "UPDATE ledger SET id = 1 WHERE id = 1")
		if errors.As(err, &pgErr) && pgErr.Code == "55F02" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after SIGHUP, ledger is still not protected: %v\n%s", err, pp.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The start and reload lines name the tables, and the default log.connections (info) logs the session.
	for _, want := range []string{
		`msg="fenceproxy listening"`, "tables=public.accounts ",
		`msg="reloaded the table list" tables=public.accounts,ledger`,
		`msg="connection started" client=127.0.0.1:`,
	} {
		waitFor(t, 10*time.Second, "a log line with "+want, func() bool { return strings.Contains(pp.stderr.String(), want) })
	}
	// A reload with a broken file keeps the running configuration.
	os.WriteFile(configPath, []byte("listen: [\n"), 0o644)
	pp.cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the failed reload to be logged", func() bool { return strings.Contains(pp.stderr.String(), "reload failed") })
	if _, err := c.Exec(ctx, "UPDATE ledger SET id = 1 WHERE id = 1"); !errors.As(err, &pgErr) || pgErr.Code != "55F02" {
		t.Fatalf("after a failed reload: want 55F02, got %v", err)
	}

	// SIGTERM: an open transaction may finish; then the process exits 0.
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pp.cmd.Process.Signal(syscall.SIGTERM)
	waitFor(t, 10*time.Second, "the drain to start", func() bool { return strings.Contains(pp.stderr.String(), "draining") })
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("transaction during drain: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit during drain: %v", err)
	}
	select {
	case err := <-pp.done:
		pp.done <- err
		if err != nil {
			t.Fatalf("fenceproxy exit after SIGTERM: %v\n%s", err, pp.stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("fenceproxy did not exit after SIGTERM and the last transaction")
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}

func TestServeRejectsBadConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bad.yaml")
	os.WriteFile(path, []byte("upstream:\n  address: 127.0.0.1:5432\ntables:\n  - name: accounts\n    tokn_column: x\n"), 0o644)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"serve", "--config", path}, &stdout, &stderr); code == 0 {
		t.Fatal("serve with a bad config exited 0")
	}
	if want := path + `:5: tables[0].tokn_column: unknown key; did you mean "token_column"? (so tables[0].token_column is missing: required)`; !strings.Contains(stderr.String(), want) {
		t.Fatalf("stderr %q does not contain %q", stderr.String(), want)
	}
	if code := run([]string{"serve"}, &stdout, &stderr); code != 2 {
		t.Fatalf("serve without --config: exit %d", code)
	}
}

func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"version"}, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "fenceproxy ") {
		t.Fatalf("version: %d %q %q", code, stdout.String(), stderr.String())
	}
	if code := run([]string{"frobnicate"}, &stdout, &stderr); code != 2 {
		t.Fatalf("unknown command: exit %d", code)
	}
}

func TestCheck(t *testing.T) {
	cl := pgtest.MustStart(t, pgtest.Options{})
	if err := cl.Exec("CREATE TABLE good(id int, fence_token bigint); CREATE TABLE wrongtype(id int, fence_token int); CREATE TABLE nocol(id int)"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	write := func(tables ...string) {
		var b strings.Builder
		fmt.Fprintf(&b, "upstream:\n  address: %s\ntables:\n", cl.Addr())
		for _, tb := range tables {
			fmt.Fprintf(&b, "  - name: %s\n    token_column: fence_token\n", tb)
		}
		os.WriteFile(path, []byte(b.String()), 0o644)
	}
	dsn := cl.SuperDSN()
	write("public.good")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"check", "--config", path, "--dsn", dsn}, &stdout, &stderr); code != 0 {
		t.Fatalf("check of a good table: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "ok    public.good") {
		t.Fatalf("check output: %s", stdout.String())
	}
	write("good", "wrongtype", "nocol", "missing")
	stdout.Reset()
	if code := run([]string{"check", "--config", path, "--dsn", dsn}, &stdout, &stderr); code == 0 {
		t.Fatalf("check with problems exited 0:\n%s", stdout.String())
	}
	for _, want := range []string{
		`ALTER TABLE "public"."wrongtype" ALTER COLUMN "fence_token" TYPE bigint;`,
		`ALTER TABLE "public"."nocol" ADD COLUMN "fence_token" bigint;`,
		"error   missing [table-missing]: no such table in database " + pgtest.TestDB,
		`fix: CREATE TABLE "missing" (id bigint PRIMARY KEY, "fence_token" bigint);`,
		"3 problem(s)",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("check output lacks %q:\n%s", want, stdout.String())
		}
	}
}
