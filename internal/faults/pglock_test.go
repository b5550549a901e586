package faults

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// The issue asks for 20 s of contention, and CI runs that long (the lock processes mostly wait, so it costs
// little CPU); -faults.contention shortens it for a quick local run.
var contentionFor = flag.Duration("faults.contention", 20*time.Second, "how long the `fenceproxy lock` processes of the contention tests contend for one lock")

// criticalSection is the worker mode "critical": holding the lock, it records its token and the server's time
// at entry and exit in the history table (a direct connection), holding the lock holdMillis in between.
func criticalSection(ctx context.Context, conn *pgx.Conn, token int64, table string, holdMillis int) int {
	var id int64
	if err := conn.QueryRow(ctx, "INSERT INTO "+table+" (token, pid, started) VALUES ($1, $2, clock_timestamp()) RETURNING id", token, os.Getpid()).Scan(&id); err != nil {
		fmt.Fprintf(os.Stderr, "worker: enter: %v\n", err)
		return 96
	}
	time.Sleep(time.Duration(holdMillis) * time.Millisecond)
	if _, err := conn.Exec(ctx, "UPDATE "+table+" SET ended = clock_timestamp() WHERE id = $1", id); err != nil {
		fmt.Fprintf(os.Stderr, "worker: leave: %v\n", err)
		return 96
	}
	return 0
}

func pgStoreFor(t *testing.T, dsn string) *tokens.PGStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := tokens.NewPGStore(ctx, dsn, tokens.PGStoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPausedHolderLateWriteIsFencedPG is the acceptance scenario with the PostgreSQL lock store, reached through
// the proxy: A's `fenceproxy lock --pg` and its writer are frozen past the lease; B takes the lock (directly
// from PostgreSQL) and writes through the other proxy; on SIGCONT A's late write fails with 55F01, B's row is
// intact, and A's lock exits 122.
func TestPausedHolderLateWriteIsFencedPG(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	table := fencedTable(t, pg, 1)
	p1 := startProxyProc(t, proxyConfig{Upstream: pg.Addr(), Tables: []string{table}})
	p2 := startProxyProc(t, proxyConfig{Upstream: pg.Addr(), Tables: []string{table}})
	dir, name := t.TempDir(), uniqueName("pgpaused")
	a := startLockStore(t, []string{"--pg", p1.DSN("faults-pgpaused-lock")}, []string{"--ttl", "1s"}, name, "late", dir, workerDSN(p1, "faults-pgpaused-a"), table, "1")
	pausedHolderScenario(t, a, dir, table, p2, "faults-pgpaused-b", func(ctx context.Context) (tokens.Held, error) {
		return pgStoreFor(t, pg.SuperDSN()).Acquire(ctx, name, tokens.AcquireOptions{TTL: 10 * time.Second})
	})
}

// exitBusy is `fenceproxy lock`'s status for a lock not obtained within --wait.
const exitBusy = 124

var waitedLog = regexp.MustCompile(`waited=(\S+)`)

// cmdPID finds the pid of the CMD that fenceproxy lock sent SIGTERM after losing its lease.
var cmdPID = regexp.MustCompile(`sending SIGTERM to CMD .* \(pid (\d+)\)`)

// lockRun is one finished `fenceproxy lock` process of the contention test.
type lockRun struct {
	code   int
	waited time.Duration
	cpu    time.Duration // user+system CPU of the lock process and its CMD
	stderr string
}

// TestPGLockContention: 20 processes contend for one PostgreSQL lock, again and again, for -faults.contention.
// Each holder records its token and the server's time at entry and exit. Never two holders at once (the
// intervals do not overlap), tokens strictly increase in that order, and every process either got the lock
// within its --wait (exit 0) or gave up at it (exit 124). The CPU the waiting costs is reported.
func TestPGLockContention(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	dsn := dsnApp(proxytest.DSN(pg.Addr(), pgtest.SuperUser, "", pgtest.TestDB), "faults-contention")
	runLockContention(t, []string{"--pg", dsn}, 20, *contentionFor)
}

// watchStalls measures, until the deadline, how late this process's own 50 ms timer fires: the longest
// lateness is the longest stretch the machine stopped running it.
func watchStalls(t *testing.T, until time.Time) func() time.Duration {
	var mu sync.Mutex
	var longest time.Duration
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		const tick = 50 * time.Millisecond
		last := time.Now()
		for time.Now().Before(until) {
			select {
			case <-done:
				return
			case now := <-time.After(tick):
				if late := now.Sub(last) - tick; late > 0 {
					mu.Lock()
					longest = max(longest, late)
					mu.Unlock()
				}
				last = now
			}
		}
	}()
	return func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return longest
	}
}

// runLockContention: procs `fenceproxy lock` processes (reaching the lock service with storeFlags) contend for
// one lock, again and again, for dur. Each holder records its token and the server's time at entry and exit in
// a history table. Never two holders at once (the intervals do not overlap), tokens strictly increase in that
// order, and every process either got the lock within its --wait (exit 0) or gave up at it (exit 124). The CPU
// the waiting costs is reported.
func runLockContention(t *testing.T, storeFlags []string, procs int, dur time.Duration) {
	hist := uniqueName("lockhist")
	if err := pg.Exec("CREATE TABLE " + hist + " (id bigserial PRIMARY KEY, token bigint NOT NULL, pid int NOT NULL, started timestamptz NOT NULL, ended timestamptz)"); err != nil {
		t.Fatal(err)
	}
	name := uniqueName("contended")
	dsn := dsnApp(proxytest.DSN(pg.Addr(), pgtest.SuperUser, "", pgtest.TestDB), "faults-contention")
	const wait = 4 * time.Second
	end := time.Now().Add(dur)
	// A machine that stops running processes for seconds (a loaded CI host, a VM paused by its hypervisor) makes
	// a holder miss its renewal, which is exactly what fenceproxy lock must answer with exit 122, and makes a
	// waiter's own --wait timer fire late. Such a stall is measured here, from this process's own timer, so
	// that those outcomes are accepted only when one happened; mutual exclusion and token order are checked
	// regardless.
	stalled := watchStalls(t, end.Add(wait+time.Minute))
	var mu sync.Mutex
	var runs []lockRun
	var wg sync.WaitGroup
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dir := filepath.Join(t.TempDir(), strconv.Itoa(i))
			os.MkdirAll(dir, 0o755)
			for time.Now().Before(end) {
				lp := startLockStore(t, storeFlags, []string{"--ttl", "5s", "--wait", wait.String()}, name, "critical", dir, dsn, hist, "20")
				select {
				case <-lp.done:
				case <-time.After(wait + 60*time.Second):
					t.Errorf("a lock process ran %v", wait+60*time.Second)
					return
				}
				r := lockRun{code: lp.cmd.ProcessState.ExitCode(), stderr: lp.stderr.String(),
					cpu: lp.cmd.ProcessState.UserTime() + lp.cmd.ProcessState.SystemTime()}
				if m := waitedLog.FindStringSubmatch(r.stderr); m != nil {
					r.waited, _ = time.ParseDuration(m[1])
				}
				mu.Lock()
				runs = append(runs, r)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	served, timedOut := 0, 0
	lost := map[int]bool{} // CMD pids of holders that lost their lease
	var maxWait, waitCPU, waitTime, servedCPU time.Duration
	for _, r := range runs {
		switch r.code {
		case 0:
			served++
			maxWait = max(maxWait, r.waited)
			servedCPU += r.cpu
			// The deadline bounds the wait; the margin is for a statement sent just before it.
			if r.waited > wait+2*time.Second+stalled() {
				t.Errorf("served after waiting %v, beyond --wait %v (longest stall seen: %v)", r.waited, wait, stalled())
			}
		case exitLeaseLost:
			// Its CMD's critical section may overlap the next holder's: the lease ended while it was stopped,
			// which is the very case the database's fence exists for. Its pid exempts that overlap below.
			if m := cmdPID.FindStringSubmatch(r.stderr); m != nil {
				pid, _ := strconv.Atoi(m[1])
				lost[pid] = true
			}
			if stalled() < time.Second {
				t.Errorf("a holder lost its lease with no stall of the machine seen:\n%s", r.stderr)
			} else {
				t.Logf("a holder lost its lease during a %v stall of the machine (exit 122, as it must)", stalled())
			}
		case exitBusy:
			timedOut++
			waitCPU += r.cpu
			waitTime += r.waited
		case exitUnavailable:
			// The lock service did not answer within --dial-timeout: the process fails closed (CMD not
			// started), as it must; a fault of the test only when the machine was not seen to stall (the CI
			// run at 5a5fcc5 met a Redis dial of more than 2 s beside the proxy package's tests).
			if stalled() < time.Second {
				t.Errorf("a lock process found its lock service unavailable with no stall of the machine seen:\n%s", r.stderr)
			} else {
				t.Logf("a lock process found its lock service unavailable during a %v stall of the machine (exit 123, CMD not started)", stalled())
			}
		default:
			t.Errorf("a lock process exited %d:\n%s", r.code, r.stderr)
		}
	}
	t.Logf("%d lock processes over %v: %d served (longest wait %v), %d gave up at --wait %v",
		len(runs), dur, served, maxWait.Round(time.Millisecond), timedOut, wait)
	if served > 0 {
		t.Logf("CPU per served run (lock process + CMD, including process start): %v", (servedCPU / time.Duration(served)).Round(time.Microsecond))
	}
	if waitTime > 0 {
		t.Logf("CPU of the processes that only waited: %v over %v of waiting = %.2f%% of a core per waiter",
			waitCPU.Round(time.Millisecond), waitTime.Round(time.Millisecond), 100*waitCPU.Seconds()/waitTime.Seconds())
	}
	if served == 0 {
		t.Fatal("nobody got the lock")
	}

	ctx := ctxFor(t, 30*time.Second)
	rows, err := connect(t, pg.SuperDSN()).Query(ctx, "SELECT token, pid, started, ended FROM "+hist+" ORDER BY started")
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		token          int64
		pid            int
		started, ended time.Time
		endedKnown     bool
	}
	var es []entry
	for rows.Next() {
		var e entry
		var ended *time.Time
		if err := rows.Scan(&e.token, &e.pid, &e.started, &ended); err != nil {
			t.Fatal(err)
		}
		if ended != nil {
			e.ended, e.endedKnown = *ended, true
		}
		es = append(es, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(es) < served || len(es) > served+len(lost) {
		t.Errorf("%d critical sections recorded, %d lock processes exited 0 and %d lost their lease", len(es), served, len(lost))
	}
	sort.SliceStable(es, func(i, j int) bool { return es[i].started.Before(es[j].started) })
	var held []entry // the critical sections of holders that kept their lease
	for i, e := range es {
		if i > 0 && e.token <= es[i-1].token {
			t.Errorf("tokens not strictly increasing: %d after %d", e.token, es[i-1].token)
		}
		if lost[e.pid] {
			continue
		}
		if !e.endedKnown {
			t.Errorf("critical section of pid %d (token %d) never ended", e.pid, e.token)
			continue
		}
		held = append(held, e)
	}
	for i := 1; i < len(held); i++ {
		e, prev := held[i], held[i-1]
		if e.started.Before(prev.ended) {
			t.Errorf("two holders at once: token %d (pid %d) entered at %v, before token %d (pid %d) left at %v",
				e.token, e.pid, e.started.Format(time.StampMicro), prev.token, prev.pid, prev.ended.Format(time.StampMicro))
		}
	}
}

// clusterCPU is the CPU time used so far by a cluster's postmaster and all its processes, live or reaped.
func clusterCPU(t *testing.T, cl *pgtest.Cluster) time.Duration {
	t.Helper()
	const tick = 10 * time.Millisecond // USER_HZ is 100 on Linux
	read := func(pid int) (ppid int, self, children int64, ok bool) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, 0, 0, false
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		// Fields after the command: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
		ppid, _ = strconv.Atoi(f[1])
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		cu, _ := strconv.ParseInt(f[13], 10, 64)
		cs, _ := strconv.ParseInt(f[14], 10, 64)
		return ppid, u + st, cu + cs, true
	}
	root := cl.PID()
	_, self, children, ok := read(root)
	if !ok {
		t.Fatalf("postmaster %d not found", root)
	}
	total := self + children
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == root {
			continue
		}
		if ppid, self, _, ok := read(pid); ok && ppid == root {
			total += self
		}
	}
	return time.Duration(total) * tick
}

// TestPGLockWaitingCPU measures what waiting costs: 20 `fenceproxy lock --pg --wait 10s` processes wait behind
// a held lock until they give up. The CPU of the waiters and of the whole PostgreSQL cluster over the wait is
// reported (not asserted: timings are not pass/fail); every waiter exits 124 without running its command.
func TestPGLockWaitingCPU(t *testing.T) {
	t.Parallel()
	cl := pgtest.MustStart(t, pgtest.Options{})
	dsn := dsnApp(proxytest.DSN(cl.Addr(), pgtest.SuperUser, "", pgtest.TestDB), "faults-waitcpu")
	name := uniqueName("waitcpu")
	holder, err := pgStoreFor(t, dsnApp(proxytest.DSN(cl.Addr(), pgtest.SuperUser, "", pgtest.TestDB), "faults-waitcpu-holder")).Acquire(context.Background(), name, tokens.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	const waiters = 20
	const wait = 10 * time.Second
	before := clusterCPU(t, cl)
	start := time.Now()
	var lps []*lockProc
	dir := t.TempDir()
	for range waiters {
		lps = append(lps, startLockStore(t, []string{"--pg", dsn}, []string{"--wait", wait.String()}, name, "critical", dir, dsn, "nosuchtable", "0"))
	}
	var clientCPU time.Duration
	for _, lp := range lps {
		if code := lp.wait(wait + 60*time.Second); code != exitBusy {
			t.Errorf("waiter exited %d, want %d:\n%s", code, exitBusy, lp.stderr.String())
		}
		clientCPU += lp.cmd.ProcessState.UserTime() + lp.cmd.ProcessState.SystemTime()
	}
	elapsed := time.Since(start)
	noLeakedBackends(t, cl, "faults-waitcpu", 20*time.Second)
	serverCPU := clusterCPU(t, cl) - before
	t.Logf("%d waiters for %v each (elapsed %v): client CPU %v (%.2f%% of a core per waiting process, its start included), PostgreSQL CPU %v (%.2f%% of a core per waiter)",
		waiters, wait, elapsed.Round(time.Millisecond), clientCPU.Round(time.Millisecond), 100*clientCPU.Seconds()/(waiters*wait.Seconds()),
		serverCPU.Round(time.Millisecond), 100*serverCPU.Seconds()/(waiters*wait.Seconds()))
	if holder.Err() != nil {
		t.Fatalf("the holder lost its lease: %v", holder.Err())
	}
}

// TestPGLockServerRestart: PostgreSQL restarts while `fenceproxy lock --pg` holds a lock with a lease longer
// than the restart. The lease is a committed row judged by the server's clock, so the holder keeps it: renewals
// resume on a new connection, CMD is not disturbed, and nobody else gets the lock. When the database then stays
// down longer than the lease, the holder declares it lost and stops CMD (exit 122); once it is back, the next
// holder's token is higher.
func TestPGLockServerRestart(t *testing.T) {
	t.Parallel()
	cl := pgtest.MustStart(t, pgtest.Options{})
	table := fencedTable(t, cl, 1)
	dsn := dsnApp(proxytest.DSN(cl.Addr(), pgtest.SuperUser, "", pgtest.TestDB), "faults-pgrestart")
	store := pgStoreFor(t, dsn)
	name := uniqueName("pgrestart")
	dirA := t.TempDir()
	a := startLockStore(t, []string{"--pg", dsn}, []string{"--ttl", "15s"}, name, "hold", dirA, dsn, table, "1")
	var ready workerReady
	readJSON(t, filepath.Join(dirA, "ready"), 30*time.Second, &ready)
	ctx := ctxFor(t, 120*time.Second)
	leaseEnd := func() time.Time {
		var end time.Time
		c, err := pgx.Connect(ctx, cl.SuperDSN())
		if err != nil {
			return time.Time{}
		}
		defer c.Close(context.Background())
		c.QueryRow(ctx, "SELECT expires_at FROM fenceproxy.lock_leases WHERE name = $1 AND owner IS NOT NULL", name).Scan(&end)
		return end
	}
	before := leaseEnd()
	if err := cl.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "a renewal after the restart", func() bool { return leaseEnd().After(before) })
	if a.exited() || exists(filepath.Join(dirA, "sigterm")) {
		t.Fatalf("the holder stopped across a restart shorter than its lease:\n%s", a.stderr.String())
	}
	if _, err := store.Acquire(ctx, name, tokens.AcquireOptions{Try: true}); err == nil {
		t.Fatal("the lock was free after the restart")
	}
	a.signalGroup(syscall.SIGTERM) // CMD exits 42 on SIGTERM; the lock was not lost
	if code := a.wait(30 * time.Second); code != 42 {
		t.Fatalf("lock exited %d, want CMD's 42:\n%s", code, a.stderr.String())
	}

	// Down for longer than the lease.
	dirB := t.TempDir()
	b := startLockStore(t, []string{"--pg", dsn}, []string{"--ttl", "2s"}, name, "hold", dirB, dsn, table, "1")
	readJSON(t, filepath.Join(dirB, "ready"), 30*time.Second, &ready)
	if err := cl.Kill(); err != nil {
		t.Fatal(err)
	}
	if code := b.wait(30 * time.Second); code != exitLeaseLost {
		t.Fatalf("lock with the database down exited %d, want %d:\n%s", code, exitLeaseLost, b.stderr.String())
	}
	if !exists(filepath.Join(dirB, "sigterm")) {
		t.Fatal("CMD was not stopped when the lease was lost")
	}
	if err := cl.StartAgain(); err != nil {
		t.Fatal(err)
	}
	var next tokens.Held
	waitFor(t, 60*time.Second, "the lock after the database came back", func() bool {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		h, err := store.Acquire(actx, name, tokens.AcquireOptions{})
		next = h
		return err == nil
	})
	defer next.Release(context.Background())
	if next.Token() <= ready.Token {
		t.Fatalf("token after the outage %d not above %d", next.Token(), ready.Token)
	}
}

// TestPGLockCutOff: the lock process reaches PostgreSQL through a relay. A cut (connections reset) that heals
// before the lease's deadline costs nothing: the holder reconnects and renews. A network that stops delivering
// (the relay stalls) means no renewal: the holder declares the lease lost, stops CMD and exits 122; B takes
// over with a higher token, and the cut-off holder's write after that is refused.
func TestPGLockCutOff(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	table := fencedTable(t, pg, 1)
	p1 := startProxyProc(t, proxyConfig{Upstream: pg.Addr(), Tables: []string{table}})
	relay := startRelay(t, pg.Addr())
	lockDSN := dsnApp(proxytest.DSN(relay.Addr(), pgtest.SuperUser, "", pgtest.TestDB), "faults-pgcut-lock")
	name := uniqueName("pgcut")
	h := &History{}
	ctx := ctxFor(t, 120*time.Second)

	dirA := t.TempDir()
	a := startLockStore(t, []string{"--pg", lockDSN}, []string{"--ttl", "3s"}, name, "hold", dirA, workerDSN(p1, "faults-pgcut-a"), table, "1")
	var ready workerReady
	readJSON(t, filepath.Join(dirA, "ready"), 30*time.Second, &ready)
	var aw Attempt
	readJSON(t, filepath.Join(dirA, "result"), time.Second, &aw)
	h.Record(aw)

	adm := connect(t, pg.SuperDSN())
	leaseEnd := func() time.Time {
		var end time.Time
		adm.QueryRow(ctx, "SELECT expires_at FROM fenceproxy.lock_leases WHERE name = $1 AND owner IS NOT NULL", name).Scan(&end)
		return end
	}
	accepted := relay.accepted.Load()
	relay.Cut()
	cutAt := leaseEnd()
	waitFor(t, 20*time.Second, "the holder to reconnect after the cut", func() bool { return relay.accepted.Load() > accepted })
	waitFor(t, 20*time.Second, "a renewal after the cut", func() bool { return leaseEnd().After(cutAt) })
	store := pgStoreFor(t, pg.SuperDSN())
	if a.exited() {
		t.Fatalf("the holder gave up after a healed cut:\n%s", a.stderr.String())
	}
	if !strings.Contains(a.stderr.String(), `msg="lock renewal failed"`) {
		t.Errorf("no log line for the failed renewal:\n%s", a.stderr.String())
	}
	if _, err := store.Acquire(ctx, name, tokens.AcquireOptions{Try: true}); err == nil {
		t.Fatal("the lock was free after a healed cut")
	}

	relay.Stall(true, true)
	if code := a.wait(30 * time.Second); code != exitLeaseLost {
		t.Fatalf("cut-off lock exited %d, want %d:\n%s", code, exitLeaseLost, a.stderr.String())
	}
	if !exists(filepath.Join(dirA, "sigterm")) {
		t.Fatal("CMD was not stopped when the lease was lost")
	}
	b, err := store.Acquire(ctx, name, tokens.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(context.Background())
	if b.Token() <= ready.Token {
		t.Fatalf("B's token %d not above A's %d", b.Token(), ready.Token)
	}
	bc := connect(t, p1.DSN("faults-pgcut-b"))
	if err := tokens.SetToken(ctx, bc, b.Token(), ""); err != nil {
		t.Fatal(err)
	}
	if bw := h.Write(ctx, bc, table, "B", b.Token(), 1); bw.Outcome != Applied {
		t.Fatalf("B's write: %v", bw)
	}
	// A writer that kept A's token (a CMD that ignored SIGTERM would) is refused.
	ac := connect(t, p1.DSN("faults-pgcut-a2"))
	if err := tokens.SetToken(ctx, ac, ready.Token, ""); err != nil {
		t.Fatal(err)
	}
	if late := h.Write(ctx, ac, table, "A-late", ready.Token, 1); late.Outcome != Stale {
		t.Fatalf("A's late write: %v, want 55F01", late)
	}
	relay.Thaw()
	h.Check(t, pg, table)
}
