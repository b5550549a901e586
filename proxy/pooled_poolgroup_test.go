package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// upstreamBackends counts the client backends of the test database but the one asking (d).
func upstreamBackends(t *testing.T, d *pgx.Conn) int {
	t.Helper()
	var n int
	if err := d.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND datname = $1 AND pid <> pg_backend_pid()", pgtest.TestDB).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The attack (an adversarial review, 2026-12-04): one client, one connection at a time, logs in with ever new
// startup options. Each options string was a pool of its own, with pool.size server connections of its own
// kept idle for pool.server_idle_timeout, until the server's max_connections refused everyone else. pool.size
// is per database and user: the pools of one share it, and a new one closes another's idle connection first.
// Here 40 such clients on pool.size 2 leave at most 2 more backends (42 before the mend), and another
// database's client still gets in.
func TestPooledPoolSizeIsPerDatabaseAndUser(t *testing.T) {
	f := newPooledFenced(t, 2, "")
	ctx := ctxT(t)
	before := upstreamBackends(t, f.d)
	for i := range 40 {
		c := connect(t, f.dsn()+fmt.Sprintf("&default_query_exec_mode=simple_protocol&options=-c%%20work_mem%%3D%dkB", 2001+i))
		var wm string
		if err := c.QueryRow(ctx, "SHOW work_mem").Scan(&wm); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("%dkB", 2001+i); wm != want {
			t.Fatalf("client %d: work_mem %s, want %s (its own startup options)", i, wm, want)
		}
		c.Close(ctx)
	}
	if after := upstreamBackends(t, f.d); after > before+2 {
		t.Errorf("%d server connections opened for one user by 40 clients with distinct options, pool.size 2 (%d before, %d after)", after-before, before, after)
	}
	// Two clients of different options at once share the two places: a third waits, then gets one.
	a := connect(t, f.dsn()+"&options=-c%20work_mem%3D2000kB")
	b := connect(t, f.dsn()+"&options=-c%20work_mem%3D3000kB")
	c := connect(t, f.dsn()+"&options=-c%20work_mem%3D4000kB") // its pool's first server connection, given back
	ta, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fxExec(t, a, "SELECT 1")
	fxExec(t, b, "SELECT 1")
	done := make(chan error, 1)
	go func() {
		var wm string
		err := c.QueryRow(ctx, "SHOW work_mem").Scan(&wm)
		if err == nil && wm != "4000kB" {
			err = fmt.Errorf("work_mem %s, want 4000kB", wm)
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a third client of the same database and user got a server connection while both places were lent: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := ta.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	tb.Rollback(ctx)
	if after := upstreamBackends(t, f.d); after > before+2 {
		t.Errorf("%d server connections open for one user, pool.size 2", after-before)
	}
	// Another database's pool is not held back by this one.
	v := connect(t, proxytest.DSN(f.p.Addr, pgtest.SuperUser, "", "postgres")+"&default_query_exec_mode=simple_protocol")
	fxExec(t, v, "SELECT 1")
}

// A pool is made at a client's first login, before the server accepted it: logins to databases that do not
// exist made pools (and wait-time series) that nothing took away (the same review). A pool with no client,
// no server connection and no dial is dropped by the reaper.
func TestPooledUnusedPoolsDropped(t *testing.T) {
	f := newPooledFenced(t, 2, "  admin_users: [admin]\n  server_idle_timeout: 200ms\n")
	ctx := ctxT(t)
	adm := connect(t, proxytest.DSN(f.p.Addr, "admin", "", "fenceproxy")+"&default_query_exec_mode=simple_protocol")
	pools := func() (n int, names []string) {
		rows, err := adm.Query(ctx, "SHOW POOLS")
		if err != nil {
			t.Fatal(err)
		}
		ms, err := pgx.CollectRows(rows, pgx.RowToMap)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			names = append(names, fmt.Sprint(m["database"]))
		}
		return len(ms), names
	}
	waitSeries := func() int {
		mfs, err := f.p.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "fenceproxy_pool_wait_seconds" {
				return len(mf.GetMetric())
			}
		}
		return 0
	}
	for i := range 20 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := pgx.Connect(cctx, proxytest.DSN(f.p.Addr, pgtest.SuperUser, "", fmt.Sprintf("nosuchdb_%d", i)))
		cancel()
		if err == nil {
			c.Close(ctx)
			t.Fatalf("login to database nosuchdb_%d succeeded", i)
		}
	}
	kept := connect(t, f.dsn())
	fxExec(t, kept, "SELECT 1")
	eventually(t, 10*time.Second, "pools of the failed logins dropped", func() bool {
		n, names := pools()
		return n == 1 && names[0] == pgtest.TestDB && !strings.Contains(strings.Join(names, ","), "nosuchdb")
	})
	if n := waitSeries(); n != 1 {
		t.Errorf("fenceproxy_pool_wait_seconds has %d series after the unused pools were dropped, want 1 (the kept client's)", n)
	}
	// The kept client's pool stays while it is connected, idle connection closed or not; once it leaves, the
	// pool goes too, and a new client makes it again.
	time.Sleep(600 * time.Millisecond)
	fxExec(t, kept, "SELECT 1")
	kept.Close(ctx)
	eventually(t, 10*time.Second, "the last pool dropped", func() bool { n, _ := pools(); return n == 0 })
	again := connect(t, f.dsn())
	fxExec(t, again, "SELECT 1")
	if n, _ := pools(); n != 1 {
		t.Errorf("%d pools after a new client, want 1", n)
	}
}

// A pool that keeps pool.min_idle connections stays when its clients leave, and its keeper opens them again
// within pool.size after the reaper closed them (here server_lifetime). The review of the first version: the
// reaper dropped the pool in the moment its connection was closed, and its keeper, already woken, opened one
// into the dropped pool, which nothing counted, reaped or closed: one more backend at each client's visit
// (10 after 10 visits, pool.size 2). A dropped pool now dials nothing (makeRoom).
func TestPooledMinIdlePoolKeptWithinSize(t *testing.T) {
	f := newPooledFenced(t, 2, "  admin_users: [admin]\n  min_idle: 1\n  server_lifetime: 100ms\n")
	ctx := ctxT(t)
	adm := connect(t, proxytest.DSN(f.p.Addr, "admin", "", "fenceproxy")+"&default_query_exec_mode=simple_protocol")
	before := upstreamBackends(t, f.d)
	for range 6 {
		c := connect(t, f.dsn()+"&default_query_exec_mode=simple_protocol")
		fxExec(t, c, "SELECT 1")
		c.Close(ctx)
		time.Sleep(700 * time.Millisecond)
	}
	rows, err := adm.Query(ctx, "SHOW POOLS")
	if err != nil {
		t.Fatal(err)
	}
	pools, err := pgx.CollectRows(rows, pgx.RowToMap)
	if err != nil {
		t.Fatal(err)
	}
	if len(pools) != 1 {
		t.Errorf("SHOW POOLS: %v, want the one pool kept for min_idle", pools)
	}
	if after := upstreamBackends(t, f.d); after-before > 2 {
		t.Errorf("%d server connections open for one database and user after 6 visits, pool.size 2, min_idle 1", after-before)
	}
}
