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
	flag.IntVar(&o.count, "count", 1, "run each test this many times (go test -count; a test fails if one run fails): to chase a flake")
	flag.BoolVar(&o.keep, "keep", false, "keep the go test -json outputs and the proxy's log in the working directory")
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
	count          int
}

func suite(o options) error {
	run, keep, src := o.run, o.keep, o.src
	var exceptions exceptionList
	if o.mode == "transaction" {
		var err error
		if exceptions, err = readExceptions(filepath.Join(src, exceptionsFile)); err != nil {
			return err
		}
	}
	ctx := context.Background()
	pgxDir, err := moduleDir(modulePath)
	if err != nil {
		return err
	}
	pkgs, err := databasePackages(pgxDir)
	if err != nil {
		return err
	}
	skip, err := skipPattern(pgxDir, pkgs, exceptions.skip)
	if err != nil {
		return err
	}
	tests := testRun{pkgs: pkgs, skip: skip, run: run, count: o.count, keep: keep}
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
	logPath := filepath.Join(tmp, "fenceproxy.log")
	if keep {
		logPath = "pgxsuite-fenceproxy.log"
	}
	proxyAddr, stop, err := startProxy(ctx, src, tmp, logPath, cluster.Addr(), cfg)
	if err != nil {
		return err
	}
	defer stop()

	var direct map[string]string
	if o.direct {
		if direct, err = goTest(pgxDir, cluster.DSN(pgtest.SuperUser, "", database), tests, "direct"); err != nil {
			return err
		}
	}
	host, port, _ := net.SplitHostPort(proxyAddr)
	proxied, err := goTest(pgxDir, fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", host, port, pgtest.SuperUser, database),
		tests, "proxy")
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
		if _, ok := exceptions.fail[name]; !ok {
			unlisted = append(unlisted, fmt.Sprintf("%s (%s through the proxy)", name, lost[name]))
		}
	}
	// A listed test that no longer fails is a list that stopped being true (unless -run left it out).
	for _, name := range slices.Sorted(maps.Keys(exceptions.fail)) {
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
	if len(exceptions.fail) > 0 {
		fmt.Printf("%d tests fail through fenceproxy as %s says (and %d it names were not run)\n", len(lost), exceptionsFile, len(exceptions.skip))
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

// exceptionList is transaction-exceptions.txt: the tests that fail through a transaction pooler (fail) and those
// not run there (skip), each "package test" with why.
type exceptionList struct{ fail, skip map[string]string }

// readExceptions reads the list: one "package test # why" a line for a test that fails, "skip package test #
// why" for a test not run (a top-level test that, through the pool, only ends when its own deadline does), the
// why required; blank lines and lines starting with # are comments.
func readExceptions(path string) (exceptionList, error) {
	l := exceptionList{fail: map[string]string{}, skip: map[string]string{}}
	b, err := os.ReadFile(path)
	if err != nil {
		return l, fmt.Errorf("exceptions: %w", err)
	}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		test, why, _ := strings.Cut(line, "#")
		f := strings.Fields(test)
		list := l.fail
		if len(f) == 3 && f[0] == "skip" && !strings.Contains(f[2], "/") {
			list, f = l.skip, f[1:]
		}
		if len(f) != 2 || strings.TrimSpace(why) == "" {
			return l, fmt.Errorf("%s:%d: want \"package test # why\" or \"skip package test # why\" (a top-level test), got %q", path, i+1, line)
		}
		list[f[0]+" "+f[1]] = strings.TrimSpace(why)
	}
	return l, nil
}

// skipPattern is go test's -skip for the skip list, checked against pgx's source in dir: each test must be
// defined in its package, and in no other package that runs (-skip matches in every package).
func skipPattern(dir string, pkgs []string, skip map[string]string) (string, error) {
	if len(skip) == 0 {
		return "", nil
	}
	var names []string
	for key := range skip {
		pkg, name, _ := strings.Cut(key, " ")
		for _, p := range pkgs {
			defined, err := definesTest(filepath.Join(dir, strings.TrimPrefix(p, modulePath)), name)
			if err != nil {
				return "", err
			}
			if defined != (p == pkg) {
				return "", fmt.Errorf("%s: skip %s %s: the test is defined in %s: it must be in its package only", exceptionsFile, pkg, name, p)
			}
			if defined {
				names = append(names, regexp.QuoteMeta(name))
			}
		}
	}
	if len(names) != len(skip) {
		return "", fmt.Errorf("%s: a skipped test is not defined in pgx (or its package does not run): %v", exceptionsFile, slices.Sorted(maps.Keys(skip)))
	}
	slices.Sort(names)
	return "^(" + strings.Join(names, "|") + ")$", nil
}

// definesTest reports whether a test file in dir defines the test function name.
func definesTest(dir, name string) (bool, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return false, err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return false, err
		}
		if bytes.Contains(b, []byte("\nfunc "+name+"(t *testing.T)")) {
			return true, nil
		}
	}
	return false, nil
}

// modulePath is pgx's module path.
const modulePath = "github.com/jackc/pgx/v5"

// databasePackages are pgx's packages whose tests use the database (PGX_TEST_DATABASE, or pgxtest's runners that
// read it): the others test pgx's own code, which no server or proxy can change. dir is pgx's module directory.
func databasePackages(dir string) ([]string, error) {
	list := exec.Command("go", "list", "-f", "{{.ImportPath}} {{.Dir}} {{join .TestGoFiles \" \"}} {{join .XTestGoFiles \" \"}}", "./...")
	list.Dir = dir
	out, err := list.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s/...: %w", modulePath, err)
	}
	var pkgs []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue // no tests
		}
		for _, name := range f[2:] {
			b, err := os.ReadFile(filepath.Join(f[1], name))
			if err != nil {
				return nil, err
			}
			if bytes.Contains(b, []byte("PGX_TEST_DATABASE")) || bytes.Contains(b, []byte("pgxtest.")) {
				pkgs = append(pkgs, f[0])
				break
			}
		}
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("no package of %s in %s has tests that use the database", modulePath, dir)
	}
	return pkgs, nil
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

// startProxy builds fenceproxy from the checkout src into dir and runs `fenceproxy serve` in front of upstream
// until stop, its output going to logPath.
func startProxy(ctx context.Context, src, dir, logPath, upstream, config string) (addr string, stop func(), err error) {
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
	logf, err := os.Create(logPath)
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

// testRun is what goTest runs: pgx's packages pkgs, with go test's -skip, -run and -count, keeping the JSON
// output with keep.
type testRun struct {
	pkgs      []string
	skip, run string
	count     int
	keep      bool
}

// goTest runs pgx's tests with PGX_TEST_DATABASE=dsn and returns each test's outcome (pass, fail, skip) by
// package and name.
func goTest(dir, dsn string, tr testRun, label string) (map[string]string, error) {
	args := []string{"test", "-json", "-count=" + strconv.Itoa(tr.count), "-p=1", "-timeout=10m"} // a hung test fails (unfinished) in minutes, not at the suite's end
	if tr.run != "" {
		args = append(args, "-run", tr.run)
	}
	if tr.skip != "" {
		args = append(args, "-skip", tr.skip)
	}
	args = append(args, tr.pkgs...)
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
	if tr.keep {
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
			if res[name] != "fail" { // with -count, one failed run fails the test
				res[name] = ev.Action
			}
		}
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("go test (%s) reported no test: %v\n%s", label, err, stderr.String())
	}
	return res, nil
}
