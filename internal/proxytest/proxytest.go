// Package proxytest runs fenceproxy in front of a test cluster, in-process or as a real process.
package proxytest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/proxy"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// Proxy is an in-process fenceproxy server listening on a free loopback port.
type Proxy struct {
	Addr     string
	Server   *proxy.Server
	Config   *config.Config
	Registry *prometheus.Registry
	Logs     *SyncBuffer
	done     chan error
}

// Options tune a test proxy.
type Options struct {
	// YAML is appended to the generated configuration (listen and upstream.address are set for you).
	YAML string
	// Hosts, when set, are upstream.hosts instead of the upstream given to Start (which is then ignored).
	Hosts []string
	// Upstream is YAML for more keys under upstream:, indented by two spaces (e.g. "  reuse:\n    max_idle: 0\n").
	Upstream string
	// Verifier, when set, is used as the forged-token defence.
	Verifier proxy.TokenVerifier
	// Grants, when set, is the lock service the failover barrier reads (upstream.hosts).
	Grants proxy.GrantSource
	// Locks, when set, is what the admin console's SHOW LOCKS lists.
	Locks *tokens.Listing
	// NoPlanner relays without fencing.
	NoPlanner bool
	// DisableEventLoop keeps every session on the goroutine-per-direction path.
	DisableEventLoop bool
	// ParkIdleAfter is proxy.Options.ParkIdleAfter (pool.mode transaction: idle clients park after about it).
	ParkIdleAfter time.Duration
	// Tune, when set, changes the proxy's options last, just before proxy.New: what only package proxy's own
	// tests can set (its export_test.go: test hooks, which the proxy reads without synchronization).
	Tune func(*proxy.Options)
	// Logger, when set, is the proxy's logger instead of one at debug level into Logs (which then stays empty):
	// benchmarks log as a production proxy does, at info, without keeping every line in memory.
	Logger *slog.Logger
}

// Start runs a proxy in front of upstream (host:port) until the test ends.
func Start(t testing.TB, upstream string, o Options) *Proxy {
	t.Helper()
	ln, err := proxy.Listen("127.0.0.1:0") // as fenceproxy serve listens
	if err != nil {
		t.Fatal(err)
	}
	up := "  address: " + upstream + "\n"
	if len(o.Hosts) > 0 {
		up = "  hosts: [" + strings.Join(o.Hosts, ", ") + "]\n"
	}
	yaml := fmt.Sprintf("listen: %s\nupstream:\n%s%s%s", ln.Addr(), up, o.Upstream, o.YAML)
	cfg, err := config.Parse("test.yaml", []byte(yaml))
	if err != nil {
		ln.Close()
		t.Fatalf("proxy config: %v\n%s", err, yaml)
	}
	logs := &SyncBuffer{}
	p := &Proxy{Addr: ln.Addr().String(), Config: cfg, Registry: prometheus.NewRegistry(), Logs: logs, done: make(chan error, 1)}
	opts := proxy.Options{
		Config:   cfg,
		Logger:   o.Logger,
		Metrics:  proxy.NewMetrics(p.Registry),
		Verifier: o.Verifier,
		Grants:   o.Grants,
		Locks:    o.Locks,

		DisableEventLoop: o.DisableEventLoop,
		ParkIdleAfter:    o.ParkIdleAfter,
	}
	if v := os.Getenv("PROXYTEST_PARK_AFTER"); v != "" && opts.ParkIdleAfter == 0 {
		// A stress of parking: every transaction-mode test with clients parking after v of idleness.
		if opts.ParkIdleAfter, err = time.ParseDuration(v); err != nil {
			t.Fatalf("PROXYTEST_PARK_AFTER: %v", err)
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if !o.NoPlanner {
		planner, err := proxy.NewPlanner(cfg, opts.Metrics)
		if err != nil {
			t.Fatal(err)
		}
		opts.Planner = planner
	}
	if o.Tune != nil {
		o.Tune(&opts)
	}
	p.Server, err = proxy.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.Server.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p.Server.Shutdown(ctx)
		if err := <-p.done; err != nil {
			t.Errorf("proxy Serve: %v", err)
		}
		if t.Failed() {
			t.Logf("proxy logs:\n%s", logs.String())
		}
	})
	return p
}

// DSN is a connection URL through the proxy.
func (p *Proxy) DSN(user, password, dbname string) string {
	return DSN(p.Addr, user, password, dbname)
}

// DSN builds a postgres:// URL for addr with sslmode=disable.
func DSN(addr, user, password, dbname string) string {
	u := url.URL{Scheme: "postgres", Host: addr, Path: "/" + dbname, RawQuery: "sslmode=disable"}
	if password != "" {
		u.User = url.UserPassword(user, password)
	} else {
		u.User = url.User(user)
	}
	return u.String()
}

// SyncBuffer is a bytes.Buffer safe for a logger and a test to share.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Binary builds the fenceproxy command once per test binary into dir and returns its path.
func Binary(t testing.TB, dir string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	out := filepath.Join(dir, "fenceproxy")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/fenceproxy")
	cmd.Dir = root
	cmd.Env = os.Environ()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/fenceproxy: %v\n%s", err, b)
	}
	return out
}
