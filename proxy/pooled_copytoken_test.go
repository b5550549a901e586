package proxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A client sends into a COPY FROM STDIN's data a row the COPY fails on and a Query that sets the token at
// session level (SET, set_config): the server runs that Query once the COPY failed, outside any transaction
// of the pool's. The session ends (copyAmbiguous) and the server connection is dropped; the token never
// reaches the pool's next client, which sees none and whose write is refused 55F02. (A write in the same
// Query after the SET is stamped with the client's own 99, as directly: the token is the client's.)
func TestPooledTokenSetIntoFailedCopyNeverLeaks(t *testing.T) {
	for _, set := range []string{
		"SET fence.token = 99",
		"SELECT pg_catalog.set_config('fence.token', '99', false)",
		"SET fence.token = 99; UPDATE",
	} {
		t.Run(set, func(t *testing.T) {
			f := newPooledFenced(t, 1, "")
			ctx := ctxT(t)
			fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token, balance) VALUES (1, 1, 0)")
			scratch := fxName(t, "pct")
			fxExec(t, f.d, "CREATE TABLE "+scratch+" (a int)")
			t.Cleanup(func() { f.d.Exec(context.Background(), "DROP TABLE IF EXISTS "+scratch) })
			q := set
			if q == "SET fence.token = 99; UPDATE" {
				q = "SET fence.token = 99; UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1"
			}
			a := pooledPgConn(t, f, "")
			conn := a.Conn()
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
			if _, err := conn.Write(appendMsgs(t, nil, &pgproto3.CopyData{Data: []byte("x\n")}, &pgproto3.Query{String: q},
				&pgproto3.Query{String: "SHOW fence.token"})); err != nil {
				t.Fatal(err)
			}
			for {
				m, err := fe.Receive()
				if err != nil {
					break
				}
				switch m := m.(type) {
				case *pgproto3.DataRow:
					if string(m.Values[0]) == "99" {
						t.Errorf("the client's session reads the token set into the COPY: %q", m.Values[0])
					}
				case *pgproto3.CommandComplete:
					t.Logf("ran: %s", m.CommandTag)
				}
			}
			b := pooledPgConn(t, f, "")
			if got := simpleOutcome(ctx, b, "SHOW fence.token"); got != `SHOW ""; ` {
				t.Errorf("the next client: %s", got)
			}
			if got := simpleOutcome(ctx, b, "UPDATE "+f.label+" SET balance = balance + 1 WHERE id = 1 RETURNING fence_token"); got != "ERROR 55F02" {
				t.Errorf("the next client's write: %q, want ERROR 55F02", got)
			}
		})
	}
}
