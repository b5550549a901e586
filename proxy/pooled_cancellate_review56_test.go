package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// A cancel the proxy sends on to the server is taken once PostgreSQL closes the cancel's connection
// (cancelUpstream); the proxy gives up waiting for that after 5 s. A cancel it gave up on is not thereby gone: it
// may still be on its way (a postmaster slow to fork under load, a relay, a network that holds it) and reach the
// backend later. The connection it went to must then serve nobody else: absorbCancel takes off only a cancel
// that already arrived. Here the cancel is held (cancelHoldingRelay) past the proxy's 5 s, the connection's next
// user on a pool of one is b, and the cancel is let go while b's statement runs: b must not get a's 57014.
func TestPooledCancelGivenUpOnNeverReachesAnotherClient(t *testing.T) {
	pgtest.Require(t, pg)
	relay, f, a, b := startCancelRelayPool(t, "30s")
	ctx := ctxT(t)
	run := func(c *pgx.Conn, sql string) chan cancelAnswer { return queryIntAsync(ctx, c, sql) }
	first := run(a, "SELECT 1 FROM pg_sleep(0.3) AS cancel_subject")
	awaitOneActive(t, f, "a's statement running", "cancel_subject")
	cancelled := make(chan error, 1)
	go func() { cancelled <- sendCancelRequest(f.p.Addr, a.PgConn().PID(), a.PgConn().SecretKey()) }()
	relay.awaitArrival(t, "a's cancel")
	if got := <-first; got.err != nil || got.v != 1 {
		t.Fatalf("a got %d, %v; want 1", got.v, got.err)
	}
	// b waits for the one connection, which a's lend keeps until the proxy gives up on a's cancel (5 s).
	bAnswer := run(b, "SELECT 2 FROM pg_sleep(1.5) AS b_subject")
	if err := <-cancelled; err != nil {
		t.Fatalf("a's CancelRequest: %v", err)
	}
	awaitOneActive(t, f, "b's statement running", "b_subject")
	relay.Release() // a's cancel, given up on by the proxy, reaches the server now
	select {
	case got := <-bAnswer:
		if got.err != nil || got.v != 2 {
			t.Fatalf("b, after a's late cancel arrived: %d, %v; want 2 (a's cancel stopped b's statement)", got.v, got.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("b did not end within 20s")
	}
}

// The same in session mode with upstream reuse: a cancel the proxy gave up on (held past its 5 s) is not known
// delivered when the session ends, and keep's reset (DISCARD ALL) does not take it off either. The backend must
// not be kept: the next session would get it, and the late cancel would stop that session's statement.
func TestSessionCancelGivenUpOnNeverReachesTheNextSession(t *testing.T) {
	pgtest.Require(t, pg)
	relay := startCancelHoldingRelay(t, pg.Addr())
	p := proxytest.Start(t, relay.ln.Addr().String(), proxytest.Options{})
	dsn := reuseDSN(p, reuseApp(t))

	a := connect(t, dsn)
	pidA := pidOf(t, a)
	cancelSent := make(chan error, 1)
	go func() { cancelSent <- sendCancelRequest(p.Addr, a.PgConn().PID(), a.PgConn().SecretKey()) }()
	relay.awaitArrival(t, "a's CancelRequest")
	if err := <-cancelSent; err != nil { // the proxy gives up on it after 5 s
		t.Fatalf("a's CancelRequest: %v", err)
	}
	closeConn(t, a)
	eventually(t, 10*time.Second, "a's session to end", func() bool {
		return strings.Contains(p.Logs.String(), "connection ended")
	})

	b := connect(t, dsn)
	defer closeConn(t, b)
	if pidOf(t, b) != pidA {
		return // a's backend was not kept
	}
	// Kept: what the late cancel does to b's statement on it.
	held := holdQuery(t, b)
	relay.Release()
	select {
	case err := <-held.done:
		t.Fatalf("a's backend was kept though a's cancel was not seen taken; a's late cancel ended b's statement: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("a's backend was kept though a's cancel was not seen taken (here the late cancel missed b's statement)")
	}
}
