package proxy_test

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"

	"github.com/jackc/pgx/v5"
)

// From a review on 2026-12-03 of txPool.wakeUnread (they held): pinned and paused clients whose server
// connection the server ends, or that stay healthy, while another client waits.

// A pool of one whose connection client a holds (pinned or idle in a block), b waiting; the server
// ends a's backend (pg_terminate_backend from a direct connection): b must be served well within
// max_client_wait, and a must see its session end.
func TestPooledUnreadPinnedTerminated(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup []string
	}{
		{"pinned idle between transactions", []string{"CREATE TEMP TABLE rev_tmp (x int)"}},
		{"pinned by advisory lock idle", []string{"SELECT pg_advisory_lock(4711)"}},
		{"pinned then idle in block", []string{"CREATE TEMP TABLE rev_tmp (x int)", "BEGIN", "SELECT 1"}},
		{"pinned inside block, idle in it", []string{"BEGIN", "CREATE TEMP TABLE rev_tmp (x int)"}},
		{"pinned in an earlier block, idle between", []string{"BEGIN", "CREATE TEMP TABLE rev_tmp (x int)", "COMMIT"}},
		{"pinned in an earlier block, idle in a new one", []string{"BEGIN", "CREATE TEMP TABLE rev_tmp (x int)", "COMMIT", "BEGIN", "SELECT 1"}},
		{"not pinned, idle in block", []string{"BEGIN", "SELECT 1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newPooledFenced(t, 1, "  max_client_wait: 20s\n  admin_users: [admin]\n")
			adm := adminConn(t, f)
			a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
			for _, s := range c.setup {
				fxExec(t, a, s)
			}
			var pid int
			if err := a.QueryRow(ctxT(t), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
			answered := make(chan error, 1)
			start := time.Now()
			go func() {
				var v int
				answered <- b.QueryRow(context.Background(), "SELECT 42").Scan(&v)
			}()
			waitingClients(t, adm, 1)
			fxExec(t, f.d, "SELECT pg_terminate_backend("+strconv.Itoa(pid)+")")
			select {
			case err := <-answered:
				if err != nil {
					t.Fatalf("b: %v (%s) after %v", err, sqlstate(err), time.Since(start))
				}
			case <-time.After(8 * time.Second):
				t.Fatalf("b still waits 8 s after a's backend was terminated")
			}
			var v int
			err := a.QueryRow(ctxT(t), "SELECT 1").Scan(&v)
			if err == nil {
				t.Fatalf("a's next statement succeeded on a terminated session")
			}
			t.Logf("a: %v (%s); b served after %v", err, sqlstate(err), time.Since(start))
		})
	}
}

// PAUSE while a (pinned or not) idles in a block and b waits; nothing must end a's healthy session;
// after RESUME and a's COMMIT (a not pinned) b is served.
func TestPooledUnreadPauseKeepsHealthy(t *testing.T) {
	for _, c := range []struct {
		name   string
		setup  []string
		pinned bool
	}{
		{"not pinned in block", []string{"BEGIN", "SELECT 1"}, false},
		{"pinned inside block", []string{"BEGIN", "CREATE TEMP TABLE rev_tmp (x int)"}, true},
		{"pinned earlier, in block", []string{"BEGIN", "CREATE TEMP TABLE rev_tmp (x int)", "COMMIT", "BEGIN", "SELECT 1"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newPooledFenced(t, 1, "  max_client_wait: 20s\n  admin_users: [admin]\n")
			adm := adminConn(t, f)
			a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
			for _, s := range c.setup {
				fxExec(t, a, s)
			}
			b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
			answered := make(chan error, 1)
			go func() {
				var v int
				answered <- b.QueryRow(context.Background(), "SELECT 42").Scan(&v)
			}()
			waitingClients(t, adm, 1)
			adm2 := adminConn(t, f)
			pdone := make(chan struct{})
			defer func() { <-pdone }()
			go func() { defer close(pdone); adm2.Exec(context.Background(), "PAUSE") }()
			// The PAUSE must hold the pool before RESUME (else: "nothing is paused"), however slow its start;
			// then a while of its polls, which must leave a's session alone.
			waitPaused(t, adm)
			time.Sleep(1500 * time.Millisecond)
			// a's session is healthy: a statement in the block works.
			var v int
			if err := a.QueryRow(ctxT(t), "SELECT 7").Scan(&v); err != nil || v != 7 {
				t.Fatalf("a during PAUSE: %v (%s)", err, sqlstate(err))
			}
			time.Sleep(500 * time.Millisecond)
			if _, err := adm.Exec(ctxT(t), "RESUME"); err != nil {
				t.Fatalf("RESUME: %v", err)
			}
			if err := a.QueryRow(ctxT(t), "SELECT 8").Scan(&v); err != nil || v != 8 {
				t.Fatalf("a after RESUME: %v (%s)", err, sqlstate(err))
			}
			if _, err := a.Exec(ctxT(t), "COMMIT"); err != nil {
				t.Fatalf("a COMMIT: %v", err)
			}
			if c.pinned {
				if _, err := a.Exec(ctxT(t), "SELECT * FROM rev_tmp"); err != nil {
					t.Fatalf("a's temp table: %v", err)
				}
				a.Close(context.Background())
			}
			select {
			case err := <-answered:
				if err != nil {
					t.Fatalf("b: %v (%s)", err, sqlstate(err))
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("b not served")
			}
		})
	}
}

// a pinned client that LISTENs with stale unreadBy (pinned in a block answered inline) gets its
// notification while another client waits, and its session stays healthy.
func TestPooledUnreadPinnedNotifyWhileWaiting(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 20s\n  admin_users: [admin]\n")
	adm := adminConn(t, f)
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	for _, s := range []string{"BEGIN", "CREATE TEMP TABLE rev_tmp (x int)", "LISTEN revchan", "COMMIT"} {
		fxExec(t, a, s)
	}
	b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	bdone := make(chan struct{})
	defer func() { <-bdone }()
	go func() {
		defer close(bdone)
		var v int
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		b.QueryRow(ctx, "SELECT 42").Scan(&v)
	}()
	waitingClients(t, adm, 1)
	fxExec(t, f.d, "NOTIFY revchan, 'hi'")
	time.Sleep(500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(ctxT(t), 3*time.Second)
	defer cancel()
	n, err := a.WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("a's notification: %v", err)
	}
	if n.Payload != "hi" {
		t.Fatalf("payload %q", n.Payload)
	}
	var v int
	if err := a.QueryRow(ctxT(t), "SELECT count(*) FROM rev_tmp").Scan(&v); err != nil {
		t.Fatalf("a after notify: %v", err)
	}
	_ = pgx.Identifier{}
}

// a private cluster; a pinned client idles in a block it was pinned in (answered inline), b waits, and
// another backend is SIGKILLed (crash restart ends every backend): b must be served after recovery, a told.
func TestPooledUnreadPinnedCrashRestart(t *testing.T) {
	pgtest.Require(t, pg)
	cl := pgtest.MustStart(t, pgtest.Options{})
	p := proxytest.Start(t, cl.Addr(), proxytest.Options{YAML: "pool:\n  mode: transaction\n  size: 1\n  max_client_wait: 20s\n  admin_users: [" + pgtest.SuperUser + "]\nauth:\n  type: trust\n"})
	ctx := haCtx(t)
	dsn := p.DSN(pgtest.SuperUser, "", pgtest.TestDB) + "&default_query_exec_mode=simple_protocol"
	a := connect(t, dsn)
	for _, s := range []string{"BEGIN", "CREATE TEMP TABLE rev_tmp (x int)"} {
		if _, err := a.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	other := connect(t, cl.SuperDSN())
	var pid int
	if err := other.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
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
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("b after crash restart: %v (%s)", err, sqlstate(err))
		}
	case <-time.After(15 * time.Second):
		t.Fatal("b not served 15 s after the crash")
	}
	var v int
	if err := a.QueryRow(ctx, "SELECT 1").Scan(&v); err == nil {
		t.Fatal("a's session survived a crash restart")
	} else {
		t.Logf("a: %v", err)
	}
}

// PAUSE while a idles in a block (not pinned, answered inline) and b waits; a's backend is terminated:
// the PAUSE completes (nothing lent any more), b stays paused, and is served after RESUME.
func TestPooledUnreadPauseTerminated(t *testing.T) {
	for _, setup := range [][]string{{"BEGIN", "SELECT 1"}, {"BEGIN", "CREATE TEMP TABLE rev_tmp (x int)"}} {
		t.Run(setup[1], func(t *testing.T) {
			f := newPooledFenced(t, 1, "  max_client_wait: 20s\n  admin_users: [admin]\n")
			adm := adminConn(t, f)
			a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
			for _, s := range setup {
				fxExec(t, a, s)
			}
			var pid int
			if err := a.QueryRow(ctxT(t), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
			answered := make(chan error, 1)
			go func() {
				var v int
				answered <- b.QueryRow(context.Background(), "SELECT 42").Scan(&v)
			}()
			waitingClients(t, adm, 1)
			adm2 := adminConn(t, f)
			paused := make(chan error, 1)
			go func() { _, err := adm2.Exec(context.Background(), "PAUSE"); paused <- err }()
			// The terminate must come after the PAUSE holds the pool: before it, the lend lost would let b
			// have a new server connection.
			waitPaused(t, adm)
			fxExec(t, f.d, "SELECT pg_terminate_backend("+strconv.Itoa(pid)+")")
			select {
			case err := <-paused:
				t.Logf("PAUSE: %v", err)
			case <-time.After(8 * time.Second):
				t.Errorf("PAUSE still busy 8 s after the only lent connection's backend was terminated")
			}
			select {
			case err := <-answered:
				t.Fatalf("b answered while paused: %v", err)
			case <-time.After(500 * time.Millisecond):
			}
			if _, err := adm.Exec(ctxT(t), "RESUME"); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-answered:
				if err != nil {
					t.Fatalf("b: %v (%s)", err, sqlstate(err))
				}
			case <-time.After(8 * time.Second):
				t.Fatal("b not served after RESUME")
			}
		})
	}
}

// waitPaused waits until SHOW POOLS says the client pool (not the admin console's) is paused: a PAUSE sent
// from another goroutine has taken effect.
func waitPaused(t *testing.T, adm *pgx.Conn) {
	t.Helper()
	eventually(t, 10*time.Second, "the pool paused in SHOW POOLS", func() bool {
		n := 0
		for _, r := range adminRows(t, adm, "SHOW POOLS") {
			if r["database"] == "fenceproxy" {
				continue
			}
			if r["paused"] != "1" {
				return false
			}
			n++
		}
		return n > 0
	})
}
