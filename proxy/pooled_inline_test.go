package proxy_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/proxy"
)

// The session goroutine reads the answer to a client's unit itself (pooled.go: answerInline). It must not stay
// there when the answer is slow: a pooled client that goes away while its statement runs has the statement
// stopped (its server connection closed) within seconds, not when the statement ends.
func TestPooledClientVanishingStopsItsStatement(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	marker := fxName(t, "slow")
	running := activeStatements(t, f, marker)
	conn, fe, _ := rawStartup(t, f.p.Addr, pgproto3.ProtocolVersionNumber, nil)
	fe.Send(&pgproto3.Query{String: "SELECT pg_sleep(60) /* " + marker + " */"})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	// The inline read's wait arms the watch that stops it (pooled.go: inlineBegins), which looks once
	// inlineWait passed.
	eventually(t, 10*time.Second, "the watch of inline reads to look", func() bool { return proxy.InlineLooks(f.p.Server) > 0 })
	eventually(t, 10*time.Second, "the statement to run", func() bool { return running() == 1 })
	conn.Close()
	eventually(t, 10*time.Second, "the statement to stop after its client went away", func() bool { return running() == 0 })
	// The pool's one server connection serves the next client.
	pc := pooledPgConn(t, f, "")
	if _, err := pc.Exec(ctxT(t), "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	// The watch does not outlive the waits.
	if proxy.InlineWatching(f.p.Server) {
		t.Fatal("the watch of inline reads is armed after the last wait ended")
	}
}

// TestPooledInlineWatchSleepsWithoutWaits: the watch of inline reads is armed only while a wait is under way,
// so that a proxy whose clients come now and then (a connection per transaction) is not woken between them; it
// used to look every 5 ms for a second after each wait (200 wake-ups a second of the whole runtime).
func TestPooledInlineWatchSleepsWithoutWaits(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	pc := pooledPgConn(t, f, "")
	for round := 0; round < 3; round++ {
		if _, err := pc.Exec(ctxT(t), "SELECT 1").ReadAll(); err != nil {
			t.Fatal(err)
		}
		// The wait ended before the answer went to the client: nothing is left for the watch to look at.
		if proxy.InlineWatching(f.p.Server) {
			t.Fatalf("round %d: the watch of inline reads is armed with no wait under way", round)
		}
	}
}

// COPY FROM STDIN in transaction mode: the server waits for the client's data after its CopyInResponse, so the
// session goroutine that read the answer so far must go back to reading the client. The client sends its data
// only once it has the CopyInResponse, so that the data is not already there when the Query is forwarded.
func TestPooledCopyIn(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	table := "public." + fxName(t, "copy")
	if _, err := f.d.Exec(ctxT(t), "CREATE TABLE "+table+" (v int)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // a COPY left waiting holds the table
		defer cancel()
		f.d.Exec(ctx, "DROP TABLE IF EXISTS "+table)
	})
	_, fe, _ := rawStartup(t, f.p.Addr, pgproto3.ProtocolVersionNumber, nil) // reads and writes time out after 10s
	for round := 0; round < 3; round++ {
		fe.Send(&pgproto3.Query{String: "COPY " + table + " FROM STDIN"})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for done := false; !done; {
			m, err := fe.Receive()
			if err != nil {
				t.Fatalf("round %d: after %v: %v", round, got, err)
			}
			got = append(got, fmt.Sprintf("%T", m))
			switch m := m.(type) {
			case *pgproto3.CopyInResponse:
				fe.Send(&pgproto3.CopyData{Data: []byte("1\n2\n3\n")})
				fe.Send(&pgproto3.CopyDone{})
				if err := fe.Flush(); err != nil {
					t.Fatal(err)
				}
			case *pgproto3.CommandComplete:
				if string(m.CommandTag) != "COPY 3" {
					t.Fatalf("round %d: %s, want COPY 3", round, m.CommandTag)
				}
			case *pgproto3.ErrorResponse:
				t.Fatalf("round %d: %s %s", round, m.Code, m.Message)
			case *pgproto3.ReadyForQuery:
				done = true
			}
		}
	}
	var n int
	if err := f.d.QueryRow(ctxT(t), "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 9 {
		t.Fatalf("rows copied: %d (%v), want 9", n, err)
	}
}

// A client idle in a transaction block holds its server connection with nothing reading it (the answer to each
// message is read inline): when the server ends that connection meanwhile (pg_terminate_backend, or
// idle_in_transaction_session_timeout), the client's next message gets the server's own FATAL, as when a reader
// relayed it at once, and never runs; in both protocols. Nothing looks at the socket before the message goes
// (heldMoved): what reads the message's answer reads the FATAL first.
func TestPooledTerminatedWhileIdleInTransaction(t *testing.T) {
	f := newPooledFenced(t, 2, "")
	ctx := ctxT(t)
	for _, mode := range []string{"simple_protocol", "exec", "cache_statement"} {
		for _, end := range []string{"terminate", "idle timeout"} {
			t.Run(mode+"/"+end, func(t *testing.T) {
				c := pooledConn(t, f, "&default_query_exec_mode="+mode)
				tx, err := c.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var pid int
				if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					t.Fatal(err)
				}
				code, msg := "57P01", "terminating connection due to administrator command"
				if end == "terminate" {
					var ok bool
					if err := f.d.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
						t.Fatalf("pg_terminate_backend(%d): %v %v", pid, ok, err)
					}
				} else {
					code, msg = "25P03", "terminating connection due to idle-in-transaction timeout"
					if _, err := tx.Exec(ctx, "SET LOCAL idle_in_transaction_session_timeout = '50ms'"); err != nil {
						t.Fatal(err)
					}
				}
				eventually(t, 10*time.Second, "the backend to end", func() bool {
					var n int
					err := f.d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n)
					return err == nil && n == 0
				})
				_, err = tx.Exec(ctx, "INSERT INTO "+f.label+" (id, fence_token) VALUES (9, 1)")
				wantPgErr(t, err, code, msg)
				var n int
				if err := f.d.QueryRow(ctx, "SELECT count(*) FROM "+f.label+" WHERE id = 9").Scan(&n); err != nil || n != 0 {
					t.Fatalf("rows with id 9: %d (%v); the INSERT must not have run", n, err)
				}
			})
		}
	}
}

// A pooled client in a transaction block when the proxy starts to shut down may go on with its transaction
// (the drain waits for it). A slow statement it sends then is read by a serveLend after inlineWait, as before
// the drain, so that when the drain's time is up the session ends, its statement is cancelled and Shutdown
// returns: it does not wait for the statement.
func TestPooledShutdownCutsAStatementSentWhileDraining(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	marker := fxName(t, "drain")
	running := activeStatements(t, f, marker)
	_, fe, _ := rawStartup(t, f.p.Addr, pgproto3.ProtocolVersionNumber, nil)
	sendUntil[*pgproto3.ReadyForQuery](t, fe, &pgproto3.Query{String: "BEGIN"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	shutdown := make(chan time.Time, 1)
	go func() {
		f.p.Server.Shutdown(ctx)
		shutdown <- time.Now()
	}()
	// The listener closes after the pools: once it refuses connections, the drain is under way.
	eventually(t, 10*time.Second, "the proxy to stop accepting", func() bool {
		c, err := net.DialTimeout("tcp", f.p.Addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	fe.Send(&pgproto3.Query{String: "SELECT pg_sleep(60) /* " + marker + " */"})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	eventually(t, 10*time.Second, "the statement to run", func() bool { return running() == 1 })
	select {
	case at := <-shutdown:
		if d := at.Sub(start); d > 15*time.Second {
			t.Fatalf("Shutdown returned %v after the statement started, with 2 s to drain", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Shutdown still waits 30 s after the statement started, with 2 s to drain: it waits for the statement")
	}
	eventually(t, 10*time.Second, "the statement to be cancelled", func() bool { return running() == 0 })
}

// An answer whose first bytes came (a NOTICE, sent at once) and whose rest is slow is read inline with no limit.
// When the drain's time is up (forceClose), the statement is cancelled and its server connection closed, so
// that the session ends and Shutdown returns: it does not wait for the statement.
func TestPooledShutdownCutsAStalledAnswer(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	marker := fxName(t, "stall")
	running := activeStatements(t, f, marker)
	_, fe, _ := rawStartup(t, f.p.Addr, pgproto3.ProtocolVersionNumber, nil)
	// The marker first: pg_stat_activity keeps the first 1 KB of the text, the token statement's included.
	sendUntil[*pgproto3.NoticeResponse](t, fe, &pgproto3.Query{String: "DO $$BEGIN RAISE NOTICE 'first bytes'; PERFORM pg_sleep(60 /* " + marker + " */); END$$"})
	eventually(t, 10*time.Second, "the statement to run", func() bool { return running() == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no time to drain: the proxy closes every session at once
	shutdown := make(chan struct{})
	go func() {
		f.p.Server.Shutdown(ctx)
		close(shutdown)
	}()
	select {
	case <-shutdown:
	case <-time.After(30 * time.Second):
		t.Fatal("Shutdown still waits 30 s after it closed every session: it waits for the stalled answer")
	}
	eventually(t, 10*time.Second, "the statement to be cancelled", func() bool { return running() == 0 })
}

// activeStatements counts, on the server, the statements running now whose text holds marker (in its first
// kilobyte, which pg_stat_activity keeps).
func activeStatements(t *testing.T, f *fenced, marker string) func() int {
	return func() int {
		var n int
		if err := f.d.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active' AND query LIKE '%' || $1 || '%'", marker).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// awaitOneActive waits up to 20 s for exactly one statement holding marker to run on the server (what names it).
func awaitOneActive(t *testing.T, f *fenced, what, marker string) {
	t.Helper()
	running := activeStatements(t, f, marker)
	eventually(t, 20*time.Second, what, func() bool { return running() == 1 })
}

// sendUntil sends msg and reads the answers up to the first of type T.
func sendUntil[T pgproto3.BackendMessage](t *testing.T, fe *pgproto3.Frontend, msg pgproto3.FrontendMessage) {
	t.Helper()
	if err := exchange(fe, []pgproto3.FrontendMessage{msg}, func(m pgproto3.BackendMessage) bool {
		_, ok := m.(T)
		return ok
	}); err != nil {
		t.Fatal(err)
	}
}
