package proxy_test

import (
	"strings"
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// The server dies (every process SIGKILLed: no FATAL, only the end of the streams) while the pool's look at a
// client's server connection after its transaction (the probe, held behind a lock on pg_cursors) waits. The
// transaction's answer went out before the probe, so only the connection was lost: the client is told what a
// client whose connection was lost with no answer in flight is told (lostFarewell), 57P01 naming the lost host
// with upstream.hosts, 08006 naming it without; not the probe's own "could not read the server connection's
// session state", which named no host and, with upstream.hosts, sent the client away with 08006 where a session
// gets 57P01. Attack of probe57 on 2026-12-05. The loss counts once in fenceproxy_upstream_errors_total, as the
// loss of a lent connection does (lendFailed); it was not counted at all (cancel57, 2026-12-05).
func TestPooledProbeCutByADeadHost(t *testing.T) {
	const yaml = "pool:\n  mode: transaction\n  size: 2\nauth:\n  type: trust\n"
	t.Run("hosts", func(t *testing.T) {
		h := startHAPairWith(t, nil, "", yaml)
		probeCutByADeadHost(t, h.proxy, h.primary, "57P01")
	})
	t.Run("single", func(t *testing.T) {
		pgtest.Require(t, pg)
		cl := pgtest.MustStart(t, pgtest.Options{})
		p := proxytest.Start(t, cl.Addr(), proxytest.Options{YAML: yaml})
		probeCutByADeadHost(t, p, cl, "08006")
	})
}

// probeCutByADeadHost kills srv under the probe of a client of p, and fails unless the client is told want
// naming srv, and the loss is counted once as an upstream error.
func probeCutByADeadHost(t *testing.T, p *proxytest.Proxy, srv *pgtest.Cluster, want string) {
	ctx := haCtx(t)
	c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB)+"&default_query_exec_mode=simple_protocol")
	if port, err := serverPort(ctx, c); err != nil || port != srv.Port() {
		t.Fatalf("the client reached port %d (%v), want %d", port, err, srv.Port())
	}
	_, done := holdProbeOnACatalogLock(ctx, t, c, srv.SuperDSN())
	before, _ := metricValue(t, p.Registry, "fenceproxy_upstream_errors_total")
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	err := <-done
	if err == nil {
		_, err = c.Exec(ctx, "SELECT 1")
	}
	if sqlstate(err) != want || !strings.Contains(err.Error(), srv.Addr()) {
		t.Errorf("the client whose probe the host's death cut: %v, want %s naming %s", err, want, srv.Addr())
	}
	// Counted before the client is told (the farewell follows the count), so read after its error.
	if after, _ := metricValue(t, p.Registry, "fenceproxy_upstream_errors_total"); after != before+1 {
		t.Errorf("fenceproxy_upstream_errors_total went from %v to %v over the loss of the server connection under the probe, want one more", before, after)
	}
}
