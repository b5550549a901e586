package proxy_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	_ "github.com/lib/pq"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

func TestSimpleExtendedAndBackendPID(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	ctx := ctxT(t)

	var pid uint32
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if pid != c.PgConn().PID() {
		t.Errorf("pg_backend_pid() = %d, driver's PID = %d: BackendKeyData must pass through unchanged", pid, c.PgConn().PID())
	}
	var s string
	var n int
	if err := c.QueryRow(ctx, "SELECT $1::text || 'x', $2::int + 1", pgx.QueryExecModeSimpleProtocol, "a", 41).Scan(&s, &n); err != nil || s != "ax" || n != 42 {
		t.Fatalf("simple protocol: %q %d %v", s, n, err)
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec} {
		if err := c.QueryRow(ctx, "SELECT $1::text || 'y', $2::int * 2", mode, "b", 21).Scan(&s, &n); err != nil || s != "by" || n != 42 {
			t.Fatalf("mode %v: %q %d %v", mode, s, n, err)
		}
	}
	// Several statements in one Query message, and an error in the middle of a transaction.
	if _, err := c.Exec(ctx, "CREATE TEMP TABLE t1(x int); INSERT INTO t1 VALUES (1),(2)"); err != nil {
		t.Fatal(err)
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "SELECT 1/0")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22012" {
		t.Fatalf("division by zero: %v", err)
	}
	_, err = tx.Exec(ctx, "SELECT 1")
	if !errors.As(err, &pgErr) || pgErr.Code != "25P02" {
		t.Fatalf("after an error in a transaction: %v", err)
	}
	tx.Rollback(ctx)
	if err := c.QueryRow(ctx, "SELECT count(*) FROM t1").Scan(&n); err != nil || n != 2 {
		t.Fatalf("count: %d %v", n, err)
	}
	// A large result and a large parameter cross buffer boundaries.
	big := strings.Repeat("z", 1<<20)
	if err := c.QueryRow(ctx, "SELECT $1::text", big).Scan(&s); err != nil || s != big {
		t.Fatalf("1 MiB round trip: len %d %v", len(s), err)
	}
	if err := c.QueryRow(ctx, "SELECT count(*) FROM (SELECT repeat('x', 100) FROM generate_series(1, 100000)) s").Scan(&n); err != nil || n != 100000 {
		t.Fatalf("large result: %d %v", n, err)
	}
	rows, _ := c.Query(ctx, "SELECT g, repeat('x', 100) FROM generate_series(1, 20000) g")
	count := 0
	for rows.Next() {
		count++
	}
	if rows.Err() != nil || count != 20000 {
		t.Fatalf("streamed rows: %d %v", count, rows.Err())
	}
}

func TestBatchAndPipeline(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	ctx := ctxT(t)

	b := &pgx.Batch{}
	for i := range 200 {
		b.Queue("SELECT $1::int * 2", i)
	}
	br := c.SendBatch(ctx, b)
	for i := range 200 {
		var got int
		if err := br.QueryRow().Scan(&got); err != nil || got != i*2 {
			t.Fatalf("batch item %d: %d %v", i, got, err)
		}
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}

	// A raw pipeline: many Parse/Bind/Describe/Execute, Flush in the middle, one Sync.
	pl := c.PgConn().StartPipeline(ctx)
	pl.SendPrepare("pl_stmt", "SELECT $1::int + 1", nil)
	pl.SendQueryPrepared("pl_stmt", [][]byte{[]byte("1")}, nil, nil)
	if err := pl.Flush(); err != nil {
		t.Fatal(err)
	}
	pl.SendQueryParams("SELECT $1::text", [][]byte{[]byte("hello")}, nil, nil, nil)
	if err := pl.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := pl.GetResults(); err != nil { // the statement description
		t.Fatal(err)
	}
	res, err := pl.GetResults()
	if err != nil {
		t.Fatal(err)
	}
	rr := res.(*pgconn.ResultReader).Read()
	if rr.Err != nil || string(rr.Rows[0][0]) != "2" {
		t.Fatalf("pipelined prepared: %v %q", rr.Err, rr.Rows)
	}
	res, err = pl.GetResults()
	if err != nil {
		t.Fatal(err)
	}
	rr = res.(*pgconn.ResultReader).Read()
	if rr.Err != nil || string(rr.Rows[0][0]) != "hello" {
		t.Fatalf("pipelined params: %v %q", rr.Err, rr.Rows)
	}
	if res, err = pl.GetResults(); err != nil {
		t.Fatal(err)
	}
	if _, ok := res.(*pgconn.PipelineSync); !ok {
		t.Fatalf("expected PipelineSync, got %T", res)
	}
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestCopyInAndOut(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	ctx := ctxT(t)
	if _, err := c.Exec(ctx, "CREATE TEMP TABLE copy_t(id int, s text)"); err != nil {
		t.Fatal(err)
	}
	rows := make([][]any, 50000)
	for i := range rows {
		rows[i] = []any{i, fmt.Sprintf("row %d", i)}
	}
	n, err := c.CopyFrom(ctx, pgx.Identifier{"copy_t"}, []string{"id", "s"}, pgx.CopyFromRows(rows))
	if err != nil || n != 50000 {
		t.Fatalf("COPY FROM: %d %v", n, err)
	}
	// COPY FROM STDIN in text format through pgconn.
	tag, err := c.PgConn().CopyFrom(ctx, strings.NewReader("1000000\ttext\n1000001\tmore\n"), "COPY copy_t FROM STDIN")
	if err != nil || tag.RowsAffected() != 2 {
		t.Fatalf("COPY FROM STDIN: %v %v", tag, err)
	}
	var out bytes.Buffer
	tag, err = c.PgConn().CopyTo(ctx, &out, "COPY (SELECT * FROM copy_t ORDER BY id) TO STDOUT")
	if err != nil || tag.RowsAffected() != 50002 {
		t.Fatalf("COPY TO: %v %v", tag, err)
	}
	if !strings.HasPrefix(out.String(), "0\trow 0\n1\trow 1\n") || !strings.HasSuffix(out.String(), "1000001\tmore\n") {
		t.Fatalf("COPY TO output starts %q", out.String()[:40])
	}
	// A COPY the client aborts: the session stays usable.
	_, err = c.PgConn().CopyFrom(ctx, &failingReader{}, "COPY copy_t FROM STDIN")
	if err == nil {
		t.Fatal("aborted COPY succeeded")
	}
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("after CopyFail: %v", err)
	}
}

type failingReader struct{ sent bool }

func (f *failingReader) Read(p []byte) (int, error) {
	if !f.sent {
		f.sent = true
		return copy(p, "5\tfive\n"), nil
	}
	return 0, errors.New("client gave up")
}

func TestListenNotifyAndNotices(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	listener := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	notifier := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	ctx := ctxT(t)
	if _, err := listener.Exec(ctx, "LISTEN fence_events"); err != nil {
		t.Fatal(err)
	}
	if _, err := notifier.Exec(ctx, "SELECT pg_notify('fence_events', 'token 42')"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(wctx)
	if err != nil || n.Channel != "fence_events" || n.Payload != "token 42" {
		t.Fatalf("notification: %+v %v", n, err)
	}

	var notices []string
	var mu sync.Mutex
	cfg, _ := pgx.ParseConfig(p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { mu.Lock(); notices = append(notices, n.Message); mu.Unlock() }
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "DO $$ BEGIN RAISE NOTICE 'hello from the server'; END $$"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(notices) != 1 || notices[0] != "hello from the server" {
		t.Fatalf("notices: %q", notices)
	}
	// ParameterStatus: a SET of a reported setting reaches the driver.
	if _, err := c.Exec(ctx, "SET application_name = 'fence-test'"); err != nil {
		t.Fatal(err)
	}
	if got := c.PgConn().ParameterStatus("application_name"); got != "fence-test" {
		t.Fatalf("ParameterStatus application_name = %q", got)
	}
}

// cancelConfig makes pgx cancel with a CancelRequest (not by closing the socket) when the context ends.
func cancelConfig(t *testing.T, dsn string) *pgx.ConnConfig {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, CancelRequestDelay: 0, DeadlineDelay: 10 * time.Second}
	}
	return cfg
}

func TestCancelStopsOnlyItsOwnQuery(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	ctx := ctxT(t)
	d := direct(t)
	victim, err := pgx.ConnectConfig(ctx, cancelConfig(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB)))
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close(ctx)
	bystander := holdQuery(t, connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB)))

	// The victim's query is cancelled once the server runs it, not on a timer: a cancel that arrives before the
	// query would be ignored, and the test would hang instead of testing the cancel.
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	victimDone := make(chan error, 1)
	go func() {
		_, err := victim.Exec(qctx, "SELECT pg_sleep(30)")
		victimDone <- err
	}()
	pid := victim.PgConn().PID()
	eventually(t, 20*time.Second, "the victim's query to run", func() bool { return backendState(t, d, pid) == "active" })
	cancel()
	// No timing check: without a working cancel the query runs its 30s and pgx then closes the connection
	// (DeadlineDelay), which is not 57014.
	var pgErr *pgconn.PgError
	if err := <-victimDone; !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("cancelled query: want 57014, got %v", err)
	}
	bystander.stillRunning(t, "another session's cancel")
	if err := bystander.release(t); err != nil {
		t.Fatalf("the other session's query was disturbed: %v", err)
	}
	var one int
	if err := victim.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("session after cancel: %v", err)
	}
}

// TestBogusCancelDoesNotCancelOthers: CancelRequests with a wrong secret for a running query's PID, or for an
// unknown PID, cancel nothing. The query is running (waiting for a lock) when they arrive, and rawCancel returns
// only once the proxy has dealt with each, so a forwarded cancel would have ended it with 57014.
func TestBogusCancelDoesNotCancelOthers(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	h := holdQuery(t, c)
	pid := c.PgConn().PID()
	wrong := append([]byte(nil), c.PgConn().SecretKey()...)
	wrong[len(wrong)-1] ^= 1
	for _, key := range [][]byte{{0, 0, 0, 0}, {0, 0, 0, 1}, {0xde, 0xad, 0xbe, 0xef}, wrong} {
		for _, target := range []uint32{pid, pid + 100000} {
			rawCancel(t, p.Addr, target, key)
		}
	}
	h.stillRunning(t, "bogus CancelRequests")
	if err := h.release(t); err != nil {
		t.Fatalf("a bogus CancelRequest cancelled a query: %v", err)
	}
	// The control: the right key does cancel it, so the requests above reached a query that could be cancelled.
	h = holdQuery(t, c)
	rawCancel(t, p.Addr, pid, c.PgConn().SecretKey())
	var pgErr *pgconn.PgError
	select {
	case err := <-h.done:
		if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
			t.Fatalf("the genuine CancelRequest: want 57014, got %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the genuine CancelRequest did not cancel the query within 20s")
	}
}

func TestAuthenticationMethods(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	ctx := ctxT(t)
	for _, u := range []struct{ user, pass string }{
		{pgtest.MD5User, pgtest.MD5Password},
		{pgtest.ScramUser, pgtest.ScramPassword},
		{pgtest.PasswordUser, pgtest.PasswordPassword},
	} {
		c := connect(t, p.DSN(u.user, u.pass, pgtest.TestDB))
		var who string
		if err := c.QueryRow(ctx, "SELECT current_user").Scan(&who); err != nil || who != u.user {
			t.Fatalf("%s: current_user %q %v", u.user, who, err)
		}
		_, err := pgx.Connect(ctx, p.DSN(u.user, "wrong", pgtest.TestDB))
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
			t.Fatalf("%s with a wrong password: want 28P01, got %v", u.user, err)
		}
	}
	if strings.Contains(p.Logs.String(), pgtest.ScramPassword) || strings.Contains(p.Logs.String(), "wrong") {
		t.Fatalf("a password reached the logs:\n%s", p.Logs.String())
	}
}

func TestLibPQ(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	db, err := sql.Open("postgres", p.DSN(pgtest.MD5User, pgtest.MD5Password, pgtest.TestDB))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := ctxT(t)
	var s string
	if err := db.QueryRowContext(ctx, "SELECT $1::text || current_user", "hi ").Scan(&s); err != nil || s != "hi md5user" {
		t.Fatalf("lib/pq query: %q %v", s, err)
	}
	st, err := db.PrepareContext(ctx, "SELECT $1::int * 3")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i := range 5 {
		var n int
		if err := st.QueryRowContext(ctx, i).Scan(&n); err != nil || n != i*3 {
			t.Fatalf("prepared: %d %v", n, err)
		}
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "CREATE TEMP TABLE lpq(x int)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func TestPsql(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Fatal("psql not found: run scripts/setup (postgresql-client)")
	}
	host, port, _ := net.SplitHostPort(p.Addr)
	cmd := exec.Command(psql, "-X", "-v", "ON_ERROR_STOP=1", "-At", "-h", host, "-p", port, "-U", pgtest.ScramUser, "-d", pgtest.TestDB,
		"-c", "SELECT 'psql says ' || current_user",
		"-c", "CREATE TEMP TABLE p(x int)",
		"-c", `\copy p FROM program 'seq 1 1000'`,
		"-c", "SELECT sum(x) FROM p")
	cmd.Env = append(os.Environ(), "PGPASSWORD="+pgtest.ScramPassword, "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=10")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	if got := string(out); !strings.Contains(got, "psql says scramuser") || !strings.Contains(got, "COPY 1000") || !strings.Contains(got, "500500") {
		t.Fatalf("psql output:\n%s", got)
	}
}

func TestPgbench(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	pgbench, err := exec.LookPath("pgbench")
	if err != nil {
		t.Fatal("pgbench not found: run scripts/setup (postgresql-contrib / postgresql-client)")
	}
	if err := pg.Exec("DROP DATABASE IF EXISTS bench_relay"); err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec("CREATE DATABASE bench_relay"); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(p.Addr)
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(pgbench, append([]string{"-h", host, "-p", port, "-U", pgtest.SuperUser}, append(args, "bench_relay")...)...)
		cmd.Env = append(os.Environ(), "PGSSLMODE=disable")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("pgbench %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	run("-i", "-s", "1", "-q")
	for _, mode := range []string{"simple", "extended", "prepared"} {
		out := run("-M", mode, "-c", "4", "-j", "2", "-t", "100")
		if !strings.Contains(out, "number of transactions actually processed: 400/400") {
			t.Fatalf("pgbench -M %s:\n%s", mode, out)
		}
		if strings.Contains(out, "number of failed transactions: ") && !strings.Contains(out, "number of failed transactions: 0 ") {
			t.Fatalf("pgbench -M %s had failures:\n%s", mode, out)
		}
	}
}
