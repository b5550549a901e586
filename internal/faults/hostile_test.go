package faults

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// connectAll opens n connections, at most par at a time, and returns those that succeeded and the errors.
func connectAll(ctx context.Context, dsn string, n, par int) ([]*pgx.Conn, []error) {
	var mu sync.Mutex
	var conns []*pgx.Conn
	var errs []error
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := pgx.Connect(ctx, dsn)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			conns = append(conns, c)
		}()
	}
	wg.Wait()
	return conns, errs
}

// TestConnectionFlood holds 250 idle sessions against max_client_connections 250, then floods 50 more: each
// extra one gets a clean 53300, the held ones keep working, and once one closes the proxy takes a new session.
// Not parallel: it uses most of the shared cluster's connection slots.
func TestConnectionFlood(t *testing.T) {
	pgtest.Require(t, pg)
	p := startProxyProc(t, proxyConfig{Upstream: pg.Addr(), Extra: "limits:\n  max_client_connections: 250\n"})
	app := "faults-flood"
	ctx := ctxFor(t, 2*time.Minute)
	held, errs := connectAll(ctx, p.DSN(app), 250, 25)
	defer func() {
		for _, c := range held {
			c.Close(context.Background())
		}
	}()
	if len(errs) > 0 {
		t.Fatalf("%d of 250 connections under the limit failed; first: %v", len(errs), errs[0])
	}
	extra, errs := connectAll(ctx, p.DSN(app), 50, 50)
	for _, c := range extra {
		c.Close(ctx)
	}
	if len(extra) > 0 {
		t.Fatalf("%d connections over the limit were accepted", len(extra))
	}
	for _, err := range errs {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "53300" {
			t.Fatalf("connection over the limit: want 53300, got %v", err)
		}
	}
	for _, i := range []int{0, 124, 249} {
		var one int
		if err := held[i].QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			t.Fatalf("held session %d during the flood: %v", i, err)
		}
	}
	held[0].Close(ctx)
	waitFor(t, 10*time.Second, "a new session once a slot is free", func() bool {
		c, err := pgx.Connect(ctx, p.DSN(app))
		if err != nil {
			return false
		}
		held[0] = c
		return true
	})
	for _, c := range held {
		c.Close(ctx)
	}
	noLeakedBackends(t, pg, app, 30*time.Second)
}

// TestClientsVanishMidQuery: many clients drop their connections (and a psql process is killed with SIGKILL)
// in the middle of a long statement; the proxy cancels their queries and closes their upstream sessions, so no
// backend is left running.
func TestClientsVanishMidQuery(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	p := startProxyProc(t, proxyConfig{Upstream: pg.Addr()})
	app := "faults-vanish"
	ctx := ctxFor(t, 2*time.Minute)
	const n = 40
	conns, errs := connectAll(ctx, p.DSN(app), n, 10)
	if len(errs) > 0 {
		t.Fatal(errs[0])
	}
	for _, c := range conns {
		// Send the statement and do not wait for it.
		c.PgConn().Conn().Write(queryMessage("SELECT pg_sleep(60)"))
	}
	psql := exec.Command(pg.Bin("psql"), "-X", "-d", p.DSN(app), "-c", "SELECT pg_sleep(60)")
	psql.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := psql.Start(); err != nil {
		t.Fatal(err)
	}
	defer psql.Wait()
	db := connect(t, pg.SuperDSN())
	waitFor(t, 30*time.Second, fmt.Sprintf("%d sleeping backends", n+1), func() bool {
		var k int
		db.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'SELECT pg_sleep%' AND state = 'active'", app).Scan(&k)
		return k == n+1
	})
	for _, c := range conns {
		c.PgConn().Conn().Close()
	}
	syscall.Kill(-psql.Process.Pid, syscall.SIGKILL)
	noLeakedBackends(t, pg, app, 20*time.Second)
}

// queryMessage is a simple-protocol Query message.
func queryMessage(sql string) []byte {
	n := 4 + len(sql) + 1
	b := []byte{'Q', byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	b = append(b, sql...)
	return append(b, 0)
}

// TestPasswordsNeverLogged logs in through the proxy (log level debug) with every password method, right and
// wrong passwords, and checks that no password shows up in the proxy's log.
func TestPasswordsNeverLogged(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	p := startProxyProc(t, proxyConfig{Upstream: pg.Addr()})
	ctx := ctxFor(t, time.Minute)
	users := []struct{ user, password string }{
		{pgtest.MD5User, pgtest.MD5Password},
		{pgtest.ScramUser, pgtest.ScramPassword},
		{pgtest.PasswordUser, pgtest.PasswordPassword},
	}
	var secrets []string
	for i, u := range users {
		secrets = append(secrets, u.password)
		c, err := pgx.Connect(ctx, proxytest.DSN(p.Addr, u.user, u.password, pgtest.TestDB))
		if err != nil {
			t.Fatalf("%s through the proxy: %v", u.user, err)
		}
		c.Close(ctx)
		wrong := "WrongSecret" + strconv.Itoa(i) + "x7Q"
		secrets = append(secrets, wrong)
		if c, err := pgx.Connect(ctx, proxytest.DSN(p.Addr, u.user, wrong, pgtest.TestDB)); err == nil {
			c.Close(ctx)
			t.Fatalf("%s with a wrong password got in", u.user)
		}
	}
	logs := p.Logs.String()
	if !strings.Contains(logs, "level=") {
		t.Fatal("the proxy logged nothing; the check would be vacuous")
	}
	for _, s := range secrets {
		if strings.Contains(logs, s) {
			t.Errorf("password %q appears in the proxy's log", s)
		}
	}
}
