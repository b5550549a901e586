package catalog_test

// DDL that reaches a protected table without naming it (DROP ... CASCADE, TRUNCATE ... CASCADE, DROP OWNED,
// REASSIGN OWNED, a schema rename, ALTER TABLE of a parent) is decided by its result in the server (rewrite/
// bycheck.go): refused (55F04) when it would drop or change a protected table, its token column, its triggers
// or the fenceproxy schema; run as sent otherwise. The same cases run with the catalog section and without it.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// cascadeDDL: acc (protected), kid (protected, an inheritance child of the unprotected base), typed (protected,
// its token column of the domain tok), a trigger on acc running guardfn; and unrelated objects of every kind.
const cascadeDDL = `
CREATE TABLE %[1]s.acc (id int PRIMARY KEY, balance int, cust_id int, fence_token bigint);
CREATE TABLE %[1]s.cust (id int PRIMARY KEY);
ALTER TABLE %[1]s.acc ADD FOREIGN KEY (cust_id) REFERENCES %[1]s.cust;
CREATE TABLE %[1]s.base (id int, fence_token bigint);
CREATE TABLE %[1]s.kid () INHERITS (%[1]s.base);
INSERT INTO %[1]s.kid VALUES (1, 5);
CREATE DOMAIN %[1]s.tok AS bigint;
CREATE TABLE %[1]s.typed (id int, fence_token %[1]s.tok);
CREATE FUNCTION %[1]s.guardfn() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;
CREATE TRIGGER g BEFORE UPDATE ON %[1]s.acc FOR EACH ROW EXECUTE FUNCTION %[1]s.guardfn();
CREATE TABLE %[1]s.pp (id int, fence_token bigint) PARTITION BY LIST (id);
CREATE TABLE %[1]s.pp1 PARTITION OF %[1]s.pp FOR VALUES IN (1);
CREATE TRIGGER g BEFORE UPDATE ON %[1]s.pp FOR EACH ROW EXECUTE FUNCTION %[1]s.guardfn();

CREATE TABLE %[1]s.other (id int PRIMARY KEY);
CREATE VIEW %[1]s.other_v AS SELECT * FROM %[1]s.other;
CREATE TABLE %[1]s.other_ref (id int REFERENCES %[1]s.other);
CREATE TABLE %[1]s.other_parent (id int, fence_token bigint);
CREATE TABLE %[1]s.other_kid () INHERITS (%[1]s.other_parent);
INSERT INTO %[1]s.other_kid VALUES (1, 5);
CREATE TYPE %[1]s.mood AS ENUM ('calm', 'cross');
CREATE DOMAIN %[1]s.tok2 AS bigint;
CREATE TABLE %[1]s.other_typed (m %[1]s.mood, t %[1]s.tok2);
CREATE FUNCTION %[1]s.otherfn() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;
CREATE TRIGGER g BEFORE UPDATE ON %[1]s.other FOR EACH ROW EXECUTE FUNCTION %[1]s.otherfn();
DROP SCHEMA IF EXISTS %[1]s_x CASCADE;
CREATE SCHEMA %[1]s_x;
CREATE TABLE %[1]s_x.base (id int);
CREATE TABLE %[1]s_x.t (id int);`

// cascadeRefused reach a protected table; each is refused and changes nothing. %[1]s is the schema; the
// client's search_path is the schema.
var cascadeRefused = []string{
	"DROP TABLE %[1]s.base CASCADE",                           // the protected inheritance child kid
	"DROP TABLE IF EXISTS base, other CASCADE",                // the same, unqualified, in a list
	"DROP SCHEMA %[1]s CASCADE",                               // every table in it
	"DROP DOMAIN %[1]s.tok CASCADE",                           // the token column of typed
	"DROP TYPE tok CASCADE",                                   // the same, as a type, through search_path
	"DROP FUNCTION %[1]s.guardfn() CASCADE",                   // the trigger on acc
	"DROP FUNCTION IF EXISTS nothing_here(), guardfn CASCADE", // the same, among others
	"TRUNCATE %[1]s.cust CASCADE",                             // acc through its foreign key
	"ALTER TABLE %[1]s.base DROP COLUMN fence_token",          // recurses into kid's token column
	"ALTER TABLE base ALTER COLUMN fence_token TYPE int",      // the same, retyped
	"ALTER TABLE base RENAME COLUMN fence_token TO tk",        // the same, renamed
	"ALTER SCHEMA %[1]s RENAME TO %[1]s_moved",                // moves the protected tables
	"ALTER TABLE pp DISABLE TRIGGER ALL",                      // recurses into the trigger it cloned on the protected partition pp1
}

// cascadePasses reach nothing protected; each runs, and check (a query straight to the server) shows its effect.
var cascadePasses = []struct{ sql, check string }{
	{"DROP TABLE %[1]s.other CASCADE", "SELECT to_regclass('%[1]s.other_v') IS NULL"},
	{"TRUNCATE other_parent CASCADE", "SELECT NOT EXISTS (SELECT FROM %[1]s.other_kid)"},
	{"DROP TABLE other_parent CASCADE", "SELECT to_regclass('%[1]s.other_kid') IS NULL"},
	{"DROP TYPE mood CASCADE", "SELECT NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = '%[1]s.other_typed'::regclass AND attname = 'm' AND NOT attisdropped)"},
	{"DROP DOMAIN %[1]s.tok2 CASCADE", "SELECT NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = '%[1]s.other_typed'::regclass AND attname = 't' AND NOT attisdropped)"},
	{"DROP FUNCTION otherfn() CASCADE", "SELECT to_regproc('%[1]s.otherfn') IS NULL"},
	{"DROP TABLE IF EXISTS no_such_scratch CASCADE", "SELECT true"},
	{"ALTER SCHEMA %[1]s_x RENAME TO %[1]s_y", "SELECT to_regclass('%[1]s_y.t') IS NOT NULL"},
	{"DROP SCHEMA %[1]s_y CASCADE", "SELECT to_regnamespace('%[1]s_y') IS NULL"},
}

// runCascadeCases runs the refused and passing cases through c, checking with e.d that refused statements
// changed nothing.
func runCascadeCases(t *testing.T, e *env, c *pgx.Conn) {
	for _, sql := range cascadeRefused {
		e.want(c, "55F04", sql)
		e.want(c, "", "SELECT 1") // the refusal left no open transaction
	}
	intact := e.s(`SELECT to_regclass('%[1]s.kid') IS NOT NULL
		AND (SELECT count(*) = 2 FROM pg_attribute WHERE attname = 'fence_token' AND NOT attisdropped
			AND atttypid IN ('bigint'::regtype, '%[1]s.tok'::regtype) AND attrelid IN ('%[1]s.kid'::regclass, '%[1]s.typed'::regclass))
		AND EXISTS (SELECT FROM pg_trigger WHERE tgrelid = '%[1]s.acc'::regclass AND tgname = 'g')
		AND EXISTS (SELECT FROM %[1]s.kid)`)
	var ok bool
	if err := e.d.QueryRow(ctxT(t), intact).Scan(&ok); err != nil || !ok {
		t.Fatalf("after the refusals the protected tables are not intact (%v)", err)
	}
	for _, p := range cascadePasses {
		e.want(c, "", p.sql)
		if err := e.d.QueryRow(ctxT(t), e.s(p.check)).Scan(&ok); err != nil || !ok {
			t.Fatalf("%s: ran through the proxy but %s is %v (%v)", e.s(p.sql), e.s(p.check), ok, err)
		}
	}
}

// newPlainEnv is newEnv without the catalog section: the configuration names the protected tables and nothing
// else.
func newPlainEnv(t *testing.T, ddl string, tables ...string) *env {
	t.Helper()
	e := newSchema(t, ddl)
	t.Cleanup(func() { e.exec(e.s("DROP SCHEMA IF EXISTS %[1]s_x CASCADE; DROP SCHEMA IF EXISTS %[1]s_y CASCADE")) })
	var y strings.Builder
	y.WriteString("tables:\n")
	for _, n := range tables {
		fmt.Fprintf(&y, "  - name: %s.%s\n    token_column: fence_token\n", e.schema, n)
	}
	e.p = proxytest.Start(t, pg.Addr(), proxytest.Options{YAML: y.String()})
	return e
}

func TestCascadeDecidedWithoutCatalog(t *testing.T) {
	e := newPlainEnv(t, cascadeDDL, "acc", "kid", "typed", "pp1")
	runCascadeCases(t, e, e.client(""))
}

func TestCascadeDecidedWithCatalog(t *testing.T) {
	e := newEnv(t, cascadeDDL, "acc", "kid", "typed", "pp1")
	t.Cleanup(func() { e.exec(e.s("DROP SCHEMA IF EXISTS %[1]s_x CASCADE; DROP SCHEMA IF EXISTS %[1]s_y CASCADE")) })
	runCascadeCases(t, e, e.client(""))
}

// The catalog snapshot is older than the statement: a parent attached to the protected table after it was
// read (straight to the server, around the proxy) is still seen, because the statement's own result is checked.
func TestCascadeSnapshotRace(t *testing.T) {
	e := newEnv(t, cascadeDDL, "acc", "kid", "typed")
	e.exec(e.s("CREATE TABLE %[1]s.late (id int); ALTER TABLE %[1]s.acc INHERIT %[1]s.late"))
	c := e.client("")
	e.want(c, "55F04", "DROP TABLE %[1]s.late CASCADE")
	e.exec(e.s("CREATE TABLE %[1]s.late_kid () INHERITS (%[1]s.acc)")) // protected as a child of acc
	e.want(c, "55F04", "DROP TABLE %[1]s.late_kid CASCADE")
}

// search_path decides what an unqualified name is; the server resolves it, not the proxy.
func TestCascadeSearchPath(t *testing.T) {
	e := newPlainEnv(t, cascadeDDL, "acc", "kid", "typed")
	c := e.client("")
	e.want(c, "55F04", "DROP TABLE base CASCADE") // %[1]s.base, the parent of kid
	e.want(c, "", "SET search_path = %[1]s_x")
	e.want(c, "", "DROP TABLE base CASCADE") // %[1]s_x.base: unrelated
	var gone bool
	if err := e.d.QueryRow(ctxT(t), e.s("SELECT to_regclass('%[1]s_x.base') IS NULL AND to_regclass('%[1]s.base') IS NOT NULL")).Scan(&gone); err != nil || !gone {
		t.Fatalf("DROP TABLE base CASCADE under search_path %s_x did not drop that schema's base only (%v)", e.schema, err)
	}
}

// Roles: DROP OWNED of a role owning the protected table's trigger function, and REASSIGN OWNED of the table's
// owner, are refused; the same for a role owning only unrelated objects runs.
func TestCascadeOwned(t *testing.T) {
	e := newPlainEnv(t, cascadeDDL, "acc", "kid", "typed")
	owner, stranger := e.schema+"_owner", e.schema+"_stranger"
	e.exec(fmt.Sprintf("DROP ROLE IF EXISTS %[1]s; DROP ROLE IF EXISTS %[2]s; CREATE ROLE %[1]s; CREATE ROLE %[2]s", owner, stranger))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for _, r := range []string{owner, stranger} {
			e.d.Exec(ctx, "DROP OWNED BY "+r+" CASCADE; DROP ROLE IF EXISTS "+r)
		}
	})
	e.exec(e.s(fmt.Sprintf("ALTER FUNCTION %%[1]s.guardfn() OWNER TO %[1]s; ALTER TABLE %%[1]s.typed OWNER TO %[1]s; ALTER TABLE %%[1]s.other_ref OWNER TO %[2]s", owner, stranger)))
	c := e.client("")
	e.want(c, "55F04", "DROP OWNED BY "+owner+" CASCADE")
	e.want(c, "55F04", "REASSIGN OWNED BY "+owner+" TO "+stranger)
	e.want(c, "", "REASSIGN OWNED BY "+stranger+" TO "+pgtest.SuperUser)
	e.want(c, "", "ALTER TABLE %[1]s.other_ref OWNER TO "+stranger)
	e.want(c, "", "DROP OWNED BY "+stranger+" CASCADE")
	var gone bool
	if err := e.d.QueryRow(ctxT(t), e.s("SELECT to_regclass('%[1]s.other_ref') IS NULL")).Scan(&gone); err != nil || !gone {
		t.Fatalf("DROP OWNED BY %s did not drop its table (%v)", stranger, err)
	}
}

// The fenceproxy schema (the guard) in a database of its own: DROP FUNCTION and DROP SCHEMA ... CASCADE that
// reach the guard's function are refused; the same on another schema's function pass.
func TestCascadeGuardSchema(t *testing.T) {
	pgtest.Require(t, pg)
	db := schemaName(t)
	d := connect(t, pg.SuperDSN())
	if _, err := d.Exec(ctxT(t), "DROP DATABASE IF EXISTS "+db); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Exec(ctxT(t), "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		d.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
	})
	g := connect(t, pg.DSN(pgtest.SuperUser, "", db))
	if _, err := g.Exec(ctxT(t), `
CREATE SCHEMA fenceproxy;
CREATE FUNCTION fenceproxy.guard_acc() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;
CREATE FUNCTION fenceproxy.helper() RETURNS int LANGUAGE sql AS 'SELECT 1';
CREATE TABLE public.acc (id int, fence_token bigint);
CREATE TRIGGER "~fenceproxy_guard" BEFORE UPDATE ON public.acc FOR EACH ROW EXECUTE FUNCTION fenceproxy.guard_acc();
CREATE SCHEMA other;
CREATE FUNCTION other.f() RETURNS int LANGUAGE sql AS 'SELECT 1';`); err != nil {
		t.Fatal(err)
	}
	p := proxytest.Start(t, pg.Addr(), proxytest.Options{YAML: "tables:\n  - name: acc\n    token_column: fence_token\n"})
	c := connect(t, p.DSN(pgtest.SuperUser, "", db))
	e := &env{t: t, d: g}
	e.want(c, "55F04", "DROP FUNCTION fenceproxy.guard_acc() CASCADE")
	e.want(c, "55F04", "DROP FUNCTION fenceproxy.helper() CASCADE") // part of the guard's schema
	e.want(c, "55F04", "DROP SCHEMA fenceproxy CASCADE")
	e.want(c, "", "DROP FUNCTION other.f() CASCADE")
	e.want(c, "", "DROP SCHEMA other CASCADE")
}

// Inside a transaction block the check sees the statement's own effect (under REPEATABLE READ too), and a
// refusal rolls back to the last savepoint like any error.
func TestCascadeInTransactionBlock(t *testing.T) {
	e := newPlainEnv(t, cascadeDDL, "acc", "kid", "typed")
	c := e.client("")
	e.want(c, "", "BEGIN ISOLATION LEVEL REPEATABLE READ")
	e.want(c, "", "SELECT count(*) FROM kid")
	e.want(c, "55F04", "DROP TABLE base CASCADE")
	e.want(c, "", "ROLLBACK")
	e.want(c, "", "BEGIN")
	e.want(c, "", "SAVEPOINT s")
	e.want(c, "55F04", "DROP SCHEMA %[1]s CASCADE")
	e.want(c, "", "ROLLBACK TO SAVEPOINT s")
	e.want(c, "", "DROP TABLE other CASCADE")
	e.want(c, "", "COMMIT")
	var ok bool
	if err := e.d.QueryRow(ctxT(t), e.s("SELECT to_regclass('%[1]s.other') IS NULL AND EXISTS (SELECT FROM %[1]s.kid)")).Scan(&ok); err != nil || !ok {
		t.Fatalf("after the transaction: other dropped and kid intact = %v (%v)", ok, err)
	}
}
