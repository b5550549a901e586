package proxy_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Cancels and pinned clients in transaction pooling, from a review on 2026-12-03 that found them holding: a
// client's cancel never reaches another client's statement, a cancel of the proxy's hidden Parse leaves the
// client's statement to be prepared again, and a pinned client leaves nothing on the connection the next client
// gets. (Test names hold none of "fence", "prepare", "temp", "create", "alter": fxName puts the test's name into
// the table's name, and those words change how the pool treats a text.)

// TestPooledPinnedClientLeavesNothing: pool.size 1. A client pinned by each kind of state (a temporary table,
// LISTEN, a session advisory lock, a WITH HOLD cursor, SET ROLE) ends, idle or in the middle of a transaction
// block, with or without Terminate; the next client of the pool finds none of it: no temporary table, no
// channel, no advisory lock, no cursor, the login role, no statement, neither of its tokens.
func TestPooledPinnedClientLeavesNothing(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 10s\n")
	fxExec(t, f.d, "DROP ROLE IF EXISTS pinned_plain")
	fxExec(t, f.d, "CREATE ROLE pinned_plain")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP ROLE IF EXISTS pinned_plain") })
	q := "&default_query_exec_mode=simple_protocol"
	states := []string{
		"CREATE TEMP TABLE pinned_tt (x int)",
		"LISTEN pinned_ch",
		"SELECT pg_advisory_lock(777)",
		"BEGIN; DECLARE pinned_cur CURSOR WITH HOLD FOR SELECT 1; COMMIT",
		"SET ROLE pinned_plain",
	}
	for _, how := range []string{"idle-terminate", "idle-close", "in-block-close"} {
		for _, st := range states {
			t.Run(how+"/"+st[:12], func(t *testing.T) {
				a, err := pgconn.Connect(ctxT(t), f.dsn()+"&options=-c%20fence.token%3D5")
				if err != nil {
					t.Fatal(err)
				}
				if err := a.Exec(ctxT(t), st).Close(); err != nil {
					t.Fatal(err)
				}
				if err := a.Exec(ctxT(t), "SET fence.token = 9").Close(); err != nil {
					t.Fatal(err)
				}
				if strings.HasPrefix(how, "in-block") {
					if err := a.Exec(ctxT(t), "BEGIN; SELECT 1").Close(); err != nil {
						t.Fatal(err)
					}
				}
				switch how {
				case "idle-terminate":
					a.Close(ctxT(t))
				default:
					a.Conn().Close()
				}
				b := pooledConn(t, f, q)
				var tt, ch, adv, cur, prep int
				var user, tok string
				err = b.QueryRow(ctxT(t), `SELECT
					(SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema())::int,
					(SELECT count(*) FROM pg_listening_channels())::int,
					(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())::int,
					(SELECT count(*) FROM pg_cursors)::int,
					(SELECT count(*) FROM pg_prepared_statements WHERE name NOT LIKE 'fenceproxy%')::int,
					current_user, current_setting('fence.token', true)`).Scan(&tt, &ch, &adv, &cur, &prep, &user, &tok)
				if err != nil {
					t.Fatal(err)
				}
				if tt+ch+adv+cur+prep != 0 || user == "pinned_plain" || tok == "9" || tok == "5" {
					t.Fatalf("the next client found the pinned client's state: temp %d listen %d advisory %d cursors %d statements %d user %s token %q", tt, ch, adv, cur, prep, user, tok)
				}
				b.Close(ctxT(t))
			})
		}
	}
}

// TestPooledCancelOfHiddenParse: pool.size 1. A prepares a named fenced UPDATE; B uses the connection, so A's next
// Bind of it gets the proxy's own Close and Parse in front (prepared again: B's function could have replaced it).
// That Parse waits for a lock held directly on the table; A cancels. A must get 57014, and its next Bind of the
// statement must run (prepared again), with A's token; and B's session must be untouched.
func TestPooledCancelOfHiddenParse(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 10s\n")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, balance, fence_token) VALUES (1, 0, 1)")
	a, err := pgconn.Connect(ctxT(t), f.dsn()+"&options=-c%20fence.token%3D5")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol&options=-c%20fence.token%3D6")
	if _, err := a.Prepare(ctxT(t), "s", "UPDATE "+f.label+" SET balance = balance + $1 WHERE id = 1", nil); err != nil {
		t.Fatal(err)
	}
	if err := a.ExecPrepared(ctxT(t), "s", [][]byte{[]byte("1")}, nil, nil).Read().Err; err != nil {
		t.Fatal(err)
	}
	fxExec(t, b, "SELECT 1")
	lock, err := f.d.Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctxT(t), "LOCK TABLE "+f.label+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.ExecPrepared(ctxT(t), "s", [][]byte{[]byte("10")}, nil, nil).Read().Err }()
	eventually(t, 5*time.Second, "A's batch waiting for the lock", func() bool {
		var n int
		// f.d is inside lock's transaction, where pg_stat_activity is a snapshot kept until its end: a look
		// taken before A's batch got to the lock would stay the answer.
		f.d.Exec(ctxT(t), "SELECT pg_stat_clear_snapshot()")
		f.d.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()").Scan(&n)
		return n > 0
	})
	if err := a.CancelRequest(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	var aerr error
	select {
	case aerr = <-done:
	case <-time.After(5 * time.Second):
		lock.Rollback(ctxT(t))
		t.Fatal("A's cancelled batch hangs")
	}
	lock.Rollback(ctxT(t))
	var pe *pgconn.PgError
	if !errors.As(aerr, &pe) || pe.Code != "57014" {
		t.Fatalf("A's cancelled batch: %v, want 57014", aerr)
	}
	if err := a.ExecPrepared(ctxT(t), "s", [][]byte{[]byte("100")}, nil, nil).Read().Err; err != nil {
		t.Fatalf("A's statement after the cancel: %v", err)
	}
	fxExec(t, b, "SELECT 1")
	if got := fxSnapshot(t, f.d, f.label); got != "1:101:5" {
		t.Fatalf("rows %s, want 1:101:5", got)
	}
}

// TestPooledCancelStormNeverHitsAnother: pool.size 1, so A and B share one server connection. A runs a mix of
// units (plain, checked, lone BEGIN blocks, with settings of its own so that a settings unit and the put-back go
// first on a connection B used) while a goroutine sends A's CancelRequests all the time. B runs pg_sleep
// statements: none of B's statements may ever be cancelled (57014), and B's session must go on.
func TestPooledCancelStormNeverHitsAnother(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 20s\n")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, balance, fence_token) VALUES (1, 0, 1)")
	q := "&default_query_exec_mode=simple_protocol"
	a := pooledConn(t, f, q+"&application_name=app_a&options=-c%20fence.token%3D5%20-c%20search_path%3Dpublic")
	b := pooledConn(t, f, q+"&application_name=app_b&options=-c%20fence.token%3D6")
	ctx := ctxT(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var aCancelled, aOther atomic.Int64
	var aErr atomic.Value
	wg.Add(2)
	go func() { // A's units
		defer wg.Done()
		stmts := []string{
			"SELECT 1",
			"SELECT pg_sleep(0.003)",
			"UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1",
			"SET application_name = 'app_a2'",
			"SELECT 1; SELECT 2",
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			var err error
			if i%6 == 5 {
				if _, err = a.Exec(ctx, "BEGIN"); err == nil {
					if _, err = a.Exec(ctx, "UPDATE "+f.label+" SET balance = balance + 1 WHERE id = 1"); err == nil {
						_, err = a.Exec(ctx, "COMMIT")
					}
				}
				if err != nil {
					a.Exec(ctx, "ROLLBACK")
				}
			} else {
				_, err = a.Exec(ctx, stmts[i%len(stmts)])
			}
			var pe *pgconn.PgError
			switch {
			case err == nil:
			case errors.As(err, &pe) && (pe.Code == "57014" || pe.Code == "55F01"):
				aCancelled.Add(1)
			default:
				aOther.Add(1)
				aErr.Store(err.Error())
				if a.IsClosed() {
					return
				}
			}
		}
	}()
	go func() { // A's cancels
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			a.PgConn().CancelRequest(cctx)
			cancel()
			time.Sleep(time.Duration(200+time.Now().UnixNano()%1500) * time.Microsecond)
		}
	}()
	bCancelled, bRuns := 0, 0
	var bErr error
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); bRuns++ {
		_, err := b.Exec(ctx, "SELECT pg_sleep(0.004)")
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "57014" {
			bCancelled++
		} else if err != nil {
			bErr = err
			break
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("B ran %d statements; A: %d cancelled, %d other errors (%v)", bRuns, aCancelled.Load(), aOther.Load(), aErr.Load())
	if bErr != nil {
		t.Fatalf("B's session failed: %v", bErr)
	}
	if bCancelled > 0 {
		t.Fatalf("%d of B's statements were cancelled by A's CancelRequests", bCancelled)
	}
	if aOther.Load() > 0 {
		t.Fatalf("A got %d errors other than 57014 under its own cancels, last: %v", aOther.Load(), aErr.Load())
	}
}
