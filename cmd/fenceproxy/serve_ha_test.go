package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/schema"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// TestServeBarrierReadsEtcd: `fenceproxy serve` with upstream.hosts and upstream.barrier.etcd runs the barrier
// before it publishes its first primary, with the grants `fenceproxy lock --etcd` recorded: the mark of a lock
// granted in etcd but never written in this database is created at the grant's token, and a write through the
// proxy with an older token on that lock is refused (55F01).
func TestServeBarrierReadsEtcd(t *testing.T) {
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
	if err := schema.Install(ctx, admin, schema.Config{
		Tables:   []config.Table{{Name: "ledger", Relation: "ledger", TokenColumn: "fence_token"}},
		Settings: schema.Settings{Token: "fence.token", Lock: "fence.lock"},
	}); err != nil {
		t.Fatal(err)
	}
	e := etcdtest.Start(t)
	held, err := tokens.NewEtcdStore(e.Client(), tokens.DefaultPrefix).Acquire(ctx, "settle", tokens.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	bin := proxytest.Binary(t, dir)
	addr := freeAddr(t)
	conf := fmt.Sprintf(`listen: %s
upstream:
  hosts: [%s]
  health:
    database: %s
  barrier:
    etcd:
      endpoints: [%s]
tables:
  - name: ledger
    token_column: fence_token
`, addr, cl.Addr(), pgtest.TestDB, e.ClientAddr())
	configPath := filepath.Join(dir, "fenceproxy.yaml")
	if err := os.WriteFile(configPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	startServe(t, bin, configPath, addr)
	c, err := pgx.Connect(ctx, proxytest.DSN(addr, pgtest.SuperUser, "", pgtest.TestDB)) // waits for the first primary
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var mark int64
	if err := admin.QueryRow(ctx, "SELECT mark FROM fenceproxy.lock_marks WHERE name = 'settle'").Scan(&mark); err != nil || mark != held.Token() {
		t.Fatalf("mark of settle after the barrier: %d (%v), want the grant's token %d", mark, err, held.Token())
	}
	_, err = c.Exec(ctx, fmt.Sprintf("SET fence.token = %d; SET fence.lock = 'settle'; INSERT INTO ledger (id) VALUES (1)", held.Token()-1))
	if code := pgCode(err); code != "55F01" {
		t.Errorf("an older token on the lock after the barrier: %v, want 55F01", err)
	}
}

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
