package proxy_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// copyhangRun sends seq in one write on a connection of dsn and reads the answers up to the readies-th
// ReadyForQuery (a COPY swallows the Syncs sent inside its data: the caller says how many answers come). A wait
// longer than five seconds ends the reading with HANG. The connection is left open, idle, for the caller.
func copyhangRun(t *testing.T, dsn string, seq []woMsg, readies int) ([]string, *pgconn.PgConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { pc.Close(context.Background()) })
	fe := pc.Frontend()
	for _, m := range seq {
		fe.Send(m.m)
	}
	if err := fe.Flush(); err != nil {
		t.Fatalf("send: %v", err)
	}
	pc.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
	defer pc.Conn().SetReadDeadline(time.Time{})
	var got []string
	for readies > 0 {
		m, err := fe.Receive()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return append(got, "HANG"), pc
			}
			return append(got, "RECVERR "+err.Error()), pc
		}
		s := woShort(m)
		if s != "" && !strings.HasPrefix(s, "S:") {
			got = append(got, s)
		}
		if strings.HasPrefix(s, "FATAL") {
			return got, pc
		}
		if _, ok := m.(*pgproto3.ReadyForQuery); ok {
			readies--
		}
	}
	return got, pc
}

// copyTestTable creates a one-column table for a COPY test on f's database, dropped at the test's end after the
// sessions still holding a lock on it are ended (a subject left inside a COPY holds one).
func copyTestTable(t *testing.T, f *fenced, prefix string) string {
	t.Helper()
	tbl := fxName(t, prefix)
	fxExec(t, f.d, "CREATE TABLE "+tbl+" (x int)")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		f.d.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE relation = '"+tbl+"'::regclass AND pid <> pg_backend_pid()")
		f.d.Exec(ctx, "DROP TABLE IF EXISTS "+tbl)
	})
	return tbl
}

// copyhangBoth sends seq in one write directly and then through f's pool (copyhangRun), tbl emptied before each,
// and returns the two answers, each joined by spaces. The pooled subject stays connected for the caller.
func copyhangBoth(t *testing.T, f *fenced, tbl string, seq []woMsg, readies int) (direct, pooled string) {
	t.Helper()
	fxExec(t, f.d, "TRUNCATE "+tbl)
	d, dc := copyhangRun(t, pg.SuperDSN()+woOpts, seq, readies)
	dc.Close(context.Background())
	fxExec(t, f.d, "TRUNCATE "+tbl)
	p, _ := copyhangRun(t, f.dsn()+woOpts, seq, readies)
	return strings.Join(d, " "), strings.Join(p, " ")
}

// secondClientServed checks that, whatever the subject of a COPY test left behind (it is still connected, or
// was ended), a second client of f's pool of one gets the pool's server connection and its own answers, none
// of the subject's, three times.
func secondClientServed(t *testing.T, f *fenced) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	other, err := pgconn.Connect(ctx, f.dsn())
	if err != nil {
		t.Fatalf("a second client: %v", err)
	}
	defer other.Close(context.Background())
	for i := range 3 {
		rs, err := other.Exec(ctx, "SELECT 'mine'").ReadAll()
		if err != nil || len(rs) != 1 || len(rs[0].Rows) != 1 || string(rs[0].Rows[0][0]) != "mine" {
			t.Fatalf("the second client's query %d on the pool of one after the subject's sequence: %v %v", i, rs, err)
		}
	}
}

// The messages of a COPY's data and end, and the sequences made of them.
func woCopyData(row string) woMsg {
	return woMsg{&pgproto3.CopyData{Data: []byte(row + "\n")}, "CopyData"}
}
func woCopyDone() woMsg           { return woMsg{&pgproto3.CopyDone{}, "CopyDone"} }
func woCopyFail(why string) woMsg { return woMsg{&pgproto3.CopyFail{Message: why}, "CopyFail"} }
func woCat(parts ...[]woMsg) []woMsg {
	var all []woMsg
	for _, p := range parts {
		all = append(all, p...)
	}
	return all
}

// A CopyDone or CopyFail that ends no COPY (PostgreSQL ignores one outside a COPY's data) sent right behind a
// statement whose text holds the word copy but starts no COPY, before the server answered it (pipelined): the
// words cannot tell the stray end from a COPY's, the server's answer to that statement can. Each sequence is
// sent in one write directly and through a pool of one, and must get the same answers; then, with the subject
// still connected, a second client must get the pool's one server connection. Before 2026-12-05 the pool took a
// stray end after an Execute of such a text for the COPY's end of a later Execute of the batch that did start
// one, counted the Sync that COPY swallowed as one to be answered, and held the client's next message for that
// answer, for ever, its server connection with it (docs/pooling.md said so: the count erred high). The Query
// forms, and the batches with no COPY after the stray end, held before (a Query's answer, or the batch's, ends
// the count) and are kept as the attack's other spellings.
func TestPooledCopyStrayEndAfterTheWordCopy(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 15s\n")
	tbl := copyTestTable(t, f, "ch")
	copyData, copyDone, copyFail := woCopyData("5"), woCopyDone(), woCopyFail("stray")
	count := woQ("SELECT count(*) FROM " + tbl)
	// A COPY run by an Execute with a Sync behind it, as libpq's PQexecParams sends one (the COPY swallows that
	// Sync), then its data and end, then the Sync that ends the batch: one ReadyForQuery.
	copyBatch := []woMsg{woP("s9", "COPY "+tbl+" FROM STDIN"), woB("", "s9"), woE("", 0), woS, copyData, copyDone, woS}
	cat := woCat
	word := []woMsg{woP("", "SELECT 'copy'"), woB("", ""), woE("", 0)}
	for _, c := range []struct {
		name    string
		seq     []woMsg
		readies int
	}{
		{"query then CopyDone", []woMsg{woQ("SELECT 'copy'"), copyDone, woQ("SELECT 2")}, 2},
		{"query then CopyFail", []woMsg{woQ("SELECT 'copy'"), copyFail, woQ("SELECT 2")}, 2},
		{"query then CopyDone then a COPY batch", cat([]woMsg{woQ("SELECT 'copy'"), copyDone}, copyBatch, []woMsg{count}), 3},
		{"execute then CopyDone", cat(word, []woMsg{copyDone, woS, woQ("SELECT 2")}), 2},
		{"execute then CopyFail", cat(word, []woMsg{copyFail, woS, woQ("SELECT 2")}), 2},
		{"execute, CopyDone, a COPY in the batch", cat(word, []woMsg{copyDone}, copyBatch, []woMsg{count}), 2},
		{"execute, CopyFail, a COPY in the batch", cat(word, []woMsg{copyFail}, copyBatch, []woMsg{count}), 2},
		{"two strays, a COPY in the batch", cat(word, []woMsg{copyDone}, word, []woMsg{copyFail}, copyBatch, []woMsg{count}), 2},
		{"copy out, CopyDone, a COPY in the batch", cat([]woMsg{woP("", "COPY (SELECT 7) TO STDOUT"), woB("", ""), woE("", 0), copyDone},
			copyBatch, []woMsg{count}), 2},
		{"a failed execute, CopyDone, a COPY in the batch", cat([]woMsg{woP("", "SELECT 'copy'::int"), woB("", ""), woE("", 0), copyDone},
			copyBatch, []woMsg{count}), 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			ds, ps := copyhangBoth(t, f, tbl, c.seq, c.readies)
			if strings.Contains(ds, "HANG") {
				t.Fatalf("the test's sequence hangs directly: %s", ds)
			}
			if ds != ps {
				t.Fatalf("differs\n  direct: %s\n  pooled: %s", ds, ps)
			}
			// The subject is still connected: the pool's one server connection must be free for another.
			secondClientServed(t, f)
		})
	}
}

// A client whose statement waits for the settings the proxy gives its server connection first (the replay of
// its session-level SET, a unit of the proxy's own, before a statement that goes without the token statement:
// checkFirst, awaitReplayed) leaves while that unit is blocked: here the
// replayed temp_tablespaces, whose check reads pg_tablespace, waits for another session's lock on it. The
// session goroutine waits for the replay's answer and reads the client no more; before 2026-12-05 nothing saw
// the client leave (the wait for an earlier unit of the client's own looked at its socket, this one did not),
// and its server connection, with the pool's one slot, stayed held for as long as the lock was. Once the client
// is gone the wait must end and the slot come back: the next client is served well within max_client_wait,
// while the lock is still held.
func TestPooledClientVanishingWhileItsSettingsReplay(t *testing.T) {
	f := newPooledFenced(t, 1, "  admin_users: [admin]\n  max_client_wait: 15s\n")
	adm := adminConn(t, f)
	a := dialRaw(t, f.p.Addr, pgtest.SuperUser, pgtest.TestDB, nil)
	if r := a.query(t, []byte("SET temp_tablespaces = 'pg_default'"))[0]; r.err != nil {
		t.Fatalf("the subject's SET: %s %s", r.err.Code, r.err.Message)
	}
	// Another client's transaction on the pool's one connection: the subject's setting goes back on it at the
	// subject's next transaction (the replay).
	b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	fxExec(t, b, "SELECT 'the other client''s first'")

	ctx := ctxT(t)
	holdCatalogLock(t, "pg_catalog.pg_tablespace")
	// A statement that runs outside any transaction block (a SET LOCAL alone, which PostgreSQL warns of and
	// ignores there) goes without the token statement, after the proxy's own units answered (checkFirst).
	a.fe.Send(&pgproto3.Query{String: "SET LOCAL work_mem = '2MB'"})
	if err := a.fe.Flush(); err != nil {
		t.Fatal(err)
	}
	cond := "wait_event_type = 'Lock' AND query LIKE '%set_config(s.n, s.v, false)%' AND pid <> pg_backend_pid()"
	eventually(t, 10*time.Second, "the subject's settings replay waiting for the lock on pg_tablespace", func() bool {
		var n int
		err := f.d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE "+cond).Scan(&n)
		return err == nil && n == 1
	})
	servedOnceGone(t, adm, b, "the other client's second", a.conn.Close)
	eventually(t, 10*time.Second, "the subject's backend gone", func() bool {
		var n int
		err := f.d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE "+cond).Scan(&n)
		return err == nil && n == 0
	})
}

// A client whose one Query's answer the session goroutine reads itself (answerInline: one unit, nothing else
// sent) leaves after the first bytes of that answer came and while the rest waits behind a lock (its second
// statement waits for an advisory lock another session holds). Past the answer's first bytes the inline read
// has no deadline and nothing looks at the client, so its leaving goes unseen, and the pool's one slot stays
// held as long as the lock: the next client must be served well within max_client_wait.
func TestPooledClientVanishingWhileItsAnswerIsReadInline(t *testing.T) {
	f := newPooledFenced(t, 1, "  admin_users: [admin]\n  max_client_wait: 15s\n")
	adm := adminConn(t, f)
	hold := connect(t, pg.SuperDSN())
	fxExec(t, hold, "SELECT pg_advisory_lock(5302)")
	a := dialRaw(t, f.p.Addr, pgtest.SuperUser, pgtest.TestDB, nil)
	a.fe.Send(&pgproto3.Query{String: "SELECT 1 AS inline_first; SELECT pg_advisory_xact_lock(5302) AS inline_busy"})
	if err := a.fe.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	cond := "wait_event_type = 'Lock' AND query LIKE '%inline_busy%' AND pid <> pg_backend_pid()"
	eventually(t, 10*time.Second, "the subject's second statement waiting for the lock", func() bool {
		var n int
		err := f.d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE "+cond).Scan(&n)
		return err == nil && n == 1
	})
	b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	servedOnceGone(t, adm, b, "the other client's", a.conn.Close)
}

// A client leaves while the proxy's look at its server connection after its transaction (the probe, which a
// SET brings) waits behind a lock on pg_cursors, which the probe reads. The probe runs where the answer is
// read: in the session goroutine when that goroutine reads the answer itself (answerInline), which then reads
// the client no more. Once the client is gone the wait must end and the slot come back: the next client on a
// pool of one is served well within max_client_wait, while the lock is still held. A probe its client's leaving
// cut is not a lost server connection: it does not count in fenceproxy_upstream_errors_total.
func TestPooledClientVanishingWhileItsProbeWaits(t *testing.T) {
	f := newPooledFenced(t, 1, "  admin_users: [admin]\n  max_client_wait: 15s\n")
	adm := adminConn(t, f)
	ctx := ctxT(t)
	holdCatalogLock(t, "pg_catalog.pg_cursors")
	sessions, _ := metricValue(t, f.p.Registry, "fenceproxy_sessions_current")
	a := dialRaw(t, f.p.Addr, pgtest.SuperUser, pgtest.TestDB, nil)
	a.fe.Send(&pgproto3.Query{String: "SET work_mem = '2MB'"})
	if err := a.fe.Flush(); err != nil {
		t.Fatal(err)
	}
	waiting := "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.relation = 'pg_catalog.pg_cursors'::regclass AND NOT l.granted"
	eventually(t, 10*time.Second, "the probe after the subject's SET waiting for the lock on pg_cursors", func() bool {
		var n int
		return f.d.QueryRow(ctx, waiting).Scan(&n) == nil && n == 1
	})
	b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	servedOnceGone(t, adm, b, "the other client's", a.conn.Close)
	// The subject's session is over (b's is the one more) once it has decided whether it lost its connection.
	eventually(t, 10*time.Second, "the subject's session to end", func() bool {
		v, _ := metricValue(t, f.p.Registry, "fenceproxy_sessions_current")
		return v == sessions+1
	})
	if v, _ := metricValue(t, f.p.Registry, "fenceproxy_upstream_errors_total"); v != 0 {
		t.Errorf("fenceproxy_upstream_errors_total is %v after a client left under its probe, want 0: no server connection was lost", v)
	}
}

// servedOnceGone has b ask for the pool's one server connection (a SELECT of the literal want), waits until the
// admin console counts it waiting, makes the subject leave (leave), and fails the test unless b is answered want
// within 5 s of that: the subject's wait, whatever it was, ended with the subject and gave the slot back.
func servedOnceGone(t *testing.T, adm, b *pgx.Conn, want string, leave func() error) {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		var v string
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := b.QueryRow(ctx, "SELECT '"+strings.ReplaceAll(want, "'", "''")+"'").Scan(&v); err != nil {
			v = "error: " + err.Error()
		}
		got <- v
	}()
	waitingClients(t, adm, 1)
	leave()
	left := time.Now()
	if v := <-got; v != want {
		t.Fatalf("the next client on the pool of one after the subject left (%v later): %s", time.Since(left).Round(time.Millisecond), v)
	}
	if waited := time.Since(left); waited > 5*time.Second {
		t.Errorf("the next client was served %v after the subject left", waited)
	}
}

// holdCatalogLock takes an ACCESS EXCLUSIVE lock on the catalog table (qualified) in a transaction of a direct
// connection, held until the test ends: what the proxy reads of it (a settings replay, the probe) waits.
func holdCatalogLock(t *testing.T, table string) {
	t.Helper()
	ctx := ctxT(t)
	tx, err := direct(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
}
