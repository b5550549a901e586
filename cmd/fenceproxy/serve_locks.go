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

// lockStores are the stores of the configuration's locks: section, opened once for the lock metrics (an
// observer per store) and the admin console's SHOW LOCKS (one listing of them all). A store that cannot be
// reached at start is not an error: observers retry at every interval (fenceproxy_lock_observer_up 0) and SHOW
// LOCKS answers an ERROR naming it; only a configuration that cannot work is.
type lockStores struct {
	pg      *tokens.PGStore
	pgDSN   string
	etcd    *tokens.EtcdStore
	others  []tokens.Store // ZooKeeper, Redis: observed by reading List
	closers []func()
}

// openLockStores opens the stores of cfg.Locks (none when it names none).
func openLockStores(cfg *config.Config) (*lockStores, error) {
	ls := &lockStores{}
	ctx := context.Background()
	if dsn := cfg.Locks.Postgres.DSN; dsn != "" {
		s, err := tokens.NewPGStore(ctx, dsn, tokens.PGStoreOptions{ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("locks.postgres: %w", err)
		}
		ls.pg, ls.pgDSN = s, dsn
	}
	if eps := cfg.Locks.Etcd.Endpoints; len(eps) > 0 {
		client, err := clientv3.New(clientv3.Config{Endpoints: eps, Logger: zap.NewNop()})
		if err != nil {
			ls.Close()
			return nil, fmt.Errorf("locks.etcd: %w", err)
		}
		ls.closers = append(ls.closers, func() { client.Close() })
		ls.etcd = tokens.NewEtcdStore(client, cfg.Locks.Etcd.Prefix)
	}
	if zs := cfg.Locks.ZooKeeper.Servers; len(zs) > 0 {
		s, err := tokens.NewZKStore(ctx, zs, tokens.ZKOptions{Root: cfg.Locks.ZooKeeper.Root, Observe: true})
		if err != nil {
			ls.Close()
			return nil, fmt.Errorf("locks.zookeeper: %w", err)
		}
		ls.closers = append(ls.closers, func() { s.Close() })
		ls.others = append(ls.others, s)
	}
	if addr := cfg.Locks.Redis.Address; addr != "" {
		s, err := tokens.NewRedisStore(ctx, addr, tokens.RedisOptions{Prefix: cfg.Locks.Redis.Prefix})
		if err != nil {
			ls.Close()
			return nil, fmt.Errorf("locks.redis: %w", err)
		}
		ls.closers = append(ls.closers, func() { s.Close() })
		ls.others = append(ls.others, s)
	}
	return ls, nil
}

// Close closes the stores' connections.
func (ls *lockStores) Close() {
	for _, c := range ls.closers {
		c()
	}
}

// listing is SHOW LOCKS' listing of the stores, with the marks of the locks.postgres database (as the gauge
// fenceproxy_lock_mark); nil without a store.
func (ls *lockStores) listing() *tokens.Listing {
	l := &tokens.Listing{}
	if ls.pg != nil {
		l.Stores = append(l.Stores, ls.pg)
		l.Marks = lockMarks(ls.pgDSN)
	}
	if ls.etcd != nil {
		l.Stores = append(l.Stores, ls.etcd)
	}
	l.Stores = append(l.Stores, ls.others...)
	if len(l.Stores) == 0 {
		return nil
	}
	return l
}

// startLockObservers registers an observer per store of ls and runs them until the returned stop is called.
func startLockObservers(cfg *config.Config, ls *lockStores, reg prometheus.Registerer, log *slog.Logger) (stop func(), err error) {
	o := tokens.ObserverOptions{MaxLocks: cfg.Locks.MaxLocks, Interval: cfg.Locks.Interval, Logger: log}
	var observers tokens.Observers
	if ls.pg != nil {
		po := o
		po.Marks = lockMarks(ls.pgDSN)
		observers = append(observers, tokens.NewPGObserver(ls.pg, po))
	}
	if ls.etcd != nil {
		observers = append(observers, tokens.NewEtcdObserver(ls.etcd, o))
	}
	for _, s := range ls.others {
		observers = append(observers, tokens.NewListObserver(s, o))
	}
	if err := reg.Register(observers); err != nil {
		return nil, fmt.Errorf("locks: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	for _, ob := range observers {
		go ob.Run(ctx)
	}
	return cancel, nil
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
