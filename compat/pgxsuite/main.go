// Command pgxsuite runs pgx's own test suite (a real client's suite that no one here wrote) twice against a
// throwaway PostgreSQL: directly, and through `fenceproxy serve` with a configuration that names a protected
// table and nothing else (no catalog section, no other key). It reports the pass counts of both runs and every
// test that passes directly but not through the proxy, and exits 1 when there is one.
//
//	go run ./compat/pgxsuite [-mode session|transaction] [-direct=false] [-run REGEXP] [-keep] [-src DIR]
//
// -mode transaction runs the proxy as a transaction pooler (pool.mode: transaction, auth.type: trust). Tests
// that need session state a pooled server connection cannot keep (a temporary table across transactions,
// LISTEN, a session advisory lock, ...) fail there by design; they are listed, each with why, in
// transaction-exceptions.txt beside this file, and the list is enforced both ways: a listed test that passes,
// or an unlisted one that is lost, fails the run. -direct=false skips the direct run (compat's
// TestPgxSuiteTransactionMode runs it so): a test is then lost when it fails through the proxy.
//
// The pgx source is the module fenceproxy depends on (`go list -m github.com/jackc/pgx/v5`, in the module
// cache); its tests read PGX_TEST_DATABASE. The database gets what pgx's CI setup gives it
// (testsetup/postgresql_setup.sql: hstore, ltree, the uint64 domain, its roles) and a protected table
// public.accounts that pgx never touches. Tests that need other PGX_TEST_* variables skip in both runs.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/freeport"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// database is the database pgx's tests use (its CI's name).
const database = "pgx_test"

// setupSQL is pgx's testsetup/postgresql_setup.sql without its psql-only part (a role named after the OS
// user), and the protected table. Each statement runs on its own; one that fails fails the run.
var setupSQL = []string{
	"CREATE EXTENSION hstore",
	"CREATE EXTENSION ltree",
	"CREATE DOMAIN uint64 AS numeric(20,0)",
	"CREATE USER pgx_ssl WITH SUPERUSER PASSWORD 'secret'",
	"CREATE USER pgx_sslcert WITH SUPERUSER PASSWORD 'secret'",
	"SET password_encryption = md5",
	"CREATE USER pgx_md5 WITH SUPERUSER PASSWORD 'secret'",
	"SET password_encryption = 'scram-sha-256'",
	"CREATE USER pgx_pw WITH SUPERUSER PASSWORD 'secret'",
	"CREATE USER pgx_scram WITH SUPERUSER PASSWORD 'secret'",
	"CREATE USER pgx_oauth WITH SUPERUSER",
	`CREATE USER " tricky, ' } "" \ test user " SUPERUSER PASSWORD 'secret'`,
	"CREATE TABLE public.accounts (id int PRIMARY KEY, balance int NOT NULL DEFAULT 0, fence_token bigint)",
}

// proxyConfig names the protected table and nothing else.
const proxyConfig = `listen: %s
upstream:
  address: %s
tables:
  - name: accounts
    token_column: fence_token
`

// poolConfig makes the proxy a transaction pooler (-mode transaction): pgx's tests run in parallel within a
// package and some hold several connections at once, so the pool is not the smallest; the proxy authenticates
// the clients itself (trust, as the throwaway cluster does), which transaction mode requires.
const poolConfig = `pool:
  mode: transaction
  size: 20
auth:
  type: trust
`

// exceptionsFile lists the tests that fail in transaction mode because they need session state (beside this
// file; -src is the checkout).
const exceptionsFile = "compat/pgxsuite/transaction-exceptions.txt"

func main() {
	var o options
	flag.StringVar(&o.mode, "mode", "session", "the proxy's pool.mode: session or transaction")
	flag.BoolVar(&o.direct, "direct", true, "also run the suite directly, and count as lost only the tests that pass there")
	flag.StringVar(&o.run, "run", "", "only the tests matching this regexp (go test -run)")
	flag.BoolVar(&o.keep, "keep", false, "keep the go test -json outputs in the working directory")
	flag.StringVar(&o.src, "src", ".", "the fenceproxy checkout whose ./cmd/fenceproxy is built and run")
	flag.Parse()
	log.SetFlags(0)
	if o.mode != "session" && o.mode != "transaction" {
		log.Fatalf("-mode %q: want session or transaction", o.mode)
	}
	if err := suite(o); err != nil {
		log.Fatal(err)
	}
}

type options struct {
	mode, run, src string
	direct, keep   bool
}

func suite(o options) error {
	run, keep, src := o.run, o.keep, o.src
	var exceptions map[string]string
	if o.mode == "transaction" {
		var err error
		if exceptions, err = readExceptions(filepath.Join(src, exceptionsFile)); err != nil {
			return err
		}
	}
	ctx := context.Background()
	pgxDir, err := moduleDir("github.com/jackc/pgx/v5")
	if err != nil {
		return err
	}
	cluster, err := pgtest.Start(pgtest.Options{})
	if err != nil {
		return err
	}
	defer cluster.Stop()
	if err := setup(ctx, cluster); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "pgxsuite")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	cfg := proxyConfig
	if o.mode == "transaction" {
		cfg += poolConfig
	}
	proxyAddr, stop, err := startProxy(ctx, src, tmp, cluster.Addr(), cfg)
	if err != nil {
		return err
	}
	defer stop()

	var direct map[string]string
	if o.direct {
		if direct, err = goTest(pgxDir, cluster.DSN(pgtest.SuperUser, "", database), run, keep, "direct"); err != nil {
			return err
		}
	}
	host, port, _ := net.SplitHostPort(proxyAddr)
	proxied, err := goTest(pgxDir, fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", host, port, pgtest.SuperUser, database),
		run, keep, "proxy")
	if err != nil {
		return err
	}
	fmt.Printf("pgx %s, pool.mode %s\n", filepath.Base(pgxDir), o.mode)
	for _, r := range []struct {
		name string
		res  map[string]string
	}{{"direct", direct}, {"through fenceproxy", proxied}} {
		if r.res != nil {
			fmt.Printf("%-20s pass %d  fail %d  skip %d\n", r.name, count(r.res, "pass"), count(r.res, "fail"), count(r.res, "skip"))
		}
	}
	lost := lostTests(direct, proxied)
	var unlisted, passing []string
	for _, name := range slices.Sorted(maps.Keys(lost)) {
		if _, ok := exceptions[name]; !ok {
			unlisted = append(unlisted, fmt.Sprintf("%s (%s through the proxy)", name, lost[name]))
		}
	}
	// A listed test that no longer fails is a list that stopped being true (unless -run left it out).
	for _, name := range slices.Sorted(maps.Keys(exceptions)) {
		if _, isLost := lost[name]; isLost {
			continue
		}
		if a, ran := proxied[name]; ran || run == "" {
			passing = append(passing, fmt.Sprintf("%s (%s through the proxy)", name, orNone(a)))
		}
	}
	var problems []string
	if len(unlisted) > 0 {
		problems = append(problems, fmt.Sprintf("%d tests that pass directly (or, with -direct=false, all tests) do not pass through fenceproxy, and are not in %s:\n  %s", len(unlisted), exceptionsFile, strings.Join(unlisted, "\n  ")))
	}
	if len(passing) > 0 {
		problems = append(problems, fmt.Sprintf("%d tests listed in %s do not fail through fenceproxy: take them off the list:\n  %s", len(passing), exceptionsFile, strings.Join(passing, "\n  ")))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	if len(exceptions) > 0 {
		fmt.Printf("%d tests fail through fenceproxy as %s says\n", len(lost), exceptionsFile)
	}
	fmt.Println("every other test that passes directly passes through fenceproxy")
	return nil
}

// lostTests are the tests that pass directly but not through the proxy, each with its outcome through the proxy.
// Without a direct run (direct nil) they are the tests that fail or do not finish through the proxy: a test skips
// only for want of a PGX_TEST_* variable, the same both ways. (Tests that a crash kept from starting are seen
// only with a direct run.)
func lostTests(direct, proxied map[string]string) map[string]string {
	lost := map[string]string{}
	if direct == nil {
		for name, a := range proxied {
			if a != "pass" && a != "skip" {
				lost[name] = a
			}
		}
		return lost
	}
	for name, a := range direct {
		if a == "pass" && proxied[name] != "pass" {
			lost[name] = orNone(proxied[name])
		}
	}
	return lost
}

// readExceptions reads the list of tests that fail through a transaction pooler: one "package test # why" a
// line, the why required; blank lines and lines starting with # are comments.
func readExceptions(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("exceptions: %w", err)
	}
	list := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		test, why, _ := strings.Cut(line, "#")
		f := strings.Fields(test)
		if len(f) != 2 || strings.TrimSpace(why) == "" {
			return nil, fmt.Errorf("%s:%d: want \"package test # why\", got %q", path, i+1, line)
		}
		list[f[0]+" "+f[1]] = strings.TrimSpace(why)
	}
	return list, nil
}

func orNone(s string) string {
	if s == "" {
		return "not run"
	}
	return s
}

func count(res map[string]string, action string) int {
	n := 0
	for _, a := range res {
		if a == action {
			n++
		}
	}
	return n
}

// moduleDir is the directory of the module path that fenceproxy's build uses.
func moduleDir(path string) (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", path).Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w", path, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("go list -m %s: no directory (run go mod download)", path)
	}
	return dir, nil
}

func setup(ctx context.Context, c *pgtest.Cluster) error {
	if err := c.ExecIn("postgres", "CREATE DATABASE "+database); err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	conn, err := pgx.Connect(ctx, c.DSN(pgtest.SuperUser, "", database))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, sql := range setupSQL {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("setup: %s: %w", sql, err)
		}
	}
	return nil
}

// startProxy builds fenceproxy from the checkout src and runs `fenceproxy serve` in front of upstream until stop.
func startProxy(ctx context.Context, src, dir, upstream, config string) (addr string, stop func(), err error) {
	bin := filepath.Join(dir, "fenceproxy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/fenceproxy")
	build.Dir = src
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", nil, fmt.Errorf("build fenceproxy (run from the repository root): %w", err)
	}
	port, err := freeport.Pick()
	if err != nil {
		return "", nil, err
	}
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg := filepath.Join(dir, "fenceproxy.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, config, addr, upstream), 0o600); err != nil {
		return "", nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "fenceproxy.log"))
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "serve", "--config", cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", pgtest.SuperUser, addr, database))
		if err == nil {
			conn.Close(ctx)
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			b, _ := os.ReadFile(logf.Name())
			return "", nil, fmt.Errorf("fenceproxy did not accept connections within 30s: %w\n%s", err, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tempNames are the random parts of temporary paths in subtest names (TestParseConfigSSLCertMode/servicefile=
// '/tmp/TestParseConfigSSLCertMode699868462/001/...'), which differ between the two runs.
var tempNames = regexp.MustCompile(`([A-Za-z_])[0-9]{6,}`)

// goTest runs pgx's tests with PGX_TEST_DATABASE=dsn and returns each test's outcome (pass, fail, skip) by
// package and name.
func goTest(dir, dsn, run string, keep bool, label string) (map[string]string, error) {
	args := []string{"test", "-json", "-count=1", "-p=1", "-timeout=10m"} // a hung test fails (unfinished) in minutes, not at the suite's end
	if run != "" {
		args = append(args, "-run", run)
	}
	args = append(args, "./...")
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	env := []string{"PGX_TEST_DATABASE=" + dsn}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PGX_TEST_") && !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "GOFLAGS=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if keep {
		os.WriteFile("pgxsuite-"+label+".json", out, 0o644)
	}
	if _, exit := err.(*exec.ExitError); err != nil && !exit {
		return nil, fmt.Errorf("go test (%s): %w", label, err)
	}
	res := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		var ev struct{ Action, Package, Test string }
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Test == "" {
			continue
		}
		name := ev.Package + " " + tempNames.ReplaceAllString(ev.Test, "$1#")
		switch ev.Action {
		case "run":
			if res[name] == "" {
				res[name] = "unfinished" // until its outcome: a test binary that hung or crashed never says
			}
		case "pass", "fail", "skip":
			res[name] = ev.Action
		}
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("go test (%s) reported no test: %v\n%s", label, err, stderr.String())
	}
	return res, nil
}
