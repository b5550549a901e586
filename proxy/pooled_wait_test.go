package proxy_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// The client's wait for a server connection of a full pool: what ends it besides a connection. Each test has a
// pool of one server connection held by client a's open transaction while client b waits, and PostgreSQL
// judges whether b's statement ran.

// waitingClients waits until the pool's SHOW POOLS says n clients wait for a server connection.
func waitingClients(t *testing.T, adm *pgx.Conn, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rows := adminRows(t, adm, "SHOW POOLS")
		got := "none"
		for _, r := range rows {
			if r["database"] != "fenceproxy" {
				got = r["cl_waiting"].(string)
			}
		}
		if got == strconv.Itoa(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("SHOW POOLS: %s clients waiting, want %d (%v)", got, n, rows)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fullPool makes a pool of one server connection (max_client_wait 20 s, an admin console) whose connection
// client a's open transaction holds, and the table client b writes to; it returns the pool, the admin console,
// a and the table.
func fullPool(t *testing.T) (f *fenced, adm, a *pgx.Conn, tbl string) {
	t.Helper()
	f = newPooledFenced(t, 1, "  max_client_wait: 20s\n  admin_users: [admin]\n")
	adm = adminConn(t, f)
	tbl = fxName(t, "w")
	fxExec(t, f.d, "CREATE TABLE "+tbl+" (x int)")
	a = pooledConn(t, f, "")
	fxExec(t, a, "BEGIN")
	return f, adm, a, tbl
}

// rowsOf counts the rows of tbl, directly.
func rowsOf(t *testing.T, f *fenced, tbl string) int {
	t.Helper()
	var n int
	if err := f.d.QueryRow(ctxT(t), "SELECT count(*) FROM "+tbl).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A client that disconnects while it waits (its process killed, a driver that closes the socket on a timeout)
// is dropped: its INSERT never runs, though the connection it waited for frees. Without the proxy's look at
// the client's socket during the wait (waitStopped: peerClosed) the INSERT committed once a committed.
//
// It is seen by TCP's state, not by an empty socket: drivers send Terminate before they close (libpq's
// PQfinish, JDBC), a client may have pipelined more, and TLS sends close_notify; a look for EOF missed all of
// those, and the INSERT ran.
func TestPooledWaiterThatLeftNeverRuns(t *testing.T) {
	for _, leave := range []struct {
		name string
		last []pgproto3.FrontendMessage // sent before the close
	}{
		{"closed", nil},
		{"terminated", []pgproto3.FrontendMessage{&pgproto3.Terminate{}}},
		{"pipelined", []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 2"}}},
	} {
		t.Run(leave.name, func(t *testing.T) {
			f, adm, a, tbl := fullPool(t)
			b := pooledPgConn(t, f, "")
			hj, err := b.Hijack()
			if err != nil {
				t.Fatal(err)
			}
			hj.Frontend.Send(&pgproto3.Query{String: "INSERT INTO " + tbl + " VALUES (1)"})
			if err := hj.Frontend.Flush(); err != nil {
				t.Fatal(err)
			}
			waitingClients(t, adm, 1)
			for _, m := range leave.last {
				hj.Frontend.Send(m)
			}
			if err := hj.Frontend.Flush(); err != nil {
				t.Fatal(err)
			}
			hj.Conn.Close()
			waitingClients(t, adm, 0)
			fxExec(t, a, "COMMIT") // the connection frees
			fxExec(t, a, "SELECT 1")
			if n := rowsOf(t, f, tbl); n != 0 {
				t.Fatalf("the INSERT of a client that disconnected while waiting ran afterwards (%d rows)", n)
			}
		})
	}
}

// A cancel of a lone Sync that waits (an idle client's: nothing runs) is ignored as the server ignores it: the
// Sync gets its ReadyForQuery, and the session's next Query is answered. Before, a lone Flush that waited got
// 57014 and the session skipped to a Sync that never came: the Query got no answer. A lone Flush no longer waits
// for a connection at all (TestPooledLoneFlushHoldsNothing).
func TestPooledCancelledLoneSync(t *testing.T) {
	cancelledLone(t, &pgproto3.Sync{})
}

// cancelledLone is TestPooledCancelledLoneSync for the message lone.
func cancelledLone(t *testing.T, lone pgproto3.FrontendMessage) {
	f, adm, a, _ := fullPool(t)
	b := pooledPgConn(t, f, "")
	hj, err := b.Hijack()
	if err != nil {
		t.Fatal(err)
	}
	hj.Frontend.Send(lone)
	if err := hj.Frontend.Flush(); err != nil {
		t.Fatal(err)
	}
	waitingClients(t, adm, 1)
	sendCancel(t, f.p.Addr, hj.PID, hj.SecretKey)
	waitingClients(t, adm, 0)
	fxExec(t, a, "COMMIT")
	hj.Frontend.Send(&pgproto3.Query{String: "SELECT 1"})
	if err := hj.Frontend.Flush(); err != nil {
		t.Fatal(err)
	}
	hj.Conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []string
	for {
		m, err := hj.Frontend.Receive()
		if err != nil {
			t.Fatalf("%T cancelled while waiting, then SELECT 1: %v after %v", lone, err, got)
		}
		got = append(got, fmt.Sprintf("%T", m))
		if _, ok := m.(*pgproto3.ReadyForQuery); ok && len(got) > 1 {
			break
		}
	}
	want := "[*pgproto3.RowDescription *pgproto3.DataRow *pgproto3.CommandComplete *pgproto3.ReadyForQuery]"
	if _, sync := lone.(*pgproto3.Sync); sync {
		want = "[*pgproto3.ReadyForQuery " + want[1:]
	}
	if fmt.Sprint(got) != want {
		t.Fatalf("%T cancelled while waiting, then SELECT 1: %v, want %s", lone, got, want)
	}
	hj.Conn.Close()
}

// A client's CancelRequest while it waits ends the wait: its statement never runs, it gets 57014 at once, and
// its session goes on. The extended protocol's batch is skipped up to its Sync. Without it, the cancel waited
// for the wait (the session held its lock), and then reached a statement already over: the INSERT committed.
func TestPooledCancelWhileWaiting(t *testing.T) {
	for _, mode := range []string{"simple_protocol", "exec"} {
		t.Run(mode, func(t *testing.T) {
			f, adm, a, tbl := fullPool(t)
			b := pooledConn(t, f, "&default_query_exec_mode="+mode)
			res := make(chan error, 1)
			go func() {
				_, err := b.Exec(context.Background(), "INSERT INTO "+tbl+" VALUES ($1)", 1)
				res <- err
			}()
			waitingClients(t, adm, 1)
			if err := b.PgConn().CancelRequest(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			var err error
			select {
			case err = <-res:
			case <-time.After(10 * time.Second):
				t.Fatal("the cancelled INSERT still waits for the pool")
			}
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "57014" {
				t.Fatalf("cancelled while waiting: %v, want 57014", err)
			}
			fxExec(t, a, "COMMIT")
			if n := rowsOf(t, f, tbl); n != 0 {
				t.Fatalf("the INSERT cancelled while it waited ran (%d rows)", n)
			}
			// The session goes on, its protocol in step: the next statement runs.
			fxExec(t, b, "INSERT INTO "+tbl+" VALUES ($1)", 2)
			if n := rowsOf(t, f, tbl); n != 1 {
				t.Fatalf("after the cancelled wait, the next INSERT gave %d rows, want 1", n)
			}
		})
	}
}

// A client that leaves during PAUSE (its driver's timeout: pgx cancels, then closes) has nothing run at RESUME.
func TestPooledWaiterThatLeftDuringPause(t *testing.T) {
	f := newPooledFenced(t, 2, "  max_client_wait: 20s\n  admin_users: [admin]\n")
	adm := adminConn(t, f)
	tbl := fxName(t, "w")
	fxExec(t, f.d, "CREATE TABLE "+tbl+" (x int)")
	b := pooledPgConn(t, f, "")
	adminRows(t, adm, "PAUSE")
	resumed := false
	defer func() {
		if !resumed {
			adminRows(t, adm, "RESUME")
		}
	}()
	qctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	_, err := b.Exec(qctx, "INSERT INTO "+tbl+" VALUES (1)").ReadAll()
	cancel()
	if err == nil {
		t.Fatal("the INSERT ran during PAUSE")
	}
	waitingClients(t, adm, 0)
	adminRows(t, adm, "RESUME")
	resumed = true
	c := pooledConn(t, f, "")
	fxExec(t, c, "SELECT 1") // a transaction after RESUME: the pool lends again
	if n := rowsOf(t, f, tbl); n != 0 {
		t.Fatalf("RESUME ran the INSERT of a client that left during the pause (%d rows)", n)
	}
}

// A drain refuses the clients waiting for a server connection at once (57P01, as an idle client is), and
// Shutdown's deadline runs nothing of theirs: before, the place freed by closing a's connection went to b's
// wait, and b's INSERT ran on a connection opened after the deadline.
func TestPooledShutdownRefusesWaiters(t *testing.T) {
	f, adm, _, tbl := fullPool(t)
	b := pooledPgConn(t, f, "")
	res := make(chan error, 1)
	go func() {
		_, err := b.Exec(context.Background(), "INSERT INTO "+tbl+" VALUES (1)").ReadAll()
		res <- err
	}()
	waitingClients(t, adm, 1)
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- f.p.Server.Shutdown(sctx) }()
	var err error
	select {
	case err = <-res:
	case <-time.After(time.Second / 2):
		t.Fatal("the drain left the waiting client waiting")
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57P01" {
		t.Fatalf("waiting client at the drain: %v, want 57P01", err)
	}
	<-shut
	if n := rowsOf(t, f, tbl); n != 0 {
		t.Fatalf("the waiting client's INSERT ran during the shutdown (%d rows)", n)
	}
}

// An idle admin console does not hold Shutdown: the drain ends it (57P01) as it ends an idle client. Before, the
// console was not among the sessions a drain looks at, and Shutdown never returned while one was open.
func TestPooledAdminConsoleDoesNotHoldShutdown(t *testing.T) {
	f := newPooledFenced(t, 1, "  admin_users: [admin]\n")
	adm := adminConn(t, f)
	adminRows(t, adm, "SHOW POOLS")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- f.p.Server.Shutdown(sctx) }()
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown with an idle admin console: %v", err)
		}
	case <-time.After(15 * time.Second):
		adm.Close(context.Background()) // lets Shutdown return, so that the test ends
		<-shut
		t.Fatal("Shutdown (5 s deadline) had not returned after 15 s: the idle admin console held it")
	}
	err := adm.Ping(ctxT(t))
	var pe *pgconn.PgError
	if err == nil || errors.As(err, &pe) && pe.Code != "57P01" {
		t.Fatalf("the admin console after the drain: %v, want its session ended", err)
	}
}

// pool.min_idle's keeper keeps working after the pool was full: with every place lent and a connection closed
// while clients wait (its place goes to a waiter), the keeper found no place and ended for good; the pool then
// never opened an idle connection again. Seen as: after the load, server_lifetime keeps closing the idle
// connection and a live keeper keeps opening another (total_server_conns grows).
func TestPooledMinIdleKeeperSurvivesAFullPool(t *testing.T) {
	f := newPooledFenced(t, 1, "  min_idle: 1\n  server_lifetime: 30ms\n  max_client_wait: 10s\n  admin_users: [admin]\n")
	adm := adminConn(t, f)
	opened := func() string { return adminRows(t, adm, "SHOW STATS")[0]["total_server_conns"].(string) }
	var clients []*pgx.Conn
	for range 3 {
		clients = append(clients, pooledConn(t, f, "&default_query_exec_mode=simple_protocol"))
	}
	for round := range 5 {
		end := time.Now().Add(time.Second)
		done := make(chan struct{}, len(clients))
		for _, c := range clients {
			go func() {
				for time.Now().Before(end) {
					c.Exec(context.Background(), "SELECT pg_sleep(0.001)")
				}
				done <- struct{}{}
			}()
		}
		for range clients {
			<-done
		}
		before := opened()
		deadline := time.Now().Add(5 * time.Second)
		for opened() == before {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: after the load no server connection is opened any more (total_server_conns %s, SHOW POOLS %v): min_idle's keeper ended",
					round, before, adminRows(t, adm, "SHOW POOLS"))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// A client's cancel that arrives while the settings it needs are being given to the connection (another client
// used it: a's application_name goes in the same write as a's statement) cancels a's statement, never the
// settings unit: that ended a's session with 08006 (seen within a few hundred rounds). The cancel waits for
// the unit (cancelDeferred). A race, so rounds for five seconds; each must give 57014 or a finished statement.
func TestPooledCancelDuringSettingsReplay(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	q := "&default_query_exec_mode=simple_protocol"
	a := pooledConn(t, f, q+"&application_name=app_a")
	b := pooledConn(t, f, q+"&application_name=app_b")
	ctx := ctxT(t)
	rounds, cancelled := 0, 0
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); rounds++ {
		fxExec(t, b, "SELECT 1") // the connection holds b's application_name: a's next transaction replays its own
		errc := make(chan error, 1)
		go func() { _, err := a.Exec(ctx, "SELECT pg_sleep(0.05)"); errc <- err }()
		for range 3 {
			a.PgConn().CancelRequest(ctx)
		}
		err := <-errc
		var pe *pgconn.PgError
		switch {
		case err == nil:
		case errors.As(err, &pe) && pe.Code == "57014":
			cancelled++
		default:
			t.Fatalf("round %d: a's cancel gave %v (closed: %v), want 57014 or nothing", rounds, err, a.IsClosed())
		}
	}
	if cancelled == 0 {
		t.Fatalf("no cancel of %d rounds reached a's statement", rounds)
	}
	t.Logf("%d rounds, %d statements cancelled", rounds, cancelled)
}

// An empty value is not NULL. A client that clears its token with a bound or computed set_config to the empty
// string has it empty, as directly: its next write is refused 55F02 (before, the probe read it as NULL, a
// RESET, and the write went with the startup token 3). And a session setting set to the empty string
// (pg_dump's default_tablespace,
// search_path) leaves the session working (before: FATAL 08006, the probe's row read as broken).
func TestPooledEmptyValuesAreNotNull(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
	upd := "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1"
	for _, mode := range []string{"simple_protocol", "exec"} {
		for _, clear := range []struct {
			sql  string
			args []any
		}{
			{"SELECT set_config('fence.token', $1, false)", []any{""}},
			{"SELECT set_config('fence.token', '' || '', false)", nil},
			// The function by its three-part name (a review's finding: the planner did not know it).
			{"SELECT " + pgtest.TestDB + ".pg_catalog.set_config('fence.token', '' || '', false)", nil},
			// A DO block: the planner reads its statements too.
			{"DO $$BEGIN PERFORM set_config('fence.token', '', false); END$$", nil},
		} {
			p := pooledConn(t, f, "&default_query_exec_mode="+mode+"&options=-c%20fence.token%3D3")
			other := pooledConn(t, f, "&options=-c%20fence.token%3D7")
			var pe *pgconn.PgError
			if _, err := p.Exec(ctxT(t), clear.sql, clear.args...); err != nil {
				if !errors.As(err, &pe) || pe.Code != "55F03" {
					t.Fatalf("%s %q: %v", mode, clear.sql, err)
				}
				continue // a literal '' (pgx's simple protocol puts the argument into the text): refused, as directly
			}
			fxExec(t, other, "SELECT 1") // the connection serves another client between
			_, err := p.Exec(ctxT(t), upd)
			if !errors.As(err, &pe) || pe.Code != "55F02" {
				t.Fatalf("%s %q: the write after clearing the token: %v, want 55F02 (row token now %d)", mode, clear.sql, err, f.token(t, 1))
			}
		}
		// The lock cleared by a DO block is cleared, as directly: not the startup lock k again.
		p := pooledConn(t, f, "&default_query_exec_mode="+mode+"&options=-c%20fence.token%3D3%20-c%20fence.lock%3Dk")
		other := pooledConn(t, f, "&options=-c%20fence.token%3D7")
		fxExec(t, p, "DO $$BEGIN PERFORM set_config('fence.lock', '', false); END$$")
		fxExec(t, other, "SELECT 1")
		var lock string
		if err := p.QueryRow(ctxT(t), "SELECT current_setting('fence.lock')").Scan(&lock); err != nil || lock != "" {
			t.Fatalf("%s: the lock after a DO block cleared it: %q (%v), want ''", mode, lock, err)
		}
		for _, stmt := range []string{"SET default_tablespace = ''", "SET application_name = ''", "SELECT pg_catalog.set_config('search_path', '', false)"} {
			p := pooledConn(t, f, "&default_query_exec_mode="+mode)
			fxExec(t, p, stmt)
			fxExec(t, p, "SELECT 1")
		}
	}
}

// sendCancel sends a CancelRequest for the session of pid and key to addr.
func sendCancel(t *testing.T, addr string, pid uint32, key []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := binary.BigEndian.AppendUint32(nil, uint32(12+len(key)))
	b = binary.BigEndian.AppendUint32(b, 80877102)
	b = binary.BigEndian.AppendUint32(b, pid)
	if _, err := c.Write(append(b, key...)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	c.Read(make([]byte, 1)) // the proxy closes it when the cancel was handled
}
