package proxy_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A reload between the Parse and the Bind of one extended-protocol batch (no Sync between them, so one lend and
// one server connection): the named and the unnamed statement parsed under the old list are bound under the new
// one, which protects the table: the first Execute is refused (55F01) and the batch with it.
func TestPooledReloadMidBatch(t *testing.T) {
	d := direct(t)
	name := fxName(t, "rb")
	fxCreateTable(t, d, "public."+name)
	fxExec(t, d, fmt.Sprintf("INSERT INTO public.%s (id, balance, fence_token) VALUES (1, 0, 9)", name))
	f := newPooledFencedOther(t, name)
	upd := fmt.Sprintf("UPDATE public.%s SET balance = balance + 1 WHERE id = $1", name)
	for _, stmt := range []string{"s", ""} {
		a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
		hj, err := a.Hijack()
		if err != nil {
			t.Fatal(err)
		}
		fe := hj.Frontend
		fe.Send(&pgproto3.Parse{Name: stmt, Query: upd})
		fe.Send(&pgproto3.Flush{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		if m, err := fe.Receive(); err != nil {
			t.Fatal(err)
		} else if _, ok := m.(*pgproto3.ParseComplete); !ok {
			t.Fatalf("statement %q: Parse answered %#v", stmt, m)
		}
		reloadTables(t, f, "public."+name+"_other", "public."+name)
		fe.Send(&pgproto3.Bind{PreparedStatement: stmt, Parameters: [][]byte{[]byte("1")}})
		fe.Send(&pgproto3.Execute{})
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var code string
		for {
			m, err := fe.Receive()
			if err != nil {
				t.Fatal(err)
			}
			if e, ok := m.(*pgproto3.ErrorResponse); ok {
				code = e.Code
			}
			if _, ok := m.(*pgproto3.ReadyForQuery); ok {
				break
			}
		}
		if code != "55F01" {
			t.Fatalf("statement %q parsed before the reload, bound after it in the same batch: error %q, want 55F01 (rows: %s)", stmt, code, f.snapshot(t))
		}
		hj.Conn.Close()
		reloadTables(t, f, "public."+name+"_other")
	}
	if got := f.snapshot(t); got != "1:0:9" {
		t.Fatalf("rows: %s, want 1:0:9", got)
	}
}

// A statement prepared before a reload that the new list refuses (it names the token column in a row
// assignment: 55F04) is refused at its use after it, by both protocols; nothing is written.
func TestPooledReloadRefusesWhatTheNewListRefuses(t *testing.T) {
	d := direct(t)
	name := fxName(t, "rf")
	fxCreateTable(t, d, "public."+name)
	fxExec(t, d, fmt.Sprintf("INSERT INTO public.%s (id, balance, fence_token) VALUES (1, 0, 9)", name))
	f := newPooledFencedOther(t, name)
	ctx := ctxT(t)
	a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	upd := fmt.Sprintf("UPDATE public.%s SET (balance, fence_token) = (7, 1) WHERE id = $1", name)
	if _, err := a.Prepare(ctx, "s", upd, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.Exec(ctx, "PREPARE sp(int) AS "+upd).Close(); err != nil {
		t.Fatal(err)
	}
	reloadTables(t, f, "public."+name)
	wantPgErr(t, execPrepared(a, "s", 1), "55F04", "unfenceable write")
	wantPgErr(t, a.Exec(ctx, "EXECUTE sp(1)").Close(), "55F04", "unfenceable write")
	if got := f.snapshot(t); got != "1:0:9" {
		t.Fatalf("rows: %s, want 1:0:9", got)
	}
}
