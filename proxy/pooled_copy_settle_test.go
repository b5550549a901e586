package proxy_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A client starts a COPY FROM STDIN by a simple Query, reads the CopyInResponse, then pipelines a row the COPY
// fails on, no CopyDone, a statement with far more output than the sockets hold, and megabytes of Queries, reads
// nothing more, and leaves. The proxy still counts the COPY as running (copyIn: no CopyDone or CopyFail came),
// so it forwards the Queries as the COPY's (forwardCopyIn), its writer filling the sockets and blocking in a
// write to the server, holding the session's lock. The server, slow on the good rows, fails the COPY at the bad
// one (ErrorResponse, ReadyForQuery), runs the big statement, whose output fills the sockets, and stops reading;
// the lend's server side, at that ReadyForQuery, waits for the lock (settle). Neither side moves, the client's
// reset goes unseen, and the connection and its pool slot would stay held until the proxy stopped: the pool
// ends such a lend (endStuckWrites). The next client must be served once the pipeliner left. Connected
// directly, the server would have seen the client leave at its next write. Also as a Query of several
// statements, whose COPY fails the rest.
func TestPooledClientLeavesACopyItFailed(t *testing.T) {
	for _, start := range []string{"COPY pcs_copy FROM STDIN", "COPY pcs_copy FROM STDIN; SELECT 1"} {
		t.Run(start, func(t *testing.T) { clientLeavesACopyItFailed(t, start) })
	}
}

func clientLeavesACopyItFailed(t *testing.T, start string) {
	f := newPooledFenced(t, 1, "  max_client_wait: 30s\n  admin_users: [admin]\n")
	// Each row the COPY takes keeps the server busy for a while: the proxy's writer meanwhile fills the sockets.
	fxExec(t, f.d, "DROP TABLE IF EXISTS pcs_copy")
	fxExec(t, f.d, "CREATE OR REPLACE FUNCTION pcs_slow(a int) RETURNS bool LANGUAGE plpgsql AS $$BEGIN PERFORM pg_sleep(0.3); RETURN true; END$$")
	fxExec(t, f.d, "CREATE TABLE pcs_copy (a int CHECK (pcs_slow(a)))")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		f.d.Exec(ctx, "DROP TABLE IF EXISTS pcs_copy")
	})
	adm := adminConn(t, f)
	ctx := ctxT(t)
	a := pooledPgConn(t, f, "")
	conn := a.Conn()
	var batch []byte
	add := func(msgs ...pgproto3.FrontendMessage) {
		for _, m := range msgs {
			var err error
			if batch, err = m.Encode(batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	add(&pgproto3.Query{String: start})
	if _, err := conn.Write(batch); err != nil {
		t.Fatal(err)
	}
	fe := pgproto3.NewFrontend(conn, conn)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatalf("waiting for the CopyInResponse: %v", err)
		}
		if _, ok := m.(*pgproto3.CopyInResponse); ok {
			break
		}
	}
	batch = batch[:0]
	add(&pgproto3.CopyData{Data: []byte("1\n2\n")}, &pgproto3.CopyData{Data: []byte("x\n")})
	// 64 MB of output, far more than the sockets between the server and the client hold.
	add(&pgproto3.Query{String: "SELECT repeat('x', 1000000) AS copy_failed_unread FROM generate_series(1, 64)"})
	// 32 MB of Queries the server has not read when it blocks writing that output.
	q := &pgproto3.Query{String: "SELECT length('" + strings.Repeat("y", 1<<20) + "')"}
	for range 32 {
		add(q)
	}
	var written atomic.Int64
	wrote := make(chan error, 1)
	go func() {
		for rest := batch; len(rest) > 0; {
			n := min(len(rest), 1<<16)
			if _, err := conn.Write(rest[:n]); err != nil {
				wrote <- err
				return
			}
			written.Add(int64(n))
			rest = rest[n:]
		}
		wrote <- nil
	}()
	eventually(t, 20*time.Second, "the server blocked writing the big statement's output", func() bool {
		var n int
		err := f.d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'ClientWrite' AND query LIKE '%copy_failed_unread%'").Scan(&n)
		return err == nil && n == 1
	})
	// The server reads no more: the proxy's writer blocks, and stops reading the client.
	last, since := written.Load(), time.Now()
	eventually(t, 20*time.Second, "the client's writes stalled for 500 ms", func() bool {
		if cur := written.Load(); cur != last {
			last, since = cur, time.Now()
		}
		return time.Since(since) > 500*time.Millisecond
	})
	if written.Load() == int64(len(batch)) {
		t.Fatal("the whole batch went out: the proxy's writer never blocked, the test proves nothing")
	}
	b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	answered := make(chan error, 1)
	go func() {
		var v int
		answered <- b.QueryRow(context.Background(), "SELECT 42").Scan(&v)
	}()
	waitingClients(t, adm, 1)
	conn.(*net.TCPConn).SetLinger(0)
	conn.Close() // a reset, with the answers unread
	<-wrote
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("the next client after the pipeliner left: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the next client was not served within 20 s after the pipeliner left: its server connection is held")
	}
	eventually(t, 10*time.Second, "the pipeliner's backend gone", func() bool {
		var n int
		err := f.d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%copy_failed_unread%' AND pid <> pg_backend_pid()").Scan(&n)
		return err == nil && n == 0
	})
}
