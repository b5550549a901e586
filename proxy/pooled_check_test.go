package proxy_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// dirtyPooledConnection leaves token 77 in the session of f's (single) pooled server connection, as a function of
// one client's can (a plain transaction: no check, no probe), and returns the function's name.
func dirtyPooledConnection(t *testing.T, f *fenced, fn string) {
	t.Helper()
	fxExec(t, f.d, "CREATE OR REPLACE FUNCTION "+fn+"() RETURNS int LANGUAGE sql AS $$ SELECT pg_catalog.set_config('fence.token', '77', false)::int $$")
	t.Cleanup(func() { f.d.Exec(t.Context(), "DROP FUNCTION IF EXISTS "+fn+"()") })
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	fxExec(t, a, "SELECT "+fn+"()")
	a.Close(ctxT(t))
}

// rawBatch sends msgs and a Sync on pc and returns, up to the ReadyForQuery, the first column of every DataRow and
// the SQLSTATE of every error.
func rawBatch(t *testing.T, pc *pgconn.PgConn, msgs ...pgproto3.FrontendMessage) (rows, codes []string) {
	t.Helper()
	fe := pc.Frontend()
	for _, m := range msgs {
		fe.Send(m)
	}
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *pgproto3.DataRow:
			rows = append(rows, string(m.Values[0]))
		case *pgproto3.ErrorResponse:
			codes = append(codes, m.Code)
		case *pgproto3.ReadyForQuery:
			return rows, codes
		}
	}
}

// A batch that binds a portal to a BEGIN with transaction modes, then binds it again to a fenced write (the
// unnamed portal, or a named one after its Close) and executes it: that Execute runs the write, not the BEGIN,
// so the token statement goes before it. A write that ran first would have the token a function left in the
// connection's session (77), another client's.
func TestPooledBeginPortalReboundGetsTokenFirst(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
	write := "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1 RETURNING fence_token"
	for name, batch := range map[string][]pgproto3.FrontendMessage{
		"unnamed portal bound again": {
			&pgproto3.Parse{Query: "BEGIN ISOLATION LEVEL SERIALIZABLE"},
			&pgproto3.Bind{},
			&pgproto3.Parse{Query: write},
			&pgproto3.Bind{},
			&pgproto3.Execute{},
		},
		"named portal closed and bound again": {
			&pgproto3.Parse{Query: "BEGIN ISOLATION LEVEL SERIALIZABLE"},
			&pgproto3.Bind{DestinationPortal: "p"},
			&pgproto3.Close{ObjectType: 'P', Name: "p"},
			&pgproto3.Parse{Query: write},
			&pgproto3.Bind{DestinationPortal: "p"},
			&pgproto3.Execute{Portal: "p"},
		},
	} {
		dirtyPooledConnection(t, f, "pooled_sneak_rebind")
		b := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
		rows, codes := rawBatch(t, b, batch...)
		for _, r := range rows {
			if r != "5" {
				t.Fatalf("%s: the write wrote with token %s (errors %v), not the client's 5", name, r, codes)
			}
		}
		if len(rows) == 0 && len(codes) == 0 {
			t.Fatalf("%s: the write neither ran nor failed", name)
		}
		if got := f.token(t, 1); got == 77 {
			t.Fatalf("%s: row 1 has the token a function of another client left: %d", name, got)
		}
		b.Close(ctxT(t))
	}
}
