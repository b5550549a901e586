package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/patronitest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// TestPatroniLeaderKilled runs the real HA engine: Patroni (etcd as its DCS, synchronous_mode) with two
// PostgreSQL nodes behind one proxy (upstream.hosts), and `fenceproxy lock` workers writing row 1 of a
// lock-fenced table through it, one write per lock term. Holder A (`fenceproxy lock --ttl 2s`, worker "fresh"
// on row 2, which no other worker writes, so only the lock's mark can refuse it) is frozen (SIGSTOP of its
// process group) past its lease: the stream's workers take the lock with newer tokens and write. The leader's
// host dies (SIGKILL to Patroni and its PostgreSQL) under the stream; Patroni promotes the other node; the
// proxy follows it and the stream goes on there. Then A wakes (SIGCONT) and writes, on a connection made after
// the failover: 55F01 naming the lock. On the new leader, the history checkers (Check: rows; CheckLocks: the
// lock-level invariant) find no stale write committed and no acknowledged write lost.
func TestPatroniLeaderKilled(t *testing.T) {
	e := etcdtest.Start(t)
	cluster := patronitest.Start(t, e.ClientAddr(), 2)
	leader, err := cluster.WaitLeader(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 4*time.Minute) // bootstrap, a failover (Patroni's ttl is 20 s), the writes
	table := fencedTable(t, leader, 2)
	installLockFence(t, leader, table)
	// synchronous_mode: once the replica is the synchronous standby, a failover loses no acknowledged commit,
	// so the checkers may demand every acknowledged write.
	admin := connect(t, leader.SuperDSN())
	waitFor(t, 60*time.Second, "the replica to be the synchronous standby", func() bool {
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'").Scan(&n)
		return err == nil && n == 1
	})
	admin.Close(ctx)

	p := proxytest.Start(t, "", proxytest.Options{
		Hosts:    []string{cluster.Nodes[0].Addr(), cluster.Nodes[1].Addr()},
		Upstream: "  health_interval: 200ms\n  health_timeout: 1s\n  connect_timeout: 2s\n",
		YAML:     fmt.Sprintf("tables:\n  - name: %s\n    token_column: fence_token\nlimits:\n  startup_timeout: 5s\n", table),
		Grants:   tokens.NewEtcdStore(e.Client(), tokens.DefaultPrefix),
	})
	dsn := dsnApp(p.DSN(pgtest.SuperUser, "", "postgres"), "faults-patroni")
	lock := uniqueName("patroni")
	bin := fenceproxyBinary(t)
	h := &History{}

	dirA := t.TempDir()
	a := startLock(t, e, []string{"--ttl", "2s"}, lock, "fresh", dirA, dsn, table, "2")
	var ready workerReady
	readJSON(t, filepath.Join(dirA, "ready"), 60*time.Second, &ready)
	a.signalGroup(syscall.SIGSTOP)

	// The stream: two workers, each a `fenceproxy lock` process after another (they wait for A's lease to end).
	var mu sync.Mutex
	newer := 0 // writes applied with a token above A's
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				att, ok := lockedWriteOnce(ctx, bin, e, lock, dsn, table, 1)
				if !ok {
					time.Sleep(100 * time.Millisecond) // no write made (the lock or the connection failed)
					continue
				}
				h.Record(att)
				if att.Outcome == Applied && att.Token > ready.Token {
					mu.Lock()
					newer++
					mu.Unlock()
				}
			}
		}()
	}
	stopped := false
	stopStream := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopStream()
	newerApplied := func() int {
		mu.Lock()
		defer mu.Unlock()
		return newer
	}

	waitFor(t, 60*time.Second, "the stream's writes with tokens above frozen A's", func() bool { return newerApplied() >= 3 })
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	killed, before := time.Now(), newerApplied()
	next, err := cluster.WaitLeader(90 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if next == leader {
		t.Fatal("the killed node is still the leader")
	}
	waitFor(t, 90*time.Second, "the stream's writes to go on after the failover", func() bool { return newerApplied() >= before+3 })
	t.Logf("the new leader %s; the stream wrote again %v after the kill", next.Name, time.Since(killed))

	// A wakes up believing it holds the lock, and writes through the proxy, which now reaches the new leader.
	writeJSON(filepath.Join(dirA, "go"), true)
	a.signalGroup(syscall.SIGCONT)
	var aw Attempt
	readJSON(t, filepath.Join(dirA, "result"), 60*time.Second, &aw)
	h.Record(aw)
	if aw.Outcome != Stale || aw.Code != "55F01" || aw.RefusedLock != lock || aw.LockMark <= ready.Token {
		t.Errorf("frozen A's write after the failover: %v (refused lock %q, mark %d), want 55F01 naming lock %s and a token above %d",
			aw, aw.RefusedLock, aw.LockMark, lock, ready.Token)
	}
	if code := a.wait(30 * time.Second); code != exitLeaseLost {
		t.Errorf("A's fenceproxy lock exited %d, want %d (lease lost)", code, exitLeaseLost)
	}
	stopStream()
	counts := h.Check(t, next, table)
	h.CheckLocks(t, next, table)
	if counts[Applied] < before+3 {
		t.Errorf("%d writes applied in all, want at least %d", counts[Applied], before+3)
	}
}

// lockedWriteOnce runs one `fenceproxy lock --ttl 5s LOCK -- worker once` process writing row through dsn and
// returns its worker's attempt; false when the worker made none (it could not take the lock or connect).
func lockedWriteOnce(ctx context.Context, bin string, e *etcdtest.Etcd, lock, dsn, table string, row int) (Attempt, bool) {
	dir, err := os.MkdirTemp("", "fenceproxy-patroni-worker-")
	if err != nil {
		return Attempt{}, false
	}
	defer os.RemoveAll(dir)
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(wctx, bin, "lock", "--etcd", strings.Join(e.Endpoints(), ","), "--dial-timeout", "2s",
		"--ttl", "5s", "--wait", "50s", lock, "--", os.Args[0], "once", dir, dsn, table, fmt.Sprint(row))
	cmd.Env = append(os.Environ(), helperEnv+"=worker")
	cmd.Run() // its status says no more than the result does
	data, err := os.ReadFile(filepath.Join(dir, "result"))
	if err != nil {
		return Attempt{}, false
	}
	var a Attempt
	if err := json.Unmarshal(data, &a); err != nil {
		return Attempt{}, false
	}
	return a, true
}
