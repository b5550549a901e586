package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// pgLease reads the lease row of lock name: its token and whether it is held.
func pgLease(t *testing.T, cl *pgtest.Cluster, name string) (token int64, held bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, cl.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	err = conn.QueryRow(ctx, "SELECT token, owner IS NOT NULL FROM fenceproxy.lock_leases WHERE name = $1", name).Scan(&token, &held)
	if err == pgx.ErrNoRows {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return token, held
}

func pgWaiters(t *testing.T, cl *pgtest.Cluster, name string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, cl.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM fenceproxy.lock_waiters WHERE name = $1 AND expires_at > clock_timestamp()", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLockPGCLI runs `fenceproxy lock --pg` as real processes against a real PostgreSQL: the same environment,
// exit statuses and lease-lost behaviour as with etcd.
func TestLockPGCLI(t *testing.T) {
	cl := pgtest.MustStart(t, pgtest.Options{})
	pgFlag := "--pg=" + cl.SuperDSN()
	ctx := context.Background()
	store, err := tokens.NewPGStore(ctx, cl.SuperDSN(), tokens.PGStoreOptions{})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("Environment", func(t *testing.T) {
		t.Parallel()
		dir, name := t.TempDir(), lockName(t)+" with space"
		// The DSN comes from FENCEPROXY_PG_DSN here.
		p := startLock(t, []string{"FENCEPROXY_PG_DSN=" + cl.SuperDSN(), "PGOPTIONS=-c application_name=outer", "FENCE_TOKEN=999999"},
			append([]string{"--ttl=5s", name, "--"}, childCmd("hold", dir)...)...)
		env := childEnv(t, dir, 10*time.Second)
		token, held := pgLease(t, cl, name)
		if !held {
			t.Fatal("no lease row while CMD runs")
		}
		tok := strconv.FormatInt(token, 10)
		want := map[string]string{
			"FENCE_TOKEN": tok,
			"FENCE_LOCK":  name,
			"PGOPTIONS":   "-c application_name=outer -c fence.token=" + tok + ` -c fence.lock=` + strings.ReplaceAll(name, " ", `\ `),
		}
		for k, v := range want {
			if env[k] != v || env[k+"_COUNT"] != "1" {
				t.Errorf("%s = %q (%s times), want %q once", k, env[k], env[k+"_COUNT"], v)
			}
		}
		os.WriteFile(filepath.Join(dir, "release"), nil, 0o644)
		if code := p.wait(t, 10*time.Second); code != 0 {
			t.Fatalf("exit %d", code)
		}
		if _, held := pgLease(t, cl, name); held {
			t.Fatal("lease still held after CMD exited")
		}
		stderr := p.stderr.String()
		for _, want := range []string{`msg="lock acquired" store=postgres`, "waited=", `msg="lock exit"`, "held=", "outcome=released"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("log lines lack %q:\n%s", want, stderr)
			}
		}
	})

	// The lock's name reaches the server as fence.lock, escaped spaces included.
	t.Run("Psql", func(t *testing.T) {
		t.Parallel()
		name := lockName(t) + ` a\b`
		p := startLock(t, nil, pgFlag, name, "--", "sh", "-c",
			`exec "$0" -X -At -d "$1" -c "SELECT current_setting('fence.token') = '$FENCE_TOKEN', current_setting('fence.lock')"`, cl.Bin("psql"), cl.SuperDSN())
		if code := p.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("exit %d; stderr %s", code, p.stderr.String())
		}
		if got := strings.TrimSpace(p.stdout.String()); got != "t|"+name {
			t.Fatalf("server sees %q, want token match and lock %q", got, name)
		}
	})

	// The lease ends on the server (as if the holder had been paused past it and another took over): the
	// holder's renewal finds it gone, CMD gets SIGTERM, the lock exits 122.
	t.Run("LeaseLost", func(t *testing.T) {
		t.Parallel()
		dir, name := t.TempDir(), lockName(t)
		p := startLock(t, nil, append([]string{pgFlag, "--ttl=3s", "--grace=300ms", name, "--"}, childCmd("hold", dir)...)...)
		childEnv(t, dir, 10*time.Second)
		if err := cl.Exec("UPDATE fenceproxy.lock_leases SET expires_at = clock_timestamp() WHERE name = '" + name + "'"); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t, 10*time.Second); code != exitLeaseLost {
			t.Fatalf("exit %d, want %d", code, exitLeaseLost)
		}
		if !fileExists(filepath.Join(dir, "sigterm")) {
			t.Fatal("CMD got no SIGTERM")
		}
		if stderr := p.stderr.String(); !strings.Contains(stderr, "lease lost") || !strings.Contains(stderr, "outcome=\"lease lost\"") {
			t.Errorf("stderr does not explain: %s", stderr)
		}
	})

	t.Run("WaitAndLocks", func(t *testing.T) {
		t.Parallel()
		dir, name := t.TempDir(), lockName(t)
		held, err := store.Acquire(ctx, name, tokens.AcquireOptions{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		for _, wait := range []string{"0", "300ms"} {
			p := startLock(t, nil, append([]string{pgFlag, "--wait=" + wait, name, "--"}, childCmd("started", dir)...)...)
			if code := p.wait(t, 10*time.Second); code != exitBusy {
				t.Fatalf("--wait=%s while held: exit %d, want %d", wait, code, exitBusy)
			}
		}
		if fileExists(filepath.Join(dir, "started")) {
			t.Fatal("CMD ran without the lock")
		}
		p := startLock(t, nil, append([]string{pgFlag, "--wait=30s", name, "--"}, childCmd("env", dir, "0")...)...)
		waitFor(t, 10*time.Second, "the lock process waiting", func() bool { return pgWaiters(t, cl, name) == 1 })

		// `fenceproxy locks` shows the holder and the waiter, as a table and as JSON.
		var out, errOut bytes.Buffer
		if code := run([]string{"locks", pgFlag}, &out, &errOut); code != 0 {
			t.Fatalf("locks: exit %d: %s", code, errOut.String())
		}
		t.Logf("fenceproxy locks:\n%s", out.String())
		var line string
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(l, name+" ") {
				line = l
			}
		}
		f := strings.Fields(line)
		if len(f) != 6 || f[2] != strconv.FormatInt(held.Token(), 10) || f[5] != "1" || !strings.HasSuffix(f[3], "s") {
			t.Fatalf("locks row %q: want holder, token %d, a lease left and 1 waiter", line, held.Token())
		}
		out.Reset()
		if code := run([]string{"locks", pgFlag, "--json"}, &out, &errOut); code != 0 {
			t.Fatalf("locks --json: exit %d", code)
		}
		var rows []struct {
			Name      string   `json:"name"`
			Token     *int64   `json:"token"`
			LeaseLeft *float64 `json:"lease_left_seconds"`
			Waiters   int      `json:"waiters"`
		}
		if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, r := range rows {
			if r.Name == name {
				found = r.Token != nil && *r.Token == held.Token() && r.LeaseLeft != nil && *r.LeaseLeft > 30 && r.Waiters == 1
			}
		}
		if !found {
			t.Fatalf("locks --json lacks %q with its holder and waiter: %s", name, out.String())
		}

		held.Release(ctx)
		if code := p.wait(t, 10*time.Second); code != 0 {
			t.Fatalf("waiter exit %d", code)
		}
		if tok, _ := strconv.ParseInt(childEnv(t, dir, time.Second)["FENCE_TOKEN"], 10, 64); tok <= held.Token() {
			t.Fatalf("waiter's token %d not above the holder's %d", tok, held.Token())
		}
	})

	// The whole process group is frozen past the TTL; another holder takes over with a higher token; on thaw the
	// lock process finds its lease lost and stops CMD.
	t.Run("FrozenPastTTL", func(t *testing.T) {
		t.Parallel()
		dir, name := t.TempDir(), lockName(t)
		p := startLock(t, nil, append([]string{pgFlag, "--ttl=1s", "--grace=5s", name, "--"}, childCmd("hold", dir)...)...)
		env := childEnv(t, dir, 10*time.Second)
		frozenTok, _ := strconv.ParseInt(env["FENCE_TOKEN"], 10, 64)
		pgid := p.cmd.Process.Pid
		if err := syscall.Kill(-pgid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		actx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		next, err := store.Acquire(actx, name, tokens.AcquireOptions{TTL: time.Minute})
		if err != nil {
			t.Fatalf("the lock was not freed while its holder was frozen: %v", err)
		}
		defer next.Release(ctx)
		if next.Token() <= frozenTok {
			t.Fatalf("new holder's token %d not above the frozen one's %d", next.Token(), frozenTok)
		}
		if err := syscall.Kill(-pgid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t, 10*time.Second); code != exitLeaseLost {
			t.Fatalf("exit %d, want %d (lease lost)", code, exitLeaseLost)
		}
		if !fileExists(filepath.Join(dir, "sigterm")) {
			t.Fatal("thawed CMD got no SIGTERM")
		}
		if next.Err() != nil {
			t.Fatalf("the new holder lost the lock: %v", next.Err())
		}
		// The frozen holder's release after the loss did not free the new holder's lease.
		if tok, held := pgLease(t, cl, name); !held || tok != next.Token() {
			t.Fatalf("lease row: token %d held %v, want the new holder's %d", tok, held, next.Token())
		}
	})
}

// TestLockPGUnreachable: a database that cannot be reached means exit 123 and CMD never runs.
func TestLockPGUnreachable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := startLock(t, nil, append([]string{"--pg=postgres://postgres@127.0.0.1:1/x?sslmode=disable", "--dial-timeout=1s", "name", "--"}, childCmd("started", dir)...)...)
	if code := p.wait(t, 10*time.Second); code != exitUnavailable {
		t.Fatalf("exit %d, want %d", code, exitUnavailable)
	}
	if fileExists(filepath.Join(dir, "started")) {
		t.Fatal("CMD started without the lock")
	}
	if !strings.Contains(p.stderr.String(), "PostgreSQL at") {
		t.Fatalf("stderr: %s", p.stderr.String())
	}
}

// TestLocksEtcd: `fenceproxy locks --etcd` shows a held lock, its token and lease, and a waiter.
func TestLocksEtcd(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	name := lockName(t)
	store := tokens.NewEtcdStore(e.Client(), tokens.DefaultPrefix)
	held, err := store.Acquire(context.Background(), name, tokens.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	dir := t.TempDir()
	etcdFlag := "--etcd=" + strings.Join(e.Endpoints(), ",")
	p := startLock(t, nil, append([]string{etcdFlag, "--wait=30s", name, "--"}, childCmd("env", dir, "0")...)...)
	waitFor(t, 10*time.Second, "the waiter queued", func() bool { return etcdtest.QueueLen(t, e.Client(), tokens.DefaultPrefix+name) == 2 })
	var out, errOut bytes.Buffer
	if code := run([]string{"locks", etcdFlag}, &out, &errOut); code != 0 {
		t.Fatalf("locks: exit %d: %s", code, errOut.String())
	}
	t.Logf("fenceproxy locks:\n%s", out.String())
	var f []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, name+" ") {
			f = strings.Fields(l)
		}
	}
	if len(f) != 6 || f[2] != strconv.FormatInt(held.Token(), 10) || f[5] != "1" {
		t.Fatalf("locks row %q: want the holder's lease, token %d and 1 waiter", f, held.Token())
	}
	held.Release(context.Background())
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("waiter exit %d", code)
	}
}

// TestStoreChoice: --pg, FENCEPROXY_PG_DSN and --etcd choose the store; the DSN's password never shows.
func TestStoreChoice(t *testing.T) {
	for _, tc := range []struct {
		env    string
		args   []string
		wantPG bool
		bad    bool
	}{
		{"", nil, false, false},
		{"postgres://u:secret@h/db", nil, true, false},
		{"postgres://u:secret@h/db", []string{"--etcd=a:1"}, false, false},
		{"", []string{"--pg=postgres://u:secret@h/db"}, true, false},
		{"", []string{"--pg=postgres://u:secret@h/db", "--etcd=a:1"}, false, true},
		{"", []string{"--pg="}, false, true},
	} {
		t.Setenv(envPGDSN, tc.env)
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		sf := addStoreFlags(fs)
		var help bytes.Buffer
		fs.SetOutput(&help)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		kind, err := sf.kind()
		pg := kind == "postgres"
		if (err != nil) != tc.bad || (err == nil && pg != tc.wantPG) {
			t.Errorf("env %q args %q: pg %v err %v", tc.env, tc.args, pg, err)
		}
		fs.PrintDefaults()
		if strings.Contains(help.String()+sf.where(), "secret") {
			t.Errorf("env %q args %q: the password shows: %s %s", tc.env, tc.args, help.String(), sf.where())
		}
	}
}
