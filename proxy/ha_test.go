package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
	"github.com/fenceproxy/fenceproxy/schema"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// haPair is a primary, its streaming standby, and a proxy in front of both (upstream.hosts) protecting
// accounts(id, v, fence_token).
type haPair struct {
	primary, standby *pgtest.Cluster
	proxy            *proxytest.Proxy
}

const haInterval = 200 * time.Millisecond

func startHAPair(t *testing.T, grants proxy.GrantSource, setup string) *haPair {
	t.Helper()
	return startHAPairWith(t, grants, setup, "")
}

// startHAPairWith is startHAPair with more configuration (yaml, appended).
func startHAPairWith(t *testing.T, grants proxy.GrantSource, setup, yaml string) *haPair {
	t.Helper()
	return startHAPairConf(t, grants, setup, yaml, nil, nil)
}

// startHAPairConf is startHAPairWith with postgresql.conf settings (conf) for both servers and, when tune is
// set, the proxy's options changed by it (proxytest.Options.Tune: the package's test hooks).
func startHAPairConf(t *testing.T, grants proxy.GrantSource, setup, yaml string, conf map[string]string, tune func(*proxy.Options)) *haPair {
	t.Helper()
	pgtest.Require(t, pg)
	primary := pgtest.MustStart(t, pgtest.Options{ExtraConf: conf})
	if err := primary.Exec(`CREATE TABLE accounts (id int PRIMARY KEY, v int NOT NULL, fence_token bigint);
		INSERT INTO accounts VALUES (1, 0, NULL), (2, 0, NULL);` + setup); err != nil {
		t.Fatal(err)
	}
	standby := pgtest.MustStartStandby(t, primary, pgtest.Options{ExtraConf: conf})
	p := proxytest.Start(t, "", proxytest.Options{
		Hosts:    []string{primary.Addr(), standby.Addr()},
		Upstream: fmt.Sprintf("  health_interval: %s\n  health_timeout: 1s\n  connect_timeout: 2s\n", haInterval),
		YAML:     "tables:\n  - name: accounts\n    token_column: fence_token\n" + yaml,
		Grants:   grants,
		Tune:     tune,
	})
	return &haPair{primary: primary, standby: standby, proxy: p}
}

// haCtx bounds an HA test: promotions, replays and failovers take longer on a loaded machine than ctxT allows.
func haCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// reachesPort reports, each time it is called, whether a new session through dsn lands on the server at port.
func reachesPort(ctx context.Context, dsn string, port int) func() bool {
	return func() bool {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return false
		}
		defer c.Close(ctx)
		got, err := serverPort(ctx, c)
		return err == nil && got == port
	}
}

// failOver waits for the standby to replay all the primary wrote, stops the primary at once, and promotes the
// standby: a failover that loses nothing.
func (h *haPair) failOver(ctx context.Context, t *testing.T) {
	t.Helper()
	h.promote(ctx, t, func() {
		if err := h.primary.StopImmediate(); err != nil {
			t.Fatal(err)
		}
	})
}

// promote waits for the standby to replay all the primary wrote, runs before (what becomes of the old primary;
// nil: it runs on) and promotes the standby.
func (h *haPair) promote(ctx context.Context, t *testing.T, before func()) {
	t.Helper()
	if err := h.standby.WaitReplayed(ctx, h.primary); err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before()
	}
	if err := h.standby.Promote(); err != nil {
		t.Fatal(err)
	}
}

// switchOver waits for the standby to replay all the primary wrote, makes the primary read-only (it stays up,
// demoted: admin is connected to it), promotes the standby, and waits until a new session through dsn reaches
// the new primary.
func (h *haPair) switchOver(ctx context.Context, t *testing.T, admin *pgx.Conn, dsn string) {
	t.Helper()
	h.promote(ctx, t, func() { setReadOnly(ctx, t, admin) })
	eventually(t, 30*time.Second, "a session through the proxy to reach the new primary", reachesPort(ctx, dsn, h.standby.Port()))
}

// splitBrain waits for the standby to replay all the primary wrote and promotes it while the primary runs on,
// and waits until the proxy sees two primaries.
func (h *haPair) splitBrain(ctx context.Context, t *testing.T) {
	t.Helper()
	h.promote(ctx, t, nil)
	waitMetric(t, h.proxy, "fenceproxy_upstream_split_brain", 1, "the proxy to see two primaries")
}

// setReadOnly makes the server admin is connected to read-only for new transactions (default_transaction_read_only
// on, reloaded): to the router a primary that is no longer one, while it stays up.
func setReadOnly(ctx context.Context, t *testing.T, admin *pgx.Conn) {
	t.Helper()
	if _, err := admin.Exec(ctx, "ALTER SYSTEM SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
}

// installFence installs the fenceproxy schema (lock marks, the guard) for accounts on the server admin is
// connected to.
func installFence(ctx context.Context, t *testing.T, admin *pgx.Conn) {
	t.Helper()
	cfg, err := config.Parse("t.yaml", []byte("upstream:\n  address: a:1\ntables:\n  - name: accounts\n    token_column: fence_token\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := schema.Install(ctx, admin, schema.FromConfig(cfg)); err != nil {
		t.Fatal(err)
	}
}

// waitMetric waits, up to 30 s (a failover's pace on a loaded machine), until the proxy's metric name, summed
// over its series, is want.
func waitMetric(t *testing.T, p *proxytest.Proxy, name string, want float64, what string) {
	t.Helper()
	eventually(t, 30*time.Second, what, func() bool {
		v, _ := metricValue(t, p.Registry, name)
		return v == want
	})
}

// connectOnPrimary connects through dsn and fails the test at once unless the session's first statement runs
// on the pair's first primary; who names it.
func (h *haPair) connectOnPrimary(ctx context.Context, t *testing.T, dsn, who string) *pgx.Conn {
	t.Helper()
	c := connect(t, dsn)
	h.onPrimary(ctx, t, c, who)
	return c
}

// onPrimary fails the test at once unless c's next statement runs on the pair's first primary; who names c.
func (h *haPair) onPrimary(ctx context.Context, t *testing.T, c *pgx.Conn, who string) {
	t.Helper()
	if port, err := serverPort(ctx, c); err != nil || port != h.primary.Port() {
		t.Fatalf("%s reached port %d (%v), want the primary's %d", who, port, err, h.primary.Port())
	}
}

// simpleDSN is a superuser DSN through the proxy to database db over the simple query protocol (what the
// admin console speaks, and pooled clients whose statements a test looks for as sent).
func (h *haPair) simpleDSN(db string) string {
	return h.proxy.DSN(pgtest.SuperUser, "", db) + "&default_query_exec_mode=simple_protocol"
}

// startPooledHAPair is startHAPairWith in transaction pooling (pooledYAML: pool holds the pool's settings) and
// the DSN of its clients (simpleDSN).
func startPooledHAPair(t *testing.T, pool ...string) (*haPair, string) {
	t.Helper()
	h := startHAPairWith(t, nil, "", pooledYAML(pool...))
	return h, h.simpleDSN(pgtest.TestDB)
}

// pooledYAML is the configuration of transaction pooling with the settings of pool (each "name: value") and
// trust authentication of the clients.
func pooledYAML(pool ...string) string {
	y := "pool:\n  mode: transaction\n"
	for _, s := range pool {
		y += "  " + s + "\n"
	}
	return y + "auth:\n  type: trust\n"
}

// poolAdmin is the pool setting that lets the tests' superuser use the admin console.
const poolAdmin = "admin_users: [" + pgtest.SuperUser + "]"

// beginWith begins a transaction on c and runs stmts in it, failing the test at once if one fails: a
// transaction holding what they take (a lock, a write) until the test ends it.
func beginWith(ctx context.Context, t *testing.T, c *pgx.Conn, stmts ...string) pgx.Tx {
	t.Helper()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range stmts {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return tx
}

// execAsync runs sql on c in the background; the channel gets its error (nil when it succeeded).
func execAsync(ctx context.Context, c *pgx.Conn, sql string) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, sql)
		done <- err
	}()
	return done
}

// waitRunning waits until one backend of the server c is connected to runs a statement whose text ends with
// stmt (a pooled client's is preceded by the proxy's own statements).
func waitRunning(ctx context.Context, t *testing.T, c *pgx.Conn, stmt, what string) {
	t.Helper()
	eventually(t, 10*time.Second, what, func() bool {
		var n int
		err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%' || $1 AND state = 'active'", stmt).Scan(&n)
		return err == nil && n == 1
	})
}

func (h *haPair) connect(t *testing.T) *pgx.Conn {
	return connect(t, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
}

// serverPort is the port of the server a connection through the proxy reached.
func serverPort(ctx context.Context, c *pgx.Conn) (int, error) {
	var port int
	err := c.QueryRow(ctx, "SELECT inet_server_port()").Scan(&port)
	return port, err
}

func sqlstate(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// TestFailoverToPromotedStandby: the primary hangs (SIGSTOP) and its standby is promoted. New sessions reach the
// new primary; an idle session on the old one ends with 57P01 naming the new primary; a COMMIT whose answer
// was lost is reported 08007 and not replayed; nothing written through the proxy after the change reaches the
// old primary. When the old primary wakes up still claiming to be primary (split brain), fenced writes are
// refused with 55F04 naming both hosts, until it is stopped.
func TestFailoverToPromotedStandby(t *testing.T) {
	h := startHAPair(t, nil, "")
	ctx := haCtx(t)
	idle := h.connectOnPrimary(ctx, t, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB), "a read-write session")
	committing := h.connect(t)
	tx := beginWith(ctx, t, committing, "SET LOCAL fence.token = 5", "UPDATE accounts SET v = 1 WHERE id = 1")
	if err := h.standby.WaitReplayed(ctx, h.primary); err != nil {
		t.Fatal(err)
	}

	if err := h.primary.Pause(); err != nil {
		t.Fatal(err)
	}
	commitErr := make(chan error, 1)
	go func() { commitErr <- tx.Commit(ctx) }() // its answer never comes: the primary is frozen
	if err := h.standby.Promote(); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()

	// New sessions reach the new primary and write there.
	var writer *pgx.Conn
	eventually(t, 30*time.Second, "a write through the proxy to reach the new primary", func() bool {
		c, err := pgx.Connect(ctx, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
		if err != nil {
			return false
		}
		if port, err := serverPort(ctx, c); err != nil || port != h.standby.Port() {
			c.Close(ctx)
			return false
		}
		if _, err := c.Exec(ctx, "SET fence.token = 6"); err != nil {
			c.Close(ctx)
			return false
		}
		if _, err := c.Exec(ctx, "UPDATE accounts SET v = 2 WHERE id = 1"); err != nil {
			c.Close(ctx)
			return false
		}
		writer = c
		return true
	})
	t.Cleanup(func() { writer.Close(context.Background()) })
	t.Logf("first write on the new primary %v after pg_ctl promote returned (health_interval %v)", time.Since(promoted), haInterval)

	// The COMMIT whose answer was lost: 08007, not retried.
	if err := <-commitErr; sqlstate(err) != "08007" {
		t.Errorf("COMMIT cut by the failover: %v, want 08007", err)
	}
	// The idle session on the old primary: 57P01 naming the new one.
	_, err := idle.Exec(ctx, "SELECT 1")
	if sqlstate(err) != "57P01" || !strings.Contains(err.Error(), h.standby.Addr()) {
		t.Errorf("idle session on the old primary: %v, want 57P01 naming %s", err, h.standby.Addr())
	}
	if _, err := writer.Exec(ctx, "INSERT INTO accounts (id, v) VALUES (3, 0)"); err != nil {
		t.Fatal(err)
	}

	// The old primary wakes up, still a primary: split brain.
	if err := h.primary.Resume(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "fenced writes refused during the split brain", func() bool {
		_, err := writer.Exec(ctx, "UPDATE accounts SET v = 3 WHERE id = 1")
		return sqlstate(err) == "55F04"
	})
	_, err = writer.Exec(ctx, "UPDATE accounts SET v = 3 WHERE id = 1")
	if sqlstate(err) != "55F04" || !strings.Contains(err.Error(), h.primary.Addr()) || !strings.Contains(err.Error(), h.standby.Addr()) {
		t.Errorf("write during the split brain: %v, want 55F04 naming %s and %s", err, h.primary.Addr(), h.standby.Addr())
	}
	// Reads go on.
	if _, err := serverPort(ctx, writer); err != nil {
		t.Errorf("read during the split brain: %v", err)
	}
	// Nothing written through the proxy after the change reached the old primary.
	old := connect(t, h.primary.SuperDSN())
	var n int
	if err := old.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 3 OR v >= 2").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d rows written after the failover are on the old primary", n)
	}
	old.Close(ctx)

	// The old primary is stopped: the split brain is over and writes go on.
	if err := h.primary.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "fenced writes to go again after the split brain", func() bool {
		_, err := writer.Exec(ctx, "UPDATE accounts SET v = 4 WHERE id = 1")
		return err == nil
	})
}

// TestFailoverAfterPrimaryStopped is the plain case: the old primary is stopped, the standby promoted;
// sessions on the old primary end with 57P01 and writes through the proxy reach the new primary.
func TestFailoverAfterPrimaryStopped(t *testing.T) {
	h := startHAPair(t, nil, "")
	ctx := haCtx(t)
	idle := h.connectOnPrimary(ctx, t, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB), "a read-write session")
	h.failOver(ctx, t)
	promoted := time.Now()
	eventually(t, 30*time.Second, "a write through the proxy to reach the new primary", func() bool {
		c, err := pgx.Connect(ctx, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
		if err != nil {
			return false
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, "SET fence.token = 6; UPDATE accounts SET v = 2 WHERE id = 1")
		port, perr := serverPort(ctx, c)
		return err == nil && perr == nil && port == h.standby.Port()
	})
	t.Logf("first write on the new primary %v after pg_ctl promote returned (health_interval %v)", time.Since(promoted), haInterval)
	if _, err := idle.Exec(ctx, "SELECT 1"); sqlstate(err) != "57P01" {
		t.Errorf("session on the stopped primary: %v, want 57P01", err)
	}
}

// TestLossyFailoverKeepsTheLockFence is the lossy failover: holder A (lock L) wrote and was superseded
// by holder B, whose write never reached the standby (its WAL receiver stopped); the primary is stopped and
// the standby promoted, so the new primary remembers only A's token on L. The failover barrier raises L's mark
// to the newest token etcd granted for L (B's), so A's write through the proxy gets 55F01 naming L while B
// goes on writing; lock M, whose holder's token is below B's, keeps its own mark (no store-wide maximum).
func TestLossyFailoverKeepsTheLockFence(t *testing.T) {
	e := etcdtest.Start(t)
	store := tokens.NewEtcdStore(e.Client(), tokens.DefaultPrefix)
	h := startHAPair(t, store, "")
	ctx := haCtx(t)
	admin := connect(t, h.primary.SuperDSN())
	installFence(ctx, t, admin)
	admin.Close(ctx)

	acquire := func(name string) tokens.Held {
		l, err := store.Acquire(ctx, name, tokens.AcquireOptions{TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// write runs an UPDATE through the proxy as the holder of lock with token: lock L's holders write row 1,
	// lock M's row 2, so that row tokens do not decide.
	write := func(lock string, token int64) error {
		row := map[string]int{"L": 1, "M": 2}[lock]
		c, err := pgx.Connect(ctx, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, fmt.Sprintf("SET fence.token = %d; SET fence.lock = '%s'; UPDATE accounts SET v = v + 1 WHERE id = %d", token, lock, row))
		return err
	}
	holderA := acquire("L")
	if err := write("L", holderA.Token()); err != nil {
		t.Fatal(err)
	}
	if err := holderA.Release(ctx); err != nil { // A is superseded (a paused holder whose lease ran out)
		t.Fatal(err)
	}
	holderM := acquire("M")
	if err := write("M", holderM.Token()); err != nil {
		t.Fatal(err)
	}
	if err := h.standby.WaitReplayed(ctx, h.primary); err != nil {
		t.Fatal(err)
	}
	if err := h.standby.StopWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	holderB := acquire("L")
	if err := write("L", holderB.Token()); err != nil { // committed on the primary only
		t.Fatal(err)
	}
	// B's write is lost: the standby (read while still a standby: once promoted, the proxy's barrier may raise
	// the mark at any moment) holds only A's token on L.
	var mark int64
	if err := connect(t, h.standby.SuperDSN()).QueryRow(ctx, "SELECT mark FROM fenceproxy.lock_marks WHERE name = 'L'").Scan(&mark); err != nil {
		t.Fatal(err)
	}
	if mark != holderA.Token() {
		t.Fatalf("the standby's mark of L is %d, want A's token %d (B's write lost)", mark, holderA.Token())
	}
	// The first primary's barrier may have raised L already (A's grant, when the first write waited for the
	// first publication: the CI run at fff9958 under load): the failover's barrier is counted from here.
	raisedBefore, _ := metricValue(t, h.proxy.Registry, "fenceproxy_failover_barrier_marks_raised_total")
	if err := h.primary.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	// The proxy sees the primary lost before the standby is promoted, so that the counts below are known (since
	// 2026-12-05 the old primary is withdrawn before any barrier anyway: a check that found both changed at once
	// also makes three changes; before, it published the new primary without the loss in between).
	waitMetric(t, h.proxy, "fenceproxy_upstream_primary_changes_total", 2, "the proxy to see the primary lost")
	if err := h.standby.Promote(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the proxy to route to the new primary", reachesPort(ctx, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB), h.standby.Port()))

	err := write("L", holderA.Token())
	if sqlstate(err) != "55F01" || !strings.Contains(err.Error(), "lock L has accepted a newer token") {
		t.Errorf("superseded holder A (token %d) after the lossy failover: %v, want 55F01 naming lock L", holderA.Token(), err)
	}
	if err := write("L", holderB.Token()); err != nil {
		t.Errorf("current holder B (token %d) after the failover: %v", holderB.Token(), err)
	}
	if err := write("M", holderM.Token()); err != nil {
		t.Errorf("holder of lock M (token %d, below B's %d) after the failover: %v", holderM.Token(), holderB.Token(), err)
	}
	// The metrics tell the story: two publications (the first primary, then the new one), each after a barrier,
	// the second raising L; one primary now.
	for name, want := range map[string]float64{
		"fenceproxy_upstream_primary_changes_total":      3, // the first primary, lost, the new one
		"fenceproxy_failover_barrier_runs_total":         2,
		"fenceproxy_failover_barrier_marks_raised_total": raisedBefore + 1,
		"fenceproxy_upstream_primary":                    1,
	} {
		if got, _ := metricValue(t, h.proxy.Registry, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

// TestTargetSessionAttrs: upstream.target picks hosts as libpq's target_session_attrs does: read-write the
// primary, read-only and prefer-standby the standby, any the first host up in the configured order (here the
// standby, listed first); prefer-standby falls back to the primary when no standby is up, read-only does not.
func TestTargetSessionAttrs(t *testing.T) {
	h := startHAPair(t, nil, "")
	ctx := haCtx(t)
	proxyFor := func(target string) *proxytest.Proxy {
		return proxytest.Start(t, "", proxytest.Options{
			Hosts:    []string{h.standby.Addr(), h.primary.Addr()},
			Upstream: fmt.Sprintf("  target: %s\n  health_interval: %s\n  health_timeout: 1s\n  connect_timeout: 2s\n", target, haInterval),
			YAML:     "limits:\n  startup_timeout: 2s\n", // how long a session waits for a host that fits
		})
	}
	reaches := func(p *proxytest.Proxy) (int, error) {
		c, err := pgx.Connect(ctx, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
		if err != nil {
			return 0, err
		}
		defer c.Close(ctx)
		return serverPort(ctx, c)
	}
	want := map[string]int{
		"read-write":     h.primary.Port(),
		"read-only":      h.standby.Port(),
		"prefer-standby": h.standby.Port(),
		"any":            h.standby.Port(),
	}
	proxies := map[string]*proxytest.Proxy{}
	for target, port := range want {
		proxies[target] = proxyFor(target)
		// Until its first check of each host, a proxy knows only the hosts checked so far.
		eventually(t, 30*time.Second, fmt.Sprintf("target %s to reach port %d", target, port), func() bool {
			got, err := reaches(proxies[target])
			return err == nil && got == port
		})
	}
	// The standby goes away: prefer-standby and any fall back to the primary; read-only finds nothing.
	if err := h.standby.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"prefer-standby", "any"} {
		eventually(t, 30*time.Second, target+" to fall back to the primary", func() bool {
			got, err := reaches(proxies[target])
			return err == nil && got == h.primary.Port()
		})
	}
	if got, err := reaches(proxies["read-only"]); err == nil {
		t.Errorf("target read-only reached port %d with no standby up", got)
	}
}

// TestSynchronousFencedWrites: with fence.synchronous_commit: remote_apply and a synchronous standby (the
// server's own synchronous_commit is local, so other commits do not wait for it), a stream of fenced writes from
// several clients through the proxy, each write its own transaction on a row of its own; mid-stream the
// standby's WAL receiver stops (what the primary writes from then on never reaches it), the primary is killed
// (-9) and the standby promoted. Every write a client saw committed is on the new primary. Deterministically:
// once the receiver is gone, a fenced write can no longer be acknowledged (it waits in SyncRep, and is cut by
// the kill with 08007, its outcome unknown), while an unfenced write still is at once; without the SET LOCAL
// the writes go on being acknowledged and are lost with the primary.
func TestSynchronousFencedWrites(t *testing.T) {
	pgtest.Require(t, pg)
	primary := pgtest.MustStart(t, pgtest.Options{ExtraConf: map[string]string{"synchronous_standby_names": "*", "synchronous_commit": "local"}})
	if err := primary.Exec(`CREATE TABLE accounts (id int PRIMARY KEY, v int NOT NULL, fence_token bigint);
		CREATE TABLE notes (id int)`); err != nil {
		t.Fatal(err)
	}
	standby := pgtest.MustStartStandby(t, primary, pgtest.Options{})
	p := proxytest.Start(t, "", proxytest.Options{
		Hosts:    []string{primary.Addr(), standby.Addr()},
		Upstream: fmt.Sprintf("  health_interval: %s\n  health_timeout: 1s\n", haInterval),
		YAML:     "tables:\n  - name: accounts\n    token_column: fence_token\nfence:\n  synchronous_commit: remote_apply\n",
	})
	ctx := haCtx(t)
	admin := connect(t, primary.SuperDSN())
	eventually(t, 30*time.Second, "the standby to be synchronous", func() bool {
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'").Scan(&n)
		return err == nil && n == 1
	})

	// The stream: each writer inserts rows of its own (id = writer*1e6 + n), one transaction each, until a
	// write fails; acked holds the ids whose INSERT the client saw succeed, ackedAfterStop those acknowledged
	// and sent once the standby's receiver was gone.
	const writers = 4
	var (
		mu             sync.Mutex
		acked          []int
		ackedAfterStop int
		receiverGone   atomic.Bool
	)
	lastErr := make([]error, writers)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
		if _, err := c.Exec(ctx, "SET fence.token = 1"); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func(w int, c *pgx.Conn) {
			defer wg.Done()
			for n := 1; ; n++ {
				id := (w+1)*1000000 + n
				// A write sent once the receiver had stopped cannot have reached the standby; one sent before
				// may have, and be acknowledged after the stop without breaking anything.
				sentAfterStop := receiverGone.Load()
				if _, err := c.Exec(ctx, fmt.Sprintf("INSERT INTO accounts (id, v) VALUES (%d, %d)", id, n)); err != nil {
					lastErr[w] = err
					return
				}
				mu.Lock()
				acked = append(acked, id)
				if sentAfterStop {
					ackedAfterStop++
				}
				mu.Unlock()
			}
		}(w, c)
	}
	ackedCount := func() (all, afterStop int) {
		mu.Lock()
		defer mu.Unlock()
		return len(acked), ackedAfterStop
	}
	eventually(t, 30*time.Second, "fenced writes acknowledged with the synchronous standby streaming", func() bool {
		n, _ := ackedCount()
		return n >= 4*writers
	})

	if err := standby.StopWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	receiverGone.Store(true)
	if _, err := admin.Exec(ctx, "INSERT INTO notes VALUES (1)"); err != nil {
		t.Fatalf("an unfenced write with the synchronous standby gone: %v", err)
	}
	// With the level set, every writer ends up waiting in SyncRep; a write acknowledged now never reaches the
	// standby. Either way the primary is killed mid-stream, and the check below judges.
	eventually(t, 30*time.Second, "the writers to wait for the synchronous standby (or, unfenced, to go on)", func() bool {
		if _, after := ackedCount(); after >= 3*writers {
			return true
		}
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&n)
		return err == nil && n == writers
	})
	admin.Close(ctx)
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}

	onNew := connect(t, standby.SuperDSN())
	rows, err := onNew.Query(ctx, "SELECT id FROM accounts")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	present := make(map[int]bool, len(ids))
	for _, id := range ids {
		present[id] = true
	}
	var lost []int
	for _, id := range acked {
		if !present[id] {
			lost = append(lost, id)
		}
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d acknowledged fenced writes are not on the new primary (%d acknowledged after the standby's receiver stopped), e.g. id %d",
			len(lost), len(acked), ackedAfterStop, lost[0])
	}
	if ackedAfterStop > 0 {
		t.Errorf("%d fenced writes sent after the synchronous standby's receiver stopped were acknowledged", ackedAfterStop)
	}
	// Every writer was cut mid-write (waiting in SyncRep): its write's outcome is unknown, never "committed".
	for w, err := range lastErr {
		if sqlstate(err) != "08007" {
			t.Errorf("writer %d's write cut by the primary's death: %v, want 08007 (transaction resolution unknown)", w, err)
		}
	}
	t.Logf("%d fenced writes acknowledged, %d rows on the new primary", len(acked), len(ids))
}

// TestSwitchoverDropsKeptConnections: a switchover where the old primary stays up, read-only
// (default_transaction_read_only on, reloaded), and the standby is promoted. Once the new primary is
// published, every new session reaches it, none the connection kept for reuse on the old primary, and a
// session left on the old primary ends with 57P01 naming the new one.
func TestSwitchoverDropsKeptConnections(t *testing.T) {
	h := startHAPair(t, nil, "")
	ctx := haCtx(t)
	kept := h.connectOnPrimary(ctx, t, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB), "a read-write session")
	kept.Close(ctx) // its upstream connection is kept for reuse
	admin := connect(t, h.primary.SuperDSN())
	eventually(t, 10*time.Second, "the upstream connection to be kept", func() bool {
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fenceproxy: kept for reuse'").Scan(&n)
		return err == nil && n == 1
	})
	left := h.connect(t)
	h.switchOver(ctx, t, admin, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	for i := 0; i < 3; i++ {
		c := h.connect(t)
		if port, err := serverPort(ctx, c); err != nil || port != h.standby.Port() {
			t.Errorf("session %d after the switchover reached port %d (%v), want the new primary's %d", i, port, err, h.standby.Port())
		}
		c.Close(ctx)
	}
	_, err := left.Exec(ctx, "SELECT 1")
	if sqlstate(err) != "57P01" || !strings.Contains(err.Error(), h.standby.Addr()) {
		t.Errorf("session left on the old primary: %v, want 57P01 naming %s", err, h.standby.Addr())
	}
}
