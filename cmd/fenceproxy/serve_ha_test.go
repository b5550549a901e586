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
	"github.com/fenceproxy/fenceproxy/internal/lockservers"
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := etcdtest.Start(t)
	held, err := tokens.NewEtcdStore(e.Client(), tokens.DefaultPrefix).Acquire(ctx, "settle", tokens.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkServeBarrier(ctx, t, fmt.Sprintf("etcd:\n      endpoints: [%s]", e.ClientAddr()), held.Token())
}

// TestServeBarrierReadsZooKeeper: as TestServeBarrierReadsEtcd with upstream.barrier.zookeeper, and the lock
// released before the proxy starts, so only the grant `fenceproxy lock --zk` recorded knows its token.
func TestServeBarrierReadsZooKeeper(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := lockservers.ZooKeeper(t)
	s, err := tokens.NewZKStore(ctx, []string{srv.Addr()}, tokens.ZKOptions{ConnectTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkServeBarrier(ctx, t, fmt.Sprintf("zookeeper:\n      servers: [%s]", srv.Addr()), acquireAndRelease(ctx, t, s))
}

// TestServeBarrierReadsRedis: as TestServeBarrierReadsZooKeeper with upstream.barrier.redis.
func TestServeBarrierReadsRedis(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := lockservers.Redis(t)
	s, err := tokens.NewRedisStore(ctx, srv.Addr(), tokens.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkServeBarrier(ctx, t, fmt.Sprintf("redis:\n      address: %s", srv.Addr()), acquireAndRelease(ctx, t, s))
}

// acquireAndRelease takes the lock settle in s and gives it up, and returns the token it was granted. The token
// offset keeps an older token valid (a fresh Redis grants 1).
func acquireAndRelease(ctx context.Context, t *testing.T, s tokens.Store) int64 {
	t.Helper()
	held, err := s.Acquire(ctx, "settle", tokens.AcquireOptions{TTL: 10 * time.Second, TokenOffset: 100})
	if err != nil {
		t.Fatal(err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return held.Token()
}

// checkServeBarrier starts `fenceproxy serve` in front of a fresh database with upstream.barrier set to barrier
// (YAML at the indentation of a key under it) and checks that the lock settle's mark is token once the first
// primary is published, and that an older token on settle is refused (55F01).
func checkServeBarrier(ctx context.Context, t *testing.T, barrier string, token int64) {
	t.Helper()
	cl := pgtest.MustStart(t, pgtest.Options{})
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

	dir := t.TempDir()
	bin := proxytest.Binary(t, dir)
	addr := freeAddr(t)
	conf := fmt.Sprintf(`listen: %s
upstream:
  hosts: [%s]
  health:
    database: %s
  barrier:
    %s
tables:
  - name: ledger
    token_column: fence_token
`, addr, cl.Addr(), pgtest.TestDB, barrier)
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
	if err := admin.QueryRow(ctx, "SELECT mark FROM fenceproxy.lock_marks WHERE name = 'settle'").Scan(&mark); err != nil || mark != token {
		t.Fatalf("mark of settle after the barrier: %d (%v), want the grant's token %d", mark, err, token)
	}
	_, err = c.Exec(ctx, fmt.Sprintf("SET fence.token = %d; SET fence.lock = 'settle'; INSERT INTO ledger (id) VALUES (1)", token-1))
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
