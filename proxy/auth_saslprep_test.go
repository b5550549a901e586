package proxy_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/fenceproxy/fenceproxy/auth"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// TestAuthUpstreamPasswordSASLprep: PostgreSQL salts a SCRAM secret from the SASLprepped password, so a
// configured upstream password with a non-ASCII space (U+00A0, prepped to a space) and a soft hyphen (U+00AD,
// prepped to nothing) must be prepped by the proxy too before it answers the server's SCRAM, in session and
// in transaction pooling. Then, against the same server, the proxy's derivation gives the server's own secret for
// passwords SASLprep changes, refuses (the server then uses the raw bytes) or checks before NFKC as the server
// does.
func TestAuthUpstreamPasswordSASLprep(t *testing.T) {
	pgtest.Require(t, pg)
	const role = "saslprep_user"
	// The shared cluster trusts every role but its own test users: this one must be asked for SCRAM.
	c := pgtest.MustStart(t, pgtest.Options{ExtraHBA: []string{"host all " + role + " 127.0.0.1/32 scram-sha-256"}})
	super := connect(t, c.SuperDSN())
	ctx := ctxT(t)
	if _, err := super.Exec(ctx, "SET password_encryption = 'scram-sha-256'"); err != nil {
		t.Fatal(err)
	}
	if _, err := super.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	setPassword := func(password string) string {
		t.Helper()
		var stmt string
		if err := super.QueryRow(ctx, "SELECT format('ALTER ROLE %I PASSWORD %L', $1::text, $2::text)", role, password).Scan(&stmt); err != nil {
			t.Fatalf("quote password %q: %v", password, err)
		}
		if _, err := super.Exec(ctx, stmt); err != nil {
			t.Fatalf("set password %q: %v", password, err)
		}
		var secret string
		if err := super.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&secret); err != nil {
			t.Fatalf("secret of %s: %v", role, err)
		}
		return secret
	}

	const password = "pass\u00a0wo\u00adrd"
	setPassword(password)
	for _, mode := range []string{"session", "transaction"} {
		yaml := fmt.Sprintf("pool:\n  mode: %s\nauth:\n  type: trust\n  upstream_passwords:\n    %s: %s\n", mode, role, strconv.Quote(password))
		p := proxytest.Start(t, c.Addr(), proxytest.Options{YAML: yaml})
		if code := loginCode(t, p.DSN(role, "", pgtest.TestDB)); code != "" {
			t.Fatalf("pool.mode %s: login with a configured password SASLprep changes: %s", mode, code)
		}
		var who string
		if err := connect(t, p.DSN(role, "", pgtest.TestDB)).QueryRow(ctx, "SELECT current_user").Scan(&who); err != nil || who != role {
			t.Fatalf("pool.mode %s: query through the proxy: %q, %v", mode, who, err)
		}
	}

	for _, pw := range []string{
		password,
		"I\u00adX",           // RFC 4013: mapped to nothing
		"\u00aa",             // RFC 4013: NFKC, "a"
		"\u2168",             // RFC 4013: NFKC, "IX"
		"x\ufb01\u3000y",     // a ligature and an ideographic space
		"caf\u00e9\u0007",    // RFC 4013: a prohibited control character, raw bytes
		"\u0627\u0031",       // RFC 4013: right-to-left text ending in a digit, raw bytes
		"\u0627x\u0628",      // right-to-left text with a left-to-right letter, raw bytes
		"\u0627\u2100\u0627", // U+2100 turns into letters only under NFKC, after the checks: prepped
		"a\u0221b",           // unassigned in Unicode 3.2, raw bytes
		"\u00ad\u200b",       // nothing left after mapping, raw bytes
		"\u00e9\U000F0000",   // private use, raw bytes
	} {
		server := setPassword(pw)
		sec, err := auth.ParseSecret(server)
		if err != nil {
			t.Fatalf("password %q: server's secret %q: %v", pw, server, err)
		}
		mine, err := auth.NewSCRAMSecret(pw, sec.Salt, sec.Iterations)
		if err != nil {
			t.Fatal(err)
		}
		if mine.String() != server {
			t.Errorf("password %q: the server stored\n%s, the proxy derives\n%s", pw, server, mine)
		}
	}
}

// TestAuthQueryRolePasswordSASLprep: the auth query's role logs in with auth.password through pgx, which
// normalizes a SCRAM password with PRECIS OpaqueString (NFC) where PostgreSQL salted the secret from its
// SASLprep (NFKC): a password the two read apart (a Roman numeral, a ligature) never logged in, and every
// client of the auth query was refused. The proxy tries the SASLprepped password first (connectOwnRole), and
// the password as written after a 28P01: an md5 secret was made from that.
func TestAuthQueryRolePasswordSASLprep(t *testing.T) {
	pgtest.Require(t, pg)
	const authRole, client, clientPassword = "fpprep_auth", "fpprep_client", "client-pw"
	const password = "\u2168x\ufb01" // SASLprep: "IXxfi"; PRECIS OpaqueString keeps it as it is
	// md5 in pg_hba.conf: the server asks for SCRAM when the role's secret is a SCRAM one, for md5 otherwise.
	c := pgtest.MustStart(t, pgtest.Options{ExtraHBA: []string{"host all " + authRole + " 127.0.0.1/32 md5"}})
	super := connect(t, c.SuperDSN())
	ctx := ctxT(t)
	var setPassword string
	if err := super.QueryRow(ctx, "SELECT format('ALTER ROLE %I PASSWORD %L', $1::text, $2::text)", authRole, password).Scan(&setPassword); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"SET password_encryption = 'scram-sha-256'",
		"CREATE ROLE " + authRole + " LOGIN",
		"CREATE ROLE " + client + " LOGIN PASSWORD '" + clientPassword + "'",
		`CREATE FUNCTION public.fpprep_secret(p_user text) RETURNS TABLE (usename name, passwd text)
		 LANGUAGE sql SECURITY DEFINER AS $$ SELECT rolname, rolpassword FROM pg_catalog.pg_authid WHERE rolname = p_user $$`,
		"GRANT EXECUTE ON FUNCTION public.fpprep_secret(text) TO " + authRole,
	} {
		if _, err := super.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for _, encryption := range []string{"scram-sha-256", "md5"} {
		for _, sql := range []string{"SET password_encryption = '" + encryption + "'", setPassword} {
			if _, err := super.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		for _, mode := range []string{"session", "transaction"} {
			yaml := fmt.Sprintf("pool:\n  mode: %s\nauth:\n  type: scram-sha-256\n  query: SELECT usename, passwd FROM public.fpprep_secret($1)\n  user: %s\n  password: %s\n  database: %s\n",
				mode, authRole, strconv.Quote(password), pgtest.TestDB)
			p := proxytest.Start(t, c.Addr(), proxytest.Options{YAML: yaml})
			if code := loginCode(t, p.DSN(client, clientPassword, pgtest.TestDB)); code != "" {
				t.Fatalf("pool.mode %s, the auth role's secret %s: a client looked up by the auth query, whose role's password SASLprep changes: %s", mode, encryption, code)
			}
		}
	}
}
