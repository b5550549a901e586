package catalog_test

// Integration tests of catalog awareness without the in-database guard: a real PostgreSQL, the proxy in-process
// with a planner built from a real catalog snapshot, pgx clients. Each test has its own schema.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/fenceproxy/fenceproxy/catalog"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

var pg *pgtest.Cluster

// noBypassRole may connect only through the proxy (127.0.0.1 in the audit tests): pg_hba.conf rejects it
// everywhere else.
const noBypassRole = "audit_nobypass"

func TestMain(m *testing.M) {
	os.Exit(pgtest.RunMain(m, pgtest.Options{ExtraHBA: []string{
		"local all " + noBypassRole + " reject",
		"host all " + noBypassRole + " ::1/128 reject",
	}}, &pg))
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctxT(t), dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// schemaName is a schema unique to the test.
func schemaName(t testing.TB) string {
	var b strings.Builder
	for _, r := range strings.ToLower(t.Name()) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	s := b.String()
	if len(s) > 50 {
		s = s[:50]
	}
	return "c_" + s
}

// env is a schema with the test's DDL, and a proxy protecting some of its tables with catalog awareness.
type env struct {
	t      testing.TB
	schema string
	d      *pgx.Conn // superuser, straight to PostgreSQL
	p      *proxytest.Proxy
	w      *catalog.Watcher
	snap   *catalog.Snapshot
}

// newSchema creates the test's schema and runs ddl in it (%[1]s is the schema).
func newSchema(t testing.TB, ddl string) *env {
	t.Helper()
	pgtest.Require(t, pg)
	e := &env{t: t, schema: schemaName(t)}
	e.d = connect(t, pg.SuperDSN())
	e.exec(fmt.Sprintf("DROP SCHEMA IF EXISTS %[1]s CASCADE; CREATE SCHEMA %[1]s", e.schema))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := e.d.Exec(ctx, "DROP SCHEMA IF EXISTS "+e.schema+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	e.exec(e.s(ddl))
	return e
}

// newEnv creates the schema, runs ddl in it (%[1]s is the schema), and starts a proxy protecting tables (names
// in the schema, token column fence_token) with the catalog section in its configuration.
func newEnv(t *testing.T, ddl string, tables ...string) *env {
	t.Helper()
	e := newSchema(t, ddl)
	var y strings.Builder
	y.WriteString("tables:\n")
	for _, n := range tables {
		fmt.Fprintf(&y, "  - name: %s.%s\n    token_column: fence_token\n", e.schema, n)
	}
	fmt.Fprintf(&y, "catalog:\n  dsn: user=%s dbname=%s\n  refresh: 1h\n", pgtest.SuperUser, pgtest.TestDB)
	e.p = proxytest.Start(t, pg.Addr(), proxytest.Options{YAML: y.String(), NoPlanner: true})
	cc, err := catalog.ConnConfig(e.p.Config)
	if err != nil {
		t.Fatal(err)
	}
	src := catalog.NewSource(cc, nil)
	t.Cleanup(src.Close)
	e.snap, err = src.Snapshot(ctxT(t), proxy.ConfiguredTables(e.p.Config))
	if err != nil {
		t.Fatal(err)
	}
	planner, err := proxy.NewPlannerWithCatalog(e.p.Config, e.snap, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.p.Server.SetPlanner(planner)
	set := proxy.NewPlannerSet(e.p.Server, e.p.Config, e.snap, nil)
	e.w = &catalog.Watcher{Source: src, Interval: time.Hour, Tables: set.Tables, Publish: set.SetSnapshot,
		Log: slog.New(slog.NewTextHandler(e.p.Logs, nil)), Last: e.snap}
	return e
}

func (e *env) exec(sql string) {
	e.t.Helper()
	if _, err := e.d.Exec(ctxT(e.t), sql); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// s expands %[1]s to the schema.
func (e *env) s(format string) string { return strings.ReplaceAll(format, "%[1]s", e.schema) }

// client connects through the proxy with the token (none when "") and search_path set to the schema.
func (e *env) client(token string) *pgx.Conn {
	e.t.Helper()
	c := connect(e.t, e.p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	if _, err := c.Exec(ctxT(e.t), "SET search_path = "+e.schema); err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		if _, err := c.Exec(ctxT(e.t), "SET fence.token = "+token); err != nil {
			e.t.Fatal(err)
		}
	}
	return c
}

// want runs sql through c and checks the SQLSTATE ("" for success).
func (e *env) want(c *pgx.Conn, code, sql string) {
	e.t.Helper()
	_, err := c.Exec(ctxT(e.t), e.s(sql))
	got := ""
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		got = pe.Code
	} else if err != nil {
		e.t.Fatalf("%s: %v", e.s(sql), err)
	}
	if got != code {
		e.t.Fatalf("%s: want SQLSTATE %q, got %q (%v)", e.s(sql), code, got, err)
	}
}

// token reads a row's token directly.
func (e *env) token(sql string) int64 {
	e.t.Helper()
	var tok *int64
	if err := e.d.QueryRow(ctxT(e.t), e.s(sql)).Scan(&tok); err != nil {
		e.t.Fatalf("%s: %v", e.s(sql), err)
	}
	if tok == nil {
		return 0
	}
	return *tok
}

const partitionsDDL = `
CREATE TABLE %[1]s.acc (id int, region text, balance int NOT NULL DEFAULT 0, fence_token bigint) PARTITION BY LIST (region);
CREATE TABLE %[1]s.acc_eu PARTITION OF %[1]s.acc FOR VALUES IN ('eu') PARTITION BY LIST (region);
CREATE TABLE %[1]s.acc_eu_1 PARTITION OF %[1]s.acc_eu FOR VALUES IN ('eu');
CREATE TABLE %[1]s.acc_us PARTITION OF %[1]s.acc FOR VALUES IN ('us');`

// A protected partitioned table: its partitions (nested too) are protected by name, qualified and not.
func TestPartitionsOfProtectedTable(t *testing.T) {
	e := newEnv(t, partitionsDDL, "acc")
	new5, old3, none := e.client("5"), e.client("3"), e.client("")
	e.want(new5, "", "INSERT INTO %[1]s.acc_us (id, region) VALUES (1, 'us')")
	if got := e.token("SELECT fence_token FROM %[1]s.acc WHERE id = 1"); got != 5 {
		t.Fatalf("INSERT into the partition by name: token %d, want 5 (fenced)", got)
	}
	e.want(old3, "55F01", "UPDATE %[1]s.acc_us SET balance = 1 WHERE id = 1")
	e.want(old3, "55F01", "DELETE FROM acc_us WHERE id = 1") // unqualified, through search_path
	e.want(none, "55F02", "UPDATE acc_eu_1 SET balance = 1")
	e.want(none, "55F04", "TRUNCATE %[1]s.acc_us")
	e.want(new5, "", "UPDATE acc_eu_1 SET balance = 1")
}

// A protected partition: a write to its parent, which routes rows into it, is fenced (the parent has the
// column) and a parent without the column is refused.
func TestParentRoutingIntoProtectedPartition(t *testing.T) {
	e := newEnv(t, partitionsDDL+`
CREATE TABLE %[1]s.base (id int, balance int NOT NULL DEFAULT 0);
CREATE TABLE %[1]s.kid (fence_token bigint) INHERITS (%[1]s.base);
CREATE VIEW %[1]s.v_base AS SELECT * FROM %[1]s.base;`, "acc_eu_1", "kid")
	new5, old3, none := e.client("5"), e.client("3"), e.client("")
	e.want(new5, "", "INSERT INTO %[1]s.acc (id, region) VALUES (1, 'eu'), (2, 'us')")
	if got := e.token("SELECT fence_token FROM %[1]s.acc_eu_1 WHERE id = 1"); got != 5 {
		t.Fatalf("INSERT through the parent into the protected partition: token %d, want 5", got)
	}
	e.want(old3, "55F01", "UPDATE acc SET balance = 2 WHERE id = 1")
	e.want(none, "55F02", "DELETE FROM %[1]s.acc_eu WHERE id = 1")
	// The inheritance parent has no token column: refused, whatever the statement.
	for _, sql := range []string{
		"UPDATE %[1]s.base SET balance = 1",
		"DELETE FROM base WHERE id = 1",
		"INSERT INTO %[1]s.base (id) VALUES (1)",
		"TRUNCATE %[1]s.base",
		"UPDATE %[1]s.v_base SET balance = 1", // a view over that parent
	} {
		e.want(new5, "55F04", sql)
	}
	// The sibling partition's own name is not protected.
	e.want(none, "", "UPDATE %[1]s.acc_us SET balance = 3")
}

// Inheritance children (and grandchildren) of a protected table are protected by name.
func TestInheritanceChildren(t *testing.T) {
	e := newEnv(t, `
CREATE TABLE %[1]s.base (id int, balance int NOT NULL DEFAULT 0, fence_token bigint);
CREATE TABLE %[1]s.kid (extra text) INHERITS (%[1]s.base);
CREATE TABLE %[1]s.grandkid () INHERITS (%[1]s.kid);`, "base")
	new5, old3, none := e.client("5"), e.client("3"), e.client("")
	e.want(new5, "", "INSERT INTO %[1]s.grandkid (id) VALUES (1)")
	if got := e.token("SELECT fence_token FROM %[1]s.grandkid WHERE id = 1"); got != 5 {
		t.Fatalf("INSERT into the grandchild: token %d, want 5", got)
	}
	e.want(old3, "55F01", "UPDATE kid SET balance = 1")
	e.want(none, "55F02", "DELETE FROM %[1]s.grandkid")
	e.want(old3, "55F01", "UPDATE base SET balance = 1")
}

// Views: one showing the token column is fenced through its own column; one without it, one with an INSTEAD
// OF trigger and one with a rule are refused; a view that only reads the table in a subquery passes.
func TestViews(t *testing.T) {
	e := newEnv(t, `
CREATE TABLE %[1]s.t (id int PRIMARY KEY, balance int NOT NULL DEFAULT 0, fence_token bigint);
CREATE TABLE %[1]s.other (id int PRIMARY KEY, n int);
CREATE VIEW %[1]s.v_with AS SELECT id, balance, fence_token AS ft FROM %[1]s.t WHERE id > 0;
CREATE VIEW %[1]s.v_over AS SELECT id AS key, ft FROM %[1]s.v_with;
CREATE VIEW %[1]s.v_without AS SELECT id, balance FROM %[1]s.t;
CREATE VIEW %[1]s.v_trig AS SELECT * FROM %[1]s.t;
CREATE FUNCTION %[1]s.trig() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN UPDATE %[1]s.t SET balance = 0; RETURN NEW; END$$;
CREATE TRIGGER instead INSTEAD OF UPDATE ON %[1]s.v_trig FOR EACH ROW EXECUTE FUNCTION %[1]s.trig();
CREATE VIEW %[1]s.v_rule AS SELECT * FROM %[1]s.t;
CREATE RULE r AS ON DELETE TO %[1]s.v_rule DO INSTEAD DELETE FROM %[1]s.t;
CREATE VIEW %[1]s.v_reads AS SELECT * FROM %[1]s.other WHERE id NOT IN (SELECT id FROM %[1]s.t);
DROP TABLE IF EXISTS public.t CASCADE;
CREATE TABLE public.t (id int, n int);
CREATE VIEW %[1]s.v_public AS SELECT * FROM public.t WHERE id IN (SELECT id FROM %[1]s.t);`, "t")
	t.Cleanup(func() { e.exec("DROP TABLE public.t CASCADE") })
	new5, old3, none := e.client("5"), e.client("3"), e.client("")
	e.want(new5, "", "INSERT INTO %[1]s.v_with (id, balance) VALUES (1, 10)")
	if got := e.token("SELECT fence_token FROM %[1]s.t WHERE id = 1"); got != 5 {
		t.Fatalf("INSERT through the view: token %d, want 5", got)
	}
	e.want(old3, "55F01", "UPDATE v_with SET balance = 1 WHERE id = 1")
	e.want(old3, "55F01", "DELETE FROM %[1]s.v_over WHERE key = 1")
	e.want(none, "55F02", "UPDATE %[1]s.v_over SET key = 2 WHERE key = 1")
	e.want(new5, "", "UPDATE v_over SET key = 7 WHERE key = 1")
	for _, sql := range []string{
		"UPDATE %[1]s.v_without SET balance = 1",
		"INSERT INTO v_without (id) VALUES (3)",
		"UPDATE %[1]s.v_trig SET balance = 1",
		"DELETE FROM %[1]s.v_rule",
	} {
		e.want(new5, "55F04", sql)
	}
	e.want(none, "", "INSERT INTO %[1]s.v_reads (id, n) VALUES (1, 1)")
	// Its base is public.t, which the catalog reader's search_path would show unqualified, like the protected
	// t it reads: the base is told by its schema, not guessed by its name.
	e.want(none, "", "INSERT INTO %[1]s.v_public (id, n) VALUES (1, 1)")
}

const fkDDL = `
CREATE TABLE %[1]s.t (id int PRIMARY KEY, balance int NOT NULL DEFAULT 0, fence_token bigint,
    p_cascade int, p_null int, p_upd int, p_plain int, mid_id int);
CREATE TABLE %[1]s.p_cascade (id int PRIMARY KEY, note text);
CREATE TABLE %[1]s.p_null (id int PRIMARY KEY, note text);
CREATE TABLE %[1]s.p_upd (id int PRIMARY KEY, note text);
CREATE TABLE %[1]s.p_plain (id int PRIMARY KEY, note text);
CREATE TABLE %[1]s.gp (id int PRIMARY KEY);
CREATE TABLE %[1]s.mid (id int PRIMARY KEY, gp_id int REFERENCES %[1]s.gp ON DELETE CASCADE);
CREATE TABLE %[1]s.unrelated (id int PRIMARY KEY);
CREATE TABLE %[1]s.unrelated_kid (u int REFERENCES %[1]s.unrelated);
CREATE VIEW %[1]s.v_cascade AS SELECT * FROM %[1]s.p_cascade;
ALTER TABLE %[1]s.t ADD FOREIGN KEY (p_cascade) REFERENCES %[1]s.p_cascade ON DELETE CASCADE,
    ADD FOREIGN KEY (p_null) REFERENCES %[1]s.p_null ON DELETE SET NULL,
    ADD FOREIGN KEY (p_upd) REFERENCES %[1]s.p_upd ON UPDATE CASCADE,
    ADD FOREIGN KEY (p_plain) REFERENCES %[1]s.p_plain,
    ADD FOREIGN KEY (mid_id) REFERENCES %[1]s.mid ON DELETE SET NULL;`

// Foreign-key actions into a protected table: DELETE and UPDATE of the referenced table that would change
// protected rows unfenced are refused, directly or through another table; actions that cannot reach it pass.
func TestForeignKeyCascades(t *testing.T) {
	e := newEnv(t, fkDDL, "t")
	c := e.client("5")
	for _, sql := range []string{
		"DELETE FROM %[1]s.p_cascade WHERE id = 1",
		"DELETE FROM p_null",
		"UPDATE %[1]s.p_upd SET id = 2 WHERE id = 1",
		"DELETE FROM %[1]s.gp", // gp -> mid (CASCADE) -> t (SET NULL)
		"MERGE INTO %[1]s.p_cascade USING (SELECT 1 AS id) s ON p_cascade.id = s.id WHEN MATCHED THEN DELETE",
		"INSERT INTO %[1]s.p_upd (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET id = 3",
		"DELETE FROM %[1]s.v_cascade", // a view over a table whose deletes cascade
	} {
		e.want(c, "55F04", sql)
	}
	for _, sql := range []string{
		"UPDATE %[1]s.p_cascade SET note = 'x'", // ON UPDATE NO ACTION
		"UPDATE p_null SET note = 'x'",
		"DELETE FROM %[1]s.p_upd",   // ON DELETE NO ACTION
		"DELETE FROM %[1]s.p_plain", // NO ACTION both ways
		"UPDATE %[1]s.p_plain SET id = id",
		"INSERT INTO %[1]s.p_cascade (id) VALUES (1)",
		"UPDATE %[1]s.gp SET id = id",
		"UPDATE %[1]s.v_cascade SET note = 'y'",
	} {
		e.want(c, "", sql)
	}
}

// TRUNCATE ... CASCADE is refused exactly when it can reach a protected table; a TRUNCATE without CASCADE
// goes to the server, which refuses it because of the foreign key.
func TestTruncateCascade(t *testing.T) {
	e := newEnv(t, fkDDL, "t")
	c := e.client("5")
	e.want(c, "55F04", "TRUNCATE %[1]s.p_plain CASCADE")
	e.want(c, "55F04", "TRUNCATE gp, unrelated CASCADE")
	e.want(c, "0A000", "TRUNCATE %[1]s.p_plain") // cannot truncate a table referenced in a foreign key
	e.want(c, "", "TRUNCATE %[1]s.unrelated CASCADE")
}

// With the guard on the reached table (a BEFORE UPDATE OR DELETE row trigger and a BEFORE TRUNCATE trigger
// of the guard's function), PostgreSQL checks the cascaded rows and the proxy lets the cascade through. A
// TRUNCATE ... CASCADE that empties the protected table is still refused, by its result (rewrite/bycheck.go),
// as the real guard's TRUNCATE trigger refuses it too (this test's stand-in for the guard lets it through).
func TestCascadeAllowedWithGuard(t *testing.T) {
	e := newEnv(t, fkDDL+`
CREATE FUNCTION %[1]s.fenceproxy_guard() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN coalesce(NEW, OLD); END$$;
CREATE TRIGGER g BEFORE UPDATE OR DELETE ON %[1]s.t FOR EACH ROW EXECUTE FUNCTION %[1]s.fenceproxy_guard();
CREATE TRIGGER gt BEFORE TRUNCATE ON %[1]s.t FOR EACH STATEMENT EXECUTE FUNCTION %[1]s.fenceproxy_guard();`, "t")
	c := e.client("5")
	e.want(c, "", "DELETE FROM %[1]s.p_cascade WHERE id = 1")
	e.want(c, "", "DELETE FROM %[1]s.gp")
	e.want(c, "55F04", "TRUNCATE %[1]s.p_plain CASCADE")
}

// A refresh (what SIGHUP and the refresh interval run) picks up a partition created after the start.
func TestRefreshPicksUpNewPartition(t *testing.T) {
	e := newEnv(t, partitionsDDL, "acc")
	none := e.client("")
	e.exec(e.s("CREATE TABLE %[1]s.acc_asia PARTITION OF %[1]s.acc FOR VALUES IN ('asia')"))
	e.want(none, "", "INSERT INTO %[1]s.acc_asia (id, region) VALUES (1, 'asia')") // the old snapshot does not know it
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.w.Run(ctx); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	e.w.Kick()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := none.Exec(ctxT(t), e.s("UPDATE %[1]s.acc_asia SET balance = 1"))
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55F02" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new partition is still not protected after the refresh: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A refresh that cannot read the catalog keeps the snapshot in force (the proxy goes on fencing the partitions
// it knew) and counts the failure; the next good read is counted and published.
func TestRefreshFailureKeepsSnapshot(t *testing.T) {
	e := newEnv(t, partitionsDDL, "acc")
	reg := prometheus.NewRegistry()
	m := catalog.NewMetrics(reg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().(*net.TCPAddr)
	ln.Close()
	cc, err := catalog.ConnConfig(e.p.Config)
	if err != nil {
		t.Fatal(err)
	}
	cc.Host, cc.Port, cc.ConnectTimeout = "127.0.0.1", uint16(dead.Port), 2*time.Second
	published := 0
	w := &catalog.Watcher{Source: catalog.NewSource(cc, nil), Interval: time.Hour, Tables: e.w.Tables, Log: slog.New(slog.NewTextHandler(e.p.Logs, nil)),
		Last: e.snap, Metrics: m, Publish: func(s *catalog.Snapshot) error { published++; return e.w.Publish(s) }}
	e.exec(e.s("CREATE TABLE %[1]s.acc_asia PARTITION OF %[1]s.acc FOR VALUES IN ('asia')"))
	w.Refresh(ctxT(t))
	if published != 0 || w.Last != e.snap || counterValue(t, m.Reads("error")) != 1 {
		t.Fatalf("failed refresh: published %d, snapshot replaced %v, errors counted %v", published, w.Last != e.snap, counterValue(t, m.Reads("error")))
	}
	e.want(e.client(""), "55F02", "UPDATE %[1]s.acc_us SET balance = 1") // the old snapshot still fences
	e.w.Metrics = m
	e.w.Refresh(ctxT(t))
	if counterValue(t, m.Reads("ok")) != 1 || e.w.Last == e.snap {
		t.Fatalf("good refresh: ok reads %v, snapshot replaced %v", counterValue(t, m.Reads("ok")), e.w.Last != e.snap)
	}
	e.want(e.client(""), "55F02", "UPDATE %[1]s.acc_asia SET balance = 1")
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
