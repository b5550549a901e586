package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/proxy"
	"github.com/fenceproxy/fenceproxy/tokens"
)

func runServe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "path of the YAML configuration file (required)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *configPath == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: fenceproxy serve --config FILE")
		return 2
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy: %v\n", err)
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

	var metricsSrv *http.Server
	if cfg.Metrics.Listen != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		opts.Metrics = proxy.NewMetrics(reg)
		if cfg.Locks.Enabled() {
			stopObservers, err := startLockObservers(cfg, reg, log)
			if err != nil {
				fmt.Fprintf(stderr, "fenceproxy: %v\n", err)
				return 1
			}
			defer stopObservers()
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
		// Profiles on the operators' port, for "where does the time go" questions in production.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mln, err := net.Listen("tcp", cfg.Metrics.Listen)
		if err != nil {
			fmt.Fprintf(stderr, "fenceproxy: metrics.listen: %v\n", err)
			return 1
		}
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go metricsSrv.Serve(mln)
		log.Info("metrics listening", "addr", mln.Addr().String())
	}

	planner, err := proxy.NewPlanner(cfg, opts.Metrics)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy: %v\n", err)
		return 1
	}
	opts.Planner = planner
	srv, err := proxy.New(opts)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy: %v\n", err)
		return 1
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy: listen: %v\n", err)
		return 1
	}
	log.Info("fenceproxy listening", "addr", ln.Addr().String(), "upstream", cfg.Upstream.Address, "tables", len(cfg.Tables), "version", versionString())

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
				reload(*configPath, cfg, srv, log, opts.Metrics)
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

// reload re-reads the configuration file and applies the table list. Other settings need a restart; a change
// to them is logged, not applied, and a file that does not validate changes nothing.
func reload(path string, cur *config.Config, srv *proxy.Server, log *slog.Logger, metrics *proxy.Metrics) {
	next, err := config.Load(path)
	if err != nil {
		log.Error("reload failed; keeping the current configuration", "err", err)
		return
	}
	planner, err := proxy.NewPlanner(next, metrics)
	if err != nil {
		log.Error("reload failed; keeping the current configuration", "err", err)
		return
	}
	srv.SetPlanner(planner)
	log.Info("reloaded the table list", "tables", len(next.Tables))
	if next.Listen != cur.Listen || next.Upstream != cur.Upstream {
		log.Warn("listen and upstream changes need a restart; not applied")
	}
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
