package proxy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// TestPooledOverlongDatabaseName: PostgreSQL cuts a database name of 64 bytes or more to 63 bytes, so every
// longer name that starts with a 63-byte database's name is that database. The pools are per name as sent, and
// pool.size per database and user: each such name had a pool group, and its slots, of its own, so one user took
// as many server connections of one database as it liked (here two, over pool.size 1, both held at once). A
// name PostgreSQL would cut is refused at startup (3D000), before any pool is made.
func TestPooledOverlongDatabaseName(t *testing.T) {
	ctx := ctxT(t)
	db := "fp_long_db_" + strings.Repeat("d", 52) // 63 bytes
	d := direct(t)
	for _, sql := range []string{`DROP DATABASE IF EXISTS "` + db + `"`, `CREATE DATABASE "` + db + `"`} {
		if _, err := d.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() { direct(t).Exec(context.Background(), `DROP DATABASE IF EXISTS "`+db+`" WITH (FORCE)`) })
	p := startProxy(t, proxytest.Options{YAML: "pool:\n  mode: transaction\n  size: 1\n  max_client_wait: 500ms\nauth:\n  type: trust\n"})
	var held []*pgx.Conn
	ran := 0
	defer func() {
		for _, c := range held {
			c.Close(context.Background())
		}
	}()
	for _, suffix := range []string{"a", "b"} {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := pgx.Connect(cctx, p.DSN(pgtest.SuperUser, "", db+suffix))
		cancel()
		if err != nil {
			if code := sqlstate(err); code != "3D000" {
				t.Fatalf("database %q: %v, want 3D000", db+suffix, err)
			}
			continue
		}
		held = append(held, c)
		// Hold a server connection: a transaction that has run a statement keeps it.
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Logf("database %q: the statement waited for the pool: %v", db+suffix, err)
			continue
		}
		ran++
	}
	if len(held) > 0 {
		t.Fatalf("%d clients logged in with database names PostgreSQL cuts to %q (%d held a server connection at once, pool.size 1), want 3D000", len(held), db, ran)
	}
}
