package proxy_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A batch of the extended protocol that holds nothing but statements PostgreSQL ignores or refuses outside a
// transaction block (SET TRANSACTION, SET LOCAL, DECLARE) answers as directly: no token statement goes in front,
// whose snapshot made SET TRANSACTION ISOLATION LEVEL fail 25001 where directly it only warns (the settings
// fuzzer's finding), also when bound in a later batch than its Parse; and a SET LOCAL of the token there leaves
// the client's token as it was. A batch with another statement beside keeps its token statement.
func TestPooledSetTransactionBatchOutsideABlock(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	run := func(pc *pgconn.PgConn) []string {
		var got []string
		for _, batch := range [][]pgproto3.FrontendMessage{
			{&pgproto3.Parse{Query: "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}},
			{&pgproto3.Parse{Name: "st", Query: "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"}, &pgproto3.Sync{}},
			{&pgproto3.Bind{PreparedStatement: "st"}, &pgproto3.Execute{}, &pgproto3.Sync{}},
			{&pgproto3.Parse{Query: "SET LOCAL fence.token = '7'"}, &pgproto3.Bind{}, &pgproto3.Execute{},
				&pgproto3.Parse{Name: "dc", Query: "DECLARE c CURSOR FOR SELECT 1"}, &pgproto3.Bind{PreparedStatement: "dc"}, &pgproto3.Execute{}, &pgproto3.Sync{}},
			{&pgproto3.Query{String: "SHOW fence.token"}},
			{&pgproto3.Parse{Query: "SELECT current_setting('fence.token')"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}},
		} {
			got = append(got, shortAnswers(t, pc, batch...)...)
		}
		return got
	}
	d, err := pgconn.Connect(ctxT(t), pg.SuperDSN()+"&options=-c%20fence.token%3D5")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(context.Background()) })
	want := run(d)
	got := run(pooledPgConn(t, f, "&options=-c%20fence.token%3D5"))
	if !slices.Equal(got, want) {
		t.Fatalf("\nproxy  %q\ndirect %q", got, want)
	}
	if !slices.Contains(want, "D5") {
		t.Fatalf("directly the token is not 5: %q", want)
	}
}

// stPBE is a Parse, Bind and Execute of text as the unnamed statement and portal.
func stPBE(text string) []woMsg { return []woMsg{woP("", text), woB("", ""), woE("", 0)} }

// stBatch is the messages of each part in order, then a Sync.
func stBatch(parts ...[]woMsg) []woMsg {
	var out []woMsg
	for _, p := range parts {
		out = append(out, p...)
	}
	return append(out, woS)
}

// An extended-protocol batch outside a block where SET TRANSACTION (or SET of transaction_isolation, or a BEGIN
// with modes after other statements) comes before any statement that takes a snapshot answers as directly
// through the pool: the token goes in front as SET LOCAL statements, which take none, where the checked token
// statement, a SELECT, made it fail 25001 (the settings fuzzer's finding, listed in docs/pooling.md until
// 2026-12-05). The judge is a direct connection to a database the guard protects (fmEnv); every answer is
// compared (SQLSTATE, the contract's messages, rows, notices, SHOW transaction_isolation in the batch) and the
// rows committed: the token is there for every write (the guard stamps it, RETURNING shows it), a stale one is
// refused 55F01, none 55F02.
func TestPooledSetTransactionBatchOracle(t *testing.T) {
	pgtest.Require(t, pg)
	pg.Exec("DROP ROLE IF EXISTS settx_login")
	if err := pg.Exec("CREATE ROLE settx_login LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Exec("DROP ROLE IF EXISTS settx_login") }) // after the databases that name it go
	e := newFmEnv(t)
	defer func() { e.w.noise.Close(context.Background()) }()
	const tok5 = "-c fence.token=5"
	ins := func(id string) []woMsg {
		return stPBE("INSERT INTO ft (id, v) VALUES (" + id + ", 0) RETURNING fence_token")
	}
	showIso := stPBE("SHOW transaction_isolation")
	curTok := stPBE("SELECT current_setting('fence.token', true)")
	cases := []struct {
		name, opts string
		seq        []woMsg
		want       []string // in the direct stream, in order
	}{
		{"serializable, select, fenced insert", tok5, stBatch(stPBE("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), showIso, curTok, ins("10")),
			[]string{"N:25P01", "C:SET", "D[serializable]", "D[5]", "D[5]", "C:INSERT 0 1"}},
		{"read only, then a write", tok5, stBatch(stPBE("SET TRANSACTION READ ONLY"), curTok, ins("10")),
			[]string{"D[5]", "E:25006"}},
		{"stale token refused", "-c fence.token=3", stBatch(stPBE("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"), showIso,
			stPBE("UPDATE ft SET v = v + 1 WHERE id = 3")), []string{"D[repeatable read]", "E:55F01("}},
		{"no token refused", "", stBatch(stPBE("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), ins("10")), []string{"E:55F02("}},
		{"older row, newer token", "-c fence.token=9", stBatch(stPBE("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE"), showIso,
			stPBE("UPDATE ft SET v = v + 1 WHERE id = 3 RETURNING fence_token")), []string{"D[serializable]", "D[9]"}},
		{"set of transaction_isolation", tok5, stBatch(stPBE("SET transaction_isolation = 'serializable'"), showIso, ins("10")),
			[]string{"D[serializable]", "D[5]"}},
		{"all three modes", tok5, stBatch(stPBE("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ ONLY, DEFERRABLE"),
			stPBE("SELECT current_setting('transaction_deferrable'), current_setting('fence.token')")), []string{"D[on,5]"}},
		{"set local token in the batch", tok5, stBatch(stPBE("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), stPBE("SET LOCAL fence.token = '12'"),
			ins("10")), []string{"D[12]"}},
		{"begin, set transaction, commit", tok5, stBatch(stPBE("BEGIN"), stPBE("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), ins("10"), showIso,
			stPBE("COMMIT")), []string{"D[5]", "D[serializable]", "C:COMMIT"}},
		{"a set, then begin with modes", tok5, stBatch(stPBE("SET statement_timeout = '5s'"), stPBE("BEGIN ISOLATION LEVEL SERIALIZABLE"),
			ins("10"), showIso, stPBE("COMMIT")), []string{"D[5]", "D[serializable]", "C:COMMIT"}},
		{"begin with modes, then set transaction", tok5, stBatch(stPBE("BEGIN ISOLATION LEVEL SERIALIZABLE"),
			stPBE("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"), showIso, ins("10"), stPBE("COMMIT")), []string{"D[repeatable read]", "D[5]"}},
		{"close first", tok5, stBatch([]woMsg{woC('S', "s1"), woP("s1", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), woB("", "s1"), woE("", 0)},
			showIso, ins("10")), []string{"D[serializable]", "D[5]"}},
		{"named, bound later behind a describe", tok5, append(stBatch([]woMsg{woP("s2", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")}),
			stBatch([]woMsg{woD('S', "s2"), woB("", "s2"), woE("", 0)}, showIso, curTok, ins("10"))...), []string{"D[serializable]", "D[5]", "D[5]"}},
		{"unnamed, bound later", tok5, append(stBatch([]woMsg{woP("", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")}),
			stBatch([]woMsg{woB("", ""), woE("", 0)}, showIso, ins("10"))...), []string{"D[serializable]", "D[5]"}},
		{"set session characteristics", tok5, append(stBatch(stPBE("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ"),
			showIso, ins("10")), woQ("SHOW default_transaction_isolation"), woQ("SHOW transaction_isolation")),
			[]string{"D[read committed]", "D[5]", "D[repeatable read]", "D[repeatable read]"}},
		{"an error first", tok5, stBatch(stPBE("SELECT 1/0"), stPBE("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), ins("10")),
			[]string{"E:22012"}},
		{"a snapshot first", tok5, stBatch(curTok, stPBE("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), ins("10")),
			[]string{"D[5]", "E:25001"}},
		{"set transaction last", tok5, stBatch(stPBE("SHOW fence.token"), stPBE("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")),
			[]string{"D[5]", "N:25P01", "C:SET"}},
		// The setting's name quoted, in any case (PostgreSQL matches setting names so): until 2026-12-05 the
		// proxy read only unquoted words there, and the checked token statement made these fail 25001 (a
		// review's finding).
		{"quoted name", tok5, stBatch(stPBE(`SET "transaction_isolation" = 'serializable'`), showIso, ins("10")),
			[]string{"C:SET", "D[serializable]", "D[5]"}},
		{"quoted name, local, case, to", tok5, stBatch(stPBE(`SET LOCAL "Transaction_Isolation" TO 'serializable'`), showIso, ins("10")),
			[]string{"N:25P01", "C:SET", "D[serializable]", "D[5]"}},
		{"quoted name, session, deferrable", tok5, stBatch(stPBE(`set session "TRANSACTION_DEFERRABLE" = on`),
			stPBE("SELECT current_setting('transaction_deferrable')"), ins("10")), []string{"C:SET", "D[on]", "D[5]"}},
		{"quoted name in a query", tok5, []woMsg{woQ(`SET "transaction_isolation" TO 'serializable'; SHOW transaction_isolation; ` +
			"INSERT INTO ft (id, v) VALUES (10, 0) RETURNING fence_token")}, []string{"C:SET", "D[serializable]", "D[5]"}},
	}
	// A login that is not a superuser: the role goes too (SET LOCAL ROLE NONE, as the plain form sets it).
	for _, su := range []*pgx.Conn{e.suD, e.suP} {
		fxExec(t, su, "GRANT ALL ON ft TO settx_login")
	}
	cases = append(cases, struct {
		name, opts string
		seq        []woMsg
		want       []string
	}{"not a superuser", tok5, stBatch(stPBE("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), stPBE("SELECT current_user::text"),
		showIso, ins("10")), []string{"N:25P01", "D[settx_login]", "D[serializable]", "D[5]"}})
	for i, c := range cases {
		e.user = ""
		if c.name == "not a superuser" {
			e.user = "settx_login"
		}
		d, p := e.both(c.seq, c.opts, int64(i))
		at := 0
		for _, w := range c.want {
			for at < len(d) && !strings.HasPrefix(d[at], w) {
				at++
			}
			if at == len(d) {
				t.Errorf("%s: directly %q not found in order; the case means something else:\n  direct %v", c.name, w, d)
				break
			}
		}
		if !woEqual(d, p) {
			t.Errorf("%s: first difference %s\n  direct %v\n  pooled %v", c.name, woFirstDiff(d, p), d, p)
		}
	}
}

// Where the statement that cannot follow a snapshot is not among the messages the proxy has read when the batch
// starts (the client flushed part of the batch and read its answers first), the proxy cannot know it: the
// checked token statement goes, as before, and SET TRANSACTION ISOLATION LEVEL fails loudly (25001) where
// directly it warns. The transaction still has the client's token (SHOW in the first part) and writes nothing
// without it.
func TestPooledSetTransactionBeyondWhatWasRead(t *testing.T) {
	e := newFmEnv(t)
	defer func() { e.w.noise.Close(context.Background()) }()
	run := func(dsn string) []string {
		pc := woConnect(t, dsn+"&options=-c%20fence.token%3D5")
		defer pc.Close(context.Background())
		fe := pc.Frontend()
		pc.Conn().SetDeadline(time.Now().Add(10 * time.Second))
		var got []string
		read := func(until func(pgproto3.BackendMessage) bool) {
			for {
				m, err := fe.Receive()
				if err != nil {
					t.Fatalf("receive: %v (so far %v)", err, got)
				}
				got = append(got, fmShort(m))
				if until(m) {
					return
				}
			}
		}
		for _, m := range append(stPBE("SHOW fence.token"), woH) {
			fe.Send(m.m)
		}
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		read(func(m pgproto3.BackendMessage) bool { _, ok := m.(*pgproto3.CommandComplete); return ok })
		for _, m := range stBatch(stPBE("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), stPBE("INSERT INTO ft (id, v) VALUES (10, 0) RETURNING fence_token")) {
			fe.Send(m.m)
		}
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		read(func(m pgproto3.BackendMessage) bool { _, ok := m.(*pgproto3.ReadyForQuery); return ok })
		res, err := pc.Exec(ctxT(t), "INSERT INTO ft (id, v) VALUES (11, 0) RETURNING fence_token").ReadAll()
		if err != nil || len(res) != 1 || len(res[0].Rows) != 1 {
			t.Fatalf("the next transaction: %v %v", res, err)
		}
		return append(got, "next:"+string(res[0].Rows[0][0]))
	}
	e.reset(e.suD)
	e.reset(e.suP)
	d := run(pg.DSN(pgtest.SuperUser, "", e.dbD))
	p := run(e.p.DSN(pgtest.SuperUser, "", e.dbP))
	wantD := "1 2 D[5] C:SHOW 1 2 N:25P01 C:SET 1 2 D[5] C:INSERT 0 1 Z:I next:5"
	wantP := "1 2 D[5] C:SHOW 1 2 N:25P01 E:25001 Z:I next:5"
	if strings.Join(d, " ") != wantD || strings.Join(p, " ") != wantP {
		t.Fatalf("\ndirect %v, want %s\npooled %v, want %s", d, wantD, p, wantP)
	}
}

// Batches with SET TRANSACTION pipelined in one write, as libpq's pipeline mode sends them: each batch's token
// goes as SET LOCAL in front of it alone (the messages read up to its Sync), the hidden answers of each are
// counted off before the client's (an error ends a batch, the next gets its own), and the client's own SET
// LOCAL keeps its warning, also after a Flush. A review's attempt (2026-12-05): it answered as directly.
func TestPooledSetTransactionBatchPipelined(t *testing.T) {
	e := newFmEnv(t)
	defer func() { e.w.noise.Close(context.Background()) }()
	ins := func(id string) []woMsg {
		return stPBE("INSERT INTO ft (id, v) VALUES (" + id + ", 0) RETURNING fence_token")
	}
	curTok := stPBE("SELECT current_setting('fence.token', true)")
	for _, c := range []struct {
		name string
		seq  []woMsg
	}{
		{"two batches", append(stBatch(stPBE("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), stPBE("SHOW transaction_isolation"), ins("10")),
			stBatch(stPBE("SET TRANSACTION READ ONLY"), curTok, ins("11"))...)},
		{"an error, then a batch", append(stBatch(stPBE("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), stPBE("SELECT 1/0"), ins("10")),
			stBatch(stPBE("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), stPBE("SET LOCAL work_mem = '1MB'"), curTok, ins("11"))...)},
		{"flushes", stBatch(stPBE("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), []woMsg{woH}, curTok, []woMsg{woH},
			stPBE("SET LOCAL work_mem = '1MB'"), ins("10"))},
	} {
		e.reset(e.suD)
		e.reset(e.suP)
		const opts = "&options=-c%20fence.token%3D5"
		d := append(woPipelined(t, pg.DSN(pgtest.SuperUser, "", e.dbD)+opts, c.seq), e.rows(e.suD))
		p := append(woPipelined(t, e.p.DSN(pgtest.SuperUser, "", e.dbP)+opts, c.seq), e.rows(e.suP))
		if !slices.Contains(d, "N:25P01") || !slices.Contains(d, "C:INSERT 0 1") {
			t.Errorf("%s: directly no warning or no write; the case means something else: %v", c.name, d)
		}
		if !slices.Equal(d, p) {
			t.Errorf("%s:\n  direct %v\n  pooled %v", c.name, d, p)
		}
	}
}
