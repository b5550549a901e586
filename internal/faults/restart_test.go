package faults

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// TestPostgresRestartMidTransaction restarts PostgreSQL (its own cluster) while a fenced transaction through the
// proxy is open: the COMMIT fails, nothing of the transaction is applied, idle sessions end with an error rather
// than hanging, and the proxy serves new sessions (and fences them) as soon as the server is back.
func TestPostgresRestartMidTransaction(t *testing.T) {
	t.Parallel()
	cl := pgtest.MustStart(t, pgtest.Options{})
	table := fencedTable(t, cl, 1)
	p := startProxyProc(t, proxyConfig{Upstream: cl.Addr(), Tables: []string{table}})
	dsn := func(app string) string { return dsnApp(proxyDSN(p.Addr), app) }
	ctx := ctxFor(t, 90*time.Second)
	h := &History{}

	// A session that ends cleanly leaves its upstream connection kept for reuse; the restart kills it while
	// it is idle, and the session after the restart must not be handed the dead connection.
	kept := connect(t, dsn("faults-pgrestart-kept"))
	if err := kept.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the closed session's upstream connection kept for reuse", func() bool { return backends(t, cl, "fenceproxy: kept for reuse") == 1 })

	idle := connect(t, dsn("faults-pgrestart-idle"))
	conn := connect(t, dsn("faults-pgrestart"))
	if _, err := conn.Exec(ctx, "SET fence.token = 10"); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := Attempt{Worker: "tx", Token: 10, Row: 1, Val: h.NextVal("tx"), Start: time.Now()}
	if _, err := tx.Exec(ctx, "UPDATE "+table+" SET val = $1 WHERE id = 1", a.Val); err != nil {
		t.Fatal(err)
	}
	if err := cl.Restart(); err != nil {
		t.Fatal(err)
	}
	err = tx.Commit(ctx)
	a.Classify(err)
	h.Record(a)
	if err == nil {
		t.Fatal("COMMIT after the server restarted succeeded")
	}
	if a.Outcome != Unknown {
		t.Errorf("COMMIT across a restart: %v", a)
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = idle.Exec(qctx, "SELECT 1")
	timedOut := qctx.Err() != nil
	cancel()
	if err == nil || timedOut {
		t.Fatalf("idle session across a restart: %v (timed out: %v)", err, timedOut)
	}

	fresh := connect(t, dsn("faults-pgrestart-kept"))
	if err := tokens.SetToken(ctx, fresh, 10, ""); err != nil {
		t.Fatal(err)
	}
	if w := h.Write(ctx, fresh, table, "after", 10, 1); w.Outcome != Applied {
		t.Fatalf("write after the restart: %v", w)
	}
	if err := tokens.SetToken(ctx, fresh, 9, ""); err != nil {
		t.Fatal(err)
	}
	if w := h.Write(ctx, fresh, table, "older", 9, 1); w.Outcome != Stale {
		t.Fatalf("older token after the restart: %v, want 55F01", w)
	}
	h.Check(t, cl, table)
	var n int
	if err := fresh.QueryRow(ctx, "SELECT count(*) FROM "+table+"_history WHERE val = $1", a.Val).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the interrupted transaction's write was applied (%d, %v)", n, err)
	}
}

func proxyDSN(addr string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", pgtest.SuperUser, addr, pgtest.TestDB)
}

// TestProxyDrainAndRestartMidLoad: workers write in transactions through two proxy processes. One is drained with
// SIGTERM (an open transaction still commits; the process exits 0) and restarted; the other is killed with
// SIGKILL and restarted. Workers reconnect; no acknowledged write is lost, the fence holds, and no backend is
// left behind.
func TestProxyDrainAndRestartMidLoad(t *testing.T) {
	t.Parallel()
	pgtest.Require(t, pg)
	const workers = 4
	e := etcdtest.Start(t)
	table := fencedTable(t, pg, workers+1)
	p1, p2 := twoProxies(t, e, table)
	proxies := []*proxyProc{p1, p2}
	ctx := ctxFor(t, 3*time.Minute)
	h := &History{}
	app := "faults-drain"

	var stop atomic.Bool
	var commits atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		l, err := tokens.Acquire(ctx, e.Client(), uniqueName("drain"), tokens.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(context.Background())
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker := fmt.Sprintf("w%d", w)
			var conn *pgx.Conn
			defer func() {
				if conn != nil {
					conn.Close(context.Background())
				}
			}()
			for i := 0; !stop.Load(); i++ {
				if conn == nil || conn.IsClosed() {
					c, err := pgx.Connect(ctx, proxies[(w+i)%2].DSN(app))
					if err != nil {
						time.Sleep(10 * time.Millisecond) // the proxy is restarting; try again
						continue
					}
					if err := tokens.SetToken(ctx, c, l.Token(), ""); err != nil {
						c.Close(ctx)
						continue
					}
					conn = c
				}
				a := Attempt{Worker: worker, Token: l.Token(), Row: w + 1, Val: h.NextVal(worker), Start: time.Now()}
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, "UPDATE "+table+" SET val = $1 WHERE id = $2", a.Val, a.Row); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, "SELECT pg_sleep(0.005)")
					return err
				})
				a.Classify(err)
				if a.Outcome == Failed && errors.Is(err, pgx.ErrTxClosed) {
					a.Outcome = Unknown
				}
				h.Record(a)
				if err == nil {
					commits.Add(1)
				} else {
					conn.Close(context.Background())
					conn = nil
				}
			}
		}()
	}
	waitCommits := func(n int64) {
		t.Helper()
		target := commits.Load() + n
		waitFor(t, 60*time.Second, fmt.Sprintf("%d more commits", n), func() bool { return commits.Load() >= target })
	}
	waitCommits(20)

	// A transaction open on p1 when SIGTERM arrives may still commit.
	l, err := tokens.Acquire(ctx, e.Client(), uniqueName("drain-tx"), tokens.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	c := connect(t, p1.DSN(app))
	if err := tokens.SetToken(ctx, c, l.Token(), ""); err != nil {
		t.Fatal(err)
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	drained := Attempt{Worker: "drained", Token: l.Token(), Row: workers + 1, Val: h.NextVal("drained"), Start: time.Now()}
	if _, err := tx.Exec(ctx, "UPDATE "+table+" SET val = $1 WHERE id = $2", drained.Val, drained.Row); err != nil {
		t.Fatal(err)
	}
	p1.Signal(syscall.SIGTERM)
	waitFor(t, 10*time.Second, "p1 to start draining", func() bool { return strings.Contains(p1.Logs.String(), "draining") })
	err = tx.Commit(ctx)
	drained.Classify(err)
	h.Record(drained)
	if err != nil {
		t.Fatalf("a transaction open when the drain began could not commit: %v", err)
	}
	c.Close(ctx)
	if err := p1.Wait(30 * time.Second); err != nil {
		t.Fatalf("p1 after SIGTERM: %v", err)
	}
	p1.Start()
	waitCommits(20)

	p2.Kill()
	p2.Start()
	waitCommits(20)
	stop.Store(true)
	wg.Wait()

	h.Check(t, pg, table)
	noLeakedBackends(t, pg, app, 20*time.Second)
}
