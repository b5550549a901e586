package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/auth"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// TestAuthCertLongUserName: PostgreSQL cuts a user name of 64 bytes or more (NAMEDATALEN) to 63 before it looks
// the role up, so the name the proxy checks a certificate against must be the one the server logs in. A
// certificate issued to the 64-byte name "<63-byte role>x" is someone else's than the 63-byte role's; through
// the proxy it logged in as that role, where PostgreSQL's own cert method compares the common name with the cut
// name and refuses.
func TestAuthCertLongUserName(t *testing.T) {
	ctx := ctxT(t)
	role := "fp_long_" + strings.Repeat("r", 55) // 63 bytes: the longest role name
	d := direct(t)
	for _, sql := range []string{`DROP ROLE IF EXISTS "` + role + `"`, `CREATE ROLE "` + role + `" LOGIN`} {
		if _, err := d.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() { direct(t).Exec(context.Background(), `DROP ROLE IF EXISTS "`+role+`"`) })
	other := role + "x"
	caFile, certFile, keyFile, clients := writeCertsFor(t, t.TempDir(), role, other)
	p := startProxy(t, proxytest.Options{YAML: fmt.Sprintf("tls:\n  cert_file: %s\n  key_file: %s\n  client_ca_file: %s\nauth:\n  type: cert\n", certFile, keyFile, caFile)})
	login := func(cn string) (string, string) {
		q := "sslmode=verify-full&sslrootcert=" + url.QueryEscape(caFile) +
			"&sslcert=" + url.QueryEscape(clients[cn][0]) + "&sslkey=" + url.QueryEscape(clients[cn][1])
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, strings.Replace(p.DSN(cn, "", pgtest.TestDB), "sslmode=disable", q, 1))
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) {
				return "", pe.Code
			}
			t.Fatalf("login as %s failed without a server error: %v", cn, err)
		}
		defer c.Close(ctx)
		var who string
		if err := c.QueryRow(ctx, "SELECT current_user").Scan(&who); err != nil {
			t.Fatal(err)
		}
		return who, ""
	}
	if who, code := login(role); code != "" || who != role {
		t.Fatalf("the role's own certificate: current_user %q, code %q", who, code)
	}
	if who, code := login(other); code != "28000" {
		t.Fatalf("a certificate for the 64-byte name %q logged in as %q (code %q), want 28000", other, who, code)
	}
}

// TestAuthNamelessOrOverlongUserNoUpstream: a StartupMessage without a user name, with an empty one, or with one
// PostgreSQL would cut (64 bytes or more) is refused with 28000 by the proxy itself, before any upstream work:
// even auth.type trust (anyone is who they say) must not log in upstream as a name the server reads otherwise.
func TestAuthNamelessOrOverlongUserNoUpstream(t *testing.T) {
	up, accepted := countingUpstream(t)
	p := proxytest.Start(t, up, proxytest.Options{YAML: "auth:\n  type: trust\n  upstream_password: secret\n"})
	for _, params := range []map[string]string{
		{"database": pgtest.TestDB},
		{"user": "", "database": pgtest.TestDB},
		{"user": strings.Repeat("u", 64), "database": pgtest.TestDB},
	} {
		if m, ok := startupAnswer(t, p.Addr, params).(*pgproto3.ErrorResponse); !ok || m.Code != "28000" {
			t.Errorf("startup %q: %#v, want 28000", params, m)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("the proxy connected upstream %d times for nameless or overlong users", n)
	}
}

// TestAuthNoDowngrade: where auth.type is md5, a user whose secret is SCRAM is asked for SCRAM, never md5 (no
// downgrade to a hash the file does not hold), and a client answering that request with an md5 password message
// is a protocol violation; SCRAM-SHA-256-PLUS, never offered, is refused (08P01) rather than run without its
// binding; and md5's salt is drawn per connection, so an answer seen once cannot be replayed.
func TestAuthNoDowngrade(t *testing.T) {
	file := writeUserlist(t, filepath.Join(t.TempDir(), "userlist.txt"), pgtest.MD5User, rolpassword(t, pgtest.MD5User),
		pgtest.ScramUser, rolpassword(t, pgtest.ScramUser))
	p := startProxy(t, proxytest.Options{YAML: "auth:\n  type: md5\n  file: " + file + "\n"})
	answer := func(user string, reply pgproto3.FrontendMessage) (pgproto3.BackendMessage, pgproto3.BackendMessage) {
		m, fe, conn := firstAuthRequest(t, p.Addr, user)
		defer conn.Close()
		fe.Send(reply)
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		next, err := fe.Receive()
		if err != nil {
			t.Fatalf("%s: answer to %#v: %v", user, reply, err)
		}
		return m, next
	}
	md5Hash := "md5" + auth.MD5Response(auth.MD5Secret(pgtest.ScramUser, pgtest.ScramPassword), [4]byte{})
	first, next := answer(pgtest.ScramUser, &pgproto3.PasswordMessage{Password: md5Hash})
	if _, ok := first.(*pgproto3.AuthenticationSASL); !ok {
		t.Fatalf("a SCRAM user under auth.type md5 is asked %#v, want SCRAM", first)
	}
	if e, ok := next.(*pgproto3.ErrorResponse); !ok || e.Code != "08P01" {
		t.Fatalf("an md5 answer to a SASL request: %#v, want 08P01", next)
	}
	_, next = answer(pgtest.ScramUser, &pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256-PLUS", Data: []byte("p=tls-server-end-point,,n=,r=abc")})
	if e, ok := next.(*pgproto3.ErrorResponse); !ok || e.Code != "08P01" {
		t.Fatalf("SCRAM-SHA-256-PLUS: %#v, want 08P01", next)
	}
	salts := map[[4]byte]bool{}
	for i := 0; i < 8; i++ {
		m, _, conn := firstAuthRequest(t, p.Addr, pgtest.MD5User)
		conn.Close()
		req, ok := m.(*pgproto3.AuthenticationMD5Password)
		if !ok {
			t.Fatalf("md5 user: %#v", m)
		}
		salts[req.Salt] = true
	}
	if len(salts) < 8 {
		t.Fatalf("8 md5 challenges showed %d salts: a salt came back", len(salts))
	}
}
