package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// caProcs are the procedures the experiment calls: each logs the token it sees (current_setting of
// fence.token, missing_ok) before and after a COMMIT.
const caProcs = `
CREATE TABLE lg (n serial, what text, tok text);
CREATE PROCEDURE p() LANGUAGE plpgsql AS $$ BEGIN
  INSERT INTO lg (what, tok) VALUES ('before', current_setting('fence.token', true));
  COMMIT;
  INSERT INTO lg (what, tok) VALUES ('after', current_setting('fence.token', true));
END $$;
`

// caLog reads lg as "what:tok ..." in the order written.
func caLog(t *testing.T, dsn string) string {
	t.Helper()
	c := connect(t, dsn)
	var s string
	if err := c.QueryRow(ctxT(t), `SELECT coalesce(string_agg(what || ':' || coalesce(tok, 'null'), ' ' ORDER BY n), '') FROM lg`).Scan(&s); err != nil {
		t.Fatalf("read lg: %v", err)
	}
	return s
}

// caPipelined sends seq in one write on a new connection, then a Query of its own whose answer marks the end,
// and returns the short forms of the answers before that mark (no ParameterStatus), ending with HANG or RECVERR
// where the answers stop: unlike woPipelined it does not count on one ReadyForQuery per Query and Sync, which is
// what it looks at.
func caPipelined(t *testing.T, dsn string, seq []woMsg) (got []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer pc.Close(context.Background())
	fe := pc.Frontend()
	pc.Conn().SetDeadline(time.Now().Add(5 * time.Second))
	for _, m := range seq {
		fe.Send(m.m)
	}
	fe.Send(&pgproto3.Query{String: "SELECT 'the end'"})
	if err := fe.Flush(); err != nil {
		return append(got, "SENDERR")
	}
	for {
		m, err := fe.Receive()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return append(got, "HANG")
			}
			return append(got, "RECVERR")
		}
		s := woShort(m)
		if s == "D[the end]" {
			if n := len(got); n > 0 && strings.HasPrefix(got[n-1], "T[") {
				got = got[:n-1]
			}
			return got
		}
		if s != "" && !strings.HasPrefix(s, "S:") {
			got = append(got, s)
		}
		if strings.HasPrefix(s, "FATAL") {
			return got
		}
	}
}

// What PostgreSQL does with a simple Query sent after an extended-protocol Execute with no Sync in between, the
// protocol a pooler may use to give a lone CALL its token without making its Query an implicit transaction
// block: exec_simple_query's start_xact_command finds the batch's implicit transaction open and runs the Query
// in it, but that transaction is no block (TBLOCK_STARTED, not the implicit block of a Query of several
// statements), so the CALL is not atomic: it sees what the Execute set transaction-locally, and it can COMMIT,
// which commits the Execute's statement with it and ends the transaction-local value; its later transactions see
// the session's. The Query is answered with a ReadyForQuery of its own, and the Sync with another. An error in
// the Execute makes the server skip the Query (it skips every message up to the Sync): one ReadyForQuery only.
// A token sent in the Query's own text makes it a block of several statements, where the CALL cannot commit
// (2D000), which is what the pool did until 2026-12-05. Kept as the record of the behaviour the pool relies on
// (proxy/pooled.go: procedureAlone); PostgreSQL 15.
func TestPostgresQueryAfterUnsyncedExecute(t *testing.T) {
	pgtest.Require(t, pg)
	db := fxName(t, "caexp")
	pg.Exec("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)")
	if err := pg.Exec("CREATE DATABASE " + db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Exec("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)") })
	dsn := pg.DSN(pgtest.SuperUser, "", db)
	su := connect(t, dsn)
	fxExec(t, su, caProcs)
	const setTok = "SELECT set_config('fence.token', '42', true)"
	const doCommit = "DO $$ BEGIN INSERT INTO lg (what, tok) VALUES ('before', current_setting('fence.token', true)); COMMIT; " +
		"INSERT INTO lg (what, tok) VALUES ('after', current_setting('fence.token', true)); END $$"
	for _, c := range []struct {
		name      string
		seq       []woMsg
		want, log string
	}{
		{"Execute, Query, Sync: the CALL sees the token and commits",
			[]woMsg{woP("", setTok), woB("", ""), woE("", 0), woQ("CALL p()"), woS},
			"1 2 D[42] C:SELECT 1 C:CALL Z:I Z:I", "before:42 after:5"},
		{"the same with a DO block",
			[]woMsg{woP("", setTok), woB("", ""), woE("", 0), woQ(doCommit), woS},
			"1 2 D[42] C:SELECT 1 C:DO Z:I Z:I", "before:42 after:5"},
		{"the token in the Query's text: an implicit block, 2D000",
			[]woMsg{woQ(setTok + "; CALL p()")},
			"T[set_config:25] D[42] C:SELECT 1 E:2D000 Z:I", ""},
		{"Execute, Sync, Query: the token is gone",
			[]woMsg{woP("", setTok), woB("", ""), woE("", 0), woS, woQ("CALL p()")},
			"1 2 D[42] C:SELECT 1 Z:I C:CALL Z:I", "before:5 after:5"},
		{"the Execute fails: the Query is skipped, one ReadyForQuery",
			[]woMsg{woP("", "SELECT 1/(SELECT 0)"), woB("", ""), woE("", 0), woQ("CALL p()"), woS},
			"1 2 E:22012 Z:I", ""},
		{"the Query fails: its own ReadyForQuery, then the Sync's",
			[]woMsg{woP("", setTok), woB("", ""), woE("", 0), woQ("CALL nosuch()"), woS},
			"1 2 D[42] C:SELECT 1 E:42883 Z:I Z:I", ""},
	} {
		fxExec(t, su, "TRUNCATE lg")
		got := strings.Join(caPipelined(t, dsn+"&options=-c%20fence.token%3D5", c.seq), " ")
		if got != c.want {
			t.Errorf("%s: answers %q, want %q", c.name, got, c.want)
		}
		if log := caLog(t, dsn); log != c.log {
			t.Errorf("%s: written %q, want %q", c.name, log, c.log)
		}
	}
}

// caObjects are what the pooled cases call, made in both databases of a r53Env: an unprotected table uw, and a
// log wl of every write of the subject's rows (ids below 900) to uw and to the protected ft with the token it
// saw (current_setting of fence.token, missing_ok; 'null' for none), written by triggers, so in the writer's
// own transaction.
const caObjects = `
CREATE TABLE uw (id int);
CREATE TABLE wl (n serial, id int, tok text);
CREATE FUNCTION wlog() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
  IF NEW.id < 900 THEN INSERT INTO wl (id, tok) VALUES (NEW.id, coalesce(current_setting('fence.token', true), 'null')); END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER wlu AFTER INSERT ON uw FOR EACH ROW EXECUTE FUNCTION wlog();
CREATE TRIGGER wlf AFTER INSERT OR UPDATE ON ft FOR EACH ROW EXECUTE FUNCTION wlog();
CREATE PROCEDURE pu(a int) LANGUAGE plpgsql AS $$ BEGIN INSERT INTO uw VALUES (a); COMMIT; INSERT INTO uw VALUES (a + 100); END $$;
CREATE PROCEDURE pw(a int) LANGUAGE plpgsql AS $$ BEGIN UPDATE ft SET v = v + 1 WHERE id = a; COMMIT; INSERT INTO uw VALUES (a + 100); END $$;
CREATE PROCEDURE pr(a int) LANGUAGE plpgsql AS $$ BEGIN INSERT INTO uw VALUES (a); ROLLBACK; INSERT INTO uw VALUES (a + 100); END $$;
CREATE PROCEDURE pe(a int) LANGUAGE plpgsql AS $$ BEGIN INSERT INTO uw VALUES (a); COMMIT; PERFORM 1 / 0; END $$;
CREATE PROCEDURE psl(a int) LANGUAGE plpgsql AS $$ BEGIN INSERT INTO uw VALUES (a); COMMIT; PERFORM pg_sleep(30); END $$;
CREATE FUNCTION hidden_set(v text) RETURNS text LANGUAGE sql AS $$ SELECT set_config('fence.token', v, false) $$;
`

// caWrites reads wl as "id:tok ..." in the order written.
func caWrites(t *testing.T, su *pgx.Conn) string {
	t.Helper()
	var s string
	if err := su.QueryRow(ctxT(t), `SELECT coalesce(string_agg(id || ':' || tok, ' ' ORDER BY n), '') FROM wl`).Scan(&s); err != nil {
		t.Fatalf("read wl: %v", err)
	}
	return s
}

// caBoth is fmEnv.both with the log emptied after the rows are reset (whose INSERT it logs): the two streams,
// each ending with the committed rows of ft, and the two logs.
func caBoth(e *fmEnv, seq []woMsg, opts string, noiseSeed int64) (d, p []string, dLog, pLog string) {
	q := "&application_name=subject"
	if opts != "" {
		q += "&options=" + strings.ReplaceAll(url.QueryEscape(opts), "+", "%20")
	}
	e.reset(e.suD)
	fxExec(e.t, e.suD, "TRUNCATE uw, wl")
	dc := woConnect(e.t, pg.DSN(pgtest.SuperUser, "", e.dbD)+q)
	d = append(e.w.run(dc, seq, false), e.rows(e.suD))
	dc.Close(context.Background())
	dLog = caWrites(e.t, e.suD)
	e.reset(e.suP)
	fxExec(e.t, e.suP, "TRUNCATE uw, wl")
	e.w.nrand = rand.New(rand.NewSource(noiseSeed))
	pc := woConnect(e.t, e.p.DSN(pgtest.SuperUser, "", e.dbP)+q)
	p = append(e.w.run(pc, seq, true), e.rows(e.suP))
	pc.Close(context.Background())
	return d, p, dLog, caWrites(e.t, e.suP)
}

// A CALL of a procedure that commits or rolls back, or a DO block that does, sent alone as a simple Query outside
// a transaction block, through a pool of one server connection that a noise client with another token (fmEnv's,
// 1000000) uses between every two of the subject's transactions, against a direct connection. Until 2026-12-05
// the pool's token statement went in the Query's text, which made it an implicit block: the CALL failed 2D000 and
// wrote nothing, where directly it runs. Now it runs: its writes before its first COMMIT or ROLLBACK carry the
// client's token (fenced: a stale one is refused 55F01 as directly), and those after carry the pool's
// placeholder (a transaction-local token cannot outlive the COMMIT, and the connection's session value is the
// placeholder), so that a write to a protected table there is refused 55F03 (docs/pooling.md, known
// differences), never run with another client's token or none. A CALL inside a block, or among other statements
// of its Query, fails 2D000 as directly.
func TestPooledProcedureCommitsAlone(t *testing.T) {
	pgtest.Require(t, pg)
	e := r53Env(t, pg)
	fxExec(t, e.suD, caObjects)
	fxExec(t, e.suP, caObjects)
	const tok5 = "-c fence.token=5"
	const ph = "fenceproxy:pooled"
	doBlock := "DO $$ BEGIN INSERT INTO uw VALUES (7); EXECUTE 'UPDATE ft SET v = v + 1 WHERE id = 4'; COMMIT; INSERT INTO uw VALUES (8); END $$"
	for i, c := range []struct {
		name, opts string
		seq        []woMsg
		// dLog and pLog are the writes each side must log; same: the answers and committed rows must be the
		// same on both sides, else the pool's must hold a 55F03 refusal of the placeholder.
		dLog, pLog string
		same       bool
	}{
		{"a committing procedure writing an unprotected table", tok5, r53Q("CALL pu(1)", "CALL pu(2)"),
			"1:5 101:5 2:5 102:5", "1:5 101:" + ph + " 2:5 102:" + ph, true},
		{"a token set by SET, then the procedure", "", r53Q("SET fence.token = 6", "CALL pu(1)", "SHOW fence.token"),
			"1:6 101:6", "1:6 101:" + ph, true},
		{"a protected write, then an unprotected one after the COMMIT", tok5, r53Q("CALL pw(1)"),
			"1:5 101:5", "1:5 101:" + ph, true},
		{"protected writes before and after the COMMIT", tok5, r53Q("CALL pc(1, 2)"),
			"1:5 2:5", "1:5", false},
		{"a stale token before the COMMIT", tok5, r53Q("CALL pc(3, 1)", "CALL pw(3)"),
			"", "", true},
		{"no token, a protected write before the COMMIT", "", r53Q("CALL pw(1)", "CALL pc(2, 1)"),
			"", "", true},
		{"a pinned client (a temporary table)", tok5, r53Q("CREATE TEMP TABLE tt (a int)", "CALL pu(1)"),
			"1:5 101:5", "1:5 101:" + ph, true},
		{"a DO block that commits", tok5, r53Q(doBlock),
			"7:5 4:5 8:5", "7:5 4:5 8:" + ph, true},
		{"a lower-case call with a comment", tok5, r53Q("/* c */ call pu(1) ;"),
			"1:5 101:5", "1:5 101:" + ph, true},
		{"a procedure that rolls back", tok5, r53Q("CALL pr(1)"),
			"101:5", "101:" + ph, true},
		{"a procedure that fails after its COMMIT", tok5, r53Q("CALL pe(1)", "CALL pu(2)"),
			"1:5 2:5 102:5", "1:5 2:5 102:" + ph, true},
		{"a CALL of no procedure", tok5, r53Q("CALL nosuch()", "CALL pu(2)"),
			"2:5 102:5", "2:5 102:" + ph, true},
		{"a statement timeout in the procedure", tok5, r53Q("SET statement_timeout = '300ms'", "CALL psl(1)", "RESET statement_timeout", "CALL pu(2)"),
			"1:5 2:5 102:5", "1:5 2:5 102:" + ph, true},
		// Unchanged: PostgreSQL runs the procedure atomically inside a block, as in a Query of several statements.
		{"CALL inside BEGIN", tok5, r53Q("BEGIN", "CALL pu(1)", "ROLLBACK", "BEGIN; CALL pu(2); COMMIT"),
			"", "", true},
		{"CALL among other statements", tok5, r53Q("CALL pu(1); CALL pu(2)", "SELECT 1; CALL pu(3)"),
			"", "", true},
		{"a procedure that does not commit, its SET clause the token", tok5, r53Q("CALL pset(3)"),
			"3:999", "3:999", true},
	} {
		d, p, dLog, pLog := caBoth(e, c.seq, c.opts, int64(i))
		if dLog != c.dLog {
			t.Errorf("%s: directly the writes were %q, want %q (the test's expectation is wrong)\n  direct: %v", c.name, dLog, c.dLog, d)
		}
		if pLog != c.pLog {
			t.Errorf("%s: through the pool the writes were %q, want %q\n  direct: %v\n  pooled: %v", c.name, pLog, c.pLog, d, p)
		}
		placeholder := false
		for _, s := range p {
			placeholder = placeholder || strings.HasPrefix(s, "E:55F03(") && strings.Contains(s, ph)
		}
		switch {
		case c.same && !woEqual(d, p):
			t.Errorf("%s: the pool differs from a direct connection (%s)\n  direct: %v\n  pooled: %v", c.name, fmSig(d, p), d, p)
		case !c.same && !placeholder:
			t.Errorf("%s: no write refused for the placeholder\n  direct: %v\n  pooled: %v", c.name, d, p)
		}
	}
	if len(e.w.bad) > 0 || e.w.noiseOK == 0 {
		t.Errorf("the noise client ran %d transactions; wrong answers: %v", e.w.noiseOK, e.w.bad)
	}
}

// The error paths of a lone CALL's token statement, sent by the extended protocol in front of the Query
// (proxy/pooled.go: procedureAlone), give the client exactly one answer and leave the pool in step: the token
// statement refused (the client's own function set the token at session level behind the proxy, which the checked
// start finds: 55F03, and the server skips the Query, so only the Sync's ReadyForQuery comes); the CALL
// cancelled by the client's CancelRequest while its procedure runs after its COMMIT (the Query's error and
// ReadyForQuery, then the Sync's); and Queries and batches pipelined behind lone CALLs in one write, against a
// direct connection. Each is followed by a statement of the same client and a transaction of the noise client,
// which must see only their own answers and token.
func TestPooledProcedureAloneErrorPaths(t *testing.T) {
	pgtest.Require(t, pg)
	e := r53Env(t, pg)
	fxExec(t, e.suD, caObjects)
	fxExec(t, e.suP, caObjects)
	const ph = "fenceproxy:pooled"
	opts := "&application_name=subject&options=-c%20fence.token%3D5"
	dsnP := e.p.DSN(pgtest.SuperUser, "", e.dbP) + opts
	dsnD := pg.DSN(pgtest.SuperUser, "", e.dbD) + opts
	e.w.nrand = rand.New(rand.NewSource(1))
	noise := func(what string) {
		t.Helper()
		if !e.w.runNoise() || len(e.w.bad) > 0 {
			t.Fatalf("%s: the noise client's transaction failed: %v", what, e.w.bad)
		}
	}

	// The check refuses the token statement: one error, one ReadyForQuery, nothing written. The first DO is
	// checked, so the connection is the client's (put back first) when its function sets the token unseen.
	fxExec(t, e.suP, "TRUNCATE uw, wl")
	got := strings.Join(caPipelined(t, dsnP, r53Q("DO $$ BEGIN END $$", "SELECT hidden_set('77')", "CALL pu(1)", "SELECT 'next'")), " ")
	if want := "C:DO Z:I T[hidden_set:25] D[77] C:SELECT 1 Z:I E:55F03 Z:I T[?column?:25] D[next] C:SELECT 1 Z:I"; got != want {
		t.Errorf("a refused token statement: answers %q, want %q", got, want)
	}
	if w := caWrites(t, e.suP); w != "" {
		t.Errorf("a refused token statement: written %q, want nothing", w)
	}
	noise("after a refused token statement")

	// Another client's function left its token at session level on the pool's one connection, unseen: the
	// procedure's transactions after its COMMIT see the placeholder (put back first), never that token, so the
	// protected write there is refused and the unprotected one logs the placeholder.
	e.reset(e.suP)
	fxExec(t, e.suP, "TRUNCATE uw, wl") // after the reset, whose INSERT it logs
	other := woConnect(t, e.p.DSN(pgtest.SuperUser, "", e.dbP)+"&application_name=other&options=-c%20fence.token%3D999999")
	for _, q := range []string{"CALL pu(1)", "CALL pc(1, 2)"} {
		if _, err := other.Exec(ctxT(t), "SELECT hidden_set('999999')").ReadAll(); err != nil {
			t.Fatal(err)
		}
		got := strings.Join(caPipelined(t, dsnP, r53Q(q)), " ")
		if !strings.Contains(got, "C:CALL") && !strings.Contains(got, "E:55F03") {
			t.Errorf("%s after another client's hidden token: answers %q", q, got)
		}
	}
	other.Close(context.Background())
	if w, want := caWrites(t, e.suP), "1:5 101:"+ph+" 1:5"; w != want {
		t.Errorf("after another client's hidden token: written %q, want %q", w, want)
	}
	if r := e.rows(e.suP); r != "ROWS[1:1:5 2:0:5 3:0:8 4:0:5]" {
		t.Errorf("after another client's hidden token: rows %s, want row 1 written with 5 and row 2 untouched", r)
	}

	// A CancelRequest while the procedure sleeps after its COMMIT.
	fxExec(t, e.suP, "TRUNCATE uw, wl")
	func() {
		pc := woConnect(t, dsnP)
		defer pc.Close(context.Background())
		fe := pc.Frontend()
		pc.Conn().SetDeadline(time.Now().Add(20 * time.Second))
		fe.Send(&pgproto3.Query{String: "CALL psl(1)"})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			var n int
			if err := e.suP.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE query = 'CALL psl(1)' AND wait_event = 'PgSleep'").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the procedure never slept")
			}
			time.Sleep(10 * time.Millisecond)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := pc.CancelRequest(ctx); err != nil {
			t.Fatal(err)
		}
		fe.Send(&pgproto3.Query{String: "SELECT 'next'"})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for len(got) == 0 || got[len(got)-1] != "D[next]" {
			m, err := fe.Receive()
			if err != nil {
				t.Fatalf("after the cancel: %v (so far %v)", err, got)
			}
			if s := woShort(m); s != "" && !strings.HasPrefix(s, "S:") {
				got = append(got, s)
			}
		}
		for {
			m, err := fe.Receive()
			if err != nil {
				t.Fatalf("after the cancel: %v (so far %v)", err, got)
			}
			got = append(got, woShort(m))
			if _, ok := m.(*pgproto3.ReadyForQuery); ok {
				break
			}
		}
		if s, want := strings.Join(got, " "), "E:57014 Z:I T[?column?:25] D[next] C:SELECT 1 Z:I"; s != want {
			t.Errorf("a cancelled CALL: answers %q, want %q", s, want)
		}
	}()
	if w := caWrites(t, e.suP); w != "1:5" {
		t.Errorf("a cancelled CALL: written %q, want %q", w, "1:5")
	}
	noise("after a cancelled CALL")

	// Pipelined: every unit is answered before the next goes, each lone CALL with its own token statement. The
	// Query drops the server connection's unnamed statement, which the token statement was just prepared as:
	// the batch right behind it gets the token statement prepared again, not bound where none is (26000).
	seq := r53Cat(r53Q("CALL pu(1)"), r53Batch("CALL pu(2)"), r53Q("CALL nosuch()", "SHOW fence.token", "CALL pe(3)", "CALL pu(4)"))
	fxExec(t, e.suD, "TRUNCATE uw, wl")
	d := strings.Join(caPipelined(t, dsnD, seq), " ")
	fxExec(t, e.suP, "TRUNCATE uw, wl")
	p := strings.Join(caPipelined(t, dsnP, seq), " ")
	if d != p {
		t.Errorf("pipelined: the pool differs from a direct connection\n  direct: %s\n  pooled: %s", d, p)
	}
	if w, want := caWrites(t, e.suD), "1:5 101:5 2:5 102:5 3:5 4:5 104:5"; w != want {
		t.Errorf("pipelined: directly written %q, want %q", w, want)
	}
	if w, want := caWrites(t, e.suP), "1:5 101:"+ph+" 2:5 102:"+ph+" 3:5 4:5 104:"+ph; w != want {
		t.Errorf("pipelined: written through the pool %q, want %q", w, want)
	}
	noise("after the pipeline")
}

// The proxy's own Queries that go in front of a client's Query (the prepared fences' PREPARE of a template, sent
// at the next idle point, upstream.prepared_fences) go before a lone CALL's token statement, never between it and
// the CALL: each is a transaction of its own, whose Query would commit the token statement's transaction, and
// the CALL would run with the placeholder. (The test's name, which names its tables, holds none of the words that
// keep a text from being templated or a pool from using prepared fences: pooled_prepared_test.go.)
func TestPooledProcedureAloneBehindOwnCommands(t *testing.T) {
	f := newPooledFencedUpstream(t, 1, "", "  prepared_fences: 64\n")
	lg := f.label + "_lg"
	fxExec(t, f.d, fmt.Sprintf(`CREATE TABLE %[1]s (n serial, tok text);
CREATE PROCEDURE %[1]s_p() LANGUAGE plpgsql AS $$ BEGIN
  INSERT INTO %[1]s (tok) VALUES (coalesce(current_setting('fence.token', true), 'null'));
  COMMIT;
  INSERT INTO %[1]s (tok) VALUES (coalesce(current_setting('fence.token', true), 'null'));
END $$`, lg))
	t.Cleanup(func() {
		f.d.Exec(context.Background(), "DROP PROCEDURE IF EXISTS "+lg+"_p()")
		f.d.Exec(context.Background(), "DROP TABLE IF EXISTS "+lg)
	})
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, balance, fence_token) VALUES (1, 0, 1)")
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol&options=-c%20fence.token%3D5")
	prepared := func() float64 {
		return fxCounter(t, f.p.Registry, "fenceproxy_prepared_fences_total", map[string]string{"outcome": "prepared"})
	}
	// Transactions of the shape prepared fences serve (prepared_test.go: preparedFixture.transaction), each
	// followed by the CALL: a template's PREPARE, queued at an UPDATE, waits for the next Query outside a block,
	// which is the CALL's.
	rounds := 0
	for ; rounds < 5 && prepared() == 0; rounds++ {
		for _, q := range []string{"BEGIN", "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1", "COMMIT"} {
			fxExec(t, a, q)
		}
		if n := prepared(); n != 0 {
			t.Fatalf("%v templates prepared before the CALL, want 0 (the PREPARE waits for the next Query)", n)
		}
		fxExec(t, a, "CALL "+lg+"_p()")
	}
	if n := prepared(); n != 1 {
		t.Fatalf("%v templates prepared in front of the CALLs, want 1", n)
	}
	var got string
	if err := f.d.QueryRow(ctxT(t), "SELECT string_agg(tok, ' ' ORDER BY n) FROM "+lg).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := strings.Repeat(" 5 fenceproxy:pooled", rounds)[1:]; got != want {
		t.Errorf("the CALL saw %q, want %q (its token before the COMMIT, the placeholder after)", got, want)
	}
}
