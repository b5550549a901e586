package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A client starts a COPY FROM STDIN, reads the CopyInResponse, then sends in one write a row the COPY fails on
// and, before any CopyDone, a write to a protected table, holding no token. The server fails the COPY at the
// row and then runs what follows as any Query. The proxy counted the COPY as running (copyIn) and forwarded
// the message as the COPY's (forwardCopyIn) as it was, neither fenced nor with its names mapped: the write
// landed unfenced (before 2026-12-05: balance 1, the Parse's nextval ran; the session ended only after). Now a
// Query goes fenced (the write meets the connection's placeholder and is refused), and a Parse ends the session
// before it reaches the server (forwardCopyIn): the server never reads the client's text as it was (a statement the pool's cancel caught would
// be in the server's log with its text, log_min_error_statement).
func TestPooledStatementIntoCopyNeverRaw(t *testing.T) {
	for _, msg := range []pgproto3.FrontendMessage{
		&pgproto3.Query{String: "UPDATE %[1]s SET balance = balance + 1 WHERE id = 1"},
		&pgproto3.Parse{Query: "WITH s AS (SELECT nextval('%[2]s')) UPDATE %[1]s SET balance = balance + (SELECT count(*) FROM s) WHERE id = 1"},
	} {
		t.Run(fmt.Sprintf("%T", msg), func(t *testing.T) { statementIntoCopy(t, msg) })
	}
}

func statementIntoCopy(t *testing.T, msg pgproto3.FrontendMessage) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token, balance) VALUES (1, 1, 0)")
	scratch := fxName(t, "pcr")
	fxExec(t, f.d, "CREATE TABLE "+scratch+" (a int)")
	// A sequence's advance is not undone when the statement is cancelled or rolled back (the pool cancels what
	// the connection still runs when it drops it): it shows that the server ran the client's text at all.
	fxExec(t, f.d, "CREATE SEQUENCE "+scratch+"_seq")
	t.Cleanup(func() {
		f.d.Exec(context.Background(), "DROP TABLE IF EXISTS "+scratch+"; DROP SEQUENCE IF EXISTS "+scratch+"_seq")
	})
	var into []pgproto3.FrontendMessage
	switch m := msg.(type) {
	case *pgproto3.Query:
		into = []pgproto3.FrontendMessage{&pgproto3.Query{String: fmt.Sprintf(m.String, f.label, scratch+"_seq")}}
	case *pgproto3.Parse:
		into = []pgproto3.FrontendMessage{&pgproto3.Parse{Query: fmt.Sprintf(m.Query, f.label, scratch+"_seq")}, &pgproto3.Bind{},
			&pgproto3.Execute{}, &pgproto3.Sync{}}
	}
	seq := scratch + "_seq"
	logFrom := logSize(t)
	a := pooledPgConn(t, f, "")
	conn := a.Conn()
	if _, err := conn.Write(appendMsgs(t, nil, &pgproto3.Query{String: "COPY " + scratch + " FROM STDIN"})); err != nil {
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
	batch := appendMsgs(t, nil, append([]pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("x\n")}}, into...)...)
	if _, err := conn.Write(batch); err != nil {
		t.Fatal(err)
	}
	// Read until the session ends or the write's answer came (a second ReadyForQuery).
	for ready := 0; ready < 2; {
		m, err := fe.Receive()
		if err != nil {
			break
		}
		switch m := m.(type) {
		case *pgproto3.ReadyForQuery:
			ready++
		case *pgproto3.ErrorResponse:
			t.Logf("error %s %s", m.Code, m.Message)
		}
	}
	// The pool drops the server connection at the COPY's failure, cancelling what it may still run: once its
	// backend is gone, what the server did with the client's text is all there is to see.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var others int
		if err := f.d.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()").Scan(&others); err != nil {
			t.Fatal(err)
		}
		if others == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d other backends still there", others)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, parse := msg.(*pgproto3.Parse); parse && bytes.Contains(logSince(t, logFrom), []byte(seq)) {
		// A statement cancelled before it ran is logged with its text (log_min_error_statement).
		t.Fatalf("the server read the statement sent into the COPY as the client sent it:\n%s", logSince(t, logFrom))
	}
	var balance int
	var ran bool
	if err := f.d.QueryRow(ctxT(t), "SELECT (SELECT balance FROM "+f.label+" WHERE id = 1), (SELECT is_called FROM "+scratch+"_seq)").Scan(&balance, &ran); err != nil {
		t.Fatal(err)
	}
	if balance != 0 || ran { // the Query's text has no nextval
		t.Fatalf("a statement sent into a failed COPY ran as the client sent it: balance %d, its nextval ran %v", balance, ran)
	}
}
