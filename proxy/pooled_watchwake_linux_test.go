package proxy_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// A client pipelines a unit behind one blocked on a lock and half-closes its socket at once (its FIN, as a
// driver that gives up sends), while the pool holds that unit until the one before is answered (awaitSettled).
// The session goroutine reads the client no more then; what sees the client leave is the watch of its socket
// (watchClient). Once it has, the session ends: first a cancel of the blocked unit, which the proxy dials the
// server for, then the server connection closed and the slot freed. Until 2026-12-05 the watch looked every
// 100 ms from the wait's start, so the leaver was seen, and its cancel dialed, 100 ms after the wait began at
// the earliest, however soon the client left; now the socket's end wakes the wait, through the client
// watcher's epoll set (one wake-up of it, which the test counts). The cancel must reach the relay in front of
// the server well within 100 ms of the moment the unit was sent (the wait cannot start before it, so a look
// every 100 ms from the wait's start always comes later). The rest of the end (PostgreSQL forks a process for
// the cancel) takes tens of milliseconds on a loaded machine, and is not what is timed.
func TestPooledClientVanishingIsSeenAtOnce(t *testing.T) {
	pgtest.Require(t, pg)
	relay := startCancelHoldingRelay(t, pg.Addr())
	relay.Release() // cancels pass at once: the relay only says when one arrives
	d := direct(t)
	name := fxName(t, "ww")
	fxCreateTable(t, d, "public."+name)
	p := proxytest.Start(t, relay.ln.Addr().String(), proxytest.Options{
		YAML: fxTables("public."+name) + "pool:\n  mode: transaction\n  size: 1\n  max_client_wait: 15s\nauth:\n  type: trust\n",
	})
	hold := connect(t, pg.SuperDSN())
	fxExec(t, hold, "SELECT pg_advisory_lock(5310)")
	a := dialRaw(t, p.Addr, pgtest.SuperUser, pgtest.TestDB, nil)
	a.fe.Send(&pgproto3.Query{String: "SELECT pg_advisory_xact_lock(5310) AS watchwake_busy"})
	if err := a.fe.Flush(); err != nil {
		t.Fatal(err)
	}
	cond := "wait_event_type = 'Lock' AND query LIKE '%watchwake_busy%' AND pid <> pg_backend_pid()"
	eventually(t, 10*time.Second, "the subject's first unit waiting for the lock", func() bool {
		var n int
		err := d.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE "+cond).Scan(&n)
		return err == nil && n == 1
	})
	a.fe.Send(&pgproto3.Query{String: "SELECT 'never' AS watchwake_next"})
	sent := time.Now()
	if err := a.fe.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := a.conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	relay.awaitArrival(t, "the cancel of the leaver's blocked unit")
	seen := time.Since(sent)
	t.Logf("the leaver's cancel reached the relay %v after its unit was sent", seen.Round(100*time.Microsecond))
	if seen >= 50*time.Millisecond {
		t.Errorf("the leaver's cancel reached the relay %v after its unit was sent, want well below 100 ms", seen.Round(time.Millisecond))
	}
	a.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, a.conn); err != nil { // nothing is answered: the session's end closes it
		t.Fatalf("the leaver's socket: %v", err)
	}
	if n := proxy.ClientWatchWakes(p.Server); n != 1 {
		t.Errorf("the client watcher's epoll set woke %d waits, want 1: the leaver's", n)
	}
	eventually(t, 10*time.Second, "the leaver's backend gone", func() bool {
		var n int
		err := d.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE "+cond).Scan(&n)
		return err == nil && n == 0
	})
}
