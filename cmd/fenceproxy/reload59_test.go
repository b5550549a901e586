package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// reload59Proxy is a `fenceproxy serve` process whose configuration file a test rewrites and reloads: the head
// (listen, upstream, the protected tables) and a tail the test changes (pool:, auth:).
type reload59Proxy struct {
	t          *testing.T
	addr, path string
	cl         *pgtest.Cluster
	pp         *proxyProcess
}

// reload59Cluster is a throwaway cluster with accounts protected from the start and ledger, which a reload may
// protect too.
func reload59Cluster(t *testing.T) *pgtest.Cluster {
	cl := pgtest.MustStart(t, pgtest.Options{})
	if err := cl.Exec("CREATE TABLE accounts(id int PRIMARY KEY, fence_token bigint); CREATE TABLE ledger(id int PRIMARY KEY, fence_token bigint); INSERT INTO accounts VALUES (1, NULL); INSERT INTO ledger VALUES (1, NULL)"); err != nil {
		t.Fatal(err)
	}
	return cl
}

func startReload59(t *testing.T, cl *pgtest.Cluster, bin, tail string) *reload59Proxy {
	r := &reload59Proxy{t: t, addr: freeAddr(t), path: filepath.Join(t.TempDir(), "fenceproxy.yaml"), cl: cl}
	r.write(tail)
	r.pp = startServe(t, bin, r.path, r.addr)
	return r
}

// write makes tail the file's changing part; tables is the protected list (accounts when none is given).
func (r *reload59Proxy) write(tail string, tables ...string) {
	r.t.Helper()
	if len(tables) == 0 {
		tables = []string{"public.accounts"}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %s\nupstream:\n  address: %s\ntables:\n", r.addr, r.cl.Addr())
	for _, tb := range tables {
		fmt.Fprintf(&b, "  - name: %s\n    token_column: fence_token\n", tb)
	}
	b.WriteString(tail)
	if err := os.WriteFile(r.path, []byte(b.String()), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// admin connects to the admin console as user.
func (r *reload59Proxy) admin(ctx context.Context, user string) (*pgx.Conn, error) {
	return pgx.Connect(ctx, proxytest.DSN(r.addr, user, "", "fenceproxy")+"&default_query_exec_mode=simple_protocol")
}

// client connects to the test database through the proxy as the superuser (auth trust).
func (r *reload59Proxy) client(ctx context.Context) *pgx.Conn {
	r.t.Helper()
	c, err := pgx.Connect(ctx, proxytest.DSN(r.addr, pgtest.SuperUser, "", pgtest.TestDB)+"&default_query_exec_mode=simple_protocol")
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// showPool is a column of SHOW POOLS for the pool of user (in the test database), "" when there is no such pool.
func showPool(ctx context.Context, t *testing.T, adm *pgx.Conn, user, column string) string {
	t.Helper()
	rows, err := adm.Query(ctx, "SHOW POOLS")
	if err != nil {
		t.Fatalf("SHOW POOLS: %v", err)
	}
	defer rows.Close()
	var value string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		row := map[string]string{}
		for i, f := range rows.FieldDescriptions() {
			row[f.Name], _ = vals[i].(string)
		}
		if row["user"] == user && row["database"] == pgtest.TestDB {
			value = row[column]
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("SHOW POOLS: %v", err)
	}
	return value
}

// showConfigValue is SHOW CONFIG's value of key.
func showConfigValue(ctx context.Context, t *testing.T, adm *pgx.Conn, key string) string {
	t.Helper()
	rows, err := adm.Query(ctx, "SHOW CONFIG")
	if err != nil {
		t.Fatalf("SHOW CONFIG: %v", err)
	}
	defer rows.Close()
	var value string
	for rows.Next() {
		var k, v, def, changeable string
		if err := rows.Scan(&k, &v, &def, &changeable); err != nil {
			t.Fatal(err)
		}
		if k == key {
			value = v
		}
	}
	return value
}

// pool.admin_users follows a reload: a role removed from it can no longer open the admin console, and one
// connected to it already is refused at its next command (42501, and the console ends): an operator removes a
// role to take RELOAD, PAUSE and SHOW away from it, now, not at the next restart. A role added uses it at
// once. Until 2026-12-06 the list was the start's until a restart, and a removed admin kept its rights.
func TestReload59AdminUsersFollowReload(t *testing.T) {
	cl := reload59Cluster(t)
	bin := proxytest.Binary(t, t.TempDir())
	const pool = "pool:\n  mode: transaction\n  size: 2\n  admin_users: [%s]\nauth:\n  type: trust\n"
	r := startReload59(t, cl, bin, fmt.Sprintf(pool, "admin"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	adm, err := r.admin(ctx, "admin")
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close(ctx)
	if _, err := r.admin(ctx, "ops"); pgCode(err) != "42501" {
		t.Fatalf("ops before it is an admin: %v, want 42501", err)
	}

	r.write(fmt.Sprintf(pool, "ops"))
	if _, err := adm.Exec(ctx, "RELOAD"); err != nil {
		t.Fatalf("RELOAD: %v", err)
	}
	if c, err := r.admin(ctx, "admin"); pgCode(err) != "42501" {
		if err == nil {
			c.Close(ctx)
		}
		t.Fatalf("a role removed from pool.admin_users opened the admin console after RELOAD: %v, want 42501", err)
	}
	ops, err := r.admin(ctx, "ops")
	if err != nil {
		t.Fatalf("a role added to pool.admin_users, after RELOAD: %v", err)
	}
	defer ops.Close(ctx)
	if _, err := ops.Exec(ctx, "SHOW POOLS"); err != nil {
		t.Fatalf("SHOW POOLS as the added admin: %v", err)
	}
	if _, err := adm.Exec(ctx, "PAUSE"); pgCode(err) != "42501" {
		t.Fatalf("PAUSE by an admin connected before its removal: %v, want 42501", err)
	}
	if !adm.IsClosed() {
		if _, err := adm.Exec(ctx, "SHOW POOLS"); err == nil {
			t.Fatal("the removed admin's console goes on after its refusal")
		}
	}
	if got := showConfigValue(ctx, t, ops, "pool.admin_users"); got != "ops" {
		t.Errorf("SHOW CONFIG pool.admin_users = %q after RELOAD, want ops", got)
	}
}

// The pool settings a running proxy follows at a reload (RELOAD, SIGHUP), each in a proxy of its own:
// pool.max_client_wait, pool.max_clients, pool.on_session_state, pool.server_lifetime, pool.server_idle_timeout
// and pool.min_idle. Until 2026-12-06 each kept its value of the start until a restart (RELOAD said only
// "changes to pool need a restart").
func TestReload59PoolSettingsFollowReload(t *testing.T) {
	cl := reload59Cluster(t)
	bin := proxytest.Binary(t, t.TempDir())
	const head = "auth:\n  type: trust\npool:\n  mode: transaction\n  admin_users: [admin]\n"
	setup := func(t *testing.T, pool string) (*reload59Proxy, *pgx.Conn, context.Context) {
		r := startReload59(t, cl, bin, head+pool)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		t.Cleanup(cancel)
		adm, err := r.admin(ctx, "admin")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { adm.Close(context.Background()) })
		return r, adm, ctx
	}
	reload := func(ctx context.Context, t *testing.T, r *reload59Proxy, adm *pgx.Conn, pool string) {
		t.Helper()
		r.write(head + pool)
		if _, err := adm.Exec(ctx, "RELOAD"); err != nil {
			t.Fatalf("RELOAD: %v", err)
		}
	}

	t.Run("max_client_wait", func(t *testing.T) {
		r, adm, ctx := setup(t, "  size: 1\n  max_client_wait: 5m\n")
		holder := r.client(ctx)
		tx, err := holder.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // holds the pool's one server connection
			t.Fatal(err)
		}
		reload(ctx, t, r, adm, "  size: 1\n  max_client_wait: 200ms\n")
		if got := showConfigValue(ctx, t, adm, "pool.max_client_wait"); got != "200ms" {
			t.Errorf("SHOW CONFIG pool.max_client_wait = %q after RELOAD", got)
		}
		waiter := r.client(ctx)
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		_, err = waiter.Exec(wctx, "SELECT 1")
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "53300" || !strings.Contains(pe.Message, "(200ms)") {
			t.Fatalf("a client waiting for the full pool after max_client_wait was reloaded to 200ms: %v, want 53300 naming 200ms", err)
		}
	})

	t.Run("max_clients", func(t *testing.T) {
		r, adm, ctx := setup(t, "  size: 2\n")
		first := r.client(ctx)
		reload(ctx, t, r, adm, "  size: 2\n  max_clients: 1\n")
		c, err := pgx.Connect(ctx, proxytest.DSN(r.addr, pgtest.SuperUser, "", pgtest.TestDB))
		if err == nil {
			c.Close(ctx)
		}
		if pgCode(err) != "53300" {
			t.Fatalf("a second client after max_clients was reloaded to 1: %v, want 53300", err)
		}
		if _, err := first.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("the client connected before: %v", err)
		}
	})

	t.Run("on_session_state", func(t *testing.T) {
		r, adm, ctx := setup(t, "  size: 2\n")
		c := r.client(ctx)
		reload(ctx, t, r, adm, "  size: 2\n  on_session_state: refuse\n")
		if _, err := c.Exec(ctx, "CREATE TEMP TABLE reload59_tmp(x int)"); err != nil {
			t.Fatal(err)
		}
		_, err := c.Exec(ctx, "SELECT 1") // the session ends at the transaction after the one that left it
		if pgCode(err) != "0A000" {
			t.Fatalf("a temporary table after on_session_state was reloaded to refuse: %v, want 0A000", err)
		}
	})

	t.Run("server_lifetime", func(t *testing.T) {
		r, adm, ctx := setup(t, "  size: 2\n")
		c := r.client(ctx)
		var before int
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&before); err != nil {
			t.Fatal(err)
		}
		reload(ctx, t, r, adm, "  size: 2\n  server_lifetime: 1ms\n")
		moved := false
		for i := 0; i < 3 && !moved; i++ { // the connection, older than 1ms, is closed when given back
			var pid int
			if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			moved = pid != before
		}
		if !moved {
			t.Fatal("after server_lifetime was reloaded to 1ms, three transactions ran on the server connection opened before")
		}
	})

	t.Run("server_idle_timeout", func(t *testing.T) {
		r, adm, ctx := setup(t, "  size: 2\n  server_idle_timeout: 1h\n  server_lifetime: 2h\n")
		c := r.client(ctx)
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		if got := showPool(ctx, t, adm, pgtest.SuperUser, "sv_idle"); got != "1" {
			t.Fatalf("sv_idle = %q before the reload, want 1", got)
		}
		reload(ctx, t, r, adm, "  size: 2\n  server_idle_timeout: 50ms\n  server_lifetime: 2h\n")
		waitFor(t, 20*time.Second, "the idle server connection to close after server_idle_timeout was reloaded to 50ms", func() bool {
			return showPool(ctx, t, adm, pgtest.SuperUser, "sv_idle") == "0"
		})
	})

	t.Run("min_idle", func(t *testing.T) {
		r, adm, ctx := setup(t, "  size: 3\n")
		c := r.client(ctx)
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		reload(ctx, t, r, adm, "  size: 3\n  min_idle: 2\n")
		waitFor(t, 20*time.Second, "two idle server connections after min_idle was reloaded to 2", func() bool {
			return showPool(ctx, t, adm, pgtest.SuperUser, "sv_idle") == "2"
		})
	})
}

// A user removed from auth.file by a reload: its pool stops keeping pool.min_idle server connections (logged in
// with the ClientKey of a client of the user that was, which the server still accepts), and those it kept
// close. Until 2026-12-06 the keeper went on opening them until a restart.
func TestReload59MinIdleStopsForARemovedUser(t *testing.T) {
	cl := reload59Cluster(t)
	bin := proxytest.Binary(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	direct, err := pgx.Connect(ctx, cl.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	var secret string
	if err := direct.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", pgtest.ScramUser).Scan(&secret); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "userlist.txt")
	users := func(pairs ...string) {
		var b strings.Builder
		for i := 0; i < len(pairs); i += 2 {
			fmt.Fprintf(&b, "%q %q\n", pairs[i], pairs[i+1])
		}
		if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	users(pgtest.ScramUser, secret)
	tail := "auth:\n  type: scram-sha-256\n  file: " + file + "\npool:\n  mode: transaction\n  size: 3\n  min_idle: 2\n"
	r := startReload59(t, cl, bin, tail)
	c, err := pgx.Connect(ctx, proxytest.DSN(r.addr, pgtest.ScramUser, pgtest.ScramPassword, pgtest.TestDB))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	backends := func() int {
		var n int
		if err := direct.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", pgtest.ScramUser).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, 20*time.Second, "min_idle's two server connections of the user", func() bool { return backends() == 2 })

	users(pgtest.ScramUser+"_gone", secret)
	if err := r.pp.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the removed user's idle server connections to close", func() bool { return backends() == 0 })
	// Asked again: the keeper, nudged by every close, opens none.
	if err := r.pp.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the second reload", func() bool { return strings.Count(r.pp.stderr.String(), "reloaded the table list") >= 2 })
	if n := backends(); n != 0 {
		t.Fatalf("%d server connections of the removed user after a second reload", n)
	}
}

// A pool setting a running proxy cannot change (pool.mode; pool.size, whose places its pools were made with)
// fails the reload with an error that names it, and nothing of the file applies: not the table list beside it.
// In transaction mode by RELOAD, in session mode by SIGHUP. Until 2026-12-06 such a reload applied the table
// list and named only the "pool" section in a NOTICE, and the running pools kept their size silently.
func TestReload59PoolChangesItCannotFollowAreRefused(t *testing.T) {
	cl := reload59Cluster(t)
	bin := proxytest.Binary(t, t.TempDir())
	ledgerUnfenced := func(ctx context.Context, t *testing.T, r *reload59Proxy) {
		t.Helper()
		if _, err := r.client(ctx).Exec(ctx, "UPDATE ledger SET id = 1 WHERE id = 1"); err != nil {
			t.Fatalf("ledger, in the refused file only, was protected: %v", err)
		}
	}
	const txHead = "auth:\n  type: trust\npool:\n  mode: transaction\n  admin_users: [admin]\n"
	for _, change := range []struct{ name, from, to string }{
		{"pool.size", txHead + "  size: 2\n", txHead + "  size: 1\n"},
		{"pool.mode", txHead + "  size: 2\n", "auth:\n  type: trust\npool:\n  mode: session\n"},
	} {
		t.Run("transaction/"+change.name, func(t *testing.T) {
			r := startReload59(t, cl, bin, change.from)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			adm, err := r.admin(ctx, "admin")
			if err != nil {
				t.Fatal(err)
			}
			defer adm.Close(ctx)
			r.write(change.to, "public.accounts", "ledger")
			_, err = adm.Exec(ctx, "RELOAD")
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "55000" || !strings.Contains(pe.Message, change.name) {
				t.Fatalf("RELOAD of a file that changes %s: %v, want 55000 naming it", change.name, err)
			}
			ledgerUnfenced(ctx, t, r)
			if _, err := adm.Exec(ctx, "SHOW POOLS"); err != nil {
				t.Fatalf("the admin console after the refused RELOAD: %v", err)
			}
		})
	}
	t.Run("session/pool.mode", func(t *testing.T) {
		r := startReload59(t, cl, bin, "auth:\n  type: trust\n")
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		r.write("auth:\n  type: trust\npool:\n  mode: transaction\n", "public.accounts", "ledger")
		if err := r.pp.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, "the reload's log line", func() bool {
			s := r.pp.stderr.String()
			return strings.Contains(s, "reload failed") || strings.Contains(s, "reloaded the table list")
		})
		if s := r.pp.stderr.String(); !strings.Contains(s, "reload failed") || !strings.Contains(s, "pool.mode") {
			t.Fatalf("SIGHUP with pool.mode changed: the log does not refuse it naming pool.mode:\n%s", s)
		}
		ledgerUnfenced(ctx, t, r)
	})
}
