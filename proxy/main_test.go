package proxy_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// pg is the package's shared throwaway cluster.
var pg *pgtest.Cluster

func TestMain(m *testing.M) { os.Exit(pgtest.RunMain(m, pgtest.Options{}, &pg)) }

// startProxy runs a proxy in front of the shared cluster.
func startProxy(t *testing.T, o proxytest.Options) *proxytest.Proxy {
	t.Helper()
	pgtest.Require(t, pg)
	return proxytest.Start(t, pg.Addr(), o)
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// direct connects to the cluster as the superuser, bypassing the proxy.
func direct(t *testing.T) *pgx.Conn {
	t.Helper()
	pgtest.Require(t, pg)
	return connect(t, pg.SuperDSN())
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
