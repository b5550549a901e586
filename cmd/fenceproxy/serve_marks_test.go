package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/schema"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// TestServeExportsLockMarks: with locks.postgres configured on a database where `fenceproxy install` ran, the
// proxy's /metrics shows each lock's accepted token as fenceproxy_lock_mark{lock}, and the gauge follows the
// mark when a writer with a newer token writes (again after an older one is refused).
func TestServeExportsLockMarks(t *testing.T) {
	cl := pgtest.MustStart(t, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cl.Exec("CREATE TABLE ledger (id int PRIMARY KEY, fence_token bigint)"); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, cl.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	cfg := schema.Config{
		Tables:   []config.Table{{Name: "ledger", Relation: "ledger", TokenColumn: "fence_token"}},
		Settings: schema.Settings{Token: "fence.token", Lock: "fence.lock"},
	}
	if err := schema.Install(ctx, admin, cfg); err != nil {
		t.Fatalf("fenceproxy install: %v", err)
	}
	name := lockName(t)
	// write inserts a row as a writer of lock name with token, straight to PostgreSQL (the guard keeps the mark).
	write := func(token int64, id int) error {
		cc, err := pgx.ParseConfig(cl.SuperDSN())
		if err != nil {
			t.Fatal(err)
		}
		cc.RuntimeParams["options"] = tokens.PGOptionsLock("", "", token, "", name)
		c, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		_, err = c.Exec(ctx, "INSERT INTO ledger (id) VALUES ($1)", id)
		return err
	}
	if err := write(5, 1); err != nil {
		t.Fatalf("first write with token 5: %v", err)
	}

	dir := t.TempDir()
	bin := proxytest.Binary(t, dir)
	addr, metricsAddr := freeAddr(t), freeAddr(t)
	conf := fmt.Sprintf("listen: %s\nmetrics:\n  listen: %s\nupstream:\n  address: %s\nlocks:\n  interval: 200ms\n  postgres:\n    dsn: %s\n",
		addr, metricsAddr, cl.Addr(), cl.SuperDSN())
	configPath := filepath.Join(dir, "fenceproxy.yaml")
	if err := os.WriteFile(configPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	startServe(t, bin, configPath, addr)
	markSeries := regexp.MustCompile(fmt.Sprintf(`(?m)^fenceproxy_lock_mark\{lock="%s"\} (\d+)$`, regexp.QuoteMeta(name)))
	mark := func() string {
		m := markSeries.FindStringSubmatch(httpGet(t, "http://"+metricsAddr+"/metrics"))
		if m == nil {
			return ""
		}
		return m[1]
	}
	waitFor(t, 20*time.Second, "fenceproxy_lock_mark 5", func() bool { return mark() == "5" })

	if err := write(7, 2); err != nil {
		t.Fatalf("write with the newer token 7: %v", err)
	}
	waitFor(t, 20*time.Second, "fenceproxy_lock_mark 7 after a write with token 7", func() bool { return mark() == "7" })

	// A stale writer is refused and moves nothing; a newer one moves the gauge again.
	var pe *pgconn.PgError
	if err := write(6, 3); !errors.As(err, &pe) || pe.Code != "55F01" {
		t.Fatalf("write with the stale token 6: %v, want 55F01", err)
	}
	if err := write(9, 4); err != nil {
		t.Fatalf("write with the newer token 9: %v", err)
	}
	waitFor(t, 20*time.Second, "fenceproxy_lock_mark 9 after a write with token 9", func() bool { return mark() == "9" })
}
