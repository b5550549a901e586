// Package etcdtest runs a single-member etcd server inside the test process
// (go.etcd.io/etcd/server/v3/embed) on free loopback ports, with a
// temporary data directory. It can be stopped and started again on the same
// ports and data, so tests can take etcd away and bring it back.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/fenceproxy/fenceproxy/internal/freeport"
)

// LogEnv, when set, turns on the etcd server's log at that level (debug,
// info, warn, error) on stderr; by default the server logs nothing.
const LogEnv = "FENCEPROXY_TEST_ETCD_LOG"

// readyTimeout bounds the wait for the server to serve clients; a single
// member elects itself within a few election timeouts.
const readyTimeout = 30 * time.Second

// Etcd is an embedded etcd server.
type Etcd struct {
	dir       string
	ownsDir   bool
	clientURL url.URL
	peerURL   url.URL

	mu      sync.Mutex
	server  *embed.Etcd // nil while stopped
	clients []*clientv3.Client
	closed  bool
}

// Start starts a server for the test t and stops it, closing its clients,
// when t ends. It fails t if the server does not come up.
func Start(t testing.TB) *Etcd {
	t.Helper()
	e, err := start(t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// New starts a server outside any test (for TestMain); the caller must call
// Close, which also removes the data directory.
func New() (*Etcd, error) {
	dir, err := os.MkdirTemp("", "fenceproxy-etcd-")
	if err != nil {
		return nil, fmt.Errorf("etcdtest: %w", err)
	}
	e, err := start(dir, true)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return e, nil
}

func start(dir string, ownsDir bool) (*Etcd, error) {
	var err error
	// A port that looked free can be taken by a parallel test process
	// before etcd binds it; try again with fresh ports.
	for attempt := 0; attempt < 5; attempt++ {
		var cport, pport int
		if cport, err = freeport.Pick(); err != nil {
			return nil, err
		}
		if pport, err = freeport.Pick(); err != nil {
			return nil, err
		}
		if cport == pport {
			continue
		}
		e := &Etcd{
			dir:       dir,
			ownsDir:   ownsDir,
			clientURL: url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(cport))},
			peerURL:   url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(pport))},
		}
		if err = e.StartAgain(); err == nil {
			return e, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			return nil, err
		}
		// A failed first start may leave a half-written member directory
		// naming the old ports.
		if rerr := os.RemoveAll(dir + "/member"); rerr != nil {
			return nil, fmt.Errorf("etcdtest: %w", rerr)
		}
	}
	return nil, err
}

func (e *Etcd) config() *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = "etcdtest"
	cfg.Dir = e.dir
	cfg.ListenClientUrls = []url.URL{e.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{e.clientURL}
	cfg.ListenPeerUrls = []url.URL{e.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{e.peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// Short ticks make the single member elect itself quickly, after the
	// first start and after every restart.
	cfg.TickMs = 10
	cfg.ElectionMs = 100
	// Durability across machine crashes does not matter here; speed does.
	cfg.UnsafeNoFsync = true
	cfg.Logger = "zap"
	cfg.LogOutputs = []string{"stderr"}
	if lvl := os.Getenv(LogEnv); lvl != "" {
		cfg.LogLevel = lvl
	} else {
		// Even at level error, etcd logs every normal shutdown (closed
		// listeners) with a stack trace; failures reach the test through
		// StartAgain's error instead.
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	}
	return cfg
}

// StartAgain starts a stopped server on the same ports and data directory
// and waits until it serves clients. Starting a running server is an error.
func (e *Etcd) StartAgain() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errors.New("etcdtest: server closed")
	}
	if e.server != nil {
		return errors.New("etcdtest: server already running")
	}
	srv, err := embed.StartEtcd(e.config())
	if err != nil {
		return fmt.Errorf("etcdtest: start etcd on %s: %w", e.clientURL.Host, err)
	}
	select {
	case <-srv.Server.ReadyNotify():
	case err := <-srv.Err():
		srv.Close()
		return fmt.Errorf("etcdtest: etcd on %s failed: %w", e.clientURL.Host, err)
	case <-time.After(readyTimeout):
		srv.Close()
		return fmt.Errorf("etcdtest: etcd on %s not ready after %v", e.clientURL.Host, readyTimeout)
	}
	e.server = srv
	return nil
}

// Stop takes the server down, keeping its data and ports for StartAgain.
// Clients stay open and reconnect once the server is back. Stopping a
// stopped server does nothing.
func (e *Etcd) Stop() {
	e.mu.Lock()
	srv := e.server
	e.server = nil
	e.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// Restart stops the server and starts it again on the same ports and data.
func (e *Etcd) Restart() error {
	e.Stop()
	return e.StartAgain()
}

// Running reports whether the server is up.
func (e *Etcd) Running() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.server != nil
}

// Close closes the clients made by Client, stops the server for good and,
// for a server made by New, removes its data directory.
func (e *Etcd) Close() {
	e.mu.Lock()
	clients := e.clients
	e.clients, e.closed = nil, true
	e.mu.Unlock()
	for _, c := range clients {
		c.Close()
	}
	e.Stop()
	if e.ownsDir {
		os.RemoveAll(e.dir)
	}
}

// Endpoints are the client URLs, for clientv3.Config.Endpoints or
// etcdctl --endpoints (joined with commas).
func (e *Etcd) Endpoints() []string { return []string{e.clientURL.String()} }

// ClientAddr is the client listener's "host:port".
func (e *Etcd) ClientAddr() string { return e.clientURL.Host }

// Client returns a new client connected to the server; each call makes a
// separate client (and so separate leases and sessions). Close closes it.
// It works across Stop and StartAgain.
func (e *Etcd) Client() *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   e.Endpoints(),
		DialTimeout: 5 * time.Second,
		// The client logs every failed retry while the server is down,
		// which is what tests do on purpose.
		Logger: zap.NewNop(),
	})
	if err != nil {
		// clientv3.New does not dial eagerly; failing here means a bad
		// configuration, a bug in this package.
		panic(fmt.Sprintf("etcdtest: new client: %v", err))
	}
	e.mu.Lock()
	e.clients = append(e.clients, c)
	e.mu.Unlock()
	return c
}

// QueueLen is the number of sessions holding or waiting for the lock whose key prefix is key (a
// concurrency.Mutex's prefix): each has a key key/<lease>.
func QueueLen(t testing.TB, c *clientv3.Client, key string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, key+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("lock queue %s: %v", key, err)
	}
	return resp.Count
}
