package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/schema"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// TestServeObservesLocks: with locks.postgres and locks.etcd configured, the proxy's /metrics shows a lock held
// in each store, with its token.
func TestServeObservesLocks(t *testing.T) {
	cl := pgtest.MustStart(t, pgtest.Options{})
	e := etcdtest.Start(t)
	ctx := context.Background()
	pgStore, err := tokens.NewPGStore(ctx, cl.SuperDSN(), tokens.PGStoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	name := lockName(t)
	pgHeld, err := pgStore.Acquire(ctx, name, tokens.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer pgHeld.Release(ctx)
	etcdHeld, err := tokens.NewEtcdStore(e.Client(), tokens.DefaultPrefix).Acquire(ctx, name, tokens.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer etcdHeld.Release(ctx)

	dir := t.TempDir()
	bin := proxytest.Binary(t, dir)
	addr, metricsAddr := freeAddr(t), freeAddr(t)
	conf := fmt.Sprintf("listen: %s\nmetrics:\n  listen: %s\nupstream:\n  address: %s\nlocks:\n  interval: 200ms\n  postgres:\n    dsn: %s\n  etcd:\n    endpoints: [%s]\n",
		addr, metricsAddr, cl.Addr(), cl.SuperDSN(), strings.Join(e.Endpoints(), ", "))
	configPath := filepath.Join(dir, "fenceproxy.yaml")
	if err := os.WriteFile(configPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	startServe(t, bin, configPath, addr)
	want := []string{
		fmt.Sprintf(`fenceproxy_lock_token{lock=%q,store="postgres"} %d`, name, pgHeld.Token()),
		fmt.Sprintf(`fenceproxy_lock_token{lock=%q,store="etcd"} %d`, name, etcdHeld.Token()),
		fmt.Sprintf(`fenceproxy_lock_acquisitions_total{lock=%q,store="postgres"} 1`, name),
		`fenceproxy_lock_observer_up{store="postgres"} 1`,
		`fenceproxy_lock_observer_up{store="etcd"} 1`,
	}
	var metrics string
	waitFor(t, 20*time.Second, "the lock series on /metrics", func() bool {
		metrics = httpGet(t, "http://"+metricsAddr+"/metrics")
		for _, w := range want {
			if !strings.Contains(metrics, w) {
				return false
			}
		}
		return true
	})
}

// TestServeShowLocks: with locks.postgres and the admin console but no metrics endpoint, the admin console's
// SHOW LOCKS lists a lock held in that store with its token and the mark its database holds for it.
func TestServeShowLocks(t *testing.T) {
	cl := pgtest.MustStart(t, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, cl.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := schema.Install(ctx, conn, schema.Config{}); err != nil {
		t.Fatal(err)
	}
	store, err := tokens.NewPGStore(ctx, cl.SuperDSN(), tokens.PGStoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	name := lockName(t)
	held, err := store.Acquire(ctx, name, tokens.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	if _, err := schema.RaiseMarks(ctx, conn, map[string]int64{name: held.Token()}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	bin := proxytest.Binary(t, dir)
	addr := freeAddr(t)
	conf := fmt.Sprintf("listen: %s\nupstream:\n  address: %s\npool:\n  mode: transaction\n  admin_users: [admin]\nauth:\n  type: trust\nlocks:\n  postgres:\n    dsn: %s\n",
		addr, cl.Addr(), cl.SuperDSN())
	configPath := filepath.Join(dir, "fenceproxy.yaml")
	if err := os.WriteFile(configPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	pp := startServe(t, bin, configPath, addr)
	adm, err := pgx.Connect(ctx, proxytest.DSN(addr, "admin", "", "fenceproxy")+"&default_query_exec_mode=simple_protocol")
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close(context.Background())
	rows, err := adm.Query(ctx, "SHOW LOCKS")
	if err != nil {
		t.Fatalf("SHOW LOCKS: %v\n%s", err, pp.stderr.String())
	}
	locks, err := pgx.CollectRows(rows, pgx.RowToMap)
	if err != nil {
		t.Fatal(err)
	}
	token := strconv.FormatInt(held.Token(), 10)
	if len(locks) != 1 || locks[0]["lock"] != name || locks[0]["store"] != "postgres" || locks[0]["token"] != token || locks[0]["mark"] != token {
		t.Fatalf("SHOW LOCKS: %v, want %s held with token and mark %s", locks, name, token)
	}
}
