package proxy_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/url"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// Upstream connection reuse: a trust session that ends cleanly and idle leaves its backend, reset with DISCARD
// ALL, to the next client whose StartupMessage is identical.

const (
	metricReused = "fenceproxy_upstream_reused_total"
	metricIdle   = "fenceproxy_upstream_idle"
)

// reuseDSN is a trust (superuser) DSN through p with an application_name of its own, plus extra URL parameters.
func reuseDSN(p *proxytest.Proxy, app string, extra ...string) string {
	dsn := p.DSN(pgtest.SuperUser, "", pgtest.TestDB) + "&application_name=" + url.QueryEscape(app)
	for _, e := range extra {
		dsn += "&" + e
	}
	return dsn
}

// reuseApp is an application_name unique to the test, so kept connections of other tests never match.
func reuseApp(t *testing.T) string { return "reuse-" + t.Name() }

// metricValue sums a gauge's or counter's series; found is false when the registry has no such metric.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) (v float64, found bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		found = true
		for _, m := range mf.GetMetric() {
			switch {
			case m.Gauge != nil:
				v += m.GetGauge().GetValue()
			case m.Counter != nil:
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v, found
}

// waitIdle waits until the proxy keeps exactly want idle upstream connections (the session end that hands a
// connection back is asynchronous to the client's Close).
func waitIdle(t *testing.T, p *proxytest.Proxy, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, found := metricValue(t, p.Registry, metricIdle)
		if v == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s = %v: last value %v (metric exported: %v)", metricIdle, want, v, found)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wantMetric checks a metric's current value.
func wantMetric(t *testing.T, p *proxytest.Proxy, name string, want float64) {
	t.Helper()
	if v, found := metricValue(t, p.Registry, name); v != want {
		t.Errorf("%s = %v, want %v (metric exported: %v)", name, v, want, found)
	}
}

// waitBackendGone waits until backend pid has left pg_stat_activity, i.e. the proxy did not keep its connection.
func waitBackendGone(t *testing.T, d *pgx.Conn, pid uint32, why string) {
	t.Helper()
	eventually(t, 10*time.Second, fmt.Sprintf("backend %d to be closed (%s)", pid, why), func() bool { return backendState(t, d, pid) == "gone" })
}

// pidOf asks the session for its backend PID and checks that the driver's BackendKeyData PID agrees.
func pidOf(t *testing.T, c *pgx.Conn) uint32 {
	t.Helper()
	var pid uint32
	if err := c.QueryRow(ctxT(t), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatalf("SELECT pg_backend_pid(): %v", err)
	}
	if pid != c.PgConn().PID() {
		t.Fatalf("pg_backend_pid() = %d but BackendKeyData carried PID %d", pid, c.PgConn().PID())
	}
	return pid
}

// wantNewBackend connects once more and checks that the session did not get backend old.
func wantNewBackend(t *testing.T, p *proxytest.Proxy, dsn string, old uint32, what string) {
	t.Helper()
	b := connect(t, dsn)
	if pid := pidOf(t, b); pid == old {
		t.Fatalf("the next session got %s (%d)", what, pid)
	}
	wantMetric(t, p, metricReused, 0)
}

func closeConn(t *testing.T, c *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
}

func simpleExec(t *testing.T, c *pgx.Conn, sql string) {
	t.Helper()
	if _, err := c.Exec(ctxT(t), sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestReuseSameBackendAndResetState(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	d := direct(t)
	ctx := ctxT(t)
	dsn := reuseDSN(p, reuseApp(t))
	const lockKey = 73400101

	a := connect(t, dsn)
	pidA := pidOf(t, a) // also leaves pgx's cached prepared statement for this SQL on the backend
	for _, sql := range []string{
		"SET search_path = pg_catalog",
		"SET fence.token = 7",
		"SET TimeZone = 'Pacific/Chatham'",
		"SET DateStyle = 'SQL, DMY'",
		"SET IntervalStyle = 'sql_standard'",
		"SET standard_conforming_strings = off",
		"SET application_name = 'changed-by-a'",
		"CREATE TEMP TABLE reuse_tmp(x int)",
		"PREPARE reuse_stmt AS SELECT 1",
		"LISTEN reuse_chan",
		fmt.Sprintf("SELECT pg_advisory_lock(%d)", lockKey),
		"SET SESSION AUTHORIZATION " + pgtest.MD5User,
	} {
		simpleExec(t, a, sql)
	}
	if got := a.PgConn().ParameterStatus("session_authorization"); got != pgtest.MD5User {
		t.Fatalf("A's ParameterStatus session_authorization = %q after SET SESSION AUTHORIZATION", got)
	}
	closeConn(t, a)
	waitIdle(t, p, 1)
	wantMetric(t, p, metricReused, 0)

	b := connect(t, dsn)
	if pidB := pidOf(t, b); pidB != pidA {
		t.Fatalf("second client with an identical startup got backend %d, the first had %d: the connection was not reused", pidB, pidA)
	}
	wantMetric(t, p, metricReused, 1)
	waitIdle(t, p, 0)

	// Everything A did to the session is gone.
	var s string
	if err := b.QueryRow(ctx, "SHOW search_path", pgx.QueryExecModeSimpleProtocol).Scan(&s); err != nil {
		t.Fatal(err)
	}
	var def string
	if err := d.QueryRow(ctx, "SHOW search_path").Scan(&def); err != nil {
		t.Fatal(err)
	}
	if s != def {
		t.Errorf("search_path = %q on the reused backend, a fresh session has %q", s, def)
	}
	var tok *string
	if err := b.QueryRow(ctx, "SELECT current_setting('fence.token', true)", pgx.QueryExecModeSimpleProtocol).Scan(&tok); err != nil {
		t.Fatal(err)
	}
	if tok != nil && *tok != "" {
		t.Errorf("fence.token = %q on the reused backend: A's token leaked to B", *tok)
	}
	var who, sessWho string
	if err := b.QueryRow(ctx, "SELECT current_user, session_user", pgx.QueryExecModeSimpleProtocol).Scan(&who, &sessWho); err != nil {
		t.Fatal(err)
	}
	if who != pgtest.SuperUser || sessWho != pgtest.SuperUser {
		t.Errorf("current_user %q, session_user %q on the reused backend: A's SET SESSION AUTHORIZATION survived", who, sessWho)
	}
	_, err := b.Exec(ctx, "SELECT count(*) FROM reuse_tmp", pgx.QueryExecModeSimpleProtocol)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Errorf("A's temp table on the reused backend: want 42P01, got %v", err)
	}
	_, err = b.Exec(ctx, "EXECUTE reuse_stmt", pgx.QueryExecModeSimpleProtocol)
	if !errors.As(err, &pgErr) || pgErr.Code != "26000" {
		t.Errorf("A's prepared statement on the reused backend: want 26000, got %v", err)
	}
	var listening int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM pg_listening_channels()", pgx.QueryExecModeSimpleProtocol).Scan(&listening); err != nil {
		t.Fatal(err)
	}
	if listening != 0 {
		t.Errorf("the reused backend still listens on %d channel(s)", listening)
	}
	var got bool
	if err := d.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", lockKey).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if !got {
		t.Errorf("advisory lock %d still held after A's session ended", lockKey)
	} else if _, err := d.Exec(ctx, "SELECT pg_advisory_unlock($1)", lockKey); err != nil {
		t.Fatal(err)
	}

	// The reported parameters B was told at startup are what the server has now, and what a fresh session gets.
	want := map[string]string{"application_name": reuseApp(t)}
	for _, name := range []string{"TimeZone", "DateStyle", "IntervalStyle", "standard_conforming_strings", "session_authorization", "is_superuser"} {
		var v string
		if err := d.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			t.Fatalf("default %s: %v", name, err)
		}
		want[name] = v
	}
	for name, w := range want {
		var server string
		if err := b.QueryRow(ctx, "SELECT current_setting($1)", pgx.QueryExecModeSimpleProtocol, name).Scan(&server); err != nil {
			t.Fatalf("%s on the reused backend: %v", name, err)
		}
		if server != w {
			t.Errorf("%s = %q on the reused backend, want %q", name, server, w)
		}
		if ps := b.PgConn().ParameterStatus(name); ps != server {
			t.Errorf("B was told %s = %q at startup, the server has %q", name, ps, server)
		}
	}
	if b.PgConn().ParameterStatus("server_version") == "" {
		t.Errorf("B got no server_version ParameterStatus")
	}

	// pgx names its cached statements after the SQL: the same query as A's must not collide with A's leftovers,
	// and the extended protocol works on the reused backend.
	if pid := pidOf(t, b); pid != pidA {
		t.Fatalf("pid changed mid-session: %d", pid)
	}
	var n int
	if err := b.QueryRow(ctx, "SELECT $1::int + 1", 41).Scan(&n); err != nil || n != 42 {
		t.Fatalf("extended protocol on the reused backend: %d %v", n, err)
	}
}

func TestReuseNeedsIdenticalStartup(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	d := direct(t)
	ctx := ctxT(t)
	app := reuseApp(t)
	const otherRole = "reuse_other_role"
	if _, err := d.Exec(ctx, fmt.Sprintf("DO $$ BEGIN CREATE ROLE %s LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$", otherRole)); err != nil {
		t.Fatalf("create role %s: %v", otherRole, err)
	}

	a := connect(t, reuseDSN(p, app))
	pidA := pidOf(t, a)
	closeConn(t, a)
	waitIdle(t, p, 1)

	otherUser := proxytest.DSN(p.Addr, otherRole, "", pgtest.TestDB) + "&application_name=" + url.QueryEscape(app)
	otherDB := proxytest.DSN(p.Addr, pgtest.SuperUser, "", "postgres") + "&application_name=" + url.QueryEscape(app)
	for _, v := range []struct{ what, dsn, user, db string }{
		{"another application_name", reuseDSN(p, app+"-other"), pgtest.SuperUser, pgtest.TestDB},
		{"no application_name", p.DSN(pgtest.SuperUser, "", pgtest.TestDB), pgtest.SuperUser, pgtest.TestDB},
		{"extra options", reuseDSN(p, app, "options=-c%20work_mem%3D8MB"), pgtest.SuperUser, pgtest.TestDB},
		{"extra run-time parameter", reuseDSN(p, app, "search_path=pg_catalog"), pgtest.SuperUser, pgtest.TestDB},
		{"another user", otherUser, otherRole, pgtest.TestDB},
		{"another database", otherDB, pgtest.SuperUser, "postgres"},
	} {
		c := connect(t, v.dsn)
		if pid := pidOf(t, c); pid == pidA {
			t.Errorf("%s: got the kept backend %d of a different startup", v.what, pid)
		}
		var user, db string
		if err := c.QueryRow(ctx, "SELECT session_user, current_database()").Scan(&user, &db); err != nil {
			t.Fatalf("%s: %v", v.what, err)
		}
		if user != v.user || db != v.db {
			t.Errorf("%s: session is %s@%s, want %s@%s", v.what, user, db, v.user, v.db)
		}
		closeConn(t, c)
	}
	wantMetric(t, p, metricReused, 0)

	// The kept connection was left alone and still goes to an identical startup.
	c := connect(t, reuseDSN(p, app))
	if pid := pidOf(t, c); pid != pidA {
		t.Fatalf("identical startup after the others: backend %d, want the kept %d", pid, pidA)
	}
	wantMetric(t, p, metricReused, 1)
}

func TestNoReuseAfterPasswordAuth(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	d := direct(t)
	ctx := ctxT(t)
	for _, u := range []struct{ user, pass string }{
		{pgtest.MD5User, pgtest.MD5Password},
		{pgtest.ScramUser, pgtest.ScramPassword},
		{pgtest.PasswordUser, pgtest.PasswordPassword},
	} {
		dsn := func(pass string) string {
			return proxytest.DSN(p.Addr, u.user, pass, pgtest.TestDB) + "&application_name=" + url.QueryEscape(reuseApp(t))
		}
		a := connect(t, dsn(u.pass))
		pidA := pidOf(t, a)
		closeConn(t, a)
		waitBackendGone(t, d, pidA, u.user+" authenticated with a password")

		_, err := pgx.Connect(ctx, dsn("wrong"))
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
			t.Fatalf("%s with a wrong password after a clean session end: want 28P01, got %v", u.user, err)
		}
		b := connect(t, dsn(u.pass))
		if pidB := pidOf(t, b); pidB == pidA {
			t.Fatalf("%s: second session got backend %d again", u.user, pidB)
		}
		closeConn(t, b)
	}
	wantMetric(t, p, metricReused, 0)
	wantMetric(t, p, metricIdle, 0)
}

func TestNoReuseWhenClientLeavesInTransaction(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	d := direct(t)
	ctx := ctxT(t)
	app := reuseApp(t)
	const table = "reuse_left_in_tx"
	if _, err := d.Exec(ctx, "DROP TABLE IF EXISTS "+table+"; CREATE TABLE "+table+"(x int)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })

	// A transaction block left open, then a clean Close (Terminate).
	a := connect(t, reuseDSN(p, app))
	pidA := pidOf(t, a)
	tx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if st := a.PgConn().TxStatus(); st != 'T' {
		t.Fatalf("TxStatus %q, want T", st)
	}
	closeConn(t, a)
	waitBackendGone(t, d, pidA, "the session ended inside a transaction block")
	var n int
	if err := d.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("the insert of a transaction the client abandoned is visible (%d rows): it was committed", n)
	}
	b := connect(t, reuseDSN(p, app))
	if pid := pidOf(t, b); pid == pidA {
		t.Fatalf("the next client got backend %d of a session that ended in a transaction", pid)
	}
	closeConn(t, b)

	// A failed transaction block ('E').
	waitIdle(t, p, 1) // b's session was clean: kept
	a = connect(t, reuseDSN(p, app+"-failed"))
	pidA = pidOf(t, a)
	tx, err = a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("1/0 succeeded")
	}
	if st := a.PgConn().TxStatus(); st != 'E' {
		t.Fatalf("TxStatus %q, want E", st)
	}
	closeConn(t, a)
	waitBackendGone(t, d, pidA, "the session ended in a failed transaction block")

	// Terminate sent right behind a query, before its result.
	conn, fe, _ := rawStartup(t, p.Addr, pgproto3.ProtocolVersionNumber, map[string]string{"application_name": app + "-midquery"})
	pidM := rawBackendPID(t, fe)
	fe.Send(&pgproto3.Query{String: "SELECT pg_sleep(2)"})
	fe.Send(&pgproto3.Terminate{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	waitBackendGone(t, d, pidM, "the session ended mid-query")

	// A client that vanishes without Terminate while idle.
	v := connect(t, reuseDSN(p, app+"-vanish"))
	pidV := pidOf(t, v)
	v.PgConn().Conn().Close()
	waitBackendGone(t, d, pidV, "the client vanished without Terminate")
	c := connect(t, reuseDSN(p, app+"-vanish"))
	if pid := pidOf(t, c); pid == pidV {
		t.Fatalf("the next client got backend %d of a client that vanished", pid)
	}

	wantMetric(t, p, metricReused, 0)
	wantMetric(t, p, metricIdle, 1) // only b's
}

// cancelRequestPacket is the CancelRequest a client sends for the backend pid with key.
func cancelRequestPacket(pid uint32, key []byte) []byte {
	pkt := binary.BigEndian.AppendUint32(nil, uint32(12+len(key)))
	pkt = binary.BigEndian.AppendUint32(pkt, 80877102)
	pkt = binary.BigEndian.AppendUint32(pkt, pid)
	return append(pkt, key...)
}

// rawCancel sends a CancelRequest for pid with key to addr and waits until the proxy closes the connection
// (it has dealt with the request by then).
func rawCancel(t *testing.T, addr string, pid uint32, key []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(cancelRequestPacket(pid, key)); err != nil {
		t.Fatalf("write CancelRequest: %v", err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if _, err := conn.Read(b[:]); isTimeoutErr(err) {
		t.Logf("the proxy kept the CancelRequest connection open for 5s")
	}
}

func TestReusedBackendCancelKey(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	d := direct(t)
	ctx := ctxT(t)
	dsn := reuseDSN(p, reuseApp(t))

	a := connect(t, dsn)
	pidA := pidOf(t, a)
	keyA := append([]byte(nil), a.PgConn().SecretKey()...)
	closeConn(t, a)
	waitIdle(t, p, 1)

	b, err := pgx.ConnectConfig(ctx, cancelConfig(t, dsn))
	if err != nil {
		t.Fatalf("connect B: %v", err)
	}
	defer b.Close(context.Background())
	if pid := pidOf(t, b); pid != pidA {
		t.Fatalf("B got backend %d, A had %d: not reused, the test cannot go on", pid, pidA)
	}
	if bytes.Equal(b.PgConn().SecretKey(), keyA) {
		t.Fatalf("B was given the same secret key as A (%x) for the same backend", keyA)
	}

	// A's stale key must not cancel B's query, which is running (waiting for a lock) when the cancel is handled.
	held := holdQuery(t, b)
	rawCancel(t, p.Addr, pidA, keyA)
	held.stillRunning(t, "A's stale CancelRequest")
	if err := held.release(t); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "57014" {
			t.Fatalf("A's old key cancelled B's query on the reused backend: %v", err)
		}
		t.Fatalf("B's query: %v", err)
	}

	// B's own key works: the cancel is sent once the server runs the query (a cancel for an idle backend is
	// ignored). No timing check: without a working cancel the query runs its 30s and pgx then closes the
	// connection, which is not 57014.
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := b.Exec(qctx, "SELECT pg_sleep(30)")
		done <- err
	}()
	eventually(t, 20*time.Second, "B's query to run", func() bool { return backendState(t, d, pidA) == "active" })
	cancel()
	var pgErr *pgconn.PgError
	if err := <-done; !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("B cancelling its own query: want 57014, got %v", err)
	}
	var one int
	if err := b.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("B after its cancel: %v", err)
	}
}

func TestReuseSkipsDeadIdleConnection(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	d := direct(t)
	ctx := ctxT(t)
	dsn := reuseDSN(p, reuseApp(t))

	a := connect(t, dsn)
	pidA := pidOf(t, a)
	closeConn(t, a)
	waitIdle(t, p, 1)
	var ok bool
	if err := d.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pidA).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v %v", pidA, ok, err)
	}
	waitBackendGone(t, d, pidA, "pg_terminate_backend")

	b := connect(t, dsn)
	pidB := pidOf(t, b)
	if pidB == pidA {
		t.Fatalf("B reports the terminated backend's PID %d", pidB)
	}
	var one int
	if err := b.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 on B: %d %v", one, err)
	}
	wantMetric(t, p, metricReused, 0)
}

func TestReuseIdleTimeout(t *testing.T) {
	// proxytest's generated YAML ends with "upstream:\n  address: ...", so indented keys continue upstream.
	p := startProxy(t, proxytest.Options{YAML: "  reuse:\n    idle_timeout: 1s\n"})
	d := direct(t)
	dsn := reuseDSN(p, reuseApp(t))

	a := connect(t, dsn)
	pidA := pidOf(t, a)
	// The proxy starts the idle clock when the session ends, which is after this instant: the backend cannot
	// be gone less than idle_timeout after it, however slow the machine (the bound is the behaviour, and it
	// needs no slack: polling only makes the measured time longer).
	beforeClose := time.Now()
	closeConn(t, a)
	waitIdle(t, p, 1)
	if st := backendState(t, d, pidA); st == "gone" {
		t.Fatalf("backend %d gone while the proxy counts it as kept", pidA)
	}
	waitBackendGone(t, d, pidA, "idle_timeout 1s")
	if el := time.Since(beforeClose); el < time.Second {
		t.Errorf("kept connection closed %v after the session ended, before idle_timeout 1s", el)
	}
	waitIdle(t, p, 0)

	wantNewBackend(t, p, dsn, pidA, "the timed-out backend")
}

func TestReuseMaxLifetime(t *testing.T) {
	p := startProxy(t, proxytest.Options{YAML: "  reuse:\n    max_lifetime: 300ms\n"})
	d := direct(t)
	dsn := reuseDSN(p, reuseApp(t))

	a := connect(t, dsn)
	pidA := pidOf(t, a)
	// The upstream connection was made before connect returned: after this it is older than max_lifetime
	// however long the connect took. (A sleep to age a connection, not a timing assertion.)
	connected := time.Now()
	time.Sleep(time.Until(connected.Add(500 * time.Millisecond)))
	closeConn(t, a)
	waitBackendGone(t, d, pidA, "older than max_lifetime 300ms")
	wantMetric(t, p, metricIdle, 0)

	wantNewBackend(t, p, dsn, pidA, "a backend older than max_lifetime")
}

func TestReuseOff(t *testing.T) {
	p := startProxy(t, proxytest.Options{YAML: "  reuse:\n    max_idle: 0\n"})
	d := direct(t)
	dsn := reuseDSN(p, reuseApp(t))

	a := connect(t, dsn)
	pidA := pidOf(t, a)
	closeConn(t, a)
	waitBackendGone(t, d, pidA, "reuse off (max_idle 0)")

	wantNewBackend(t, p, dsn, pidA, "a backend with reuse off")
	wantMetric(t, p, metricIdle, 0)
}

func TestReuseMaxIdle(t *testing.T) {
	p := startProxy(t, proxytest.Options{YAML: "  reuse:\n    max_idle: 1\n"})
	d := direct(t)
	app := reuseApp(t)

	a1 := connect(t, reuseDSN(p, app+"-1"))
	a2 := connect(t, reuseDSN(p, app+"-2"))
	pid1, pid2 := pidOf(t, a1), pidOf(t, a2)
	closeConn(t, a1)
	waitIdle(t, p, 1)
	closeConn(t, a2)
	// Only one is kept: one of the two backends goes away, the other stays.
	eventually(t, 10*time.Second, "one of the two backends to be closed (max_idle 1)", func() bool {
		return backendState(t, d, pid1) == "gone" || backendState(t, d, pid2) == "gone"
	})
	if backendState(t, d, pid1) == "gone" && backendState(t, d, pid2) == "gone" {
		t.Fatalf("both backends closed, max_idle 1 should keep one")
	}
	waitIdle(t, p, 1)
	if v, _ := metricValue(t, p.Registry, metricIdle); v > 1 {
		t.Fatalf("%s = %v with max_idle 1", metricIdle, v)
	}
}

// rawSession starts a trust session with a StartupMessage whose parameters are in exactly the order given,
// and returns the connection and the backend PID from BackendKeyData.
func rawSession(t *testing.T, addr string, params ...string) (net.Conn, *pgproto3.Frontend, uint32) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	body := binary.BigEndian.AppendUint32(nil, pgproto3.ProtocolVersionNumber)
	for _, p := range params {
		body = append(append(body, p...), 0)
	}
	body = append(body, 0)
	if _, err := conn.Write(append(binary.BigEndian.AppendUint32(nil, uint32(4+len(body))), body...)); err != nil {
		t.Fatalf("send StartupMessage: %v", err)
	}
	fe := pgproto3.NewFrontend(conn, conn)
	var pid uint32
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatalf("startup %q: %v", params, err)
		}
		switch m := m.(type) {
		case *pgproto3.ErrorResponse:
			t.Fatalf("startup %q: %s %s", params, m.Code, m.Message)
		case *pgproto3.BackendKeyData:
			pid = m.ProcessID
		case *pgproto3.ReadyForQuery:
			conn.SetDeadline(time.Time{})
			return conn, fe, pid
		}
	}
}

// terminate ends a raw session cleanly.
func terminate(t *testing.T, conn net.Conn, fe *pgproto3.Frontend) {
	t.Helper()
	fe.Send(&pgproto3.Terminate{})
	if err := fe.Flush(); err != nil {
		t.Fatalf("send Terminate: %v", err)
	}
	conn.Close()
}

// TestReuseIgnoresParameterOrder: the same startup parameters in another order are the same session as far as
// PostgreSQL is concerned. pgx (pgproto3.StartupMessage.Encode) writes its parameters in Go map order, which is
// random per connection, so a byte-for-byte comparison would reuse pgx connections only by chance.
func TestReuseIgnoresParameterOrder(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	app := reuseApp(t)
	order1 := []string{"user", pgtest.SuperUser, "database", pgtest.TestDB, "application_name", app}
	order2 := []string{"application_name", app, "database", pgtest.TestDB, "user", pgtest.SuperUser}

	conn, fe, pid := rawSession(t, p.Addr, order1...)
	inLoop(t, p, 1) // see TestReuseAfterImmediateTerminate
	terminate(t, conn, fe)
	waitIdle(t, p, 1)

	// Identical bytes: reused.
	conn, fe, pid2 := rawSession(t, p.Addr, order1...)
	if pid2 != pid {
		t.Fatalf("byte-identical StartupMessage: backend %d, want the kept %d", pid2, pid)
	}
	terminate(t, conn, fe)
	waitIdle(t, p, 1)

	// The same parameters in another order: reused too.
	_, _, pid3 := rawSession(t, p.Addr, order2...)
	if pid3 != pid {
		t.Fatalf("the same startup parameters in another order: backend %d, want the kept %d (pgx sends its parameters in random order)", pid3, pid)
	}
	wantMetric(t, p, metricReused, 2)
}

// inLoop waits, on Linux, until n sessions have been handed to the event loop.
func inLoop(t *testing.T, p *proxytest.Proxy, n int) {
	t.Helper()
	if runtime.GOOS == "linux" {
		eventually(t, 5*time.Second, "the session to enter the event loop", func() bool { return proxy.SessionsInLoop(p.Server) == n })
	}
}

// TestReuseAfterImmediateTerminate: a client that sends Terminate right after ReadyForQuery (a connection
// check, a health probe) ends its session cleanly and idle, so its connection is kept, even when the Terminate
// arrives while the session is being handed to the event loop. Fresh startups each time (distinct
// application_name), so every session goes through the handover.
func TestReuseAfterImmediateTerminate(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	app := reuseApp(t)
	for i := range 10 {
		conn, fe, _ := rawSession(t, p.Addr, "user", pgtest.SuperUser, "database", pgtest.TestDB, "application_name", fmt.Sprintf("%s-%d", app, i))
		terminate(t, conn, fe)
		waitIdle(t, p, float64(i+1))
	}
}
