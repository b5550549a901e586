package proxy_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// The admin console and the limits of transaction pooling (admin.go, pool.go), against a real PostgreSQL.

// adminConn connects to f's admin console as the role admin (listed in pool.admin_users by the test).
func adminConn(t *testing.T, f *fenced) *pgx.Conn {
	t.Helper()
	return connect(t, proxytest.DSN(f.p.Addr, "admin", "", "fenceproxy")+"&default_query_exec_mode=simple_protocol")
}

// adminRows runs an admin command and returns its rows by column name.
func adminRows(t *testing.T, adm *pgx.Conn, cmd string) []map[string]any {
	t.Helper()
	rows, err := adm.Query(ctxT(t), cmd)
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToMap)
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return out
}

// rowWhere is the one row whose column col is v, or nil.
func rowWhere(rows []map[string]any, col, v string) map[string]any {
	for _, r := range rows {
		if r[col] == v {
			return r
		}
	}
	return nil
}

// gathered is a series of reg: a gauge's value, or a histogram's count and sum.
func gathered(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (value float64, count uint64, sum float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			value += m.GetGauge().GetValue()
			count += m.GetHistogram().GetSampleCount()
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	return value, count, sum
}

// SHOW CLIENTS and SHOW SERVERS link a client to the server connection lent to it (by the PID the client was
// given and the backend's PID), and show a client waiting for a full pool as waiting; SHOW POOLS and the
// per-pool series count the same; the wait-time histogram sees the wait; SHOW CONFIG shows the pool's settings
// and no password.
func TestPooledAdminShowClientsAndServers(t *testing.T) {
	d := direct(t)
	name := fxName(t, "tp")
	fxCreateTable(t, d, "public."+name)
	p := startProxy(t, proxytest.Options{YAML: fxTables("public."+name) + "pool:\n  mode: transaction\n  size: 1\n  admin_users: [admin]\nauth:\n  type: trust\n  upstream_password: never-shown\n"})
	f := &fenced{p: p, d: d, name: name, label: "public." + name}
	ctx := ctxT(t)
	adm := adminConn(t, f)
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol&application_name=client_a")
	fxExec(t, a, "BEGIN") // holds the pool's one server connection
	aHeld := time.Now()
	aBackend := strconv.FormatUint(uint64(backendPID(t, a)), 10)
	aPtr := strconv.FormatUint(uint64(a.PgConn().PID()), 10)

	b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol&application_name=client_b")
	bPtr := strconv.FormatUint(uint64(b.PgConn().PID()), 10)
	bDone := make(chan error, 1)
	go func() {
		_, err := b.Exec(context.Background(), "SELECT 1")
		bDone <- err
	}()
	var clients []map[string]any
	eventually(t, 10*time.Second, "client b waiting in SHOW CLIENTS", func() bool {
		clients = adminRows(t, adm, "SHOW CLIENTS")
		r := rowWhere(clients, "ptr", bPtr)
		return r != nil && r["state"] == "waiting"
	})
	ra, rb := rowWhere(clients, "ptr", aPtr), rowWhere(clients, "ptr", bPtr)
	if len(clients) != 2 || ra == nil || ra["state"] != "active" || ra["link"] != aBackend || ra["user"] != pgtest.SuperUser ||
		ra["database"] != pgtest.TestDB || ra["application_name"] != "client_a" || ra["type"] != "C" || ra["addr"] != "127.0.0.1" || rb["link"] != "" {
		t.Fatalf("SHOW CLIENTS: %v", clients)
	}
	servers := adminRows(t, adm, "SHOW SERVERS")
	if len(servers) != 1 || servers[0]["state"] != "active" || servers[0]["remote_pid"] != aBackend || servers[0]["link"] != aPtr ||
		servers[0]["user"] != pgtest.SuperUser || servers[0]["type"] != "S" {
		t.Fatalf("SHOW SERVERS: %v", servers)
	}
	pools := adminRows(t, adm, "SHOW POOLS")
	if len(pools) != 1 || pools[0]["cl_active"] != "1" || pools[0]["cl_waiting"] != "1" || pools[0]["sv_active"] != "1" || pools[0]["sv_idle"] != "0" || pools[0]["paused"] != "0" {
		t.Fatalf("SHOW POOLS: %v", pools)
	}
	labels := map[string]string{"database": pgtest.TestDB, "user": pgtest.SuperUser}
	for _, s := range []struct {
		name, state string
		want        float64
	}{{"fenceproxy_pool_clients", "waiting", 1}, {"fenceproxy_pool_clients", "active", 1}, {"fenceproxy_pool_servers", "active", 1}, {"fenceproxy_pool_servers", "idle", 0}} {
		l := map[string]string{"state": s.state}
		for k, v := range labels {
			l[k] = v
		}
		if v, _, _ := gathered(t, f.p.Registry, s.name, l); v != s.want {
			t.Errorf("%s{state=%q} = %v, want %v", s.name, s.state, v, s.want)
		}
	}
	_, waitsBefore, _ := gathered(t, f.p.Registry, "fenceproxy_pool_wait_seconds", labels)
	bWaits := time.Now()              // b waits from before this
	time.Sleep(50 * time.Millisecond) // a wait SHOW STATS must count, whatever the machine's speed
	aCommits := time.Now()
	fxExec(t, a, "COMMIT")
	if err := <-bDone; err != nil {
		t.Fatalf("client b after a's commit: %v", err)
	}
	_, waits, waited := gathered(t, f.p.Registry, "fenceproxy_pool_wait_seconds", labels)
	if waits != waitsBefore+1 || waited <= 0 {
		t.Fatalf("fenceproxy_pool_wait_seconds: count %d (before b's lend %d), sum %v: want b's wait counted", waits, waitsBefore, waited)
	}
	// The client has b's ReadyForQuery before the proxy gives the connection back (it writes the answer, then
	// settles the lend): the server turns idle right after.
	eventually(t, 10*time.Second, "the server idle in SHOW SERVERS after both transactions", func() bool {
		servers = adminRows(t, adm, "SHOW SERVERS")
		return len(servers) == 1 && servers[0]["state"] == "idle"
	})
	if servers[0]["link"] != "" {
		t.Fatalf("SHOW SERVERS after both transactions: %v", servers)
	}
	// SHOW STATS: pgbouncer's microseconds, at least a's transaction and b's wait as the test saw them.
	stats := adminRows(t, adm, "SHOW STATS")
	atLeast := func(col string, d time.Duration) {
		t.Helper()
		if n, err := strconv.ParseInt(stats[0][col].(string), 10, 64); err != nil || n < d.Microseconds() {
			t.Errorf("SHOW STATS %s = %v, want at least %d", col, stats[0][col], d.Microseconds())
		}
	}
	atLeast("total_xact_time", aCommits.Sub(aHeld))
	atLeast("total_wait_time", aCommits.Sub(bWaits))
	if n, _ := strconv.Atoi(stats[0]["total_xact_count"].(string)); n < 2 {
		t.Errorf("SHOW STATS total_xact_count = %v, want at least 2 (a's transaction and b's)", stats[0]["total_xact_count"])
	}
	if v, _, _ := gathered(t, f.p.Registry, "fenceproxy_pool_servers", map[string]string{"state": "idle"}); v != 1 {
		t.Fatalf("fenceproxy_pool_servers{state=idle} = %v, want 1", v)
	}

	cfg := adminRows(t, adm, "SHOW CONFIG")
	if r := rowWhere(cfg, "key", "pool.size"); r == nil || r["value"] != "1" || r["default"] != "20" || r["changeable"] != "no" {
		t.Fatalf("SHOW CONFIG pool.size: %v", r)
	}
	for _, r := range cfg {
		if strings.Contains(fmt.Sprint(r), "never-shown") {
			t.Fatalf("SHOW CONFIG shows the upstream password: %v", r)
		}
	}
	_, err := adm.Exec(ctx, "SHOW NONSENSE")
	wantPgErr(t, err, "0A000", "fenceproxy admin console: unknown command")
	// An empty database name is no database: not PAUSE of every pool.
	for _, cmd := range []string{`PAUSE ""`, `RESUME ""`} {
		_, err = adm.Exec(ctx, cmd)
		wantPgErr(t, err, "0A000", "fenceproxy admin console: unknown command")
	}
	if p := adminRows(t, adm, "SHOW POOLS"); len(p) > 0 && p[0]["paused"] != "0" {
		t.Fatalf(`PAUSE "" paused: %v`, p)
	}
}

// PAUSE: new transactions wait (no lend) while the running one finishes; PAUSE returns once the pool's server
// connections are all back, and closes them; RESUME lets the waiting client go on. PAUSE of another database
// leaves the pool alone; RESUME of what is not paused is refused.
func TestPooledAdminPauseResume(t *testing.T) {
	f := newPooledFenced(t, 2, "  admin_users: [admin]\n")
	ctx := ctxT(t)
	adm, watch := adminConn(t, f), adminConn(t, f)
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	fxExec(t, a, "BEGIN")
	aBackend := backendPID(t, a)
	c := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	fxExec(t, c, "SELECT 1") // c's pool has an idle server connection now, too
	cPtr := strconv.FormatUint(uint64(c.PgConn().PID()), 10)

	paused := make(chan error, 1)
	go func() {
		_, err := adm.Exec(context.Background(), "PAUSE")
		paused <- err
	}()
	eventually(t, 10*time.Second, "the pool paused in SHOW POOLS", func() bool {
		p := adminRows(t, watch, "SHOW POOLS")
		return len(p) == 1 && p[0]["paused"] == "1"
	})
	cDone := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), "SELECT 1")
		cDone <- err
	}()
	eventually(t, 10*time.Second, "client c waiting during the pause", func() bool {
		r := rowWhere(adminRows(t, watch, "SHOW CLIENTS"), "ptr", cPtr)
		return r != nil && r["state"] == "waiting"
	})
	select {
	case err := <-paused:
		t.Fatalf("PAUSE returned (%v) while a transaction still held a server connection", err)
	default:
	}
	if _, err := a.Exec(ctx, "SELECT 1"); err != nil { // the running transaction goes on
		t.Fatalf("a transaction running at PAUSE: %v", err)
	}
	fxExec(t, a, "COMMIT")
	select {
	case err := <-paused:
		if err != nil {
			t.Fatalf("PAUSE: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("PAUSE did not return after the last transaction ended")
	}
	eventually(t, 10*time.Second, "the paused pool's server connections closed", func() bool {
		var n int
		err := f.d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", aBackend).Scan(&n)
		return err == nil && n == 0
	})
	if s := adminRows(t, watch, "SHOW SERVERS"); len(s) != 0 {
		t.Fatalf("SHOW SERVERS after PAUSE: %v", s)
	}
	select {
	case err := <-cDone:
		t.Fatalf("client c ran during the pause: %v", err)
	default:
	}
	fxExec(t, adm, "RESUME")
	select {
	case err := <-cDone:
		if err != nil {
			t.Fatalf("client c after RESUME: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("client c did not go on after RESUME")
	}
	_, err := adm.Exec(ctx, "RESUME")
	wantPgErr(t, err, "55000", "RESUME: nothing is paused")

	// PAUSE of another database: this pool lends on. No client used that one: a NOTICE says so (pgbouncer
	// refuses a database it does not know; pools here are made at first use).
	acfg := adm.Config().Copy()
	var notices []string
	acfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Message) }
	adm2, err := pgx.ConnectConfig(ctx, acfg)
	if err != nil {
		t.Fatal(err)
	}
	defer adm2.Close(ctx)
	fxExec(t, adm2, "PAUSE otherdb")
	if len(notices) != 1 || !strings.Contains(notices[0], `no client has used database "otherdb" yet`) {
		t.Fatalf("PAUSE otherdb: notices %q", notices)
	}
	fxExec(t, adm2, "PAUSE "+pgtest.TestDB)
	fxExec(t, adm2, "RESUME "+pgtest.TestDB)
	if len(notices) != 1 {
		t.Fatalf("PAUSE of a database in use: notices %q", notices[1:])
	}
	fxExec(t, a, "SELECT 1")
	_, err = adm.Exec(ctx, "RESUME "+pgtest.TestDB)
	wantPgErr(t, err, "55000", fmt.Sprintf("RESUME %s: database %q is not paused", pgtest.TestDB, pgtest.TestDB))
	fxExec(t, adm, "RESUME otherdb")
}

// A PAUSE whose pool stays busy (a transaction left open) gives up at limits.shutdown_timeout with an error
// naming the pool, and the pool stays paused; a client that waits through the pause longer than
// pool.max_client_wait is refused with 53300 saying so, as pgbouncer's query_wait_timeout does.
func TestPooledAdminPauseDeadline(t *testing.T) {
	f := newPooledFenced(t, 2, "  admin_users: [admin]\n  max_client_wait: 1s\nlimits:\n  shutdown_timeout: 1s\n")
	ctx := ctxT(t)
	adm := adminConn(t, f)
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	fxExec(t, a, "BEGIN")
	_, err := adm.Exec(ctx, "PAUSE "+pgtest.TestDB)
	pool := pgtest.TestDB + "/" + pgtest.SuperUser
	wantPgErr(t, err, "55000", "PAUSE: server connections still active after limits.shutdown_timeout in "+pool+" (1)")
	if p := adminRows(t, adm, "SHOW POOLS"); len(p) != 1 || p[0]["paused"] != "1" {
		t.Fatalf("SHOW POOLS after a PAUSE that gave up: %v", p)
	}
	b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	_, err = b.Exec(ctx, "SELECT 1")
	wantPgErr(t, err, "53300", "pool "+pool+" stayed paused (PAUSE) for pool.max_client_wait (1s)")
	fxExec(t, a, "COMMIT") // a's transaction, running at PAUSE, ends normally
	fxExec(t, adm, "RESUME "+pgtest.TestDB)
	fxExec(t, a, "SELECT 1")
}

// pool.max_clients: a client beyond it is refused with 53300 after its authentication; the admin console is
// not counted; a client that leaves frees its place.
func TestPooledMaxClients(t *testing.T) {
	f := newPooledFenced(t, 2, "  admin_users: [admin]\n  max_clients: 2\n")
	ctx := ctxT(t)
	a := pooledConn(t, f, "")
	pooledConn(t, f, "")
	_, err := pgx.Connect(ctx, f.dsn())
	wantPgErr(t, err, "53300", "sorry, too many clients already")
	adm := adminConn(t, f)
	if p := adminRows(t, adm, "SHOW POOLS"); len(p) != 1 || p[0]["cl_active"] != "2" {
		t.Fatalf("SHOW POOLS: %v", p)
	}
	if n := fxCounter(t, f.p.Registry, "fenceproxy_sessions_refused_total", map[string]string{"reason": "max_clients"}); n != 1 {
		t.Fatalf("refusals for max_clients: %v, want 1", n)
	}
	a.Close(ctx)
	eventually(t, 10*time.Second, "a new client let in after one left", func() bool {
		c, err := pgx.Connect(ctx, f.dsn())
		if err != nil {
			return false
		}
		c.Close(ctx)
		return true
	})
}

// idleServers is the backend PIDs of the idle server connections SHOW SERVERS lists.
func idleServers(t *testing.T, adm *pgx.Conn) []string {
	var pids []string
	for _, r := range adminRows(t, adm, "SHOW SERVERS") {
		if r["state"] == "idle" {
			pids = append(pids, r["remote_pid"].(string))
		}
	}
	slices.Sort(pids)
	return pids
}

// pool.min_idle: the pool opens idle server connections in the background up to min_idle (within pool.size),
// and opens another when the server closed one (the reaper finds it).
func TestPooledMinIdle(t *testing.T) {
	f := newPooledFenced(t, 3, "  admin_users: [admin]\n  min_idle: 2\n  server_idle_timeout: 1s\n")
	adm := adminConn(t, f)
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	fxExec(t, a, "SELECT 1")
	var idle []string
	eventually(t, 10*time.Second, "two idle server connections", func() bool {
		idle = idleServers(t, adm)
		return len(idle) == 2
	})
	pid, _ := strconv.Atoi(idle[0])
	fxExec(t, f.d, "SELECT pg_terminate_backend($1)", pid)
	eventually(t, 10*time.Second, "the terminated one replaced", func() bool {
		now := idleServers(t, adm)
		return len(now) == 2 && !slices.Contains(now, idle[0])
	})
	// Three busy at once: the pool holds three (pool.size) and opens no idle one beyond.
	var held []*pgx.Conn
	for range 3 {
		c := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
		fxExec(t, c, "BEGIN")
		held = append(held, c)
	}
	if s := adminRows(t, adm, "SHOW SERVERS"); len(s) != 3 {
		t.Fatalf("SHOW SERVERS with three transactions open: %d rows, want pool.size 3: %v", len(s), s)
	}
	for _, c := range held {
		fxExec(t, c, "COMMIT")
	}
}

// pool.server_idle_timeout keeps pool.min_idle: of three idle server connections it closes the two idle
// longest, never the last one (which stays one of the three: not closed and opened again).
func TestPooledMinIdleKeptFromIdleTimeout(t *testing.T) {
	f := newPooledFenced(t, 3, "  admin_users: [admin]\n  min_idle: 1\n  server_idle_timeout: 200ms\n")
	adm := adminConn(t, f)
	var held []*pgx.Conn
	for range 3 {
		c := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
		fxExec(t, c, "BEGIN")
		held = append(held, c)
	}
	var three []string
	for _, r := range adminRows(t, adm, "SHOW SERVERS") {
		three = append(three, r["remote_pid"].(string))
	}
	if len(three) != 3 {
		t.Fatalf("server connections with three transactions open: %v", three)
	}
	for _, c := range held {
		fxExec(t, c, "COMMIT")
	}
	var left []map[string]any
	eventually(t, 10*time.Second, "the idle timeout down to pool.min_idle", func() bool {
		left = adminRows(t, adm, "SHOW SERVERS")
		return len(left) <= 1
	})
	if len(left) != 1 || !slices.Contains(three, left[0]["remote_pid"].(string)) {
		t.Fatalf("after the idle timeout: %v, want one of %v", left, three)
	}
}

// Upstream 28P01 in transaction mode: when the server refuses the login of a pool's server connection (the
// role's password changed; the proxy's auth.file is stale), the proxy reads its secrets again and tries once
// more; the client then gets the server's 28P01 (not 08006), and the refusal is counted. Once the operator
// writes the new secret, the client with the new password gets in.
func TestPooledUpstreamRefreshes(t *testing.T) {
	ctx := ctxT(t)
	d := direct(t)
	old := rolpassword(t, pgtest.MD5User)
	t.Cleanup(func() {
		direct(t).Exec(context.Background(), fmt.Sprintf("SET password_encryption = 'md5'; ALTER ROLE %s PASSWORD '%s'", pgtest.MD5User, pgtest.MD5Password))
	})
	file := writeUserlist(t, filepath.Join(t.TempDir(), "userlist.txt"), pgtest.MD5User, old)
	p := startProxy(t, proxytest.Options{YAML: "pool:\n  mode: transaction\n  size: 2\nauth:\n  type: md5\n  file: " + file + "\n"})
	if code := loginCode(t, p.DSN(pgtest.MD5User, pgtest.MD5Password, pgtest.TestDB)); code != "" {
		t.Fatalf("login before the rotation: %s", code)
	}
	if _, err := d.Exec(ctx, fmt.Sprintf("SET password_encryption = 'md5'; ALTER ROLE %s PASSWORD 'rotated'", pgtest.MD5User)); err != nil {
		t.Fatal(err)
	}
	// The pool's idle server connection logged in before the rotation; a client in a transaction holds it, so
	// the next client's transaction needs a new one.
	c := connect(t, p.DSN(pgtest.MD5User, pgtest.MD5Password, pgtest.TestDB)+"&default_query_exec_mode=simple_protocol")
	fxExec(t, c, "BEGIN")
	e := connect(t, p.DSN(pgtest.MD5User, pgtest.MD5Password, pgtest.TestDB)+"&default_query_exec_mode=simple_protocol")
	_, err := e.Exec(ctx, "SELECT 1")
	wantPgErr(t, err, "28P01", fmt.Sprintf("password authentication failed for user %q", pgtest.MD5User))
	if n := strings.Count(p.Logs.String(), "secret refreshed, trying again"); n != 1 {
		t.Fatalf("the proxy tried again %d times, want once", n)
	}
	if n := fxCounter(t, p.Registry, "fenceproxy_auth_failures_total", map[string]string{"reason": "upstream"}); n != 1 {
		t.Fatalf("auth failures (upstream) = %v, want 1", n)
	}
	fxExec(t, c, "COMMIT")
	writeUserlist(t, file, pgtest.MD5User, rolpassword(t, pgtest.MD5User), "someone", old)
	fxExec(t, c, "BEGIN")
	n := connect(t, p.DSN(pgtest.MD5User, "rotated", pgtest.TestDB)+"&default_query_exec_mode=simple_protocol")
	fxExec(t, n, "SELECT 1") // a new server connection, logged in with the new secret
	fxExec(t, c, "COMMIT")
}
