package proxy_test

import (
	"testing"
	"time"
)

// The probe (the proxy's look at a server connection after a transaction that may have left session state) is
// the proxy's own statement: the client's statement_timeout and lock_timeout, which its transaction just set,
// must not cancel it (a cancelled probe ends the client's session with 08006: pgx's
// TestSendBatchHandlesTimeoutBetweenParseAndDescribe/describe_exec, 100 ms, got 08006 instead of 57014 now and
// then on a busy machine). Here the probe is made slow
// for sure: another session holds a lock on pg_cursors, which the probe reads, far past the client's limits. The
// client's session goes on, and keeps its own limits, not the probe's: they move with it to the server
// connection after another client with none used it. A cancel that reaches the probe makes it run again.
func TestPooledProbeOutlastsClientLimits(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	q := "&default_query_exec_mode=simple_protocol"
	c := pooledConn(t, f, q)
	other := pooledConn(t, f, q)
	fxExec(t, c, "SELECT 1")
	fxExec(t, other, "SELECT 1")

	blocker := direct(t)
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	fxExec(t, blocker, "LOCK TABLE pg_catalog.pg_cursors IN ACCESS EXCLUSIVE MODE")

	// The SET ends c's transaction at once; the probe after it waits for the lock.
	fxExec(t, c, "SET statement_timeout = '50ms'; SET lock_timeout = '40ms'")
	waiting := "SELECT a.pid, a.query_start FROM pg_locks l JOIN pg_stat_activity a USING (pid) " +
		"WHERE l.relation = 'pg_catalog.pg_cursors'::regclass AND NOT l.granted AND clock_timestamp() - a.query_start > interval '500 ms'"
	var pid int32
	var began time.Time
	eventually(t, 20*time.Second, "the probe still waiting for the lock ten times the client's statement_timeout after it began", func() bool {
		return f.d.QueryRow(ctx, waiting).Scan(&pid, &began) == nil
	})
	// A cancel that reaches the probe (as a client's CancelRequest sent as its statement ended may) changed
	// nothing: the probe runs again.
	fxExec(t, f.d, "SELECT pg_cancel_backend($1)", pid)
	eventually(t, 20*time.Second, "the probe run again after a cancel", func() bool {
		var again time.Time
		return f.d.QueryRow(ctx, waiting+" AND a.pid = $1 AND a.query_start > $2", pid, began).Scan(&pid, &again) == nil
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	want := map[string]string{"statement_timeout": "50ms", "lock_timeout": "40ms"}
	for round := range 2 {
		for name, v := range want {
			var got string
			if err := c.QueryRow(ctx, "SHOW "+name).Scan(&got); err != nil {
				t.Fatalf("round %d: the client after its probe: SHOW %s: %v", round, name, err)
			}
			if got != v {
				t.Errorf("round %d: the client's %s is %q, want %q", round, name, got, v)
			}
			if err := other.QueryRow(ctx, "SHOW "+name).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != "0" {
				t.Errorf("round %d: the other client's %s is %q, want 0", round, name, got)
			}
		}
	}
}
