package proxy_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// A pooled client's lent server connection lost under a running statement (the server SIGKILLed: no FATAL, only
// the end of the stream) counts once in fenceproxy_upstream_errors_total, and the client is told 08007 naming
// the host in its detail. lendFailed and the probe's failure share one step for this (serverConnLost, 9767b52), but only the
// probe's count was pinned (TestPooledProbeCutByADeadHost). From mutate58 (2026-12-06): with lendFailed telling
// the client without counting, every test passed, and this one failed (went from 0 to 0).
func TestPooledLendLostUnderAStatementIsCounted(t *testing.T) {
	pgtest.Require(t, pg)
	cl := pgtest.MustStart(t, pgtest.Options{})
	p := proxytest.Start(t, cl.Addr(), proxytest.Options{YAML: "pool:\n  mode: transaction\n  size: 2\nauth:\n  type: trust\n"})
	ctx := haCtx(t)
	c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB)+"&default_query_exec_mode=simple_protocol")
	admin := connect(t, cl.SuperDSN())
	before, _ := metricValue(t, p.Registry, "fenceproxy_upstream_errors_total")
	done := execAsync(ctx, c, "SELECT pg_sleep(30)")
	eventually(t, 10*time.Second, "the statement to run", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the statement ended before the server died: %v", err)
		default:
		}
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'").Scan(&n)
		return err == nil && n == 1
	})
	if err := cl.Kill(); err != nil {
		t.Fatal(err)
	}
	err := <-done
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "08007" || !strings.Contains(pe.Detail, cl.Addr()) {
		t.Errorf("a statement running as the server died: %v, want 08007 naming %s in its detail", err, cl.Addr())
	}
	// Counted before the client is told (the farewell follows the count), so read after its error.
	if after, _ := metricValue(t, p.Registry, "fenceproxy_upstream_errors_total"); after != before+1 {
		t.Errorf("fenceproxy_upstream_errors_total went from %v to %v over the loss of a lent server connection, want one more", before, after)
	}
}
