package pgtest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

var pg *pgtest.Cluster

// orphanEnv makes the test binary act as a test process that starts a
// cluster and dies without stopping it (see TestReaperStopsOrphanedServer).
const orphanEnv = "PGTEST_ORPHAN_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(orphanEnv) == "1" {
		c, err := pgtest.Start(pgtest.Options{})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(2)
		}
		fmt.Printf("%d %s\n", c.PID(), c.DataDir())
		// Block until the parent kills us: no Stop, no deferred cleanup.
		select {}
	}
	os.Exit(pgtest.RunMain(m, pgtest.Options{}, &pg))
}

func connect(t *testing.T, dsn string) (*pgx.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err == nil {
		t.Cleanup(func() { conn.Close(context.Background()) })
	}
	return conn, err
}

func queryString(t *testing.T, conn *pgx.Conn, sql string, args ...any) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func TestAuthMethods(t *testing.T) {
	pgtest.Require(t, pg)
	cases := []struct {
		user, password, method string
	}{
		{pgtest.SuperUser, "", "trust"},
		{pgtest.MD5User, pgtest.MD5Password, "md5"},
		{pgtest.ScramUser, pgtest.ScramPassword, "scram-sha-256"},
		{pgtest.PasswordUser, pgtest.PasswordPassword, "password"},
	}
	super, err := connect(t, pg.DSN(pgtest.SuperUser, "", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.user, func(t *testing.T) {
			conn, err := connect(t, pg.DSN(tc.user, tc.password, pgtest.TestDB))
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			if got := queryString(t, conn, "SELECT current_user"); got != tc.user {
				t.Errorf("current_user = %q, want %q", got, tc.user)
			}
			// The first pg_hba.conf line that matches the user over TCP is
			// the method the server used.
			method := queryString(t, super, `SELECT auth_method FROM pg_hba_file_rules
				WHERE type = 'host' AND address = '127.0.0.1' AND (user_name = ARRAY[$1] OR user_name = '{all}')
				ORDER BY line_number LIMIT 1`, tc.user)
			if method != tc.method {
				t.Errorf("hba method = %q, want %q", method, tc.method)
			}
			if tc.password == "" {
				return
			}
			_, err = connect(t, pg.DSN(tc.user, tc.password+"-wrong", pgtest.TestDB))
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
				t.Fatalf("wrong password: err = %v, want SQLSTATE 28P01", err)
			}
		})
	}
	// How each password is stored decides which mechanisms can work.
	for user, prefix := range map[string]string{pgtest.MD5User: "md5", pgtest.ScramUser: "SCRAM-SHA-256$"} {
		stored := queryString(t, super, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", user)
		if !strings.HasPrefix(stored, prefix) {
			t.Errorf("%s password stored as %.14q..., want prefix %q", user, stored, prefix)
		}
	}
}

func TestDatabasesAndExec(t *testing.T) {
	pgtest.Require(t, pg)
	if err := pg.Exec("CREATE TABLE exec_probe (id int); INSERT INTO exec_probe VALUES (1), (2)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Exec("DROP TABLE exec_probe") })
	conn, err := connect(t, pg.DSN(pgtest.ScramUser, pgtest.ScramPassword, pgtest.TestDB))
	if err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, conn, "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()"); got != pgtest.SuperUser {
		t.Errorf("owner of %s = %q, want %q", pgtest.TestDB, got, pgtest.SuperUser)
	}
	if got := queryString(t, conn, "SHOW max_connections"); got != "300" {
		t.Errorf("max_connections = %s, want the default 300", got)
	}
	// Ordinary roles may create tables in public (PostgreSQL 15 revoked it).
	if _, err := conn.Exec(context.Background(), "CREATE TABLE scram_owned (id int); DROP TABLE scram_owned"); err != nil {
		t.Errorf("scramuser cannot create a table: %v", err)
	}
	if err := pg.Exec("SELECT * FROM no_such_table"); err == nil {
		t.Error("Exec of a failing statement returned nil")
	}
}

func TestPsql(t *testing.T) {
	pgtest.Require(t, pg)
	out, err := pg.Psql("-tA", "-c", "SELECT current_database()").CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != pgtest.TestDB {
		t.Errorf("psql printed %q, want %q", got, pgtest.TestDB)
	}
}

func TestSSLVerifyFull(t *testing.T) {
	c := pgtest.MustStart(t, pgtest.Options{
		SSL:            true,
		MaxConnections: 40,
		ExtraConf:      map[string]string{"work_mem": "7MB", "application_name": "it's quoted"},
	})
	for _, host := range []string{"127.0.0.1", "localhost"} {
		t.Run(host, func(t *testing.T) {
			u, err := url.Parse(c.DSN(pgtest.ScramUser, pgtest.ScramPassword, pgtest.TestDB))
			if err != nil {
				t.Fatal(err)
			}
			u.Host = host + ":" + strconv.Itoa(c.Port())
			u.RawQuery = url.Values{"sslmode": {"verify-full"}, "sslrootcert": {c.CAFile}}.Encode()
			conn, err := connect(t, u.String())
			if err != nil {
				t.Fatalf("verify-full: %v", err)
			}
			if got := queryString(t, conn, "SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()"); got != "true" {
				t.Errorf("pg_stat_ssl.ssl = %s, want true", got)
			}
		})
	}
	conn, err := connect(t, c.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	for setting, want := range map[string]string{"max_connections": "40", "work_mem": "7MB", "ssl": "on"} {
		if got := queryString(t, conn, "SHOW "+setting); got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}
	// Without the CA the server certificate must not verify.
	u := strings.Replace(c.DSN(pgtest.SuperUser, "", pgtest.TestDB), "sslmode=disable", "sslmode=verify-full&sslrootcert="+url.QueryEscape(os.DevNull), 1)
	if _, err := connect(t, u); err == nil {
		t.Error("verify-full without the CA succeeded")
	}
}

func TestRestartKeepsPort(t *testing.T) {
	pgtest.Require(t, pg)
	port, pid := pg.Port(), pg.PID()
	conn, err := connect(t, pg.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(); err != nil {
		t.Fatal(err)
	}
	if pg.Port() != port {
		t.Errorf("port changed from %d to %d", port, pg.Port())
	}
	if newPID := pg.PID(); newPID == 0 || newPID == pid {
		t.Errorf("postmaster pid after restart = %d (before %d)", newPID, pid)
	}
	if err := conn.Ping(context.Background()); err == nil {
		t.Error("connection survived a restart")
	}
	if _, err := connect(t, pg.DSN(pgtest.MD5User, pgtest.MD5Password, pgtest.TestDB)); err != nil {
		t.Fatalf("connect after restart: %v", err)
	}
}

func TestKillStartAgain(t *testing.T) {
	pgtest.Require(t, pg)
	if err := pg.Exec("CREATE TABLE kill_probe (id int); INSERT INTO kill_probe VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Exec("DROP TABLE IF EXISTS kill_probe") })
	conn, err := connect(t, pg.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	pid := pg.PID()
	if err := pg.Kill(); err != nil {
		t.Fatal(err)
	}
	if pg.PID() != 0 {
		t.Fatalf("PID() = %d after Kill", pg.PID())
	}
	if syscall.Kill(pid, 0) == nil && pg.PID() != 0 {
		t.Fatalf("postmaster %d still alive", pid)
	}
	if err := conn.Ping(context.Background()); err == nil {
		t.Error("connection survived Kill")
	}
	if _, err := connect(t, pg.SuperDSN()); err == nil {
		t.Error("connected to a killed server")
	}
	if err := pg.StartAgain(); err != nil {
		t.Fatal(err)
	}
	conn, err = connect(t, pg.SuperDSN())
	if err != nil {
		t.Fatalf("connect after StartAgain: %v", err)
	}
	if got := queryString(t, conn, "SELECT id::text FROM kill_probe"); got != "42" {
		t.Errorf("committed row after crash recovery = %s, want 42", got)
	}
}

func TestPauseResume(t *testing.T) {
	pgtest.Require(t, pg)
	conn, err := connect(t, pg.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_ = pg.Resume()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err = conn.PgConn().Exec(ctx, "SELECT 1").Close()
	cancel()
	if err == nil {
		t.Fatal("a paused server answered")
	}
	if err := pg.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	conn2, err := connect(t, pg.SuperDSN())
	if err != nil {
		t.Fatalf("connect after Resume: %v", err)
	}
	if got := queryString(t, conn2, "SELECT 'up'"); got != "up" {
		t.Errorf("got %q", got)
	}
}

func TestStopRemovesEverything(t *testing.T) {
	c := pgtest.MustStart(t, pgtest.Options{})
	pid, dir := c.PID(), c.SocketDir()
	if pid == 0 {
		t.Fatal("PID() = 0 for a running cluster")
	}
	// Stop must not hang on a frozen server.
	if err := c.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s still there after Stop: %v", dir, err)
	}
	waitGone(t, pid)
	if err := c.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// TestReaperStopsOrphanedServer kills a test process that started a
// cluster and checks that the server and its directory go away anyway.
func TestReaperStopsOrphanedServer(t *testing.T) {
	pgtest.Require(t, pg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), orphanEnv+"=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		t.Fatalf("helper: %v", err)
	}
	var pid int
	var dataDir string
	if _, err := fmt.Sscanf(line, "%d %s", &pid, &dataDir); err != nil || pid == 0 {
		_ = cmd.Process.Kill()
		t.Fatalf("helper printed %q", line)
	}
	// SIGKILL: no deferred function, no signal handler can run.
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	waitGone(t, pid)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(dataDir); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("data directory %s not removed", dataDir)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil || strings.Contains(string(stat), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("postmaster %d still running", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStandbyStreamsAndPromotes: a standby made by StartStandby replays what the primary commits, refuses
// writes until promoted, and takes them after Promote.
func TestStandbyStreamsAndPromotes(t *testing.T) {
	pgtest.Require(t, pg)
	primary := pgtest.MustStart(t, pgtest.Options{})
	standby := pgtest.MustStartStandby(t, primary, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := primary.Exec("CREATE TABLE streamed(x int); INSERT INTO streamed VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := standby.WaitReplayed(ctx, primary); err != nil {
		t.Fatal(err)
	}
	conn, err := connect(t, standby.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, conn, "SELECT count(*)::text FROM streamed"); got != "1" {
		t.Fatalf("standby sees %s rows, want 1", got)
	}
	if err := standby.Exec("INSERT INTO streamed VALUES (2)"); err == nil {
		t.Fatal("a standby took a write")
	}
	if err := standby.StopWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	if err := primary.Exec("INSERT INTO streamed VALUES (3)"); err != nil {
		t.Fatal(err)
	}
	if err := primary.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Exec("INSERT INTO streamed VALUES (4)"); err != nil {
		t.Fatalf("promoted standby refuses a write: %v", err)
	}
	// The row committed after the WAL receiver stopped never arrived.
	if got := queryString(t, conn, "SELECT string_agg(x::text, ',' ORDER BY x) FROM streamed"); got != "1,4" {
		t.Fatalf("promoted standby holds rows %s, want 1,4", got)
	}
}
