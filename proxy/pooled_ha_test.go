package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// TestPooledSwitchover: transaction pooling over upstream.hosts, through a switchover where the old primary stays
// up, read-only, and the standby is promoted. A pooled client between transactions is bound to no host: its next
// transaction runs on the new primary, not on the server connection left idle on the old one, and its fenced
// write lands there. A client inside a transaction on the old primary has that server connection closed: 57P01
// naming the new primary, as a session-mode session on the old primary gets; one whose statement was running
// there gets 08007 (its outcome is unknown; nothing is replayed).
func TestPooledSwitchover(t *testing.T) {
	h, dsn := startPooledHAPair(t, "size: 3")
	ctx := haCtx(t)
	inTx := connect(t, dsn)
	if _, err := inTx.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	h.onPrimary(ctx, t, inTx, "a pooled transaction")
	between := h.connectOnPrimary(ctx, t, dsn, "a pooled client") // its server connection goes back to the pool, idle on the primary
	running := connect(t, dsn)
	runErr := execAsync(ctx, running, "SELECT pg_sleep(20)")
	admin := connect(t, h.primary.SuperDSN())
	waitRunning(ctx, t, admin, "SELECT pg_sleep(20)", "the statement to run on the primary")
	h.switchOver(ctx, t, admin, dsn)
	if port, err := serverPort(ctx, between); err != nil || port != h.standby.Port() {
		t.Errorf("the client between transactions reached port %d (%v) after the switchover, want the new primary's %d", port, err, h.standby.Port())
	}
	if _, err := between.Exec(ctx, "SET fence.token = 7; UPDATE accounts SET v = 7 WHERE id = 1"); err != nil {
		t.Errorf("fenced write after the switchover: %v", err)
	}
	newPrimary := connect(t, h.standby.SuperDSN())
	var tok int64
	if err := newPrimary.QueryRow(ctx, "SELECT fence_token FROM accounts WHERE id = 1 AND v = 7").Scan(&tok); err != nil || tok != 7 {
		t.Errorf("the fenced write on the new primary: token %d (%v), want 7", tok, err)
	}
	var err error
	eventually(t, 10*time.Second, "the transaction left on the old primary to end", func() bool {
		_, err = inTx.Exec(ctx, "SELECT 1")
		return err != nil
	})
	if sqlstate(err) != "57P01" || !strings.Contains(err.Error(), h.standby.Addr()) {
		t.Errorf("transaction on the old primary: %v, want 57P01 naming %s", err, h.standby.Addr())
	}
	if err := <-runErr; sqlstate(err) != "08007" {
		t.Errorf("statement running on the old primary: %v, want 08007", err)
	}
}

// A server that crashed (every process SIGKILLed: no FATAL reaches the proxy's idle server connection, only the
// end of the stream) and came back: a client between transactions gets a fresh server connection, since nothing
// of its was on the dead one. From a review on 2026-12-03: the lend looked only for unread bytes, lent the dead
// connection, and ended the client's session with FATAL 08006 (with pool.size N, up to N clients so).
func TestPooledDeadIdleConnectionNotLent(t *testing.T) {
	pgtest.Require(t, pg)
	cl := pgtest.MustStart(t, pgtest.Options{})
	p := proxytest.Start(t, cl.Addr(), proxytest.Options{YAML: pooledYAML("size: 1", "max_client_wait: 5s")})
	ctx := haCtx(t)
	dsn := p.DSN(pgtest.SuperUser, "", pgtest.TestDB) + "&default_query_exec_mode=simple_protocol"
	a := connect(t, dsn)
	if _, err := a.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if err := cl.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := cl.StartAgain(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("a client between transactions, after the server's crash and restart: %v (%s); want a fresh server connection", err, sqlstate(err))
	}
}

// pooledBackends counts the client backends on c other than the proxy's health checks and c's own.
func pooledBackends(ctx context.Context, c *pgx.Conn) (int, error) {
	var n int
	err := c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'
		AND pid <> pg_backend_pid() AND application_name NOT LIKE 'fenceproxy: health%'`).Scan(&n)
	return n, err
}

// After a failover the pool opens pool.min_idle server connections on the new primary without waiting for a
// client. From a review on 2026-12-03: dropping the old primary's connections did not wake the refill, which
// then waited for the first lend (or the reaper's tick, minutes by default).
func TestPooledMinIdleAfterFailover(t *testing.T) {
	h, dsn := startPooledHAPair(t, "size: 3", "min_idle: 2")
	ctx := haCtx(t)
	c := connect(t, dsn)
	if _, err := serverPort(ctx, c); err != nil {
		t.Fatal(err)
	}
	op := connect(t, h.primary.SuperDSN())
	eventually(t, 10*time.Second, "min_idle on the primary", func() bool {
		n, err := pooledBackends(ctx, op)
		return err == nil && n == 2
	})
	op.Close(ctx)
	h.failOver(ctx, t)
	np := connect(t, h.standby.SuperDSN())
	eventually(t, 30*time.Second, "min_idle on the new primary, no client coming", func() bool {
		n, err := pooledBackends(ctx, np)
		return err == nil && n == 2
	})
}

// A backend killed with SIGKILL makes PostgreSQL restart every backend and recover: a client waiting for the pool
// then is served once the server is back (the pool tries a login refused 57P03 again, within
// limits.startup_timeout), not given the server's 57P03 at once. From a review on 2026-12-03.
func TestPooledWaiterOutlastsCrashRecovery(t *testing.T) {
	pgtest.Require(t, pg)
	cl := pgtest.MustStart(t, pgtest.Options{})
	p := proxytest.Start(t, cl.Addr(), proxytest.Options{YAML: pooledYAML("size: 1", "max_client_wait: 20s", poolAdmin)})
	ctx := haCtx(t)
	dsn := p.DSN(pgtest.SuperUser, "", pgtest.TestDB) + "&default_query_exec_mode=simple_protocol"
	a := connect(t, dsn)
	if _, err := a.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := a.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	b := connect(t, dsn)
	answered := make(chan error, 1)
	go func() {
		var v int
		answered <- b.QueryRow(context.Background(), "SELECT 42").Scan(&v)
	}()
	waitingClients(t, connect(t, p.DSN(pgtest.SuperUser, "", "fenceproxy")+"&default_query_exec_mode=simple_protocol"), 1)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-answered; err != nil {
		t.Fatalf("the waiting client, after the server's crash recovery: %v (%s)", err, sqlstate(err))
	}
}

// The lossy failover of TestLossyFailoverKeepsTheLockFence in transaction pooling (pool.size 2; 1 held too, in
// a review on 2026-12-05, and is left out for time): holder A
// (lock L) wrote, B superseded it on the old primary only, the standby was promoted. A pooled client is bound to
// no host, so A's client, connected before the failover with its token and lock set at session level, is not
// ended by it: its next transaction runs on the new primary with A's token, and the lock fence (the barrier
// raised L's mark to B's grant) refuses it, 55F01 naming L; B's client goes on writing, and a fresh client as
// A is refused too.
func TestPooledLossyFailoverKeepsTheLockFence(t *testing.T) {
	for _, size := range []int{2} {
		t.Run(fmt.Sprintf("size%d", size), func(t *testing.T) {
			e := etcdtest.Start(t)
			store := tokens.NewEtcdStore(e.Client(), tokens.DefaultPrefix)
			h := startHAPairWith(t, store, "", pooledYAML(fmt.Sprintf("size: %d", size)))
			ctx := haCtx(t)
			admin := connect(t, h.primary.SuperDSN())
			installFence(ctx, t, admin)
			admin.Close(ctx)
			acquire := func() tokens.Held {
				l, err := store.Acquire(ctx, "L", tokens.AcquireOptions{TTL: 30 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				return l
			}
			dsn := h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB)
			holder := func(tok int64) *pgx.Conn {
				c := connect(t, dsn)
				if _, err := c.Exec(ctx, fmt.Sprintf("SET fence.token = %d; SET fence.lock = 'L'", tok)); err != nil {
					t.Fatal(err)
				}
				return c
			}
			write := func(c *pgx.Conn) error {
				_, err := c.Exec(ctx, "UPDATE accounts SET v = v + 1 WHERE id = 1")
				return err
			}
			heldA := acquire()
			a := holder(heldA.Token())
			if err := write(a); err != nil {
				t.Fatal(err)
			}
			if err := heldA.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := h.standby.WaitReplayed(ctx, h.primary); err != nil {
				t.Fatal(err)
			}
			if err := h.standby.StopWALReceiver(ctx); err != nil {
				t.Fatal(err)
			}
			heldB := acquire()
			b := holder(heldB.Token())
			if err := write(b); err != nil { // committed on the old primary only
				t.Fatal(err)
			}
			if err := h.primary.StopImmediate(); err != nil {
				t.Fatal(err)
			}
			waitMetric(t, h.proxy, "fenceproxy_upstream_primary_changes_total", 2, "the proxy to see the primary lost")
			if err := h.standby.Promote(); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "the proxy to route to the new primary", reachesPort(ctx, dsn, h.standby.Port()))
			for _, w := range []struct {
				what string
				c    *pgx.Conn
			}{{"A's client, connected across the failover", a}, {"a fresh client as A", holder(heldA.Token())}} {
				if err := write(w.c); sqlstate(err) != "55F01" || !strings.Contains(err.Error(), "lock L has accepted a newer token") {
					t.Errorf("%s (token %d) after the lossy failover: %v, want 55F01 naming lock L", w.what, heldA.Token(), err)
				}
			}
			if err := write(b); err != nil {
				t.Errorf("B's client (token %d) after the failover: %v", heldB.Token(), err)
			}
		})
	}
}

// A CancelRequest with the key of a pooled client whose transaction was left on the old primary, sent after a
// switchover, cancels nothing of another client's: B's statement on the new primary runs to its end. Attack of a
// review on 2026-12-05 (a cancel during or after a switch); held: a pooled client's key is the proxy's own, and
// its cancel goes only to the server connection lent to it.
func TestPooledCancelAfterSwitchover(t *testing.T) {
	h, dsn := startPooledHAPair(t, "size: 2")
	ctx := haCtx(t)
	a := connect(t, dsn)
	if _, err := a.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	h.onPrimary(ctx, t, a, "A's transaction")
	pid, key := a.PgConn().PID(), a.PgConn().SecretKey()
	h.switchOver(ctx, t, connect(t, h.primary.SuperDSN()), dsn)
	b := connect(t, dsn)
	done := execAsync(ctx, b, "SELECT pg_sleep(1.5)")
	np := connect(t, h.standby.SuperDSN())
	waitRunning(ctx, t, np, "SELECT pg_sleep(1.5)", "B's statement to run on the new primary")
	for range 3 {
		if err := sendCancelRequest(h.proxy.Addr, pid, key); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Errorf("B's statement on the new primary, after A's cancel: %v (%s), want it to run to its end", err, sqlstate(err))
	}
}
