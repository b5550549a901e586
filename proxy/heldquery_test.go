package proxy_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// heldQuery is a query, run on a session through the proxy, that waits for an advisory lock a direct connection
// holds. It is active in pg_stat_activity, provably, for as long as the test keeps the lock, so a cancel sent in
// that time reaches a running query (PostgreSQL ignores a cancel for an idle backend, which would make a "the
// cancel did not stop it" check pass vacuously). Released, it finishes without error; cancelled, with 57014.
type heldQuery struct {
	d    *pgx.Conn
	key  int64
	pid  uint32
	done chan error
}

// holdQuery starts the query on c and returns once the server shows it waiting for the lock.
func holdQuery(t *testing.T, c *pgx.Conn) *heldQuery {
	t.Helper()
	ctx := ctxT(t)
	h := &heldQuery{d: direct(t), key: rand.Int64(), pid: c.PgConn().PID(), done: make(chan error, 1)}
	if _, err := h.d.Exec(ctx, "SELECT pg_advisory_lock($1)", h.key); err != nil {
		t.Fatalf("take the advisory lock: %v", err)
	}
	go func() {
		_, err := c.Exec(ctx, "SELECT pg_advisory_lock($1), pg_advisory_unlock($1)", h.key)
		h.done <- err
	}()
	eventually(t, 20*time.Second, "the held query to be active, waiting for the advisory lock", func() bool {
		var waiting bool
		err := h.d.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND state = 'active'
			AND wait_event_type = 'Lock' AND wait_event = 'advisory')`, h.pid).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	return h
}

// stillRunning fails the test if the query has ended.
func (h *heldQuery) stillRunning(t *testing.T, after string) {
	t.Helper()
	select {
	case err := <-h.done:
		t.Fatalf("the held query ended (%v) after %s", err, after)
	default:
	}
}

// release lets the query finish and returns its error. The wait is bounded only so that a hang fails the test.
func (h *heldQuery) release(t *testing.T) error {
	t.Helper()
	if _, err := h.d.Exec(ctxT(t), "SELECT pg_advisory_unlock($1)", h.key); err != nil {
		t.Fatalf("release the advisory lock: %v", err)
	}
	select {
	case err := <-h.done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the held query did not finish within 20s of its lock's release")
		return nil
	}
}
