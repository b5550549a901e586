package proxy_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A second cancel of a's that comes while settle waits (pl.mu held) for a's first, still on its way: the second
// must neither go to the connection once it is back in the pool nor be held for ever; b, next on the pool of
// one, runs its statement untouched, and both of a's cancel connections are answered.
func TestPooledCancelWhileSettleWaitsForAnother(t *testing.T) {
	pgtest.Require(t, pg)
	relay, f, a, b := startCancelRelayPool(t, "20s")
	ctx := ctxT(t)
	run := func(c *pgx.Conn, sql string) chan cancelAnswer { return queryIntAsync(ctx, c, sql) }
	first := run(a, "SELECT 1 FROM pg_sleep(0.3) AS settle_subject")
	awaitOneActive(t, f, "a's statement running", "settle_subject")
	cancels := make(chan error, 2)
	go func() { cancels <- sendCancelRequest(f.p.Addr, a.PgConn().PID(), a.PgConn().SecretKey()) }()
	relay.awaitArrival(t, "a's first cancel")
	if got := <-first; got.err != nil || got.v != 1 {
		t.Fatalf("a got %d, %v; want 1", got.v, got.err)
	}
	// settle now waits for the first cancel, holding the session's lock; the second waits for that lock.
	go func() { cancels <- sendCancelRequest(f.p.Addr, a.PgConn().PID(), a.PgConn().SecretKey()) }()
	bAnswer := run(b, "SELECT 2 FROM pg_sleep(0.5) AS b_settle_subject")
	relay.Release()
	for range 2 {
		select {
		case err := <-cancels:
			if err != nil {
				t.Fatalf("a's CancelRequest: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a cancel connection of a's was not answered within 20s")
		}
	}
	select {
	case got := <-bAnswer:
		if got.err != nil || got.v != 2 {
			t.Fatalf("b after a's two cancels: %d, %v; want 2", got.v, got.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("b did not end within 20s")
	}
	if got := <-run(a, "SELECT 3"); got.err != nil || got.v != 3 {
		t.Fatalf("a's next statement: %d, %v; want 3", got.v, got.err)
	}
}
