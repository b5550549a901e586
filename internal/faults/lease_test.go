package faults

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// Exit statuses of `fenceproxy lock` (cmd/fenceproxy/lock.go).
const (
	exitLeaseLost   = 122
	exitUnavailable = 123
)

// twoProxies starts two fenceproxy processes in front of the shared cluster, both verifying tokens with e.
func twoProxies(t *testing.T, e *etcdtest.Etcd, table string) (*proxyProc, *proxyProc) {
	cfg := proxyConfig{Upstream: pg.Addr(), Tables: []string{table}, Etcd: e.Endpoints()}
	return startProxyProc(t, cfg), startProxyProc(t, cfg)
}

// TestPausedHolderLateWriteIsFenced is the acceptance scenario. A writer runs under `fenceproxy lock --ttl 1s`
// through one proxy process; the test freezes its whole process group (lock and writer) past the TTL; B takes
// the lock and writes through the other proxy process; on SIGCONT the writer's late write fails with 55F01, the
// row keeps B's value and token, and the lock process exits with "lease lost".
func TestPausedHolderLateWriteIsFenced(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	e := etcdtest.Start(t)
	table := fencedTable(t, pg, 1)
	p1, p2 := twoProxies(t, e, table)
	dir, name := t.TempDir(), uniqueName("paused")
	a := startLock(t, e, []string{"--ttl", "1s"}, name, "late", dir, workerDSN(p1, "faults-paused-a"), table, "1")
	pausedHolderScenario(t, a, dir, table, p2, "faults-paused-b", func(ctx context.Context) (tokens.Held, error) {
		return tokens.Acquire(ctx, e.Client(), name, tokens.WithTTL(10*time.Second))
	})
}

// pausedHolderScenario is the acceptance scenario's course, the same for every lock store, once A runs: A is a
// `fenceproxy lock --ttl 1s` process whose "late" worker reports DIR/ready holding the lock (through one proxy);
// the test freezes A's whole process group (lock and writer) past the lease; takeB takes the lock for B, which
// returns only once A's lease has ended on the server; B writes through p2; on SIGCONT A's late write fails with
// 55F01 naming B's token, A's lock exits 122 ("lease lost"), B's row keeps its value and token, and B keeps its
// lock (A's late release cannot take it).
func pausedHolderScenario(t *testing.T, a *lockProc, dir, table string, p2 *proxyProc, appB string, takeB func(context.Context) (tokens.Held, error)) {
	t.Helper()
	ctx := ctxFor(t, 90*time.Second)
	h := &History{}
	var ready workerReady
	readJSON(t, filepath.Join(dir, "ready"), 60*time.Second, &ready)
	a.signalGroup(syscall.SIGSTOP)

	b, err := takeB(ctx)
	if err != nil {
		t.Fatalf("B could not take the lock while A was frozen: %v", err)
	}
	defer b.Release(context.Background())
	if b.Token() <= ready.Token {
		t.Fatalf("B's token %d is not above frozen A's %d", b.Token(), ready.Token)
	}
	if a.exited() {
		t.Fatal("the frozen lock process exited")
	}
	bc := connect(t, p2.DSN(appB))
	if err := tokens.SetToken(ctx, bc, b.Token(), ""); err != nil {
		t.Fatal(err)
	}
	bw := h.Write(ctx, bc, table, "B", b.Token(), 1)
	if bw.Outcome != Applied {
		t.Fatalf("B's write: %v", bw)
	}

	writeJSON(filepath.Join(dir, "go"), true)
	a.signalGroup(syscall.SIGCONT)
	var aw Attempt
	readJSON(t, filepath.Join(dir, "result"), 30*time.Second, &aw)
	h.Record(aw)
	if aw.Outcome != Stale || aw.Code != "55F01" || aw.RowToken != b.Token() || aw.Token != ready.Token {
		t.Fatalf("A's late write: got %v (row token %d), want 55F01 naming B's token %d", aw, aw.RowToken, b.Token())
	}
	if code := a.wait(30 * time.Second); code != exitLeaseLost {
		t.Fatalf("fenceproxy lock exited %d, want %d (lease lost)", code, exitLeaseLost)
	}
	var val string
	var tok int64
	if err := bc.QueryRow(ctx, "SELECT val, fence_token FROM "+table+" WHERE id = 1").Scan(&val, &tok); err != nil {
		t.Fatal(err)
	}
	if val != bw.Val || tok != b.Token() {
		t.Fatalf("row is %q/%d, want B's %q/%d", val, tok, bw.Val, b.Token())
	}
	if b.Err() != nil {
		t.Fatalf("B lost its lease to A's late release: %v", b.Err())
	}
	h.Check(t, pg, table)
}

// TestSimultaneousAcquire starts several `fenceproxy lock` processes at once, each running a writer that writes
// the same row once through one of two proxies: they run one at a time, with strictly increasing tokens, and
// every write is applied.
func TestSimultaneousAcquire(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	e := etcdtest.Start(t)
	table := fencedTable(t, pg, 1)
	p1, p2 := twoProxies(t, e, table)
	name := uniqueName("simultaneous")
	const n = 4
	var procs []*lockProc
	var dirs []string
	for i := range n {
		p := p1
		if i%2 == 1 {
			p = p2
		}
		dir := t.TempDir()
		dirs = append(dirs, dir)
		procs = append(procs, startLock(t, e, []string{"--ttl", "5s"}, name, "once", dir, workerDSN(p, "faults-simultaneous"), table, "1"))
	}
	h := &History{}
	tokensSeen := map[int64]bool{}
	for i, lp := range procs {
		if code := lp.wait(60 * time.Second); code != 0 {
			t.Fatalf("lock process %d exited %d:\n%s", i, code, lp.stderr.String())
		}
		var a Attempt
		readJSON(t, filepath.Join(dirs[i], "result"), time.Second, &a)
		h.Record(a)
		if a.Outcome != Applied {
			t.Errorf("writer %d: %v", i, a)
		}
		if tokensSeen[a.Token] {
			t.Errorf("token %d handed out twice", a.Token)
		}
		tokensSeen[a.Token] = true
	}
	h.Check(t, pg, table)
	// Mutual exclusion shows in the applied order: each writer held the lock alone, so tokens strictly rise.
	rows, err := connect(t, pg.SuperDSN()).Query(ctxFor(t, 10*time.Second), "SELECT new_token FROM "+table+"_history ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	toks, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(toks); i++ {
		if toks[i] <= toks[i-1] {
			t.Fatalf("applied tokens not strictly increasing: %v", toks)
		}
	}
	if len(toks) != n {
		t.Fatalf("%d writes applied, want %d", len(toks), n)
	}
}

// TestHolderCrash kills the lock holder's process group (lock and writer) with SIGKILL while a second
// `fenceproxy lock` waits: the waiter gets the lock once the lease expires, writes with a higher token, and the
// crashed writer's backend does not linger.
func TestHolderCrash(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	e := etcdtest.Start(t)
	table := fencedTable(t, pg, 1)
	p1, p2 := twoProxies(t, e, table)
	admin := e.Client()
	name := uniqueName("crash")
	h := &History{}

	dirA, dirB := t.TempDir(), t.TempDir()
	a := startLock(t, e, []string{"--ttl", "1s"}, name, "hold", dirA, workerDSN(p1, "faults-crash-a"), table, "1")
	var ready workerReady
	readJSON(t, filepath.Join(dirA, "ready"), 30*time.Second, &ready)
	var aw Attempt
	readJSON(t, filepath.Join(dirA, "result"), time.Second, &aw)
	h.Record(aw)
	b := startLock(t, e, []string{"--ttl", "5s"}, name, "once", dirB, workerDSN(p2, "faults-crash-b"), table, "1")
	waitFor(t, 20*time.Second, "B queued behind A", func() bool { return etcdtest.QueueLen(t, admin, tokens.DefaultPrefix+name) == 2 })
	if exists(filepath.Join(dirB, "result")) {
		t.Fatal("B wrote while A held the lock")
	}
	a.signalGroup(syscall.SIGKILL)
	if code := b.wait(30 * time.Second); code != 0 {
		t.Fatalf("B's lock process exited %d", code)
	}
	var bw Attempt
	readJSON(t, filepath.Join(dirB, "result"), time.Second, &bw)
	h.Record(bw)
	if aw.Outcome != Applied || bw.Outcome != Applied || bw.Token <= aw.Token {
		t.Fatalf("A %v, B %v: want both applied, B's token higher", aw, bw)
	}
	noLeakedBackends(t, pg, "faults-crash-a", 20*time.Second)
	h.Check(t, pg, table)
}

// TestEtcdDownFailsClosed stops etcd under a running `fenceproxy lock`: the lock cannot renew its lease, reports
// the loss, stops its writer and exits "lease lost". While etcd is down a new lock fails ("unavailable") without
// running its command, and the proxy refuses a token it cannot verify (55F03), at startup and at SET. Once etcd
// is back, locks and writes work again, with higher tokens.
func TestEtcdDownFailsClosed(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	e := etcdtest.Start(t)
	table := fencedTable(t, pg, 1)
	p1, _ := twoProxies(t, e, table)
	name := uniqueName("etcddown")
	h := &History{}

	dirA := t.TempDir()
	a := startLock(t, e, []string{"--ttl", "1s"}, name, "hold", dirA, workerDSN(p1, "faults-etcddown"), table, "1")
	var ready workerReady
	readJSON(t, filepath.Join(dirA, "ready"), 30*time.Second, &ready)
	var aw Attempt
	readJSON(t, filepath.Join(dirA, "result"), time.Second, &aw)
	h.Record(aw)

	e.Stop()
	if code := a.wait(30 * time.Second); code != exitLeaseLost {
		t.Fatalf("lock process with etcd down exited %d, want %d (lease lost)", code, exitLeaseLost)
	}
	if !exists(filepath.Join(dirA, "sigterm")) {
		t.Fatal("the writer was not sent SIGTERM when the lease was lost")
	}
	if !strings.Contains(a.stderr.String(), "lease") {
		t.Errorf("lock process did not say why it stopped:\n%s", a.stderr.String())
	}

	dirC := t.TempDir()
	c := startLock(t, e, []string{"--ttl", "1s", "--dial-timeout", "1s"}, name, "once", dirC, workerDSN(p1, "faults-etcddown"), table, "1")
	if code := c.wait(30 * time.Second); code != exitUnavailable {
		t.Fatalf("lock with etcd down exited %d, want %d", code, exitUnavailable)
	}
	if exists(filepath.Join(dirC, "result")) {
		t.Fatal("the command ran without the lock")
	}

	// A token the proxy has not seen etcd issue must be checked with etcd; etcd is down: refused.
	unverified := ready.Token + 1000
	ctx := ctxFor(t, 60*time.Second)
	_, err := pgx.Connect(ctx, p1.DSN("faults-etcddown")+"&options="+urlQuery("-c fence.token="+strconv.FormatInt(unverified, 10)))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55F03" || !strings.HasPrefix(pgErr.Message, "invalid fencing token") {
		t.Fatalf("startup with an unverifiable token while etcd is down: want 55F03, got %v", err)
	}
	conn := connect(t, p1.DSN("faults-etcddown"))
	if _, err := conn.Exec(ctx, "SET fence.token = "+strconv.FormatInt(unverified, 10)); !errors.As(err, &pgErr) || pgErr.Code != "55F03" {
		t.Errorf("SET of an unverifiable token while etcd is down: want 55F03, got %v", err)
	}
	// The proxy keeps serving reads, and writes under tokens it has already verified.
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if err := tokens.SetToken(ctx, conn, ready.Token, ""); err != nil {
		t.Fatalf("a token verified before etcd went down: %v", err)
	}

	if err := e.StartAgain(); err != nil {
		t.Fatal(err)
	}
	// The proxy's etcd client reconnects with a backoff: until it does, verification still fails closed. Wait
	// until a token etcd has only now issued (a new revision, above any the proxy has seen) is accepted.
	back := time.Now()
	probe := e.Client()
	waitFor(t, 60*time.Second, "the proxy to verify tokens again after etcd came back", func() bool {
		resp, err := probe.Put(ctx, "faults-probe", "x")
		if err != nil {
			return false
		}
		c, err := pgx.Connect(ctx, p1.DSN("faults-etcddown")+"&options="+urlQuery("-c fence.token="+strconv.FormatInt(resp.Header.Revision, 10)))
		if err != nil {
			return false
		}
		c.Close(ctx)
		return true
	})
	t.Logf("the proxy verified tokens again %v after etcd came back", time.Since(back).Round(time.Millisecond))
	dirD := t.TempDir()
	d := startLock(t, e, []string{"--ttl", "2s"}, name, "once", dirD, workerDSN(p1, "faults-etcddown"), table, "1")
	if code := d.wait(60 * time.Second); code != 0 {
		t.Fatalf("lock after etcd came back exited %d", code)
	}
	var dw Attempt
	readJSON(t, filepath.Join(dirD, "result"), time.Second, &dw)
	h.Record(dw)
	if dw.Outcome != Applied || dw.Token <= aw.Token {
		t.Fatalf("after etcd came back: %v (A had token %d)", dw, aw.Token)
	}
	h.Check(t, pg, table)
}

func urlQuery(s string) string {
	r := strings.NewReplacer(" ", "%20", "=", "%3D")
	return r.Replace(s)
}

// TestVerifierFailOpenWhenEtcdDown: with token.verify.etcd.fail_open, a token the proxy cannot verify because
// etcd is down is let through unverified (the documented trade-off of fail_open); without it, it is refused.
func TestVerifierFailOpenWhenEtcdDown(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	e := etcdtest.Start(t)
	table := fencedTable(t, pg, 1)
	open := startProxyProc(t, proxyConfig{Upstream: pg.Addr(), Tables: []string{table}, Etcd: e.Endpoints(), FailOpen: true})
	e.Stop()
	ctx := ctxFor(t, 30*time.Second)
	conn := connect(t, open.DSN("faults-failopen"))
	if _, err := conn.Exec(ctx, "SET fence.token = 5000"); err != nil {
		t.Fatalf("fail_open: true, etcd down: SET of a token that cannot be verified: want accepted, got %v", err)
	}
}
