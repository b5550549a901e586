package proxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// A pooled client's server connection killed while the proxy reads its session state back after a transaction
// that set the token at session level (the probe, held on a lock of pg_class that the test takes, so that the
// kill lands inside it): the client either goes on with the token it set or its session ends; it never goes on
// with an older one, and the next client of the pool (size 1) sees no token of its. Attack of a review on
// 2026-12-05 (a server connection killed mid probe).
func TestPooledProbeKilledKeepsTheClientsToken(t *testing.T) {
	pgtest.Require(t, pg)
	cl := pgtest.MustStart(t, pgtest.Options{})
	if err := cl.Exec("CREATE TABLE accounts (id int PRIMARY KEY, v int NOT NULL, fence_token bigint); INSERT INTO accounts VALUES (1, 0, NULL)"); err != nil {
		t.Fatal(err)
	}
	p := proxytest.Start(t, cl.Addr(), proxytest.Options{YAML: "tables:\n  - name: accounts\n    token_column: fence_token\npool:\n  mode: transaction\n  size: 1\n  max_client_wait: 20s\nauth:\n  type: trust\n"})
	ctx := haCtx(t)
	dsn := p.DSN(pgtest.SuperUser, "", pgtest.TestDB) + "&default_query_exec_mode=simple_protocol"
	x := connect(t, dsn)
	y := connect(t, dsn)
	if _, err := x.Exec(ctx, "SET fence.token = 5"); err != nil {
		t.Fatal(err)
	}
	var tok string
	if err := y.QueryRow(ctx, "SHOW fence.token").Scan(&tok); err != nil || tok != "" {
		t.Fatalf("the other client's token: %q (%v), want none", tok, err)
	}
	admin := connect(t, cl.SuperDSN())
	locker, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(context.Background())
	if _, err := locker.Exec(ctx, "LOCK TABLE pg_catalog.pg_class IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	setErr := make(chan error, 1)
	go func() {
		_, err := x.Exec(ctx, "SET fence.token = 9")
		setErr <- err
	}()
	var pid int
	eventually(t, 10*time.Second, "the probe to wait for pg_class", func() bool {
		err := locker.QueryRow(ctx, "SELECT pid FROM pg_catalog.pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'SELECT s.a, s.b, pg_catalog.set_config(%'").Scan(&pid)
		return err == nil
	})
	if _, err := locker.Exec(ctx, "SELECT pg_catalog.pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-setErr
	t.Logf("SET fence.token = 9, its probe killed: %v (%s)", err, sqlstate(err))
	// x goes on with 9 (its SET was answered) or ends; never 5.
	err = x.QueryRow(ctx, "SHOW fence.token").Scan(&tok)
	t.Logf("the client whose probe was killed, next: token %q, %v (%s)", tok, err, sqlstate(err))
	if err == nil && tok != "9" {
		t.Errorf("the client whose probe was killed goes on with token %q, want 9 (or its session ended)", tok)
	}
	if _, err := x.Exec(ctx, "UPDATE accounts SET v = 1 WHERE id = 1"); err == nil {
		var row int64
		if err := admin.QueryRow(ctx, "SELECT fence_token FROM accounts WHERE id = 1").Scan(&row); err != nil || row != 9 {
			t.Errorf("the client whose probe was killed wrote with token %d (%v), want 9", row, err)
		}
	}
	if err := y.QueryRow(ctx, "SHOW fence.token").Scan(&tok); err != nil || tok != "" {
		t.Errorf("the next client of the pool: token %q (%v), want none", tok, err)
	}
	var n int
	if err := y.QueryRow(ctx, "SELECT count(*) FROM accounts").Scan(&n); err != nil {
		t.Errorf("the next client of the pool: %v", err)
	}
}
