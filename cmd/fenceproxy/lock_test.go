package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// The test binary doubles as the programs these tests run, chosen by lockHelperEnv:
//
//	runlock ARGS...       `fenceproxy lock ARGS...` (runLock in a process of its own)
//	child MODE DIR [ARG]  a CMD for the lock to run (see lockTestChild)
const lockHelperEnv = "FENCEPROXY_LOCK_TEST_HELPER"

func init() {
	switch os.Getenv(lockHelperEnv) {
	case "runlock":
		os.Exit(runLock(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	case "child":
		os.Exit(lockTestChild(os.Args[1:]))
	}
}

// lockTestChild is the CMD run under the lock. Modes:
//
//	env DIR CODE          write the lock variables to DIR/env, exit CODE
//	hold DIR [ignore]     write DIR/env, then wait for DIR/release (exit 0); on SIGTERM append to DIR/sigterm and
//	                      exit 42, or with "ignore" carry on
//	started DIR           create DIR/started (it must never run), exit 0
//	killself              die of SIGKILL
func lockTestChild(args []string) int {
	if len(args) == 1 && args[0] == "killself" {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "child: bad args", args)
		return 99
	}
	mode, dir := args[0], args[1]
	writeEnv := func() {
		var b strings.Builder
		for _, k := range []string{"FENCE_TOKEN", "FENCE_LOCK", "PGOPTIONS"} {
			n := 0
			for _, kv := range os.Environ() {
				if strings.HasPrefix(kv, k+"=") {
					n++
				}
			}
			fmt.Fprintf(&b, "%s=%s\n%s_COUNT=%d\n", k, os.Getenv(k), k, n)
		}
		fmt.Fprintf(&b, "PID=%d\n", os.Getpid())
		// Written under another name and renamed, so a reader never sees half of it.
		os.WriteFile(filepath.Join(dir, "env.tmp"), []byte(b.String()), 0o644)
		os.Rename(filepath.Join(dir, "env.tmp"), filepath.Join(dir, "env"))
	}
	switch mode {
	case "env":
		writeEnv()
		code, _ := strconv.Atoi(args[2])
		return code
	case "started":
		os.WriteFile(filepath.Join(dir, "started"), nil, 0o644)
		return 0
	case "hold":
		ignore := len(args) > 2 && args[2] == "ignore"
		terms := make(chan os.Signal, 4)
		signal.Notify(terms, syscall.SIGTERM)
		writeEnv()
		tick := time.NewTicker(10 * time.Millisecond)
		for {
			select {
			case <-terms:
				f, err := os.OpenFile(filepath.Join(dir, "sigterm"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
				if err == nil {
					f.WriteString("TERM\n")
					f.Close()
				}
				if !ignore {
					return 42
				}
			case <-tick.C:
				if _, err := os.Stat(filepath.Join(dir, "release")); err == nil {
					return 0
				}
			}
		}
	}
	fmt.Fprintln(os.Stderr, "child: unknown mode", mode)
	return 99
}

// childCmd is the CMD part of a lock command line that runs lockTestChild.
func childCmd(args ...string) []string {
	return append([]string{"env", lockHelperEnv + "=child", os.Args[0]}, args...)
}

// nestedLockCmd is a CMD that is itself `fenceproxy lock ARGS...`.
func nestedLockCmd(args ...string) []string {
	return append([]string{"env", lockHelperEnv + "=runlock", os.Args[0]}, args...)
}

type lockOutput struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *lockOutput) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *lockOutput) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lockProc is a `fenceproxy lock` process in a process group of its own, with its CMD.
type lockProc struct {
	cmd            *exec.Cmd
	stdout, stderr lockOutput
	done           chan struct{}
	code           int
}

// startLock runs `fenceproxy lock args...` with the test's environment plus env.
func startLock(t *testing.T, env []string, args ...string) *lockProc {
	t.Helper()
	p := &lockProc{done: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], args...)
	p.cmd.Env = append(append(os.Environ(), lockHelperEnv+"=runlock"), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		pgid := p.cmd.Process.Pid
		syscall.Kill(-pgid, syscall.SIGCONT)
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
		if t.Failed() {
			t.Logf("fenceproxy lock %q stderr:\n%s", args, p.stderr.String())
		}
	})
	return p
}

// wait returns the lock process's exit status, failing the test if it runs longer than timeout.
func (p *lockProc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		t.Fatalf("fenceproxy lock still running after %v; stderr:\n%s", timeout, p.stderr.String())
		return -1
	}
}

// waitFor polls cond until it is true, failing t after timeout. (serve_test.go uses it too.)
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// childEnv waits for the child's report in dir and parses it.
func childEnv(t *testing.T, dir string, timeout time.Duration) map[string]string {
	t.Helper()
	path := filepath.Join(dir, "env")
	waitFor(t, timeout, "the child's environment report", func() bool { return fileExists(path) })
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		m[k] = v
	}
	return m
}

var lockSeq atomic.Int64

func lockName(t *testing.T) string {
	return fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), lockSeq.Add(1))
}

// holderKey returns the key of the session that holds the lock with key prefix key.
func lockHolder(t *testing.T, c *clientv3.Client, key string) (string, clientv3.LeaseID, int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, key+"/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("no holder under %q: %v", key+"/", err)
	}
	kv := resp.Kvs[0]
	return string(kv.Key), clientv3.LeaseID(kv.Lease), kv.CreateRevision
}

func TestLockCLI(t *testing.T) {
	e := etcdtest.Start(t)
	admin := e.Client()
	etcdFlag := "--etcd=" + strings.Join(e.Endpoints(), ",")
	ctx := context.Background()

	t.Run("Environment", func(t *testing.T) {
		t.Parallel()
		dir, name := t.TempDir(), lockName(t)
		p := startLock(t, []string{"PGOPTIONS=-c application_name=outer", "FENCE_TOKEN=999999", "FENCE_LOCK=bogus"},
			append([]string{etcdFlag, "--ttl=5s", name, "--"}, childCmd("hold", dir)...)...)
		env := childEnv(t, dir, 10*time.Second)
		_, _, createRev := lockHolder(t, admin, tokens.DefaultPrefix+name)
		want := map[string]string{
			"FENCE_TOKEN": strconv.FormatInt(createRev, 10),
			"FENCE_LOCK":  name,
			"PGOPTIONS":   "-c application_name=outer -c fence.token=" + strconv.FormatInt(createRev, 10) + " -c fence.lock=" + name,
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("%s = %q, want %q", k, env[k], v)
			}
			if env[k+"_COUNT"] != "1" {
				t.Errorf("%s appears %s times in the environment", k, env[k+"_COUNT"])
			}
		}
		os.WriteFile(filepath.Join(dir, "release"), nil, 0o644)
		if code := p.wait(t, 10*time.Second); code != 0 {
			t.Fatalf("exit %d, want 0", code)
		}
		if n := etcdtest.QueueLen(t, admin, tokens.DefaultPrefix+name); n != 0 {
			t.Fatalf("%d lock keys left after CMD exited", n)
		}
	})

	t.Run("OffsetSettingAndNoInheritedPGOptions", func(t *testing.T) {
		t.Parallel()
		dir, name := t.TempDir(), lockName(t)
		p := startLock(t, []string{"PGOPTIONS="},
			append([]string{etcdFlag, "--token-offset=1000000", "--setting=app.fence", "--prefix=/custom/", name, "--"}, childCmd("hold", dir)...)...)
		env := childEnv(t, dir, 10*time.Second)
		_, _, createRev := lockHolder(t, admin, "/custom/"+name)
		token := strconv.FormatInt(createRev+1000000, 10)
		if env["FENCE_TOKEN"] != token || env["PGOPTIONS"] != "-c app.fence="+token+" -c fence.lock="+name {
			t.Errorf("FENCE_TOKEN=%q PGOPTIONS=%q, want token %s", env["FENCE_TOKEN"], env["PGOPTIONS"], token)
		}
		os.WriteFile(filepath.Join(dir, "release"), nil, 0o644)
		if code := p.wait(t, 10*time.Second); code != 0 {
			t.Fatalf("exit %d", code)
		}
	})

	t.Run("Nested", func(t *testing.T) {
		t.Parallel()
		dir, outer, inner := t.TempDir(), lockName(t), lockName(t)
		p := startLock(t, []string{"PGOPTIONS=-c application_name=outer"},
			append(append([]string{etcdFlag, outer, "--"}, nestedLockCmd(etcdFlag, inner, "--")...), childCmd("env", dir, "0")...)...)
		if code := p.wait(t, 10*time.Second); code != 0 {
			t.Fatalf("exit %d", code)
		}
		env := childEnv(t, dir, time.Second)
		m := regexp.MustCompile(`^-c application_name=outer -c fence\.token=(\d+) -c fence\.lock=\S+ -c fence\.token=(\d+) -c fence\.lock=\S+$`).FindStringSubmatch(env["PGOPTIONS"])
		if m == nil {
			t.Fatalf("PGOPTIONS = %q", env["PGOPTIONS"])
		}
		outerTok, _ := strconv.ParseInt(m[1], 10, 64)
		innerTok, _ := strconv.ParseInt(m[2], 10, 64)
		if env["FENCE_TOKEN"] != m[2] || env["FENCE_LOCK"] != inner || innerTok <= outerTok {
			t.Fatalf("nested lock: FENCE_TOKEN=%q FENCE_LOCK=%q PGOPTIONS=%q", env["FENCE_TOKEN"], env["FENCE_LOCK"], env["PGOPTIONS"])
		}
	})

	t.Run("ExitStatus", func(t *testing.T) {
		t.Parallel()
		dir, name := t.TempDir(), lockName(t)
		for _, tc := range []struct {
			cmd  []string
			want int
		}{
			{childCmd("env", dir, "0"), 0},
			{childCmd("env", dir, "7"), 7},
			{childCmd("killself"), 128 + int(syscall.SIGKILL)},
		} {
			p := startLock(t, nil, append([]string{etcdFlag, name, "--"}, tc.cmd...)...)
			if code := p.wait(t, 10*time.Second); code != tc.want {
				t.Errorf("%q: exit %d, want %d", tc.cmd, code, tc.want)
			}
		}
		if n := etcdtest.QueueLen(t, admin, tokens.DefaultPrefix+name); n != 0 {
			t.Fatalf("%d lock keys left", n)
		}
	})

	// The lease is revoked under a running CMD that exits on SIGTERM, and under one that ignores it.
	for _, ignore := range []bool{false, true} {
		t.Run(fmt.Sprintf("LeaseLost/ignoreTERM=%v", ignore), func(t *testing.T) {
			t.Parallel()
			dir, name := t.TempDir(), lockName(t)
			mode := []string{"hold", dir}
			if ignore {
				mode = append(mode, "ignore")
			}
			p := startLock(t, nil, append([]string{etcdFlag, "--ttl=30s", "--grace=300ms", name, "--"}, childCmd(mode...)...)...)
			env := childEnv(t, dir, 10*time.Second)
			_, lease, _ := lockHolder(t, admin, tokens.DefaultPrefix+name)
			if _, err := admin.Revoke(ctx, lease); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(t, 10*time.Second); code != exitLeaseLost {
				t.Fatalf("exit %d, want %d (lease lost)", code, exitLeaseLost)
			}
			if !fileExists(filepath.Join(dir, "sigterm")) {
				t.Fatal("CMD got no SIGTERM")
			}
			stderr := p.stderr.String()
			t.Logf("stderr:\n%s", stderr)
			if !strings.Contains(stderr, "lease lost") || !strings.Contains(stderr, "SIGTERM") {
				t.Errorf("stderr does not explain: %s", stderr)
			}
			if ignore != strings.Contains(stderr, "sending SIGKILL") {
				t.Errorf("ignoreTERM=%v but stderr: %s", ignore, stderr)
			}
			pid, _ := strconv.Atoi(env["PID"])
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("CMD (pid %d) still exists: %v", pid, err)
			}
		})
	}

	t.Run("SIGTERMForwardedThenReleased", func(t *testing.T) {
		t.Parallel()
		dir, name := t.TempDir(), lockName(t)
		p := startLock(t, nil, append([]string{etcdFlag, "--ttl=60s", name, "--"}, childCmd("hold", dir)...)...)
		childEnv(t, dir, 10*time.Second)
		p.cmd.Process.Signal(syscall.SIGTERM)
		if code := p.wait(t, 10*time.Second); code != 42 {
			t.Fatalf("exit %d, want CMD's 42", code)
		}
		if !fileExists(filepath.Join(dir, "sigterm")) {
			t.Fatal("SIGTERM not forwarded to CMD")
		}
		// Released, not left to expire (the TTL is 60s): the lock is free at once.
		l, err := tokens.TryAcquire(ctx, admin, name)
		if err != nil {
			t.Fatalf("lock not released: %v", err)
		}
		l.Release(ctx)
	})

	t.Run("InterruptedWhileWaiting", func(t *testing.T) {
		t.Parallel()
		dir, name := t.TempDir(), lockName(t)
		held, err := tokens.Acquire(ctx, admin, name)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release(ctx)
		p := startLock(t, nil, append([]string{etcdFlag, name, "--"}, childCmd("started", dir)...)...)
		waitFor(t, 10*time.Second, "the lock process queued", func() bool { return etcdtest.QueueLen(t, admin, tokens.DefaultPrefix+name) == 2 })
		p.cmd.Process.Signal(syscall.SIGINT)
		if code := p.wait(t, 10*time.Second); code != 128+int(syscall.SIGINT) {
			t.Fatalf("exit %d, want %d", code, 128+int(syscall.SIGINT))
		}
		if fileExists(filepath.Join(dir, "started")) {
			t.Fatal("CMD ran without the lock")
		}
		if n := etcdtest.QueueLen(t, admin, tokens.DefaultPrefix+name); n != 1 {
			t.Fatalf("%d keys in the queue after the waiter gave up, want 1", n)
		}
	})

	t.Run("Wait", func(t *testing.T) {
		t.Parallel()
		dir, name := t.TempDir(), lockName(t)
		held, err := tokens.Acquire(ctx, admin, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, wait := range []string{"0", "200ms"} {
			p := startLock(t, nil, append([]string{etcdFlag, "--wait=" + wait, name, "--"}, childCmd("started", dir)...)...)
			if code := p.wait(t, 10*time.Second); code != exitBusy {
				t.Fatalf("--wait=%s while held: exit %d, want %d", wait, code, exitBusy)
			}
			if !strings.Contains(p.stderr.String(), "held by another session") {
				t.Errorf("--wait=%s: stderr %q", wait, p.stderr.String())
			}
		}
		if fileExists(filepath.Join(dir, "started")) {
			t.Fatal("CMD ran without the lock")
		}
		if n := etcdtest.QueueLen(t, admin, tokens.DefaultPrefix+name); n != 1 {
			t.Fatalf("%d keys in the queue, want the holder's only", n)
		}
		// A waiter that is still waiting when the lock is released gets it, with a higher token.
		p := startLock(t, nil, append([]string{etcdFlag, "--wait=30s", name, "--"}, childCmd("env", dir, "0")...)...)
		waitFor(t, 10*time.Second, "the lock process queued", func() bool { return etcdtest.QueueLen(t, admin, tokens.DefaultPrefix+name) == 2 })
		held.Release(ctx)
		if code := p.wait(t, 10*time.Second); code != 0 {
			t.Fatalf("exit %d", code)
		}
		if tok, _ := strconv.ParseInt(childEnv(t, dir, time.Second)["FENCE_TOKEN"], 10, 64); tok <= held.Token() {
			t.Fatalf("waiter's token %d not above the holder's %d", tok, held.Token())
		}
	})

	// The acceptance scenario: the holder's whole process group is frozen past its TTL; another holder takes
	// the lock with a higher token; on thaw the frozen lock process sees the loss and stops CMD.
	t.Run("FrozenPastTTL", func(t *testing.T) {
		t.Parallel()
		dir, name := t.TempDir(), lockName(t)
		p := startLock(t, nil, append([]string{etcdFlag, "--ttl=1s", "--grace=5s", name, "--"}, childCmd("hold", dir)...)...)
		env := childEnv(t, dir, 10*time.Second)
		frozenTok, _ := strconv.ParseInt(env["FENCE_TOKEN"], 10, 64)
		pgid := p.cmd.Process.Pid
		if err := syscall.Kill(-pgid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		actx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		next, err := tokens.Acquire(actx, e.Client(), name)
		if err != nil {
			t.Fatalf("the lock was not freed while its holder was frozen: %v", err)
		}
		defer next.Release(ctx)
		if next.Token() <= frozenTok {
			t.Fatalf("new holder's token %d not above the frozen one's %d", next.Token(), frozenTok)
		}
		if fileExists(filepath.Join(dir, "sigterm")) {
			t.Fatal("frozen CMD got SIGTERM while frozen")
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
		t.Logf("stderr:\n%s", p.stderr.String())
		if next.Err() != nil {
			t.Fatalf("the new holder lost the lock: %v", next.Err())
		}
	})

	t.Run("EtcdctlMutualExclusion", func(t *testing.T) {
		t.Parallel()
		etcdctl, err := exec.LookPath("etcdctl")
		if err != nil {
			if os.Getenv(pgtest.SkipEnv) == "1" {
				t.Skipf("etcdctl not found (%s=1)", pgtest.SkipEnv)
			}
			t.Fatalf("etcdctl not found: run scripts/setup (apt-get install etcd-client)")
		}
		dir, name := t.TempDir(), "/fenceproxy-test/"+lockName(t)
		release := filepath.Join(dir, "release")
		ectl := exec.Command(etcdctl, "--endpoints="+strings.Join(e.Endpoints(), ","), "lock", name, "--",
			"sh", "-c", `echo "$ETCD_LOCK_REV" > "$1.tmp"; mv "$1.tmp" "$1"; while [ ! -e "$2" ]; do sleep 0.02; done`, "sh", filepath.Join(dir, "rev"), release)
		ectl.Env = append(os.Environ(), "ETCDCTL_API=3")
		if err := ectl.Start(); err != nil {
			t.Fatal(err)
		}
		ectlDone := make(chan error, 1)
		go func() { ectlDone <- ectl.Wait() }()
		t.Cleanup(func() { ectl.Process.Kill(); <-ectlDone })
		waitFor(t, 10*time.Second, "etcdctl to hold the lock", func() bool { return fileExists(filepath.Join(dir, "rev")) })
		b, _ := os.ReadFile(filepath.Join(dir, "rev"))
		ectlRev, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)

		busy := startLock(t, nil, append([]string{etcdFlag, "--prefix=", "--wait=0", name, "--"}, childCmd("started", dir)...)...)
		if code := busy.wait(t, 10*time.Second); code != exitBusy {
			t.Fatalf("while etcdctl holds %q: exit %d, want %d", name, code, exitBusy)
		}
		p := startLock(t, nil, append([]string{etcdFlag, "--prefix=", name, "--"}, childCmd("env", dir, "0")...)...)
		waitFor(t, 10*time.Second, "the lock process queued", func() bool { return etcdtest.QueueLen(t, admin, name) == 2 })
		os.WriteFile(release, nil, 0o644)
		if code := p.wait(t, 10*time.Second); code != 0 {
			t.Fatalf("exit %d", code)
		}
		if tok, _ := strconv.ParseInt(childEnv(t, dir, time.Second)["FENCE_TOKEN"], 10, 64); tok <= ectlRev {
			t.Fatalf("our token %d not above etcdctl's ETCD_LOCK_REV %d", tok, ectlRev)
		}
		if fileExists(filepath.Join(dir, "started")) {
			t.Fatal("CMD ran while etcdctl held the lock")
		}
	})

	// End to end with PostgreSQL: psql run under the lock uses the lock's token, not an inherited one.
	t.Run("Psql", func(t *testing.T) {
		t.Parallel()
		pg := pgtest.MustStart(t, pgtest.Options{})
		name := lockName(t)
		p := startLock(t, []string{"PGOPTIONS=-c fence.token=5"}, etcdFlag, name, "--", "sh", "-c",
			`echo "$FENCE_TOKEN"; exec "$0" -X -At -d "$1" -c "SHOW fence.token"`, pg.Bin("psql"), pg.SuperDSN())
		if code := p.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("exit %d; stderr %s", code, p.stderr.String())
		}
		lines := strings.Fields(p.stdout.String())
		if len(lines) != 2 || lines[0] != lines[1] || lines[0] == "5" {
			t.Fatalf("FENCE_TOKEN and the server's fence.token: %q", lines)
		}
	})
}

func TestLockEtcdUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	p := startLock(t, nil, append([]string{"--etcd=" + addr, "--dial-timeout=1s", "name", "--"}, childCmd("started", dir)...)...)
	if code := p.wait(t, 10*time.Second); code != exitUnavailable {
		t.Fatalf("exit %d, want %d", code, exitUnavailable)
	}
	if fileExists(filepath.Join(dir, "started")) {
		t.Fatal("CMD started without the lock")
	}
	t.Logf("stderr:\n%s", p.stderr.String())
	if stderr := p.stderr.String(); !strings.Contains(stderr, addr) || !strings.Contains(stderr, "did not answer") {
		t.Fatalf("stderr does not say etcd is unreachable: %q", stderr)
	}
}

func TestLockEndpointsFromEnvironment(t *testing.T) {
	for _, tc := range []struct {
		fenceproxy, etcdctl, want string
	}{
		{"", "", "127.0.0.1:2379"},
		{"", "a:1,b:2", "a:1,b:2"},
		{"c:3", "a:1", "c:3"},
	} {
		t.Setenv("FENCEPROXY_ETCD_ENDPOINTS", tc.fenceproxy)
		t.Setenv("ETCDCTL_ENDPOINTS", tc.etcdctl)
		if got := defaultEndpoints(); got != tc.want {
			t.Errorf("FENCEPROXY_ETCD_ENDPOINTS=%q ETCDCTL_ENDPOINTS=%q: %q, want %q", tc.fenceproxy, tc.etcdctl, got, tc.want)
		}
	}
	if got := splitEndpoints(" a:1, ,b:2,"); strings.Join(got, "|") != "a:1|b:2" {
		t.Errorf("splitEndpoints: %q", got)
	}
}

// TestLockUsage: bad command lines fail with 125 before contacting etcd; an unknown CMD with 127.
func TestLockUsage(t *testing.T) {
	t.Parallel()
	unreachable := "--etcd=127.0.0.1:1"
	notExecutable := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notExecutable, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want int
	}{
		{nil, exitUsage},
		{[]string{"name"}, exitUsage},
		{[]string{"name", "true"}, exitUsage},
		{[]string{"name", "--"}, exitUsage},
		{[]string{"name", "--ttl=1s", "--", "true"}, exitUsage},
		{[]string{"--ttl=500ms", "name", "--", "true"}, exitUsage},
		{[]string{"--grace=-1s", "name", "--", "true"}, exitUsage},
		{[]string{"--wait=-1s", "name", "--", "true"}, exitUsage},
		{[]string{"--token-offset=-1", "name", "--", "true"}, exitUsage},
		{[]string{"--setting=fence token", "name", "--", "true"}, exitUsage},
		{[]string{"--setting=token", "name", "--", "true"}, exitUsage},
		{[]string{"--etcd=,", "name", "--", "true"}, exitUsage},
		{[]string{"--bogus", "name", "--", "true"}, exitUsage},
		{[]string{"", "--", "true"}, exitUsage},
		{[]string{"-h"}, 0},
		{[]string{"name", "--", "no-such-command-fenceproxy"}, exitNotFound},
		{[]string{"name", "--", notExecutable}, exitCannotRun},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{unreachable}, tc.args...)
		if code := runLock(context.Background(), args, &stdout, &stderr); code != tc.want {
			t.Errorf("lock %q: exit %d, want %d; stderr %s", tc.args, code, tc.want, stderr.String())
		}
		if tc.want != 0 && stderr.Len() == 0 {
			t.Errorf("lock %q: nothing on stderr", tc.args)
		}
	}
}
