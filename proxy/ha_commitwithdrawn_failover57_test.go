package proxy_test

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A transaction that wrote a protected table on the primary is not told it committed once that host is no longer
// the published primary: the message that would commit it (a COMMIT, or the Sync of an extended-protocol batch
// whose implicit transaction holds the write) never reaches the host, the session ends with FATAL 55F04 and the
// server rolls the transaction back. From failover57 (2026-12-05, attack: the COMMIT of a transaction straddling
// the switch): the write was allowed (the host was the published primary then), the standby was promoted and the
// old primary withdrawn while the barrier ran on the new one, and the COMMIT reached the old primary and
// committed there, a write the new primary never sees that the client believed committed. A transaction that
// wrote only unprotected tables goes on and commits, as during a split brain (docs/ha.md).
func TestCommitRefusedOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		for _, end := range []string{"COMMIT", "Sync"} {
			t.Run(mode.name+"/"+end, func(t *testing.T) {
				h, admin := startBarrierPair(t, mode.yaml, nil)
				ctx := haCtx(t)
				if _, err := admin.Exec(ctx, "CREATE TABLE notes (v int)"); err != nil {
					t.Fatal(err)
				}
				c := tokenClient(ctx, t, h, 5)
				var pipe *pgconn.Pipeline
				if end == "COMMIT" {
					if _, err := c.Exec(ctx, "BEGIN"); err != nil {
						t.Fatal(err)
					}
					h.onPrimary(ctx, t, c, "the transaction")
					if _, err := c.Exec(ctx, "UPDATE accounts SET v = 7 WHERE id = 2"); err != nil {
						t.Fatalf("fenced write on the published primary: %v", err)
					}
				} else {
					// An extended-protocol batch flushed, not synced: its implicit transaction holds the write
					// until its Sync.
					pipe = c.PgConn().StartPipeline(ctx)
					pipe.SendQueryParams("UPDATE accounts SET v = 7 WHERE id = 2 AND inet_server_port() = $1", [][]byte{[]byte(strconv.Itoa(h.primary.Port()))}, nil, nil, nil)
					pipe.SendFlushRequest()
					if err := pipe.Flush(); err != nil {
						t.Fatal(err)
					}
					res, err := pipe.GetResults()
					if err != nil {
						t.Fatal(err)
					}
					rr, ok := res.(*pgconn.ResultReader)
					if !ok {
						t.Fatalf("the batch's first result is %T, want its UPDATE's", res)
					}
					if tag, err := rr.Close(); err != nil || tag.RowsAffected() != 1 {
						t.Fatalf("fenced write on the published primary: %v (%v), want one row on port %d", tag, err, h.primary.Port())
					}
				}
				// Another client's transaction that writes only an unprotected table.
				other := connect(t, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
				if end == "COMMIT" {
					if _, err := other.Exec(ctx, "BEGIN"); err != nil {
						t.Fatal(err)
					}
					if _, err := other.Exec(ctx, "INSERT INTO notes VALUES (1)"); err != nil {
						t.Fatal(err)
					}
				}
				h.splitBrain(ctx, t)
				hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
				var endErr error
				if end == "COMMIT" {
					_, endErr = c.Exec(ctx, "COMMIT")
				} else {
					if endErr = pipe.Sync(); endErr == nil {
						var res any
						if res, endErr = pipe.GetResults(); endErr == nil {
							if _, synced := res.(*pgconn.PipelineSync); !synced {
								t.Errorf("the batch's Sync was answered with %T", res)
							}
						}
					}
				}
				var otherErr error
				if end == "COMMIT" {
					_, otherErr = other.Exec(ctx, "COMMIT")
				}
				if err := hold.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
				var n int
				if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 2 AND v = 7").Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 0 || endErr == nil {
					t.Errorf("%s of a fenced write's transaction on the withdrawn primary while the barrier ran: %v; rows committed there: %d, want FATAL 55F04 and none", end, endErr, n)
				}
				if endErr != nil && sqlstate(endErr) != "55F04" {
					t.Errorf("%s refused with %v, want 55F04", end, endErr)
				}
				if end == "COMMIT" {
					if err := admin.QueryRow(ctx, "SELECT count(*) FROM notes").Scan(&n); err != nil {
						t.Fatal(err)
					}
					if otherErr != nil || n != 1 {
						t.Errorf("a transaction writing only an unprotected table on the withdrawn primary: COMMIT %v, %d rows, want it committed", otherErr, n)
					}
				}
			})
		}
	}
}

// The COMMIT of such a transaction sent while a statement of it still runs (pipelined behind it) ends the session
// with FATAL 08007, not 55F04: the proxy cannot say the transaction did not commit when an answer is still owed
// (what runs may have been a COMMIT). Here the statement waits for a lock the test holds on the old primary, so
// it is still running when the COMMIT comes. From failover57 (2026-12-05): the refusal first said 55F04 and
// "did not commit" whatever was in flight.
// Since review57 the session is ended at the router's change, before the COMMIT comes: the running statement
// is cancelled first, so the transaction did not commit and 55F04 says so.
func TestCommitBehindARunningStatementOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			c, lock := fencedTxBesideALockedTable(ctx, t, h, admin)
			pipe := c.PgConn().StartPipeline(ctx)
			pipe.SendQueryParams("SELECT count(*) FROM notes", nil, nil, nil, nil)
			if err := pipe.Sync(); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "the statement to wait for the lock", func() bool {
				var n int
				err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT count(*) FROM notes' AND wait_event_type = 'Lock'").Scan(&n)
				return err == nil && n == 1
			})
			h.splitBrain(ctx, t)
			hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
			pipe.SendQueryParams("COMMIT", nil, nil, nil, nil)
			if err := pipe.Sync(); err != nil {
				t.Fatal(err)
			}
			var codes []string
			for range 10 {
				res, err := pipe.GetResults()
				if err != nil {
					codes = append(codes, sqlstate(err))
					if sqlstate(err) == "" || sqlstate(err) == "08007" {
						break
					}
					continue
				}
				if rr, ok := res.(*pgconn.ResultReader); ok {
					if _, err := rr.Close(); err != nil {
						codes = append(codes, sqlstate(err))
					}
				}
			}
			if err := lock.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := hold.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 2 AND v = 7").Scan(&n); err != nil {
				t.Fatal(err)
			}
			// Since review57 the router's change (the split brain) ends the session at once, the running statement
			// cancelled first (Server.fencedHostsRefused): 57014, then FATAL 55F04 (nothing was owed any more, the
			// COMMIT never went), or 08007 when the farewell comes while an answer is still owed.
			if n != 0 || !slices.Contains(codes, "08007") && !(slices.Contains(codes, "57014") && slices.Contains(codes, "55F04")) {
				t.Errorf("COMMIT pipelined behind a running statement on the withdrawn primary: errors %q, rows committed there %d; want FATAL 08007 (or the statement cancelled and FATAL 55F04) and none", codes, n)
			}
		})
	}
}
