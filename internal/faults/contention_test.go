package faults

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// TestHotKeyContention: several workers (goroutines, each with its own etcd client and connections) contend for
// one lock and write a few hot rows through two proxy processes, for many iterations. A seeded schedule picks
// rows, proxies, protocol and when a holder "freezes": its lease ends behind its back (revoked, as an expiry
// during a pause would), a newer holder writes, and the frozen one then writes late to the row the newer holder
// wrote, which must fail with 55F01. The history checker then judges the whole run.
func TestHotKeyContention(t *testing.T) { hotKeyContention(t, false) }

// TestHotKeyContentionLockFence is TestHotKeyContention with lock fences: the guard installed (`fenceproxy
// install`), every worker's session naming the lock in its startup options as `fenceproxy lock` sets them
// (PGOPTIONS: -c fence.token=N -c fence.lock=NAME), and the frozen holder's late write an INSERT of a new row,
// which no row token can refuse: only the lock's mark can. CheckLocks then judges the lock-level invariant
// over the whole run.
func TestHotKeyContentionLockFence(t *testing.T) { hotKeyContention(t, true) }

func hotKeyContention(t *testing.T, lockFence bool) {
	t.Parallel()
	pgtest.Require(t, pg)
	s := seed(t)
	workers, iterations, rows := 4, 10, 3
	if *longRun {
		workers, iterations, rows = 8, 150, 5
	}
	e := etcdtest.Start(t)
	table := fencedTable(t, pg, rows)
	if lockFence {
		installLockFence(t, pg, table)
	}
	p1, p2 := twoProxies(t, e, table)
	proxies := []*proxyProc{p1, p2}
	admin := e.Client()
	name := uniqueName("hot")
	ctx := ctxFor(t, 10*time.Minute)
	h := &History{}

	var (
		mu             sync.Mutex
		highestToken   int64 // highest token of an acknowledged write, and the row it wrote
		highestRow     int
		frozen         atomic.Bool
		done           atomic.Int64
		freezes, lates atomic.Int64
		newRows        atomic.Int64 // keys of the late INSERTs, above the table's rows
	)
	lock := "" // the lock the sessions name: none, or the etcd lock's name
	if lockFence {
		lock = name
	}
	noteApplied := func(a Attempt) {
		mu.Lock()
		defer mu.Unlock()
		if a.Outcome == Applied && a.Token >= highestToken {
			highestToken, highestRow = a.Token, a.Row
		}
	}
	highest := func() (int64, int) {
		mu.Lock()
		defer mu.Unlock()
		return highestToken, highestRow
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer done.Add(1)
			rng := rand.New(rand.NewPCG(uint64(s), uint64(w)))
			worker := "w" + string(rune('a'+w))
			client := e.Client()
			for range iterations {
				l, err := tokens.Acquire(ctx, client, name, tokens.WithTTL(5*time.Second))
				if err != nil {
					errs <- err
					return
				}
				conn, err := hotConnect(ctx, proxies[rng.IntN(2)].DSN("faults-hot"), l.Token(), lock)
				if err != nil {
					l.Release(ctx)
					errs <- err
					return
				}
				wh := h
				if rng.IntN(2) == 0 {
					wh = &History{Mode: pgx.QueryExecModeSimpleProtocol}
				}
				for range 1 + rng.IntN(3) {
					a := h.writeLocked(ctx, wh.Mode, conn, table, worker, lock, l.Token(), 1+rng.IntN(rows), false)
					noteApplied(a)
					if a.Outcome != Applied {
						t.Errorf("%s: write under a held lock: %v", worker, a)
					}
				}
				// Worker 0 freezes at every chance until the run has had one late write, so that every run
				// exercises a takeover and a refused late write; the others freeze at random.
				wantFreeze := rng.Float64() < 0.2 || w == 0 && lates.Load() == 0
				if wantFreeze && frozen.CompareAndSwap(false, true) {
					// Frozen past the lease: the lease ends while this holder is not looking.
					freezes.Add(1)
					admin.Revoke(ctx, l.Lease())
					<-l.Lost()
					deadline := time.Now().Add(30 * time.Second)
					for {
						tok, _ := highest()
						if tok > l.Token() || done.Load() == int64(workers-1) || time.Now().After(deadline) {
							break
						}
						time.Sleep(5 * time.Millisecond)
					}
					tok, row := highest()
					if tok > l.Token() {
						var a Attempt
						if lockFence {
							// A new row: only the lock's mark can refuse it.
							a = h.writeLocked(ctx, wh.Mode, conn, table, worker+"-late", lock, l.Token(), 1000+int(newRows.Add(1)), true)
						} else {
							a = h.writeLocked(ctx, wh.Mode, conn, table, worker+"-late", lock, l.Token(), row, false)
						}
						lates.Add(1)
						if a.Outcome != Stale || lockFence && a.RefusedLock != lock {
							t.Errorf("%s: late write under a lost lock after token %d wrote row %d: %v", worker, tok, row, a)
						}
					}
					frozen.Store(false)
					client.Close()
					client = e.Client()
				} else {
					l.Release(ctx)
				}
				conn.Close(ctx)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	counts := h.Check(t, pg, table)
	if lockFence {
		h.CheckLocks(t, pg, table)
	}
	t.Logf("%d workers x %d iterations, %d freezes, %d late writes", workers, iterations, freezes.Load(), lates.Load())
	// The schedule must have done what the test claims: a holder frozen past its lease, a newer holder that
	// took over and wrote, and the frozen one's late write refused (counted below against the history).
	if freezes.Load() == 0 || lates.Load() == 0 {
		t.Fatalf("the schedule exercised %d freezes and %d late writes after a takeover; want at least one of each", freezes.Load(), lates.Load())
	}
	if int64(counts[Stale]) != lates.Load() {
		t.Errorf("%d stale refusals, want one per late write (%d)", counts[Stale], lates.Load())
	}
	noLeakedBackends(t, pg, "faults-hot", 20*time.Second)
}

// hotConnect connects a worker through dsn with its token and, when lock is not "", the lock's name as
// startup options, exactly as `fenceproxy lock` passes them in PGOPTIONS (without a lock, the token by SET).
func hotConnect(ctx context.Context, dsn string, token int64, lock string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if lock != "" {
		cfg.RuntimeParams["options"] = tokens.PGOptionsLock("", "", token, "", lock)
		return pgx.ConnectConfig(ctx, cfg)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := tokens.SetToken(ctx, conn, token, ""); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	return conn, nil
}
