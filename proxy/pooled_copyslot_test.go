package proxy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A client pipelines a unit behind one the server has not answered, and leaves (a Terminate, then its socket
// closed; or a reset with nothing said) while the pool holds that next unit until the one before is answered;
// or it sends a Terminate behind such a unit and closes its socket. The session goroutine waits for the answer
// (forwardPooled, endPooled) and reads the client no more, so nothing saw it leave: before the mend the server
// connection stayed lent, its transaction and locks held, for as long as the answer took, which for the units
// here is for ever:
//
//   - busy: the first unit waits for an advisory lock that another session holds (directly the server, too,
//     would wait; but not holding a pool slot that other clients need); the client leaves with a reset, or
//     with a Terminate and then its socket closed;
//   - (until 2026-12-05 a third case, a stray copy end after a statement whose text holds the word copy, then a
//     COPY run by an Execute, its data and end and a Terminate: the pool took the stray end for the COPY's and
//     waited for an answer the server never sends. Since then the server's answer says the end was stray, the
//     pool owes nothing, and the Terminate ends the session at once, before a next client could wait, so the
//     case tested a race: TestPooledCopyStrayEndAfterTheWordCopy covers stray ends, "busy, then a Terminate"
//     the wait behind a Terminate.)
//
// Once the client is gone the wait must end, its server connection be closed (the server rolls back) and the
// slot freed: the next client on the pool of one is served well within max_client_wait, SHOW POOLS shows no
// server connection lent, and the leaver's backend is gone.
func TestPooledClientVanishingWhileItsNextUnitWaits(t *testing.T) {
	d := direct(t)
	tbl := fxName(t, "cs")
	fxExec(t, d, "CREATE TABLE "+tbl+" (x int)")
	t.Cleanup(func() {
		// A held connection keeps the COPY's lock on the table: its backend goes first.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE relation = '"+tbl+"'::regclass AND pid <> pg_backend_pid()")
		d.Exec(ctx, "DROP TABLE IF EXISTS "+tbl)
	})
	hold := connect(t, pg.SuperDSN())
	fxExec(t, hold, "SELECT pg_advisory_lock(5301)")

	for _, c := range []struct {
		name      string
		msgs      []pgproto3.FrontendMessage
		held      string // pg_stat_activity's condition for the leaver's backend while the pool holds its next unit
		terminate bool   // leave with a Terminate, then close; else a reset
	}{
		{"busy", []pgproto3.FrontendMessage{
			&pgproto3.Query{String: "SELECT pg_advisory_xact_lock(5301) AS copyslot_busy"},
			&pgproto3.Query{String: "SELECT 'never' AS copyslot_busy"},
		}, "wait_event_type = 'Lock' AND query LIKE '%copyslot_busy%'", false},
		{"busy, then a Terminate", []pgproto3.FrontendMessage{
			&pgproto3.Query{String: "SELECT pg_advisory_xact_lock(5301) AS copyslot_busy"},
			&pgproto3.Query{String: "SELECT 'never' AS copyslot_busy"},
		}, "wait_event_type = 'Lock' AND query LIKE '%copyslot_busy%'", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A proxy of its own: a leaver held before the mend keeps its pool's one slot.
			f := newPooledFenced(t, 1, "  admin_users: [admin]\n  max_client_wait: 15s\n")
			adm := adminConn(t, f)
			a := dialRaw(t, f.p.Addr, pgtest.SuperUser, pgtest.TestDB, nil)
			for _, m := range c.msgs {
				a.fe.Send(m)
			}
			if err := a.fe.Flush(); err != nil {
				t.Fatal(err)
			}
			cond := c.held + " AND pid <> pg_backend_pid()"
			eventually(t, 10*time.Second, "the leaver's backend held ("+c.held+")", func() bool {
				var n int
				err := f.d.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE "+cond).Scan(&n)
				return err == nil && n == 1
			})
			b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
			got := make(chan string, 1)
			go func() {
				var v string
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				if err := b.QueryRow(ctx, "SELECT 'the next client''s'").Scan(&v); err != nil {
					v = "error: " + err.Error()
				}
				got <- v
			}()
			waitingClients(t, adm, 1)
			if c.terminate {
				a.fe.Send(&pgproto3.Terminate{})
				if err := a.fe.Flush(); err != nil {
					t.Fatal(err)
				}
			} else {
				a.conn.(interface{ SetLinger(int) error }).SetLinger(0)
			}
			a.conn.Close()
			left := time.Now()
			if v := <-got; v != "the next client's" {
				t.Fatalf("the next client on the pool of one after the leaver (%v later): %s", time.Since(left).Round(time.Millisecond), v)
			}
			if waited := time.Since(left); waited > 5*time.Second {
				t.Errorf("the next client was served %v after the leaver left", waited)
			}
			b.Close(ctxT(t))
			eventually(t, 10*time.Second, "SHOW POOLS: no server connection lent", func() bool {
				for _, r := range adminRows(t, adm, "SHOW POOLS") {
					if r["database"] != "fenceproxy" && r["sv_active"] != "0" {
						return false
					}
				}
				return true
			})
			eventually(t, 10*time.Second, "the leaver's backend gone", func() bool {
				var n int
				err := f.d.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE "+cond).Scan(&n)
				return err == nil && n == 0
			})
		})
	}
}

// A COPY end counts as one only where a COPY can be in progress (pooledState.copyEnds), and the pool must never
// count one low: a COPY end the server takes for a COPY's that the pool ignored would make it take the Syncs
// after it for ones the COPY swallowed and end the lend with answers still to come. Each sequence is sent in
// one write, directly and through a pool of one, and must get the same answers: stray ends (CopyDone and
// CopyFail) before and after a COPY run by an Execute of a named portal bound in an earlier batch of the block
// (the portal, not the batch, says a COPY may start), of the unnamed portal bound again from a text without
// COPY, and a second end right after a COPY's own.
func TestPooledCopyEndsCountOnlyAfterACopy(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	tbl := fxName(t, "ce")
	fxExec(t, f.d, "CREATE TABLE "+tbl+" (x int)")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		f.d.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE relation = '"+tbl+"'::regclass AND pid <> pg_backend_pid()")
		f.d.Exec(ctx, "DROP TABLE IF EXISTS "+tbl)
	})
	copyData := woMsg{&pgproto3.CopyData{Data: []byte("5\n")}, "CopyData"}
	copyDone := woMsg{&pgproto3.CopyDone{}, "CopyDone"}
	copyFail := woMsg{&pgproto3.CopyFail{Message: "stray"}, "CopyFail"}
	count := woQ("SELECT count(*) FROM " + tbl)
	for name, seq := range map[string][]woMsg{
		"portal of an earlier batch": {woQ("BEGIN"), woP("s1", "COPY "+tbl+" FROM STDIN"), woB("p", "s1"), woS,
			woP("", "SELECT 1"), woB("", ""), woE("", 0), copyDone, woE("p", 0), woS, copyData, copyDone, woS, woQ("COMMIT"), count},
		"unnamed portal bound again": {woP("s2", "COPY "+tbl+" FROM STDIN"), woB("", "s2"), woP("", "SELECT 2"), woB("", ""),
			woE("", 0), copyFail, woB("", "s2"), woE("", 0), woS, copyData, copyDone, woS, count},
		"a second end after the COPY's": {woP("s3", "COPY "+tbl+" FROM STDIN"), woB("", "s3"), woE("", 0), woS, copyData, copyDone,
			copyDone, woS, count},
	} {
		t.Run(name, func(t *testing.T) {
			fxExec(t, f.d, "TRUNCATE "+tbl)
			d := strings.Join(woPipelined(t, pg.SuperDSN()+woOpts, seq), " ")
			fxExec(t, f.d, "TRUNCATE "+tbl)
			p := strings.Join(woPipelined(t, f.dsn()+woOpts, seq), " ")
			if d != p {
				t.Fatalf("differs\n  direct: %s\n  pooled: %s", d, p)
			}
			t.Logf("%s", p)
		})
	}
}
