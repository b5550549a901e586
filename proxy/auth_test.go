package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/auth"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// rolpassword is the secret PostgreSQL stores for role.
func rolpassword(t *testing.T, role string) string {
	t.Helper()
	var s string
	if err := direct(t).QueryRow(ctxT(t), "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&s); err != nil {
		t.Fatalf("secret of %s: %v", role, err)
	}
	return s
}

// writeUserlist writes a pgbouncer userlist of user, secret pairs.
func writeUserlist(t *testing.T, path string, pairs ...string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("; written by the test\n")
	for i := 0; i < len(pairs); i += 2 {
		fmt.Fprintf(&b, "%q %q\n", pairs[i], pairs[i+1])
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// loginCode connects and returns the SQLSTATE of the refusal, or "" when the login worked.
func loginCode(t *testing.T, dsn string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err == nil {
		var who string
		if err := c.QueryRow(ctx, "SELECT current_user").Scan(&who); err != nil {
			t.Fatalf("query after login: %v", err)
		}
		c.Close(ctx)
		return ""
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	t.Fatalf("login failed without a server error: %v", err)
	return ""
}

// TestAuthFileSCRAM: a SCRAM user from an auth file logs in through the proxy with pgx and psql; the proxy logs
// in upstream with the client's ClientKey (pg_hba asks scramuser for SCRAM); a wrong password gets 28P01 from
// the proxy; and a second client of the same user gets the first one's kept upstream connection, which
// passthrough never does for a password user.
func TestAuthFileSCRAM(t *testing.T) {
	file := writeUserlist(t, filepath.Join(t.TempDir(), "userlist.txt"), pgtest.ScramUser, rolpassword(t, pgtest.ScramUser))
	p := startProxy(t, proxytest.Options{YAML: "auth:\n  type: scram-sha-256\n  file: " + file + "\n"})
	dsn := p.DSN(pgtest.ScramUser, pgtest.ScramPassword, pgtest.TestDB) + "&application_name=" + reuseApp(t)
	for i := 0; i < 2; i++ {
		if code := loginCode(t, dsn); code != "" {
			t.Fatalf("login %d: %s", i, code)
		}
		waitIdle(t, p, 1)
	}
	if n, _ := metricValue(t, p.Registry, "fenceproxy_upstream_reused_total"); n < 1 {
		t.Fatalf("the second SCRAM client did not reuse the first's upstream connection (reused %v)", n)
	}
	if code := loginCode(t, p.DSN(pgtest.ScramUser, "Wr0ng-"+pgtest.ScramPassword, pgtest.TestDB)); code != "28P01" {
		t.Fatalf("wrong password: %q, want 28P01", code)
	}
	if n := fxCounter(t, p.Registry, "fenceproxy_auth_failures_total", map[string]string{"reason": "password"}); n != 1 {
		t.Fatalf("auth failures (password) = %v, want 1", n)
	}
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Fatal("psql not found: run scripts/setup (postgresql-client)")
	}
	host, port, _ := net.SplitHostPort(p.Addr)
	cmd := exec.Command(psql, "-X", "-At", "-h", host, "-p", port, "-U", pgtest.ScramUser, "-d", pgtest.TestDB, "-c", "SELECT 'psql is ' || current_user")
	cmd.Env = append(os.Environ(), "PGPASSWORD="+pgtest.ScramPassword, "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=10")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "psql is "+pgtest.ScramUser) {
		t.Fatalf("psql: %v\n%s", err, out)
	}
}

// TestAuthFileMD5: an md5 user from an auth file; upstream (pg_hba md5) is answered with the md5 secret.
func TestAuthFileMD5(t *testing.T) {
	file := writeUserlist(t, filepath.Join(t.TempDir(), "userlist.txt"), pgtest.MD5User, rolpassword(t, pgtest.MD5User))
	p := startProxy(t, proxytest.Options{YAML: "auth:\n  type: md5\n  file: " + file + "\n"})
	if code := loginCode(t, p.DSN(pgtest.MD5User, pgtest.MD5Password, pgtest.TestDB)); code != "" {
		t.Fatalf("md5 login: %s", code)
	}
	if code := loginCode(t, p.DSN(pgtest.MD5User, "nope", pgtest.TestDB)); code != "28P01" {
		t.Fatalf("md5 wrong password: %q, want 28P01", code)
	}
}

// countingUpstream is an upstream that counts connections and closes them.
func countingUpstream(t *testing.T) (addr string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = &atomic.Int64{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	return ln.Addr().String(), accepted
}

// scramServerFirst starts a SCRAM login as user and returns the proxy's server-first-message.
func scramServerFirst(t *testing.T, addr, user string) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fe := pgproto3.NewFrontend(conn, conn)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: map[string]string{"user": user, "database": pgtest.TestDB}})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := fe.Receive()
	if sasl, ok := m.(*pgproto3.AuthenticationSASL); err != nil || !ok || len(sasl.AuthMechanisms) != 1 || sasl.AuthMechanisms[0] != "SCRAM-SHA-256" {
		t.Fatalf("first answer to %s: %#v %v", user, m, err)
	}
	fe.Send(&pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: []byte("n,,n=,r=fixednonce")})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err = fe.Receive()
	cont, ok := m.(*pgproto3.AuthenticationSASLContinue)
	if err != nil || !ok {
		t.Fatalf("server-first for %s: %#v %v", user, m, err)
	}
	// Without the server nonce, which is fresh each time.
	_, rest, _ := strings.Cut(string(cont.Data), ",s=")
	return "s=" + rest
}

// TestAuthUnknownUserNoUpstream: unknown users and wrong passwords are refused with 28P01 without the proxy
// connecting upstream at all (the upstream here only counts connections), and an unknown user's SCRAM challenge
// looks like a real one: the same salt every time, PostgreSQL's default iterations.
func TestAuthUnknownUserNoUpstream(t *testing.T) {
	up, accepted := countingUpstream(t)
	file := writeUserlist(t, filepath.Join(t.TempDir(), "userlist.txt"), pgtest.ScramUser, rolpassword(t, pgtest.ScramUser))
	p := proxytest.Start(t, up, proxytest.Options{YAML: "auth:\n  type: scram-sha-256\n  file: " + file + "\n"})
	for _, u := range []struct{ user, password string }{{"nobody", "x"}, {"nobody", pgtest.ScramPassword}, {pgtest.ScramUser, "wrong"}, {"a\"b'c", "x"}} {
		if code := loginCode(t, p.DSN(u.user, u.password, pgtest.TestDB)); code != "28P01" {
			t.Fatalf("%s/%s: %q, want 28P01", u.user, u.password, code)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("refused logins made %d upstream connections", n)
	}
	first, again := scramServerFirst(t, p.Addr, "nobody"), scramServerFirst(t, p.Addr, "nobody")
	if first != again || !strings.HasSuffix(first, fmt.Sprintf(",i=%d", auth.MockIterations)) {
		t.Fatalf("unknown user's challenge changes or looks mock: %q then %q", first, again)
	}
	if other := scramServerFirst(t, p.Addr, "nobody2"); other == first {
		t.Fatal("two unknown users share a salt")
	}
	// The counter counts: the right password does reach the upstream.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, err := pgx.Connect(ctx, p.DSN(pgtest.ScramUser, pgtest.ScramPassword, pgtest.TestDB)); err == nil {
		c.Close(ctx)
		t.Fatal("login succeeded against an upstream that closes every connection")
	}
	if n := accepted.Load(); n != 1 {
		t.Fatalf("the right password made %d upstream connections, want 1", n)
	}
}
