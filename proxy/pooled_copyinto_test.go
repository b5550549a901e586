package proxy_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// intoFailedCopy starts a COPY FROM STDIN into a scratch table on pc's connection, waits for its CopyInResponse,
// then sends in one write a row the COPY fails on followed by msgs, and reads the answers until the session ends
// or nothing comes for a while; then it waits until no pooled backend is left, so that what the server did with
// msgs is all done.
func intoFailedCopy(t *testing.T, f *fenced, pc *pgconn.PgConn, scratch string, msgs ...pgproto3.FrontendMessage) {
	t.Helper()
	conn := pc.Conn()
	fe := pgproto3.NewFrontend(conn, conn)
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Write(appendMsgs(t, nil, &pgproto3.Query{String: "COPY " + scratch + " FROM STDIN"})); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatalf("waiting for the CopyInResponse: %v", err)
		}
		if _, ok := m.(*pgproto3.CopyInResponse); ok {
			break
		}
	}
	if _, err := conn.Write(appendMsgs(t, nil, append([]pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("x\n")}}, msgs...)...)); err != nil {
		t.Fatal(err)
	}
	for {
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		m, err := fe.Receive()
		if err != nil {
			break
		}
		switch m := m.(type) {
		case *pgproto3.ErrorResponse:
			t.Logf("error %s %s", m.Code, m.Message)
		case *pgproto3.CommandComplete:
			t.Logf("ran: %s", m.CommandTag)
		}
	}
	pc.Conn().Close()
	eventually(t, 20*time.Second, "the pooled server connections to end", func() bool {
		n, err := pooledBackends(ctxT(t), f.d)
		return err == nil && n == 0
	})
}

// A Query sent behind a COPY's bad row may name SQL-level prepared statements (EXECUTE): the server runs it
// once the COPY failed, and its names cannot be mapped there (copyQuery), so it goes as the proxy's refusal.
// Sent fenced but unmapped, the EXECUTE named the server connection's own statement: the proxy's settings
// statement (fenceproxy_c, which sets at session level whatever it is given), prepared there for this client's
// settings. It put a token the client never set (98) in the connection's session, past token.scope and
// verification, and the fenced UPDATE behind it in the same Query wrote with it. The row must keep its token.
func TestPooledExecuteIntoFailedCopyIsRefused(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token, balance) VALUES (1, 1, 0)")
	scratch := fxName(t, "pce")
	fxExec(t, f.d, "CREATE TABLE "+scratch+" (a int)")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP TABLE IF EXISTS "+scratch) })
	other := pooledPgConn(t, f, "")
	hostile := pooledPgConn(t, f, "")
	// The hostile client's settings differ from the other's: its transactions first put its own on the one
	// server connection by the proxy's settings statement, prepared there for it.
	if got := simpleOutcome(ctx, hostile, "SET work_mem = '5MB'"); got != "SET; " {
		t.Fatalf("SET work_mem: %s", got)
	}
	if got := simpleOutcome(ctx, other, "SELECT 1"); got != `SELECT 1 "1"; ` {
		t.Fatalf("SELECT 1: %s", got)
	}
	intoFailedCopy(t, f, hostile, scratch, &pgproto3.Query{String: "EXECUTE fenceproxy_c(ARRAY[concat('fen', 'ce.token')], ARRAY['98']); " +
		"UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1"})
	var balance, token int64
	if err := f.d.QueryRow(ctx, "SELECT balance, fence_token FROM "+f.label+" WHERE id = 1").Scan(&balance, &token); err != nil {
		t.Fatal(err)
	}
	if balance != 0 || token != 1 {
		t.Fatalf("row 1 is balance=%d token=%d after an EXECUTE of the proxy's settings statement and a write sent into a failed COPY by a client without a token, want balance=0 token=1 (refused)", balance, token)
	}
}

// A Parse sent behind a COPY's bad row ends the session before it reaches the server (forwardCopyIn): its
// statement names are the pool's to map, and the server would read its text as the client sent it. The text
// here fails the server's parse analysis (a column no table has), which the server logs with the statement's
// text (log_min_error_statement): the log shows whether the server ever read it.
func TestPooledParseIntoFailedCopyNeverReachesTheServer(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	scratch := fxName(t, "pcp")
	fxExec(t, f.d, "CREATE TABLE "+scratch+" (a int)")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP TABLE IF EXISTS "+scratch) })
	marker := scratch + "_never_read"
	from := logSize(t)
	intoFailedCopy(t, f, pooledPgConn(t, f, ""), scratch,
		&pgproto3.Parse{Query: "UPDATE " + f.label + " SET balance = " + marker + " WHERE id = 1"}, &pgproto3.Sync{})
	if log := logSince(t, from); bytes.Contains(log, []byte(marker)) {
		t.Fatalf("the server read a Parse sent into a failed COPY as the client sent it:\n%s", log)
	}
}
