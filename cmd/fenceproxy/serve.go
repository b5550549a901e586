package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fenceproxy/fenceproxy/catalog"
	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/proxy"
	"github.com/fenceproxy/fenceproxy/schema"
	"github.com/fenceproxy/fenceproxy/tokens"
)

const serveHelp = `usage: fenceproxy serve --config FILE

Runs the proxy: accepts PostgreSQL clients on "listen", relays each session to upstream.address, and fences
every write to the tables the configuration protects (the README's "Configuration" lists the keys).

Signals: SIGTERM or SIGINT drains (stops accepting, closes idle sessions, lets busy ones finish within
limits.shutdown_timeout, exits 0); SIGHUP re-reads FILE and applies its table list to every session (a file
that does not validate changes nothing; listen and upstream changes need a restart) and reads auth.file again.

Logs go to stderr (log.level, log.format; log.connections for one line per connection). With metrics.listen
set, /metrics and /healthz are served there. Exit status: 0 after a drain, 1 on a configuration or listen
error, 2 on a usage error.
`

func runServe(args []string, stdout, stderr io.Writer) int {
	fs := newCommandFlags("serve", serveHelp, stderr)
	configPath := fs.String("config", "", "path of the YAML configuration `FILE` (required)")
	if status, done := fs.parse(args, 2, stdout, stderr); done {
		return status
	}
	if *configPath == "" || fs.NArg() > 0 {
		fs.usageError(stderr, "")
		return 2
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		printConfigError(stderr, err)
		return 1
	}
	log := newLogger(cfg, stderr)

	opts := proxy.Options{Config: cfg, Logger: log}
	if eps := cfg.Token.Verify.Etcd.Endpoints; len(eps) > 0 {
		v, err := tokens.NewRevisionVerifier(tokens.VerifierConfig{
			Endpoints:   eps,
			TokenOffset: cfg.Token.Offset,
			FailOpen:    cfg.Token.Verify.Etcd.FailOpen,
			Timeout:     cfg.Token.Verify.Etcd.Timeout,
		})
		if err != nil {
			fmt.Fprintf(stderr, "fenceproxy: token.verify.etcd: %v\n", err)
			return 1
		}
		defer v.Close()
		opts.Verifier = v
	}
	if zs := cfg.Token.Verify.ZooKeeper; len(zs.Servers) > 0 {
		v, err := tokens.NewZKVerifier(zs.Servers, tokens.VerifierConfig{
			TokenOffset: cfg.Token.Offset,
			FailOpen:    zs.FailOpen,
			Timeout:     zs.Timeout,
		})
		if err != nil {
			fmt.Fprintf(stderr, "fenceproxy: token.verify.zookeeper: %v\n", err)
			return 1
		}
		defer v.Close()
		opts.Verifier = v
	}
	grants, err := openGrantSource(cfg.Upstream.Barrier)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy: %v\n", err)
		return 1
	}
	if grants != nil {
		defer grants.Close()
		opts.Grants = grants
	}

	keeper, err := startCeilingKeeper(cfg, &opts, log)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy: %v\n", err)
		return 1
	}
	if keeper != nil {
		defer keeper.Close()
	}

	var stores *lockStores // the locks: section's stores: lock metrics and the admin console's SHOW LOCKS
	if cfg.Locks.Enabled() {
		if stores, err = openLockStores(cfg); err != nil {
			fmt.Fprintf(stderr, "fenceproxy: %v\n", err)
			return 1
		}
		defer stores.Close()
		opts.Locks = stores.listing()
	}

	var metricsSrv *http.Server
	var catalogMetrics *catalog.Metrics
	if cfg.Metrics.Listen != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		opts.Metrics = proxy.NewMetrics(reg)
		if cfg.Catalog != nil {
			catalogMetrics = catalog.NewMetrics(reg)
		}
		if stores != nil {
			stopObservers, err := startLockObservers(cfg, stores, reg, log)
			if err != nil {
				fmt.Fprintf(stderr, "fenceproxy: %v\n", err)
				return 1
			}
			defer stopObservers()
		}
		mux := metricsMux(reg, cfg.Metrics.Pprof)
		mln, err := net.Listen("tcp", cfg.Metrics.Listen)
		if err != nil {
			fmt.Fprintf(stderr, "fenceproxy: metrics.listen: %v\n", err)
			return 1
		}
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go metricsSrv.Serve(mln)
		log.Info("metrics listening", "addr", mln.Addr().String())
	}

	watcher, snap, err := startCatalog(cfg, log, catalogMetrics)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy: %v\n", err)
		return 1
	}
	planner, err := proxy.NewPlannerWithCatalog(cfg, snap, opts.Metrics)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy: %v\n", err)
		return 1
	}
	opts.Planner = planner
	// SIGHUP and the admin console's RELOAD do the one reload; the Server and the planners it needs are made
	// below, before anything can ask for it (the listener is not open yet).
	var srv *proxy.Server
	var planners *proxy.PlannerSet
	var reloading sync.Mutex // a RELOAD and a SIGHUP at once take turns
	opts.Reload = func() ([]string, error) {
		reloading.Lock()
		defer reloading.Unlock()
		if keeper != nil {
			// Not configuration: the ceiling the verifier keeps, written again (a reinstalled schema gets it back).
			defer syncCeiling(keeper, cfg, log)
		}
		// What the reload applies (the table list, auth.file's users) is all read and checked before any of it is
		// applied: a reload that fails changes nothing. Until 2026-12-05 a broken auth.file failed RELOAD after
		// the new table list had been applied, and a broken configuration file still applied auth.file.
		applyAuth, err := srv.ReadAuthAgain()
		if err != nil {
			err = fmt.Errorf("auth.file: %w", err)
			log.Error("reload failed; keeping the current configuration and users", "err", err)
			return nil, err
		}
		notApplied, err := reload(*configPath, cfg, srv, planners, watcher, log)
		if err != nil {
			return nil, err
		}
		applyAuth()
		return notApplied, nil
	}
	srv, err = proxy.New(opts)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy: %v\n", err)
		return 1
	}
	planners = proxy.NewPlannerSet(srv, cfg, snap, opts.Metrics)
	if watcher != nil {
		defer watcher.Source.Close()
		watcher.Tables, watcher.Publish = planners.Tables, planners.SetSnapshot
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		go watcher.Run(ctx)
	}
	ln, err := proxy.Listen(cfg.Listen)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy: listen: %v\n", err)
		return 1
	}
	log.Info("fenceproxy listening", "addr", ln.Addr().String(), "upstream", strings.Join(cfg.Upstream.HostList(), ","), "target", cfg.Upstream.Target, "tables", tableNames(cfg), "version", versionString())

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	for {
		select {
		case err := <-serveErr:
			if err != nil {
				log.Error("serve failed", "err", err)
				return 1
			}
			return 0
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				opts.Reload() // it logs what it could not apply
				continue
			}
			log.Info("shutting down: draining sessions", "signal", sig.String(), "timeout", cfg.Limits.ShutdownTimeout)
			ctx, cancel := context.WithTimeout(context.Background(), cfg.Limits.ShutdownTimeout)
			err := srv.Shutdown(ctx)
			cancel()
			if metricsSrv != nil {
				metricsSrv.Close()
			}
			if err != nil {
				log.Warn("shutdown", "err", err)
			}
			log.Info("stopped")
			return 0
		}
	}
}

// reload re-reads the configuration file and applies the table list and the pool settings (proxy.ReloadPool),
// then reads the catalog again for the list. Other sections need a restart; those whose change it did not
// apply are logged and returned. A file that does not validate, or that changes a pool setting the running
// proxy cannot follow (pool.mode, pool.size), changes nothing (the error says why, and is logged).
func reload(path string, cur *config.Config, srv *proxy.Server, planners *proxy.PlannerSet, watcher *catalog.Watcher, log *slog.Logger) ([]string, error) {
	next, err := config.Load(path)
	var applyPool func()
	if err == nil {
		applyPool, err = srv.ReloadPool(next.Pool) // checked before anything applies
	}
	if err == nil {
		// Only the tables: the planner built from the whole new file took its token setting, lock setting,
		// fence.synchronous_commit and cache size too, which nothing else of the proxy (startup options, the
		// pool's token statements, verification) follows until a restart: writes under the old setting were
		// refused, and the two disagreed on which setting carries the token.
		applied := *cur
		applied.Tables = next.Tables
		err = planners.SetConfig(&applied)
	}
	if err != nil {
		log.Error("reload failed; keeping the current configuration", "err", err)
		return nil, err
	}
	applyPool()
	log.Info("reloaded the table list", "tables", tableNames(next))
	notApplied := restartSections(cur, next)
	if len(notApplied) > 0 {
		log.Warn("changes that need a restart; not applied", "sections", strings.Join(notApplied, ", "))
	}
	if watcher != nil {
		watcher.Refresh(context.Background())
	}
	return notApplied, nil
}

// restartSections names the sections of the configuration that differ between cur and next and that a reload
// does not apply: all but the tables and the pool (whose changes apply, or fail the reload: proxy.ReloadPool; a
// change of auth.file's contents applies; a change of the auth section does not).
func restartSections(cur, next *config.Config) []string {
	var keys []string
	for _, s := range []struct {
		key       string
		was, next any
	}{
		{"listen", cur.Listen, next.Listen}, {"upstream", cur.Upstream, next.Upstream}, {"tls", cur.TLS, next.TLS},
		{"catalog", cur.Catalog, next.Catalog}, {"metrics", cur.Metrics, next.Metrics}, {"limits", cur.Limits, next.Limits},
		{"relay", cur.Relay, next.Relay}, {"log", cur.Log, next.Log}, {"auth", cur.Auth, next.Auth},
		{"locks", cur.Locks, next.Locks}, {"fence", cur.Fence, next.Fence}, {"token", cur.Token, next.Token},
	} {
		if !reflect.DeepEqual(s.was, s.next) {
			keys = append(keys, s.key)
		}
	}
	return keys
}

// startCeilingKeeper makes the verifier keep fenceproxy.token_ceiling (docs/verification.md) over the catalog's
// connection, when tokens are verified and the configuration has a catalog section; it writes the ceiling
// once now (a failure is logged: the next verified token writes it).
func startCeilingKeeper(cfg *config.Config, opts *proxy.Options, log *slog.Logger) (*schema.CeilingKeeper, error) {
	if opts.Verifier == nil {
		return nil, nil
	}
	if cfg.Catalog == nil {
		log.Warn("token verification without a catalog section: the token ceiling is not kept, so the in-database guard cannot refuse a forged token set by a user function (docs/verification.md)")
		return nil, nil
	}
	cc, err := catalog.ConnConfig(cfg)
	if err != nil {
		return nil, err
	}
	store := "etcd"
	if len(cfg.Token.Verify.ZooKeeper.Servers) > 0 {
		store = "zookeeper"
	}
	keeper := schema.NewCeilingKeeper(opts.Verifier, store, func(ctx context.Context) (*pgx.Conn, error) {
		return pgx.ConnectConfig(ctx, cc.Copy())
	})
	opts.Verifier = keeper
	syncCeiling(keeper, cfg, log)
	return keeper, nil
}

// syncCeiling writes the token ceiling now (at start and on SIGHUP, so that a reinstalled schema gets it back).
func syncCeiling(keeper *schema.CeilingKeeper, cfg *config.Config, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Upstream.ConnectTimeout+2*cfg.Token.Verify.Etcd.Timeout+time.Second)
	defer cancel()
	if err := keeper.Sync(ctx); err != nil {
		log.Warn("token ceiling not written; the next verified token writes it", "err", err)
	}
}

// startCatalog reads the first catalog snapshot when the configuration has a catalog section. A first read
// that fails stops the start: the operator asked for partitions, views and cascades to be fenced, and a proxy
// that silently protected only the configured names would leave exactly those paths open. Without the
// section the proxy protects the configured names only, and says so.
func startCatalog(cfg *config.Config, log *slog.Logger, metrics *catalog.Metrics) (*catalog.Watcher, *catalog.Snapshot, error) {
	if cfg.Catalog == nil {
		if len(cfg.Tables) > 0 {
			log.Warn("no catalog section: partitions, inheritance children, views and foreign-key cascades of the protected tables are not fenced (docs/catalog.md)")
		}
		return nil, nil, nil
	}
	cc, err := catalog.ConnConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	src := catalog.NewSource(cc, nil)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Upstream.ConnectTimeout+30*time.Second)
	defer cancel()
	snap, err := src.Snapshot(ctx, proxy.ConfiguredTables(cfg))
	metrics.Observe(snap, err)
	if err != nil {
		return nil, nil, fmt.Errorf("%w (the first catalog read must succeed; see docs/catalog.md)", err)
	}
	for _, u := range snap.Unresolved {
		log.Warn("protected table not in the catalog; protected by name only", "table", u)
	}
	log.Info("catalog read", "protected", len(snap.Protected), "refused", len(snap.Refused), "refresh", cfg.Catalog.Refresh)
	return &catalog.Watcher{Source: src, Interval: cfg.Catalog.Refresh, Log: log, Last: snap, Metrics: metrics}, snap, nil
}

// tableNames lists the protected tables for the start and reload lines, as configured, comma-separated.
func tableNames(cfg *config.Config) string {
	names := make([]string, len(cfg.Tables))
	for i, t := range cfg.Tables {
		names[i] = t.Name
	}
	if len(names) == 0 {
		return "(none: nothing is fenced)"
	}
	return strings.Join(names, ",")
}

func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.Log.Level)); err != nil {
		level = slog.LevelInfo
	}
	ho := &slog.HandlerOptions{Level: level}
	if cfg.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, ho))
	}
	return slog.New(slog.NewTextHandler(w, ho))
}

// metricsMux serves /metrics and /healthz, and the profiles only when metrics.pprof asks for them: a metrics
// port is opened to whatever scrapes it, and a CPU profile or an execution trace is not for everyone who can
// reach it.
func metricsMux(reg *prometheus.Registry, pprofOn bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	if pprofOn {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// grantSource is a lock store the failover barrier reads its grants from.
type grantSource interface {
	proxy.GrantSource
	Close() error
}

// openGrantSource opens the lock service of upstream.barrier (validation allows one at most), or returns nil
// when none is set.
func openGrantSource(b config.Barrier) (grantSource, error) {
	switch {
	case len(b.Etcd.Endpoints) > 0:
		// No DialTimeout: the client connects in the background, so an etcd that is down at start does not
		// stop the proxy; the barrier then fails (closed) until etcd answers.
		client, err := clientv3.New(clientv3.Config{Endpoints: b.Etcd.Endpoints, Logger: zap.NewNop()})
		if err != nil {
			return nil, fmt.Errorf("upstream.barrier.etcd: %w", err)
		}
		return tokens.NewEtcdStore(client, b.Etcd.Prefix), nil
	case len(b.ZooKeeper.Servers) > 0:
		// An observing store holds no lock, so its client reconnects after a disconnect; the first session must
		// come up at start.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := tokens.NewZKStore(ctx, b.ZooKeeper.Servers, tokens.ZKOptions{Root: b.ZooKeeper.Root, Observe: true})
		if err != nil {
			return nil, fmt.Errorf("upstream.barrier.zookeeper: %w", err)
		}
		return s, nil
	case b.Redis.Address != "":
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := tokens.NewRedisStore(ctx, b.Redis.Address, tokens.RedisOptions{Prefix: b.Redis.Prefix})
		if err != nil {
			return nil, fmt.Errorf("upstream.barrier.redis: %w", err)
		}
		return s, nil
	}
	return nil, nil
}
