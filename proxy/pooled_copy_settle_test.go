package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A client starts a COPY FROM STDIN by a simple Query, reads the CopyInResponse, then pipelines a row the COPY
// fails on, no CopyDone, a statement with far more output than the sockets hold, and Queries until the sockets
// are full, reads nothing more, and leaves. The proxy still counts the COPY as running (copyIn: no CopyDone or
// CopyFail came), so it forwards the Queries as the COPY's (forwardCopyIn), its writer filling the sockets and
// blocking in a write to the server, holding the session's lock. The server, slow on the good rows, fails the
// COPY at the bad one (ErrorResponse, ReadyForQuery), runs the big statement, whose output fills the sockets, and
// stops reading; the lend's server side, at that ReadyForQuery, waits for the lock (settle). Neither side moves,
// the client's reset goes unseen, and the connection and its pool slot would stay held until the proxy stopped:
// the pool ends such a lend (endStuckWrites). The next client must be served once the pipeliner left. Connected
// directly, the server would have seen the client leave at its next write. Also as a Query of several statements,
// whose COPY fails the rest.
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
	a := pooledPgConn(t, f, "")
	conn := a.Conn()
	batch := appendMsgs(t, nil, &pgproto3.Query{String: start})
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
	batch = appendMsgs(t, batch[:0], &pgproto3.CopyData{Data: []byte("1\n2\n")}, &pgproto3.CopyData{Data: []byte("x\n")})
	// 64 MB of output, far more than the sockets between the server and the client hold.
	batch = appendMsgs(t, batch, &pgproto3.Query{String: "SELECT repeat('x', 1000000) AS copy_failed_unread FROM generate_series(1, 64)"})
	// Then Queries the server has not read when it blocks writing that output, until the sockets are full and
	// the proxy's writer blocks (endlessly).
	q := &pgproto3.Query{String: "SELECT length('" + strings.Repeat("y", 1<<20) + "')"}
	u := writeUnread(conn, endlessly(batch, appendMsgs(t, nil, q)))
	u.blockedOn(t, f, "copy_failed_unread")
	u.leaveAndNextServed(t, f, adm, "copy_failed_unread")
}

// A Query (or a Sync) the client sends into a COPY FROM STDIN before its CopyDone or CopyFail: while the COPY
// runs, PostgreSQL fails on a Query (08P01, then FATAL) and ignores a Sync; once the COPY has failed on a bad
// row it runs them, each answered by a ReadyForQuery of its own. Which of the two happened the pool cannot
// tell, so a COPY that fails with such a message sent into it ends the session with the pool's FATAL 08P01,
// its server connection closed (directly the Query would run: docs/pooling.md). Before, the lend ended at the
// failed COPY's ReadyForQuery with the Query's answers still to come: the client waited for them for ever,
// and the connection went back to the pool with them on their way to its next client.
func TestPooledMessagesIntoACopyThatFailed(t *testing.T) {
	for name, into := range map[string]pgproto3.FrontendMessage{
		"query": &pgproto3.Query{String: "SELECT 11 AS into_failed_copy"},
		"sync":  &pgproto3.Sync{},
	} {
		t.Run(name, func(t *testing.T) {
			f := newPooledFenced(t, 1, "  max_client_wait: 10s\n")
			plainTable(t, f, "pcs_copy2")
			a := pooledPgConn(t, f, "")
			conn := a.Conn()
			fe := pgproto3.NewFrontend(conn, conn)
			fe.Send(&pgproto3.Query{String: "COPY pcs_copy2 FROM STDIN"})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			var got []string
			receive := func() bool {
				m, err := fe.Receive()
				if err != nil {
					got = append(got, "read: "+err.Error())
					return false
				}
				switch m := m.(type) {
				case *pgproto3.ErrorResponse:
					got = append(got, m.Severity+" "+m.Code)
				case *pgproto3.ReadyForQuery:
					got = append(got, "Z"+string(m.TxStatus))
				default:
					got = append(got, strings.TrimPrefix(strings.TrimPrefix(fmtType(m), "*pgproto3."), "&"))
				}
				return true
			}
			for receive() && got[len(got)-1] != "CopyInResponse" {
			}
			// The bad row and the message in one write: both reach the proxy while the COPY is still running
			// as far as it knows.
			fe.Send(&pgproto3.CopyData{Data: []byte("x\n")})
			fe.Send(into)
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			for receive() && !strings.HasPrefix(got[len(got)-1], "FATAL") {
			}
			want := "CopyInResponse ERROR 22P02 ZI FATAL 08P01"
			if s := strings.Join(got, " "); s != want {
				t.Fatalf("the client got %s, want %s", s, want)
			}
			b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
			var v int
			if err := b.QueryRow(ctxT(t), "SELECT 42").Scan(&v); err != nil || v != 42 {
				t.Fatalf("the pool's next client: %v, %v", v, err)
			}
		})
	}
}

// fmtType is a message's Go type, for a test's transcript.
func fmtType(m pgproto3.BackendMessage) string { return fmt.Sprintf("%T", m) }
