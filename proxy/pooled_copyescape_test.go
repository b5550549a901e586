package proxy_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// A client of a pooled server connection that sends, behind the data of a COPY FROM STDIN into an unprotected
// table, a bad row and then a write to a protected table (a Query, or a Parse, Bind, Execute and Sync): the
// server fails the COPY at the bad row and then runs what follows as any message. The pool forwarded those
// messages as they were, not through the core, so the write went unfenced (no token, a forged token column)
// and committed. Found by a review on 2026-12-05 (attack: what the pool sends on a server connection while it
// thinks the server reads a COPY's data).
func TestPooledWriteBehindFailedCopyIsFenced(t *testing.T) {
	pgtest.Require(t, pg)
	cl := pgtest.MustStart(t, pgtest.Options{})
	if err := cl.Exec("CREATE TABLE accounts (id int PRIMARY KEY, v int NOT NULL, fence_token bigint); INSERT INTO accounts VALUES (1, 0, 100); CREATE TABLE t_copy (i int)"); err != nil {
		t.Fatal(err)
	}
	p := proxytest.Start(t, cl.Addr(), proxytest.Options{YAML: "tables:\n  - name: accounts\n    token_column: fence_token\npool:\n  mode: transaction\n  size: 1\nauth:\n  type: trust\n"})
	for _, w := range []struct {
		name  string
		write []pgproto3.FrontendMessage
	}{
		{"Query", []pgproto3.FrontendMessage{&pgproto3.Query{String: "UPDATE accounts SET v = 1, fence_token = 1 WHERE id = 1"}}},
		{"extended", []pgproto3.FrontendMessage{&pgproto3.Parse{Query: "UPDATE accounts SET v = 2, fence_token = 1 WHERE id = 1"},
			&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}}},
	} {
		t.Run(w.name, func(t *testing.T) {
			pc, err := pgconn.Connect(ctxT(t), p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close(ctxT(t))
			got := wireSteps(t, pc, 500*time.Millisecond, nil,
				[]pgproto3.FrontendMessage{&pgproto3.Query{String: "COPY t_copy FROM STDIN"}},
				append([]pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("not a number\n")}}, w.write...))
			t.Logf("answers: %v", got)
			// What the server was sent runs before its backend ends, and the session's end closed the server
			// connection: once no backend but d's is left, the row shows whether a write went.
			d := connect(t, cl.SuperDSN())
			eventually(t, 10*time.Second, "the pooled server connection to end", func() bool {
				n, err := pooledBackends(ctxT(t), d)
				return err == nil && n == 0
			})
			var v int
			var tok int64
			if err := d.QueryRow(ctxT(t), "SELECT v, fence_token FROM accounts WHERE id = 1").Scan(&v, &tok); err != nil {
				t.Fatal(err)
			}
			if v != 0 || tok != 100 {
				t.Errorf("accounts row 1 is v=%d token=%d after a write without a token sent behind a failed COPY, want v=0 token=100 (refused)", v, tok)
			}
		})
	}
}
