package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// helperEnv makes the test binary act as a worker process instead of running tests (see TestMain).
const helperEnv = "FENCEPROXY_FAULTS_HELPER"

// workerReady is what a worker process reports once it is connected and holds its token.
type workerReady struct {
	Token int64
	PID   int // the worker's own process id
}

// helperMain runs a worker: the CMD of `fenceproxy lock`, with FENCE_TOKEN and PGOPTIONS set by it. Arguments:
// MODE DIR DSN TABLE ROW. The worker connects (PGOPTIONS carries the token to the proxy), then:
//
//	late  reports DIR/ready, waits for DIR/go, writes once and reports DIR/result; SIGTERM (from a lock that
//	      was lost) does not stop it, as it would not stop a writer that has already decided to write; it
//	      exits once it has had SIGTERM, so that the lock's exit status reflects the loss
//	fresh as late, but on a connection made after DIR/go (the first one, and its deadline, may not outlive
//	      a long pause: a failover ends it)
//	once  writes once, reports DIR/result, exits 0
//	hold  writes once, reports DIR/result and DIR/ready, then waits; SIGTERM makes it write DIR/sigterm and
//	      exit 42
func helperMain(mode string, args []string) int {
	if len(args) != 5 {
		fmt.Fprintf(os.Stderr, "worker: want MODE DIR DSN TABLE ROW, got %q\n", args)
		return 99
	}
	op, dir, dsn, table := args[0], args[1], args[2], args[3]
	row, _ := strconv.Atoi(args[4])
	token, err := strconv.ParseInt(os.Getenv("FENCE_TOKEN"), 10, 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "worker: FENCE_TOKEN: %v\n", err)
		return 99
	}
	_ = mode
	terms := make(chan os.Signal, 4)
	signal.Notify(terms, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		fmt.Fprintf(os.Stderr, "worker: connect: %v\n", err)
		return 98
	}
	defer conn.Close(context.Background())
	worker := fmt.Sprintf("proc%d", os.Getpid())
	write := func() {
		h := &History{}
		h.seq = int(token) * 1000 // values unique across processes: one write per process and token
		a := h.Write(ctx, conn, table, worker, token, row)
		a.Lock = os.Getenv("FENCE_LOCK") // the lock whose name `fenceproxy lock` put in PGOPTIONS (fence.lock)
		writeJSON(filepath.Join(dir, "result"), a)
	}
	switch op {
	case "late":
		writeJSON(filepath.Join(dir, "ready"), workerReady{Token: token, PID: os.Getpid()})
		for !exists(filepath.Join(dir, "go")) {
			time.Sleep(5 * time.Millisecond)
		}
		write()
		select {
		case <-terms:
			return 0
		case <-ctx.Done():
			return 97
		}
	case "fresh":
		writeJSON(filepath.Join(dir, "ready"), workerReady{Token: token, PID: os.Getpid()})
		for !exists(filepath.Join(dir, "go")) {
			time.Sleep(5 * time.Millisecond)
		}
		freshCtx, freshCancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer freshCancel()
		ctx = freshCtx
		fresh, err := pgx.Connect(ctx, dsn)
		if err != nil {
			fmt.Fprintf(os.Stderr, "worker: connect after go: %v\n", err)
			return 98
		}
		defer fresh.Close(context.Background())
		conn = fresh
		write()
		select {
		case <-terms:
			return 0
		case <-ctx.Done():
			return 97
		}
	case "once":
		write()
		return 0
	case "critical":
		return criticalSection(ctx, conn, token, table, row)
	case "hold":
		write()
		writeJSON(filepath.Join(dir, "ready"), workerReady{Token: token, PID: os.Getpid()})
		select {
		case <-terms:
			os.WriteFile(filepath.Join(dir, "sigterm"), nil, 0o644)
			return 42
		case <-ctx.Done():
			return 97
		}
	}
	fmt.Fprintf(os.Stderr, "worker: unknown op %q\n", op)
	return 99
}

// writeJSON writes v to path atomically (a reader never sees half of it).
func writeJSON(path string, v any) {
	b, _ := json.Marshal(v)
	os.WriteFile(path+".tmp", b, 0o644)
	os.Rename(path+".tmp", path)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// readJSON waits for path to appear and decodes it.
func readJSON(t *testing.T, path string, within time.Duration, v any) {
	t.Helper()
	waitFor(t, within, path, func() bool { return exists(path) })
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// lockProc is a `fenceproxy lock ... -- worker` process, leader of its own process group (the lock keeps CMD
// in its group), so that the test can freeze or kill both at once.
type lockProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stderr *proxytest.SyncBuffer
	done   chan struct{}
}

// startLock runs `fenceproxy lock --etcd E --ttl TTL --grace 30s NAME -- worker OP DIR DSN TABLE ROW`.
func startLock(t *testing.T, e *etcdtest.Etcd, flags []string, name string, workerArgs ...string) *lockProc {
	t.Helper()
	return startLockStore(t, []string{"--etcd", strings.Join(e.Endpoints(), ",")}, flags, name, workerArgs...)
}

// startLockStore is startLock with the flags that choose the lock store (--etcd E, or --pg DSN).
func startLockStore(t *testing.T, store []string, flags []string, name string, workerArgs ...string) *lockProc {
	t.Helper()
	args := append([]string{"lock"}, store...)
	args = append(args, "--grace", "30s", "--dial-timeout", "2s")
	args = append(args, flags...)
	args = append(args, name, "--", os.Args[0])
	args = append(args, workerArgs...)
	lp := &lockProc{t: t, cmd: exec.Command(fenceproxyBinary(t), args...), stderr: &proxytest.SyncBuffer{}, done: make(chan struct{})}
	lp.cmd.Env = append(os.Environ(), helperEnv+"=worker")
	lp.cmd.Stdout, lp.cmd.Stderr = lp.stderr, lp.stderr
	lp.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := lp.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { lp.cmd.Wait(); close(lp.done) }()
	t.Cleanup(func() {
		syscall.Kill(-lp.cmd.Process.Pid, syscall.SIGCONT)
		syscall.Kill(-lp.cmd.Process.Pid, syscall.SIGKILL)
		<-lp.done
		if t.Failed() {
			t.Logf("fenceproxy lock %s output:\n%s", name, lp.stderr.String())
		}
	})
	return lp
}

// signalGroup sends sig to the lock process and its CMD.
func (lp *lockProc) signalGroup(sig syscall.Signal) {
	lp.t.Helper()
	if err := syscall.Kill(-lp.cmd.Process.Pid, sig); err != nil {
		lp.t.Fatalf("signal %v to process group %d: %v", sig, lp.cmd.Process.Pid, err)
	}
}

// wait returns the lock process's exit status.
func (lp *lockProc) wait(within time.Duration) int {
	lp.t.Helper()
	select {
	case <-lp.done:
	case <-time.After(within):
		lp.t.Fatalf("fenceproxy lock still running after %v:\n%s", within, lp.stderr.String())
	}
	return lp.cmd.ProcessState.ExitCode()
}

func (lp *lockProc) exited() bool {
	select {
	case <-lp.done:
		return true
	default:
		return false
	}
}

// workerDSN is a DSN for a worker process: the token comes from PGOPTIONS, set by `fenceproxy lock`.
func workerDSN(p *proxyProc, app string) string { return p.DSN(app) }
