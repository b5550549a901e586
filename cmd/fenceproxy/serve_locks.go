package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/schema"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// startLockObservers registers an observer per lock store configured under locks: and runs them until the
// returned stop is called. A store that cannot be reached at start is retried at every interval (its series
// show fenceproxy_lock_observer_up 0); only a configuration that cannot work is an error.
func startLockObservers(cfg *config.Config, reg prometheus.Registerer, log *slog.Logger) (stop func(), err error) {
	ctx, cancel := context.WithCancel(context.Background())
	var closers []func()
	stop = func() {
		cancel()
		for _, c := range closers {
			c()
		}
	}
	o := tokens.ObserverOptions{MaxLocks: cfg.Locks.MaxLocks, Interval: cfg.Locks.Interval, Logger: log}
	var observers tokens.Observers
	if dsn := cfg.Locks.Postgres.DSN; dsn != "" {
		s, err := tokens.NewPGStore(ctx, dsn, tokens.PGStoreOptions{ReadOnly: true})
		if err != nil {
			stop()
			return nil, fmt.Errorf("locks.postgres: %w", err)
		}
		po := o
		po.Marks = lockMarks(dsn)
		observers = append(observers, tokens.NewPGObserver(s, po))
	}
	if eps := cfg.Locks.Etcd.Endpoints; len(eps) > 0 {
		client, err := clientv3.New(clientv3.Config{Endpoints: eps, Logger: zap.NewNop()})
		if err != nil {
			stop()
			return nil, fmt.Errorf("locks.etcd: %w", err)
		}
		closers = append(closers, func() { client.Close() })
		observers = append(observers, tokens.NewEtcdObserver(tokens.NewEtcdStore(client, cfg.Locks.Etcd.Prefix), o))
	}
	if zs := cfg.Locks.ZooKeeper.Servers; len(zs) > 0 {
		s, err := tokens.NewZKStore(ctx, zs, tokens.ZKOptions{Root: cfg.Locks.ZooKeeper.Root, Observe: true})
		if err != nil {
			stop()
			return nil, fmt.Errorf("locks.zookeeper: %w", err)
		}
		closers = append(closers, func() { s.Close() })
		observers = append(observers, tokens.NewListObserver(s, o))
	}
	if addr := cfg.Locks.Redis.Address; addr != "" {
		s, err := tokens.NewRedisStore(ctx, addr, tokens.RedisOptions{Prefix: cfg.Locks.Redis.Prefix})
		if err != nil {
			stop()
			return nil, fmt.Errorf("locks.redis: %w", err)
		}
		closers = append(closers, func() { s.Close() })
		observers = append(observers, tokens.NewListObserver(s, o))
	}
	if err := reg.Register(observers); err != nil {
		stop()
		return nil, fmt.Errorf("locks: %w", err)
	}
	for _, ob := range observers {
		go ob.Run(ctx)
	}
	return stop, nil
}

// lockMarks reads lock fences' marks (fenceproxy.lock_marks, schema.Marks) from the database at dsn, the
// PostgreSQL lock store's: the gauge fenceproxy_lock_mark{lock} shows them when `fenceproxy install` was run
// there (none otherwise). Like the store's own reading, each reading is one short connection.
func lockMarks(dsn string) func(ctx context.Context) (map[string]int64, error) {
	return func(ctx context.Context) (map[string]int64, error) {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return nil, fmt.Errorf("lock marks: connect: %w", err)
		}
		defer conn.Close(context.Background())
		return schema.Marks(ctx, conn)
	}
}
