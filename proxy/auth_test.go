package proxy_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
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

// firstAuthRequest sends a StartupMessage as user and returns the proxy's first answer.
func firstAuthRequest(t *testing.T, addr, user string) (pgproto3.BackendMessage, *pgproto3.Frontend, net.Conn) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fe := pgproto3.NewFrontend(conn, conn)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: map[string]string{"user": user, "database": pgtest.TestDB}})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := fe.Receive()
	if err != nil {
		t.Fatalf("first answer to %q: %v", user, err)
	}
	return m, fe, conn
}

// scramServerFirst starts a SCRAM login as user and returns the proxy's server-first-message.
func scramServerFirst(t *testing.T, addr, user string) string {
	t.Helper()
	m, fe, conn := firstAuthRequest(t, addr, user)
	defer conn.Close()
	if sasl, ok := m.(*pgproto3.AuthenticationSASL); !ok || len(sasl.AuthMechanisms) != 1 || sasl.AuthMechanisms[0] != "SCRAM-SHA-256" {
		t.Fatalf("first answer to %s: %#v", user, m)
	}
	fe.Send(&pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: []byte("n,,n=,r=fixednonce")})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := fe.Receive()
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

// TestAuthQuery: SCRAM users looked up by an auth query through a dedicated role. The query's connection has
// search_path pinned to pg_catalog whatever the role's default or the client's startup says (the test function
// hands out an attacker's secret under any other search_path), and the user name is bound, never spliced: a
// name with quotes finds no one and gets the same 28P01 as any unknown user.
func TestAuthQuery(t *testing.T) {
	ctx := ctxT(t)
	d := direct(t)
	attacker, err := auth.NewSCRAMSecret("attacker", []byte("attacker's salt!"), 4096)
	if err != nil {
		t.Fatal(err)
	}
	setup := []string{
		"DROP SCHEMA IF EXISTS fenceproxy_authq CASCADE", "DROP SCHEMA IF EXISTS evil CASCADE", "DROP ROLE IF EXISTS fpauth",
		"CREATE ROLE fpauth LOGIN",
		"CREATE SCHEMA fenceproxy_authq", "CREATE SCHEMA evil",
		`CREATE FUNCTION fenceproxy_authq.get_auth(p_user text) RETURNS TABLE (usename name, passwd text)
		 LANGUAGE sql SECURITY DEFINER AS $$
		   SELECT rolname, CASE WHEN pg_catalog.current_setting('search_path') = 'pg_catalog' THEN rolpassword
		                        ELSE '` + attacker.String() + `' END
		   FROM pg_catalog.pg_authid WHERE rolname = p_user $$`,
		"REVOKE ALL ON FUNCTION fenceproxy_authq.get_auth(text) FROM PUBLIC",
		"GRANT USAGE ON SCHEMA fenceproxy_authq TO fpauth",
		"GRANT EXECUTE ON FUNCTION fenceproxy_authq.get_auth(text) TO fpauth",
		"ALTER ROLE fpauth SET search_path = evil, pg_catalog",
	}
	for _, sql := range setup {
		if _, err := d.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		c := direct(t)
		for _, sql := range []string{"DROP SCHEMA IF EXISTS fenceproxy_authq CASCADE", "DROP SCHEMA IF EXISTS evil CASCADE", "DROP ROLE IF EXISTS fpauth"} {
			c.Exec(context.Background(), sql)
		}
	})
	p := startProxy(t, proxytest.Options{YAML: fmt.Sprintf(`auth:
  type: scram-sha-256
  query: SELECT usename, passwd FROM fenceproxy_authq.get_auth($1)
  user: fpauth
  database: %s
`, pgtest.TestDB)})
	if code := loginCode(t, p.DSN(pgtest.ScramUser, pgtest.ScramPassword, pgtest.TestDB)); code != "" {
		t.Fatalf("SCRAM login through the auth query: %s", code)
	}
	withOptions := p.DSN(pgtest.ScramUser, "attacker", pgtest.TestDB) + "&options=" + url.QueryEscape("-c search_path=evil,pg_catalog")
	if code := loginCode(t, withOptions); code != "28P01" {
		t.Fatalf("attacker's password with the client's search_path: %q, want 28P01 from the proxy", code)
	}
	for _, name := range []string{pgtest.ScramUser + "' OR 'a' = 'a", "x'); SELECT 'SCRAM-SHA-256$1:AA==$AA==:AA==' --"} {
		if code := loginCode(t, p.DSN(name, pgtest.ScramPassword, pgtest.TestDB)); code != "28P01" {
			t.Fatalf("user %q: %q, want 28P01", name, code)
		}
	}
	// A name that is not UTF-8 cannot be a role the query finds (its connection speaks UTF-8, and the server
	// refuses the parameter, 22021): an unknown user, asked as one, not a failed lookup (08006 before 2026-12-03,
	// with an error logged at each try).
	if m, _, _ := firstAuthRequest(t, p.Addr, "bad\xffname"); fmt.Sprintf("%T", m) != "*pgproto3.AuthenticationSASL" {
		t.Fatalf("a user name that is not UTF-8 is answered %#v, want a SASL challenge as any unknown user", m)
	}
	if n := fxCounter(t, p.Registry, "fenceproxy_auth_failures_total", map[string]string{"reason": "lookup"}); n != 0 {
		t.Fatalf("auth failures (lookup) = %v, want 0", n)
	}
	if n := fxCounter(t, p.Registry, "fenceproxy_auth_failures_total", map[string]string{"reason": "password"}); n != 3 {
		t.Fatalf("auth failures (password) = %v, want 3 (every refusal the proxy's own)", n)
	}
	if n, _ := metricValue(t, p.Registry, "fenceproxy_auth_failures_total"); n != 3 {
		t.Fatalf("auth failures = %v, want 3", n)
	}
}

// TestAuthUpstreamRefreshes: when the upstream refuses the proxy's login (28P01: the password changed), the
// proxy reads its secrets again and tries once more, then gives the client the server's error; the operator's
// new secret in auth.file works at the next login without a reload.
func TestAuthUpstreamRefreshes(t *testing.T) {
	ctx := ctxT(t)
	d := direct(t)
	old := rolpassword(t, pgtest.MD5User)
	t.Cleanup(func() {
		direct(t).Exec(context.Background(), fmt.Sprintf("SET password_encryption = 'md5'; ALTER ROLE %s PASSWORD '%s'", pgtest.MD5User, pgtest.MD5Password))
	})
	file := writeUserlist(t, filepath.Join(t.TempDir(), "userlist.txt"), pgtest.MD5User, old)
	p := startProxy(t, proxytest.Options{YAML: "auth:\n  type: md5\n  file: " + file + "\n"})
	if _, err := d.Exec(ctx, fmt.Sprintf("SET password_encryption = 'md5'; ALTER ROLE %s PASSWORD 'rotated'", pgtest.MD5User)); err != nil {
		t.Fatal(err)
	}
	if code := loginCode(t, p.DSN(pgtest.MD5User, pgtest.MD5Password, pgtest.TestDB)); code != "28P01" {
		t.Fatalf("stale secret: %q, want the server's 28P01", code)
	}
	if n := strings.Count(p.Logs.String(), "secret refreshed, trying again"); n != 1 {
		t.Fatalf("the proxy tried again %d times, want once", n)
	}
	if n := fxCounter(t, p.Registry, "fenceproxy_auth_failures_total", map[string]string{"reason": "upstream"}); n != 1 {
		t.Fatalf("auth failures (upstream) = %v, want 1", n)
	}
	// The operator writes the new secret, and another user, so that the file's size changes as well as its
	// modification time (which a coarse file system might not tell apart within the test).
	writeUserlist(t, file, pgtest.MD5User, rolpassword(t, pgtest.MD5User), "someone", old)
	if code := loginCode(t, p.DSN(pgtest.MD5User, "rotated", pgtest.TestDB)); code != "" {
		t.Fatalf("new secret in auth.file: %s", code)
	}
}

// writeCertsFor writes a CA, a server certificate for 127.0.0.1 and localhost, and a client certificate for each
// common name.
func writeCertsFor(t *testing.T, dir string, clients ...string) (caFile, certFile, keyFile string, clientFiles map[string][2]string) {
	t.Helper()
	ca := newTestCA(t, dir)
	certFile, keyFile = ca.issue(2, pkix.Name{CommonName: "127.0.0.1"}, nil, x509.ExtKeyUsageServerAuth, "server")
	clientFiles = map[string][2]string{}
	for i, cn := range clients {
		c, k := ca.issue(int64(10+i), pkix.Name{CommonName: cn}, nil, x509.ExtKeyUsageClientAuth, fmt.Sprintf("client%d", i))
		clientFiles[cn] = [2]string{c, k}
	}
	return ca.file, certFile, keyFile, clientFiles
}

// testCA is a throwaway certificate authority that writes its certificate (file) and those it issues, as PEM,
// into dir.
type testCA struct {
	t    *testing.T
	dir  string
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
	file string
}

func newTestCA(t *testing.T, dir string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fenceproxy auth test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{t: t, dir: dir, key: key, cert: cert}
	ca.file = ca.write("ca.pem", "CERTIFICATE", der)
	return ca
}

func (ca *testCA) write(name, typ string, b []byte) string {
	path := filepath.Join(ca.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
		ca.t.Fatal(err)
	}
	return path
}

// issue writes a certificate for subject (or rawSubject, when set: a subject pkix.Name cannot say) and its key,
// as name.pem and name.key; a server's is for 127.0.0.1 and localhost.
func (ca *testCA) issue(serial int64, subject pkix.Name, rawSubject []byte, usage x509.ExtKeyUsage, name string) (certFile, keyFile string) {
	ca.t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: subject, RawSubject: rawSubject,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		ca.t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return ca.write(name+".pem", "CERTIFICATE", der), ca.write(name+".key", "EC PRIVATE KEY", keyDER)
}

// TestAuthCert: auth.type cert lets in a client whose verified certificate names its user, and refuses (28000)
// one whose certificate names someone else and one without a certificate.
func TestAuthCert(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile, clients := writeCertsFor(t, dir, pgtest.SuperUser, "mallory")
	p := startProxy(t, proxytest.Options{YAML: fmt.Sprintf("tls:\n  cert_file: %s\n  key_file: %s\n  client_ca_file: %s\nauth:\n  type: cert\n", certFile, keyFile, caFile)})
	dsn := func(cn string) string {
		q := "sslmode=verify-full&sslrootcert=" + url.QueryEscape(caFile)
		if cn != "" {
			q += "&sslcert=" + url.QueryEscape(clients[cn][0]) + "&sslkey=" + url.QueryEscape(clients[cn][1])
		}
		return strings.Replace(p.DSN(pgtest.SuperUser, "", pgtest.TestDB), "sslmode=disable", q, 1)
	}
	if code := loginCode(t, dsn(pgtest.SuperUser)); code != "" {
		t.Fatalf("certificate for the user: %s", code)
	}
	if code := loginCode(t, dsn("mallory")); code != "28000" {
		t.Fatalf("certificate for another user: %q, want 28000", code)
	}
	if code := loginCode(t, dsn("")); code != "28000" {
		t.Fatalf("no certificate: %q, want 28000", code)
	}
	if code := loginCode(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB)); code != "28000" {
		t.Fatalf("no TLS: %q, want 28000", code)
	}
	if n := fxCounter(t, p.Registry, "fenceproxy_auth_failures_total", map[string]string{"reason": "certificate"}); n != 3 {
		t.Fatalf("auth failures (certificate) = %v, want 3", n)
	}
}

// TestAuthTrustUpstreamPassword: auth.type trust lets clients in without a password, and the proxy answers the
// upstream's SCRAM with the password configured for the user; a user without one cannot log in upstream.
func TestAuthTrustUpstreamPassword(t *testing.T) {
	p := startProxy(t, proxytest.Options{YAML: fmt.Sprintf("auth:\n  type: trust\n  upstream_passwords:\n    %s: %s\n", pgtest.ScramUser, pgtest.ScramPassword)})
	if code := loginCode(t, p.DSN(pgtest.ScramUser, "", pgtest.TestDB)); code != "" {
		t.Fatalf("trust with an upstream password: %s", code)
	}
	if code := loginCode(t, p.DSN(pgtest.MD5User, "", pgtest.TestDB)); code != "08006" {
		t.Fatalf("trust without an upstream password for an md5 user: %q, want 08006", code)
	}
}

// TestAuthFileOtherSalt: an auth file secret of the right password but another salt than the server's: the
// client's key cannot answer the server, a configured upstream password can; without one the login fails
// cleanly (08006), it does not hang or reach the client as success.
func TestAuthFileOtherSalt(t *testing.T) {
	sec, err := auth.NewSCRAMSecret(pgtest.ScramPassword, []byte("not the server's salt"), 4096)
	if err != nil {
		t.Fatal(err)
	}
	file := writeUserlist(t, filepath.Join(t.TempDir(), "userlist.txt"), pgtest.ScramUser, sec.String())
	without := startProxy(t, proxytest.Options{YAML: "auth:\n  type: scram-sha-256\n  file: " + file + "\n"})
	if code := loginCode(t, without.DSN(pgtest.ScramUser, pgtest.ScramPassword, pgtest.TestDB)); code != "08006" {
		t.Fatalf("other salt, no upstream password: %q, want 08006", code)
	}
	with := startProxy(t, proxytest.Options{YAML: "auth:\n  type: scram-sha-256\n  file: " + file + "\n  upstream_password: " + pgtest.ScramPassword + "\n"})
	if code := loginCode(t, with.DSN(pgtest.ScramUser, pgtest.ScramPassword, pgtest.TestDB)); code != "" {
		t.Fatalf("other salt with an upstream password: %s", code)
	}
}

// TestAuthMessageLimit: before it is authenticated, a client may not send a password message larger than
// PostgreSQL allows (65535 bytes), whatever limits.max_message_size says: 08P01 and the connection closed.
func TestAuthMessageLimit(t *testing.T) {
	up, accepted := countingUpstream(t)
	p := proxytest.Start(t, up, proxytest.Options{YAML: "auth:\n  type: scram-sha-256\n  file: " + writeUserlist(t, filepath.Join(t.TempDir(), "u"), "x", "md5"+strings.Repeat("0", 32)) + "\n"})
	conn, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fe := pgproto3.NewFrontend(conn, conn)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: map[string]string{"user": "x", "database": pgtest.TestDB}})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := fe.Receive(); err != nil {
		t.Fatalf("SASL request: %#v %v", m, err)
	}
	big := make([]byte, 5+70000)
	big[0] = 'p'
	big[1], big[2], big[3], big[4] = 0, 0x01, 0x11, 0x74 // 70004
	conn.Write(big[:5])
	m, err := fe.Receive()
	if e, ok := m.(*pgproto3.ErrorResponse); err != nil || !ok || e.Code != "08P01" {
		t.Fatalf("oversized password message: %#v %v, want 08P01", m, err)
	}
	if _, err := fe.Receive(); err == nil {
		t.Fatal("connection stayed open after the protocol error")
	}
	if accepted.Load() != 0 {
		t.Fatal("upstream contacted")
	}
}

// TestAuthFloodDoesNotStall: clients that stop in the middle of a SCRAM exchange, and a crowd failing their
// password, do not hold up a client with the right password: nothing is locked while an exchange waits or runs.
// (The good client's connect deadline is far below limits.startup_timeout, which is what a stalled attacker
// would hold a shared lock for.)
func TestAuthFloodDoesNotStall(t *testing.T) {
	file := writeUserlist(t, filepath.Join(t.TempDir(), "userlist.txt"), pgtest.ScramUser, rolpassword(t, pgtest.ScramUser))
	p := startProxy(t, proxytest.Options{YAML: "auth:\n  type: scram-sha-256\n  file: " + file + "\nlimits:\n  startup_timeout: 60s\n"})
	for i := 0; i < 10; i++ {
		conn, err := net.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		fe := pgproto3.NewFrontend(conn, conn)
		fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: map[string]string{"user": pgtest.ScramUser, "database": pgtest.TestDB}})
		fe.Flush()
		if _, err := fe.Receive(); err != nil {
			t.Fatal(err)
		}
		fe.Send(&pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: []byte("n,,n=,r=stalled")})
		fe.Flush()
		if m, err := fe.Receive(); err != nil {
			t.Fatalf("attacker %d: %#v %v", i, m, err)
		}
		// ... and never sends its proof.
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if c, err := pgx.Connect(ctx, p.DSN(pgtest.ScramUser, "wrong", pgtest.TestDB)); err == nil {
				c.Close(ctx)
			}
			cancel()
		}
	}()
	defer func() { close(stop); <-done }()
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := pgx.Connect(ctx, p.DSN(pgtest.ScramUser, pgtest.ScramPassword, pgtest.TestDB))
		if err != nil {
			cancel()
			t.Fatalf("login %d during the flood: %v", i, err)
		}
		c.Close(ctx)
		cancel()
	}
}
