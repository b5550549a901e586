package schema_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/schema"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) { os.Exit(pgtest.RunMain(m, pgtest.Options{}, &pg)) }

// newDB creates a database of the test's own (install is database-wide) and returns its name.
func newDB(t *testing.T) string {
	t.Helper()
	pgtest.Require(t, pg)
	h := fnv.New32a()
	h.Write([]byte(t.Name()))
	name := fmt.Sprintf("guard_%08x", h.Sum32())
	if err := pg.ExecIn("postgres", "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
	if err := pg.ExecIn("postgres", "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.ExecIn("postgres", "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })
	return name
}

// connect opens a connection to db as user with the given startup options (e.g. "-c fence.token=42").
func connect(t *testing.T, db, user, options string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(pg.DSN(user, "", db))
	if err != nil {
		t.Fatal(err)
	}
	if options != "" {
		cfg.RuntimeParams["options"] = options
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func superConn(t *testing.T, db string) *pgx.Conn { return connect(t, db, pgtest.SuperUser, "") }

// exec runs sql (simple protocol, may hold several statements) and fails the test on error.
func exec(t *testing.T, c *pgx.Conn, sql string) {
	t.Helper()
	if err := execErr(c, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func execErr(c *pgx.Conn, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.PgConn().Exec(ctx, sql).ReadAll()
	return err
}

// wantCode asserts that err is a server error with SQLSTATE code whose message starts with prefix.
func wantCode(t *testing.T, what string, err error, code, prefix string) *pgconn.PgError {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("%s: want SQLSTATE %s, got %v", what, code, err)
	}
	if pe.Code != code || !strings.HasPrefix(pe.Message, prefix) {
		t.Fatalf("%s: want SQLSTATE %s %q..., got %s %q (detail %q)", what, code, prefix, pe.Code, pe.Message, pe.Detail)
	}
	return pe
}

func queryInt(t *testing.T, c *pgx.Conn, sql string) int64 {
	t.Helper()
	var v *int64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.QueryRow(ctx, sql).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if v == nil {
		return -1
	}
	return *v
}

// table is a configured protected table.
func table(name, column string) config.Table {
	t := config.Table{Name: name, TokenColumn: column, Relation: name}
	if i := strings.IndexByte(name, '.'); i >= 0 {
		t.Schema, t.Relation = name[:i], name[i+1:]
	}
	return t
}

func guardConfig(tables ...config.Table) schema.Config {
	return schema.Config{Tables: tables, Settings: schema.Settings{Token: "fence.token", Lock: "fence.lock"}}
}

func install(t *testing.T, c *pgx.Conn, cfg schema.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := schema.Install(ctx, c, cfg); err != nil {
		t.Fatal(err)
	}
	st, err := schema.Inspect(ctx, c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Findings) > 0 {
		t.Fatalf("after install: %+v", st.Findings)
	}
}

// waitBlocked polls until the backend pid waits for a lock.
func waitBlocked(t *testing.T, observer *pgx.Conn, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var waiting bool
		err := observer.QueryRow(context.Background(),
			"SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("backend %d never waited for a lock", pid)
}

// async runs sql on c in the background; the returned channel gets its error.
func async(c *pgx.Conn, sql string) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- execErr(c, sql) }()
	return ch
}

// mustNotFinish asserts that the background statement is still running (it is known to be blocked, see
// waitBlocked); mustFinish waits for it.
func mustFinish(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("statement did not finish")
		return nil
	}
}
