package proxy_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// TestAuthQueryOtherEncoding: the auth query's connection took the client_encoding its database gives (here
// UTF8, by ALTER DATABASE), so the server converted the name into the database's encoding before the query
// compared it, while the StartupMessage's user name is compared with the stored role names byte for byte. In a
// LATIN1 database the UTF-8 name "café" (63 61 66 c3 a9) found the role stored as 63 61 66 e9, whose password
// the client proved, and the server then logged in the role stored as 63 61 66 c3 a9: "cafÃ©" in LATIN1,
// another role. The query must see the bytes the server compares: the name finds the twin, whose password logs
// in, and the victim's password fails (28P01).
func TestAuthQueryOtherEncoding(t *testing.T) {
	ctx := ctxT(t)
	const db = "fp_latin1_auth"
	d := direct(t)
	for _, sql := range []string{"DROP DATABASE IF EXISTS " + db,
		"CREATE DATABASE " + db + " ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0",
		// Sessions there speak UTF-8 unless they say otherwise: the server converts their text to LATIN1.
		"ALTER DATABASE " + db + " SET client_encoding = 'UTF8'"} {
		if _, err := d.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// Roles are created from a session of the LATIN1 database, so that their names are stored in LATIN1.
	l1, err := pgx.Connect(ctx, pg.DSN(pgtest.SuperUser, "", db))
	if err != nil {
		t.Fatal(err)
	}
	const victim, twin = "café", "cafÃ©"
	for _, sql := range []string{
		`DROP ROLE IF EXISTS "` + victim + `"`, `DROP ROLE IF EXISTS "` + twin + `"`,
		`SET password_encryption = 'scram-sha-256'`,
		`CREATE ROLE "` + victim + `" LOGIN PASSWORD 'victim-pw'`,
		`CREATE ROLE "` + twin + `" LOGIN PASSWORD 'twin-pw'`,
		`CREATE SCHEMA fpenc`,
		`CREATE FUNCTION fpenc.get_auth(p_user text) RETURNS TABLE (usename name, passwd text) LANGUAGE sql
		 SECURITY DEFINER SET search_path = pg_catalog AS
		 $$ SELECT rolname, rolpassword FROM pg_catalog.pg_authid WHERE rolname = p_user AND rolcanlogin $$`,
	} {
		if _, err := l1.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	var twinOID uint32
	if err := l1.QueryRow(ctx, `SELECT oid FROM pg_catalog.pg_authid WHERE rolname = $1`, twin).Scan(&twinOID); err != nil {
		t.Fatal(err)
	}
	l1.Close(ctx)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), pg.DSN(pgtest.SuperUser, "", db))
		if err == nil {
			c.Exec(context.Background(), `DROP ROLE IF EXISTS "`+victim+`"`)
			c.Exec(context.Background(), `DROP ROLE IF EXISTS "`+twin+`"`)
			c.Close(context.Background())
		}
		direct(t).Exec(context.Background(), "DROP DATABASE IF EXISTS "+db)
	})
	p := startProxy(t, proxytest.Options{YAML: fmt.Sprintf(`auth:
  type: scram-sha-256
  query: SELECT usename, passwd FROM fpenc.get_auth($1)
  user: %s
  database: %s
`, pgtest.SuperUser, db)})
	ctx2, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx2, p.DSN(victim, "victim-pw", pgtest.TestDB))
	if err == nil {
		var oid uint32
		qerr := c.QueryRow(ctx2, "SELECT oid FROM pg_catalog.pg_roles WHERE rolname = session_user").Scan(&oid)
		c.Close(ctx2)
		if qerr == nil && oid == twinOID {
			t.Fatalf("the password of %q (LATIN1) logged in as the other role %q", victim, twin)
		}
		t.Fatalf("a name the query's conversion changes logged in (session_user oid %d, the twin is %d, %v), want 28P01", oid, twinOID, qerr)
	}
	if code := sqlstate(err); code != "28P01" {
		t.Fatalf("a name the query's conversion changes: %v, want 28P01", err)
	}
	// The name is the twin's as the server reads it: the twin's password logs in, as the twin.
	if code := loginCode(t, p.DSN(victim, "twin-pw", pgtest.TestDB)); code != "" {
		t.Fatalf("the twin's password for the name whose bytes are the twin's: %q", code)
	}
}

// TestAuthQueryNameTheDatabaseCannotEncode: a user name that is UTF-8 but has no spelling in the auth database's
// encoding (here EUC_JP, where e2 82 ac, the euro sign, is no character) makes the auth query fail 22021. Such a
// user exists nowhere in that database: it is an unknown user (28P01 after the same exchange as any), and the
// query's connection stays. Before, each try answered 08006 and dropped the connection, so a flood of such
// names opened an upstream connection per login (the auth review's finding).
func TestAuthQueryNameTheDatabaseCannotEncode(t *testing.T) {
	ctx := ctxT(t)
	const db = "fp_eucjp_auth"
	d := direct(t)
	for _, sql := range []string{"DROP DATABASE IF EXISTS " + db,
		"CREATE DATABASE " + db + " ENCODING 'EUC_JP' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"} {
		if _, err := d.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() { direct(t).Exec(context.Background(), "DROP DATABASE IF EXISTS "+db) })
	ej, err := pgx.Connect(ctx, pg.DSN(pgtest.SuperUser, "", db))
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{`CREATE SCHEMA fpenc`,
		`CREATE FUNCTION fpenc.get_auth(p_user text) RETURNS TABLE (usename name, passwd text) LANGUAGE sql
		 SECURITY DEFINER SET search_path = pg_catalog AS
		 $$ SELECT rolname, rolpassword FROM pg_catalog.pg_authid WHERE rolname = p_user AND rolcanlogin $$`} {
		if _, err := ej.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	ej.Close(ctx)
	p := startProxy(t, proxytest.Options{YAML: fmt.Sprintf(`auth:
  type: scram-sha-256
  query: SELECT usename, passwd FROM fpenc.get_auth($1)
  user: %s
  database: %s
`, pgtest.SuperUser, db)})
	queryConn := func() []uint32 {
		var pids []uint32
		rows, err := d.Query(ctx, "SELECT pid FROM pg_catalog.pg_stat_activity WHERE application_name = 'fenceproxy auth query' ORDER BY pid")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var pid uint32
			if err := rows.Scan(&pid); err != nil {
				t.Fatal(err)
			}
			pids = append(pids, pid)
		}
		return pids
	}
	if code := loginCode(t, p.DSN("fp_nobody", "pw", pgtest.TestDB)); code != "28P01" {
		t.Fatalf("an unknown user: %q, want 28P01", code)
	}
	before := queryConn()
	if len(before) != 1 {
		t.Fatalf("auth query connections after one lookup: %v, want one", before)
	}
	// The lookups take the query's connection slots in turn (four), opening each once; a lookup that dropped
	// its connection would leave only the first.
	for range 6 {
		if code := loginCode(t, p.DSN("fp_\u20ac", "pw", pgtest.TestDB)); code != "28P01" {
			t.Fatalf("a name EUC_JP cannot spell: %q, want 28P01 (an unknown user)", code)
		}
	}
	after := queryConn()
	if len(after) != 4 || !slices.Contains(after, before[0]) {
		t.Fatalf("auth query connections after names EUC_JP cannot spell: %v (before %v), want the first and three more, kept: the lookups dropped theirs", after, before)
	}
}
