package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
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
