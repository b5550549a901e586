package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// Hostile and awkward clients against prepared fences (proxy/prepared.go): what a client can do to the
// statements the proxy prepares on its upstream connection, and what the proxy must still guarantee (every write
// to a protected table fenced, the client's answers its own, the server holding no statement the proxy forgot).

// TestPreparedAttackForgetDoesNotLeak: whatever makes the proxy forget its statements (a text that merely
// mentions a discarded row, the client deallocating a statement of its own, a DISCARD ALL that fails inside a
// transaction block) must not leave them on the server: a session that loops on it would otherwise grow the
// backend's memory without bound, one orphaned statement per shape per round.
func TestPreparedAttackForgetDoesNotLeak(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		c := f.simple(t, "5")
		markDiscarded := fmt.Sprintf("UPDATE public.%s SET note = 'discarded' WHERE id = 2", f.name)
		fxExec(t, c, "PREPARE keep AS SELECT 42") // the client's own statement outlives every sweep
		// The UPDATE of balance is templated (a shape's third text is the first its template serves) and
		// prepared; the UPDATE of note, whose constant is a string, is never prepared.
		for i := range 3 {
			if err := f.transaction(t, c, 1, i+1); err != nil {
				t.Fatal(err)
			}
			fxExec(t, c, markDiscarded)
		}
		for _, forget := range []struct {
			name   string
			forget bool // the proxy cannot tell that its statements are still there: it forgets and sweeps
			run    func(round int)
		}{
			{"a text mentioning a discarded row", false, func(int) { fxExec(t, c, markDiscarded) }},
			{"DEALLOCATE of the client's own statement", false, func(round int) {
				fxExec(t, c, fmt.Sprintf("PREPARE mine%d AS SELECT 1", round))
				fxExec(t, c, fmt.Sprintf("DEALLOCATE mine%d", round))
			}},
			{"DEALLOCATE of the client's own statement, with a comment", true, func(round int) {
				fxExec(t, c, fmt.Sprintf("PREPARE mine%d AS SELECT 1", round))
				fxExec(t, c, fmt.Sprintf("DEALLOCATE /* its own */ mine%d", round))
			}},
			{"a string holding the word discard", true, func(int) { fxExec(t, c, "SELECT 'discard'") }},
			{"DISCARD ALL refused inside a transaction block", true, func(int) {
				fxExec(t, c, "BEGIN")
				if _, err := c.Exec(ctxT(t), "DISCARD ALL"); err == nil {
					t.Fatal("DISCARD ALL inside a transaction block succeeded")
				}
				fxExec(t, c, "ROLLBACK")
			}},
		} {
			prepares := func() float64 {
				return fxCounter(t, f.p.Registry, "fenceproxy_prepared_fences_total", map[string]string{"outcome": "prepared"})
			}
			before := prepares()
			for round := range 4 {
				start := serverStatements(t, c)
				forget.run(round)
				for i := range 3 {
					if err := f.transaction(t, c, 1, i+1); err != nil {
						t.Fatalf("%s, round %d: %v", forget.name, round, err)
					}
					fxExec(t, c, markDiscarded)
				}
				// Two shapes are in use: the UPDATE of balance and the UPDATE of note.
				now := serverStatements(t, c)
				if n := len(now); n > 2 {
					t.Fatalf("after %s, round %d: %d statements of the proxy's on the server, want at most 2 (the shapes in use)", forget.name, round, n)
				}
				// And it is used: forgotten or not, the UPDATE of balance is prepared (again) at the idle point
				// after its first use, so at least its second and third ran as EXECUTE.
				if n := runsSince(start, now); n < 2 {
					t.Fatalf("after %s, round %d: the server ran %d of the round's three UPDATEs of balance as EXECUTE, want at least 2 (%v)", forget.name, round, n, now)
				}
			}
			if n := prepares() - before; !forget.forget && n > 2 {
				t.Fatalf("%s: %v PREPAREs, want at most 2 (the first time, one per shape): it drops nothing of the proxy's", forget.name, n)
			}
		}
		var kept int
		if err := c.QueryRow(ctxT(t), "EXECUTE keep").Scan(&kept); err != nil || kept != 42 {
			t.Fatalf("the client's own statement after the sweeps: %v, %v", kept, err)
		}
		f.wantRows(t, fmt.Sprintf("1:%d:5 2:0:5", (1+5*4)*(1+2+3)))
	})
}

// TestPreparedAttackPlantedNames: a client that prepares statements under the proxy's names (before the proxy
// does, or in place of one the proxy prepared, by DEALLOCATE and PREPARE in one text or in a DO block) never
// makes the proxy run the client's statement in place of its fenced template: its UPDATE still writes, and a stale
// token is still refused.
func TestPreparedAttackPlantedNames(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		c := f.simple(t, "5")
		// Names the proxy would take next, taken first: the proxy's PREPAREs fail, and the statements run as SQL.
		for i := 1; i <= 3; i++ {
			fxExec(t, c, fmt.Sprintf("PREPARE fenceproxy_p%d(int4, int4) AS SELECT $1, $2", i))
		}
		balance := 0
		for i := 1; i <= 4; i++ {
			if err := f.transaction(t, c, 1, i); err != nil {
				t.Fatalf("transaction %d: %v", i, err)
			}
			balance += i
		}
		fxExec(t, c, "DEALLOCATE ALL")
		sqlPlant := func(format string) func(n int) {
			return func(n int) { fxExec(t, c, fmt.Sprintf(format, n)) }
		}
		for _, plant := range []struct {
			name string
			run  func(n int)
		}{
			{"DEALLOCATE and PREPARE in one text", sqlPlant("DEALLOCATE fenceproxy_p%[1]d; PREPARE fenceproxy_p%[1]d(int4, int4) AS SELECT $1, $2")},
			{"DEALLOCATE and PREPARE in a DO block", sqlPlant("DO $$BEGIN EXECUTE 'DEALLOCATE fenceproxy_p%[1]d'; EXECUTE 'PREPARE fenceproxy_p%[1]d(int4, int4) AS SELECT $1, $2'; END$$")},
			{"Close and Parse (extended protocol)", func(n int) {
				name := fmt.Sprintf("fenceproxy_p%d", n)
				if err := c.PgConn().Deallocate(ctxT(t), name); err != nil {
					t.Fatalf("Close %s: %v", name, err)
				}
				if _, err := c.PgConn().Prepare(ctxT(t), name, "SELECT $1::int4, $2::int4", nil); err != nil {
					t.Fatalf("Parse %s: %v", name, err)
				}
			}},
		} {
			if tr == pooledTransport && plant.name != "DEALLOCATE and PREPARE in a DO block" {
				// The pool gives the client's SQL-level and protocol-level statement names server names of its
				// own (pooledsqlprep.go, pooledstmts.go): only code the server runs reaches the proxy's names.
				continue
			}
			before := serverStatements(t, c)
			for i := 1; i <= 4; i++ {
				if err := f.transaction(t, c, 1, i); err != nil {
					t.Fatalf("transaction %d: %v", i, err)
				}
				balance += i
			}
			planted := serverStatements(t, c)
			if runsSince(before, planted) == 0 {
				t.Fatalf("before %s: no statement ran as EXECUTE (%v)", plant.name, planted)
			}
			var name string
			if err := c.QueryRow(ctxT(t), "SELECT name FROM pg_prepared_statements WHERE name LIKE 'fenceproxy\\_p%' AND statement LIKE '%UPDATE%'").Scan(&name); err != nil {
				t.Fatal(err)
			}
			var n int
			if _, err := fmt.Sscanf(name, "fenceproxy_p%d", &n); err != nil {
				t.Fatal(err)
			}
			// The prepared UPDATE is replaced by the client's SELECT under its name; the next UPDATE must write.
			plant.run(n)
			q := fmt.Sprintf("UPDATE public.%s SET balance = balance + 1000 WHERE id = 1", f.name)
			tag, err := c.Exec(ctxT(t), q)
			if err != nil {
				t.Fatalf("after %s: %s: %v", plant.name, q, err)
			}
			if tag.String() != "UPDATE 1" {
				t.Fatalf("after %s: %s: %s: the client's planted statement ran in place of the fenced UPDATE", plant.name, q, tag)
			}
			balance += 1000
			if got, want := fxSnapshot(t, f.d, "public."+f.name), fmt.Sprintf("1:%d:5 2:0:1", balance); got != want {
				t.Fatalf("after %s: rows %s, want %s", plant.name, got, want)
			}
			// The proxy prepares the UPDATE again, under a statement of its own, and runs it: the planted
			// statement is gone.
			for i := 1; i <= 3; i++ {
				if err := f.transaction(t, c, 1, i); err != nil {
					t.Fatalf("after %s, transaction %d: %v", plant.name, i, err)
				}
				balance += i
			}
			now := serverStatements(t, c)
			if runsOfNew(planted, now) == 0 {
				t.Fatalf("after %s: the UPDATE was not prepared again and run as EXECUTE (%v)", plant.name, now)
			}
			for _, st := range now {
				if !strings.Contains(st.text, "UPDATE") {
					t.Fatalf("after %s: the planted statement is still on the server: %v", plant.name, st)
				}
			}
		}
		// A stale holder is refused however the names were played with.
		newer := f.simple(t, "9")
		if err := f.transaction(t, newer, 1, 1); err != nil {
			t.Fatal(err)
		}
		var pgErr *pgconn.PgError
		for i := range 3 {
			if err := f.transaction(t, c, 1, i); !errors.As(err, &pgErr) || pgErr.Code != "55F01" {
				t.Fatalf("stale holder, statement %d: %v, want 55F01", i, err)
			}
		}
	})
}

// transcript reads c's messages up to and including the next ReadyForQuery, each as a short line: what the
// client saw, in order.
func transcript(t *testing.T, c *rawClient) []string {
	t.Helper()
	var out []string
	for {
		m, err := c.fe.Receive()
		if err != nil {
			t.Fatalf("receive after %q: %v", out, err)
		}
		switch m := m.(type) {
		case *pgproto3.CommandComplete:
			out = append(out, "C "+string(m.CommandTag))
		case *pgproto3.DataRow:
			for _, v := range m.Values {
				out = append(out, "D "+string(v))
			}
		case *pgproto3.ErrorResponse:
			out = append(out, "E "+m.Code)
		case *pgproto3.NotificationResponse:
			out = append(out, "A "+m.Channel+" "+m.Payload)
		case *pgproto3.ParseComplete:
			out = append(out, "1")
		case *pgproto3.BindComplete:
			out = append(out, "2")
		case *pgproto3.ReadyForQuery:
			return append(out, "Z "+string(m.TxStatus))
		}
	}
}

// send writes msgs to the proxy in one write.
func (c *rawClient) send(t *testing.T, msgs ...pgproto3.FrontendMessage) {
	t.Helper()
	c.conn.SetDeadline(time.Now().Add(20 * time.Second))
	for _, m := range msgs {
		c.fe.Send(m)
	}
	if err := c.fe.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestPreparedAttackPipelines: a client that pipelines (Query messages sent without waiting, extended-protocol
// batches between them, errors in the middle, a notification of its own) while the proxy's PREPAREs go out sees
// exactly the answers to its own messages, in order, and nothing of the proxy's.
func TestPreparedAttackPipelines(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		c := dialRaw(t, f.p.Addr, pgtest.SuperUser, pgtest.TestDB, nil)
		upd := func(delta, id int) *pgproto3.Query {
			return &pgproto3.Query{String: fmt.Sprintf("UPDATE public.%s SET balance = balance + %d WHERE id = %d", f.name, delta, id)}
		}
		note := func(s string) *pgproto3.Query {
			return &pgproto3.Query{String: fmt.Sprintf("UPDATE public.%s SET note = '%s' WHERE id = 2", f.name, s)}
		}
		want := func(what string, got []string, want ...string) {
			t.Helper()
			if strings.Join(got, "|") != strings.Join(want, "|") {
				t.Fatalf("%s: the client saw %q, want %q", what, got, want)
			}
		}
		c.send(t, &pgproto3.Query{String: "SET fence.token = 5"})
		want("SET", transcript(t, c), "C SET", "Z I")
		c.send(t, &pgproto3.Query{String: "LISTEN pf"})
		want("LISTEN", transcript(t, c), "C LISTEN", "Z I")
		balance := 0
		for round := range 6 {
			// Each round starts idle, so the PREPAREs queued by the last round go out before its first Query.
			c.send(t,
				upd(1, 1), note(fmt.Sprintf("r%d", round)),
				&pgproto3.Query{String: "SELECT 'one'"},
				&pgproto3.Parse{Query: fmt.Sprintf("UPDATE public.%s SET balance = balance + $1 WHERE id = 1", f.name)},
				&pgproto3.Bind{Parameters: [][]byte{[]byte("10")}}, &pgproto3.Execute{}, &pgproto3.Sync{},
				upd(100, 1),
				&pgproto3.Query{String: "NOTIFY pf, 'x'"},
				&pgproto3.Query{String: "SELECT 1/0"},
				&pgproto3.Query{String: "BEGIN"}, upd(1000, 1), &pgproto3.Query{String: "SELECT 1/0"}, upd(1000, 1),
				&pgproto3.Query{String: "ROLLBACK"},
				&pgproto3.Parse{Query: "SELECT 1/0"}, &pgproto3.Bind{}, &pgproto3.Execute{},
				&pgproto3.Parse{Query: fmt.Sprintf("UPDATE public.%s SET balance = balance + 1000 WHERE id = 1", f.name)},
				&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
				upd(2, 1),
			)
			what := fmt.Sprintf("round %d", round)
			want(what+", UPDATE", transcript(t, c), "C UPDATE 1", "Z I")
			want(what+", UPDATE note", transcript(t, c), "C UPDATE 1", "Z I")
			want(what+", SELECT", transcript(t, c), "D one", "C SELECT 1", "Z I")
			want(what+", extended UPDATE", transcript(t, c), "1", "2", "C UPDATE 1", "Z I")
			want(what+", UPDATE", transcript(t, c), "C UPDATE 1", "Z I")
			want(what+", NOTIFY", transcript(t, c), "C NOTIFY", "A pf x", "Z I")
			want(what+", error", transcript(t, c), "E 22012", "Z I")
			want(what+", BEGIN", transcript(t, c), "C BEGIN", "Z T")
			want(what+", UPDATE in the block", transcript(t, c), "C UPDATE 1", "Z T")
			want(what+", error in the block", transcript(t, c), "E 22012", "Z E")
			want(what+", UPDATE in the failed block", transcript(t, c), "E 25P02", "Z E")
			want(what+", ROLLBACK", transcript(t, c), "C ROLLBACK", "Z I")
			want(what+", failed batch", transcript(t, c), "1", "E 22012", "Z I") // 1/0 is folded when the plan is made, at Bind
			want(what+", UPDATE", transcript(t, c), "C UPDATE 1", "Z I")
			balance += 1 + 10 + 100 + 2
		}
		// The proxy's statements run as EXECUTE only after a BEGIN (prepared.go).
		for range 3 {
			rawTransaction(t, c, upd(1, 1))
			balance++
		}
		if n := runsSince(nil, rawServerStatements(t, c)); n == 0 {
			t.Fatal("the server ran no statement as EXECUTE")
		}
		f.wantRows(t, fmt.Sprintf("1:%d:5 2:0:5", balance))
		c.send(t, &pgproto3.Query{String: "SELECT 'end'"})
		want("the last Query", transcript(t, c), "D end", "C SELECT 1", "Z I")
	})
}

// TestPreparedAttackReuse: a session that plants statements under the proxy's names and ends cleanly hands its
// upstream connection (reset with DISCARD ALL) to the next session, which prepares its own templates under the
// same names and whose writes are fenced by them, not by anything the first session left.
func TestPreparedAttackReuse(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		pidOf := func(t *testing.T, c *pgx.Conn) uint32 {
			if tr != pooledTransport {
				return pidOf(t, c) // and BackendKeyData says the same
			}
			var pid uint32 // BackendKeyData is the proxy's own; the pool of one has one backend
			if err := c.QueryRow(ctxT(t), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			return pid
		}
		a := f.simple(t, "5")
		pidA := pidOf(t, a)
		for i := 1; i <= 4; i++ {
			if err := f.transaction(t, a, 1, i); err != nil {
				t.Fatal(err)
			}
		}
		for i := 2; i <= 4; i++ {
			fxExec(t, a, fmt.Sprintf("PREPARE fenceproxy_p%d(int4, int4) AS SELECT $1, $2", i))
		}
		closeConn(t, a)
		if tr != pooledTransport {
			waitIdle(t, f.p, 1) // kept for reuse; a pool's connection simply goes back to the pool
		}
		b := f.simple(t, "5")
		if pidB := pidOf(t, b); pidB != pidA {
			t.Fatalf("the second session got backend %d, the first had %d: the connection was not reused", pidB, pidA)
		}
		for i := 1; i <= 4; i++ {
			if err := f.transaction(t, b, 1, 100); err != nil {
				t.Fatal(err)
			}
		}
		if executions(t, b) == 0 {
			t.Fatal("the second session ran no statement as EXECUTE")
		}
		f.wantRows(t, "1:410:5 2:0:1")
		// (A pool keeps the first client's own statements, under names of its own, for clients that prepare the
		// same: only those under the proxy's names count there.)
		var planted int
		if err := b.QueryRow(ctxT(t), "SELECT count(*) FROM pg_prepared_statements WHERE statement NOT LIKE '%UPDATE%' AND ($1 OR name LIKE 'fenceproxy\\_p%')", tr != pooledTransport).Scan(&planted); err != nil || planted != 0 {
			t.Fatalf("%d statements of the first session on the reused connection (%v)", planted, err)
		}
	})
}

// TestPreparedAttackConfigReload: a template prepared under one table configuration is not executed after a
// reload changes the table's fence (here its token column): the session's next statement is fenced as the new
// configuration says.
func TestPreparedAttackConfigReload(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		fxExec(t, f.d, fmt.Sprintf("ALTER TABLE public.%s ADD COLUMN other_token bigint", f.name))
		c := f.simple(t, "5")
		for i := 1; i <= 4; i++ {
			if err := f.transaction(t, c, 1, i); err != nil {
				t.Fatal(err)
			}
		}
		// The fifth: the template prepared in the fourth is verified before its BEGIN (prepared.go).
		if err := f.transaction(t, c, 1, 5); err != nil {
			t.Fatal(err)
		}
		old := serverStatements(t, c)
		if runsSince(nil, old) == 0 {
			t.Fatal("no statement ran as EXECUTE before the reload")
		}
		cfg, err := config.Parse("reload.yaml", []byte(fmt.Sprintf("listen: %s\nupstream:\n  address: %s\ntables:\n  - name: public.%s\n    token_column: other_token\n", f.p.Addr, pg.Addr(), f.name)))
		if err != nil {
			t.Fatal(err)
		}
		planner, err := proxy.NewPlanner(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		f.p.Server.SetPlanner(planner)
		fxExec(t, f.d, fmt.Sprintf("UPDATE public.%s SET other_token = 9 WHERE id = 1", f.name))
		for i := range 4 {
			err := f.transaction(t, c, 1, 1000)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "55F01" {
				t.Fatalf("statement %d after the reload: %v, want 55F01 (row 1's other_token is 9, the session's token 5)", i, err)
			}
		}
		f.wantRows(t, "1:15:5 2:0:1")
		// The refusals came from the template of the new configuration, run as EXECUTE; the old one ran no more.
		now := serverStatements(t, c)
		if runsOfNew(old, now) == 0 {
			t.Fatalf("after the reload no template of the new configuration ran as EXECUTE (%v)", now)
		}
		if runsSince(old, now) != runsOfNew(old, now) {
			t.Fatalf("after the reload a template of the old configuration ran (before: %v, now: %v)", old, now)
		}
	})
}

// TestPreparedAttackSearchPath: a template prepared under one search_path, with the table unqualified (configured
// unqualified, so protected in every schema), writes the table the current search_path names, as the SQL would:
// PostgreSQL analyses a prepared statement again when search_path changed.
func TestPreparedAttackSearchPath(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		d := direct(t)
		name := preparedName(t)
		s1, s2 := name+"_s1", name+"_s2"
		for _, s := range []string{s1, s2} {
			fxCreateSchema(t, d, s)
			fxCreateTable(t, d, s+"."+name)
			fxExec(t, d, fmt.Sprintf("INSERT INTO %s.%s (id, balance, fence_token) VALUES (1, 0, 1)", s, name))
		}
		p := startProxy(t, tr.options(fxTables(name), "", ""))
		c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB)+"&default_query_exec_mode=simple_protocol")
		fxExec(t, c, "SET fence.token = 5")
		run := func(schema string, delta int) {
			t.Helper()
			fxExec(t, c, "SET search_path = "+schema)
			for range 4 {
				fxTransaction(t, c, fmt.Sprintf("UPDATE %s SET balance = balance + %d WHERE id = 1", name, delta))
			}
		}
		run(s1, 1)
		afterS1 := executions(t, c)
		run(s2, 10)
		afterS2 := executions(t, c)
		run(s1, 100)
		// The first four build the shape's template and prepare it; the later rounds run the statement prepared
		// under the first search_path.
		if n := executions(t, c); afterS2-afterS1 < 2 || n-afterS2 < 2 {
			t.Fatalf("the server ran %d, %d and %d of each four statements as EXECUTE, want at least 2 of the second and third four", afterS1, afterS2-afterS1, n-afterS2)
		}
		if got1, got2 := fxSnapshot(t, d, s1+"."+name), fxSnapshot(t, d, s2+"."+name); got1 != "1:404:5" || got2 != "1:40:5" {
			t.Fatalf("rows %s in %s and %s in %s, want 1:404:5 and 1:40:5", got1, s1, got2, s2)
		}
	})
}

// TestPreparedAttackShadowingTable: a temporary table created after the template was prepared shadows the
// protected table's unqualified name. The SQL writes the temporary table; so must the statement after the CREATE
// (the proxy forgets its statements on CREATE and prepares again), not the table the template was prepared for.
func TestPreparedAttackShadowingTable(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		d := direct(t)
		name := preparedName(t)
		fxCreateTable(t, d, "public."+name)
		fxExec(t, d, fmt.Sprintf("INSERT INTO public.%s (id, balance, fence_token) VALUES (1, 0, 1)", name))
		p := startProxy(t, tr.options(fxTables(name), "", ""))
		c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB)+"&default_query_exec_mode=simple_protocol")
		fxExec(t, c, "SET fence.token = 5")
		// The session's temporary schema exists before the template is prepared.
		fxExec(t, c, "CREATE TEMP TABLE scratch (x int)")
		for i := 1; i <= 6; i++ {
			fxTransaction(t, c, fmt.Sprintf("UPDATE %s SET balance = balance + %d WHERE id = 1", name, i))
		}
		before := serverStatements(t, c)
		if runsSince(nil, before) == 0 {
			t.Fatal("no statement ran as EXECUTE")
		}
		fxExec(t, c, fmt.Sprintf("CREATE TEMP TABLE %s (LIKE public.%s INCLUDING ALL)", name, name))
		fxExec(t, c, fmt.Sprintf("INSERT INTO %s (id, balance, fence_token) VALUES (1, 0, 1)", name))
		for i := 1; i <= 6; i++ {
			fxTransaction(t, c, fmt.Sprintf("UPDATE %s SET balance = balance + %d WHERE id = 1", name, 100*i))
		}
		if now := serverStatements(t, c); runsOfNew(before, now) == 0 {
			t.Fatalf("after the CREATE the UPDATE was not prepared again and run as EXECUTE (before %v, now %v)", before, now)
		}
		if got := fxSnapshot(t, d, "public."+name); got != "1:21:5" {
			t.Fatalf("public table %s, want 1:21:5 (the later statements belong to the temporary table)", got)
		}
		var temp string
		if err := c.QueryRow(ctxT(t), fmt.Sprintf("SELECT balance || ':' || fence_token FROM pg_temp.%s WHERE id = 1", name)).Scan(&temp); err != nil || temp != "2100:5" {
			t.Fatalf("temporary table %q (%v), want 2100:5", temp, err)
		}
	})
}

// TestPreparedAttackReadingChanges: client_encoding and standard_conforming_strings changed while a session writes
// string constants: strings are never prepared (a string parameter is read otherwise than its literal:
// rewrite/prepared.go), so each statement goes as SQL and means what the client's text means (re-encoded for the
// client's encoding, backslashes read as the setting says).
func TestPreparedAttackReadingChanges(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		c := dialRaw(t, f.p.Addr, pgtest.SuperUser, pgtest.TestDB, nil)
		ok := func(what string, rs []result) {
			t.Helper()
			for _, r := range rs {
				if r.err != nil {
					t.Fatalf("%s: %s", what, r)
				}
			}
		}
		ok("SET", c.query(t, []byte("SET fence.token = 5")))
		setNote := func(encName, literal string, id int) {
			t.Helper()
			ok(literal, c.query(t, enc(t, encName, fmt.Sprintf("UPDATE public.%s SET note = %s WHERE id = %d", f.name, literal, id))))
		}
		for i := range 4 {
			setNote("UTF8", fmt.Sprintf("'w%d'", i), i%2+1)
		}
		for _, step := range []struct {
			set, encName, literal, want string
		}{
			{"SET client_encoding = LATIN1", "LATIN1", "'é1'", "é1"},
			{"SET standard_conforming_strings = off", "LATIN1", `'a\\b\'é'`, `a\b'é`},
			{"SET client_encoding = SJIS", "SJIS", `'ソ\\表'`, `ソ\表`},
			{"SET standard_conforming_strings = on", "SJIS", `'ソ\表'`, `ソ\表`},
			{"SET client_encoding = UTF8", "UTF8", `E'\x41\\'`, `A\`},
		} {
			ok(step.set, c.query(t, []byte(step.set)))
			for id := 3; id <= 6; id++ { // no such rows: the shape under the new settings, templated
				setNote(step.encName, step.literal, id)
			}
			setNote(step.encName, step.literal, 1)
			if st := rawServerStatements(t, c); len(st) != 0 {
				t.Fatalf("after %s: %s was prepared (%v); string constants are not prepared", step.set, step.literal, st)
			}
			var note string
			if err := f.d.QueryRow(ctxT(t), fmt.Sprintf("SELECT note FROM public.%s WHERE id = 1", f.name)).Scan(&note); err != nil || note != step.want {
				t.Fatalf("after %s, note = %s: the row holds %q (%v), want %q", step.set, step.literal, note, err, step.want)
			}
		}
	})
}

// TestPreparedAttackLockedTable: the proxy's PREPARE goes out ahead of whatever the client sends next, and
// analysing a template locks its tables; while another session holds (or waits for) a lock that conflicts, as a
// migration's ALTER TABLE or a LOCK TABLE does, the client's next statement, which may touch nothing of that table,
// must not wait behind it. The PREPARE gives up at once and is tried again at a later idle point.
func TestPreparedAttackLockedTable(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		c := f.simple(t, "5")
		for i := 1; i <= 3; i++ { // the PREPARE is queued
			if err := f.transaction(t, c, 1, i); err != nil {
				t.Fatal(err)
			}
		}
		tx, err := f.d.Begin(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctxT(t))
		if _, err := tx.Exec(ctxT(t), "LOCK TABLE public."+f.name+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			t.Fatal(err)
		}
		var one int
		if err := c.QueryRow(ctxT(t), "SELECT 1").Scan(&one); err != nil {
			t.Fatalf("SELECT 1 while another session locks the protected table: %v", err)
		}
		if err := tx.Rollback(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if n := fxCounter(t, f.p.Registry, "fenceproxy_prepared_fences_total", map[string]string{"outcome": "retried"}); n != 1 {
			t.Fatalf("%v PREPAREs met the lock, want 1 (the one sent ahead of SELECT 1)", n)
		}
		for i := 1; i <= 3; i++ {
			if err := f.transaction(t, c, 1, 10); err != nil {
				t.Fatal(err)
			}
		}
		if executions(t, c) == 0 {
			t.Fatal("the template was not prepared once the lock was gone")
		}
		f.wantRows(t, "1:36:5 2:0:1")
	})
}

// TestPreparedAttackCopy: COPY in both directions right behind the proxy's PREPARE (the first Query after the
// template is queued): the client gets the COPY's own answers, and its data reaches the table.
func TestPreparedAttackCopy(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		other := f.name + "_copy"
		fxExec(t, f.d, "CREATE TABLE public."+other+" (x int)")
		t.Cleanup(func() { f.d.Exec(ctxT(t), "DROP TABLE IF EXISTS public."+other) })
		c := dialRaw(t, f.p.Addr, pgtest.SuperUser, pgtest.TestDB, nil)
		c.send(t, &pgproto3.Query{String: "SET fence.token = 5"})
		transcript(t, c)
		upd := func(delta int) *pgproto3.Query {
			return &pgproto3.Query{String: fmt.Sprintf("UPDATE public.%s SET balance = balance + %d WHERE id = 1", f.name, delta)}
		}
		for round := range 4 {
			// In round 0 the third UPDATE queues the template, whose PREPARE goes out just before the COPY.
			for i := 1; i <= 3; i++ {
				c.send(t, upd(i))
				if got := strings.Join(transcript(t, c), "|"); got != "C UPDATE 1|Z I" {
					t.Fatalf("UPDATE: %s", got)
				}
			}
			// One in a transaction: the proxy's statements run as EXECUTE only after a BEGIN (prepared.go).
			rawTransaction(t, c, upd(0))
			c.send(t, &pgproto3.Query{String: "COPY public." + other + " FROM STDIN"},
				&pgproto3.CopyData{Data: []byte(fmt.Sprintf("%d\n", round))}, &pgproto3.CopyDone{},
				upd(100))
			if got := strings.Join(transcript(t, c), "|"); got != "C COPY 1|Z I" {
				t.Fatalf("round %d, COPY FROM STDIN: %s", round, got)
			}
			if got := strings.Join(transcript(t, c), "|"); got != "C UPDATE 1|Z I" {
				t.Fatalf("round %d, UPDATE after the COPY: %s", round, got)
			}
			// And out: CopyOutResponse, the data, CopyDone, reach the client as the server sent them.
			c.send(t, &pgproto3.Query{String: "COPY (SELECT count(*) FROM public." + other + ") TO STDOUT"})
			var got []string
			for {
				m, err := c.fe.Receive()
				if err != nil {
					t.Fatal(err)
				}
				switch m := m.(type) {
				case *pgproto3.CopyOutResponse:
					got = append(got, "H")
				case *pgproto3.CopyData:
					got = append(got, "d "+strings.TrimSpace(string(m.Data)))
				case *pgproto3.CopyDone:
					got = append(got, "c")
				case *pgproto3.CommandComplete:
					got = append(got, "C "+string(m.CommandTag))
				case *pgproto3.ErrorResponse:
					got = append(got, "E "+m.Code)
				}
				if _, ok := m.(*pgproto3.ReadyForQuery); ok {
					break
				}
			}
			if want := fmt.Sprintf("H|d %d|c|C COPY 1", round+1); strings.Join(got, "|") != want {
				t.Fatalf("round %d, COPY TO STDOUT: %q, want %q", round, got, want)
			}
		}
		if n := runsSince(nil, rawServerStatements(t, c)); n < 3 {
			t.Fatalf("the server ran %d of the UPDATEs as EXECUTE, want at least 3 (the one in each round's transaction once the template is prepared and verified)", n)
		}
		f.wantRows(t, "1:424:5 2:0:1")
	})
}

// TestPreparedAttackTypedLiteralsNotFrozen: a typed literal the shape keeps as written (TIMESTAMPTZ '...', DATE
// '...', INTERVAL '...') is converted when the statement is analysed, under the session's TimeZone, DateStyle
// and IntervalStyle and at the current time ('now', 'today'): in a prepared template that would be once, at the
// PREPARE, and every EXECUTE would write that value. Each statement must read its literals when it runs, as the
// SQL does.
func TestPreparedAttackTypedLiteralsNotFrozen(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		c := f.simple(t, "5")
		fxExec(t, c, "SET TimeZone = 'UTC'")
		set := func(id int) {
			t.Helper()
			fxExec(t, c, fmt.Sprintf("UPDATE public.%s SET note = (TIMESTAMPTZ '2024-01-01 00:00' AT TIME ZONE 'UTC')::text WHERE id = %d", f.name, id))
		}
		for id := 3; id <= 6; id++ { // no such rows: the shape, prepared under TimeZone UTC if it may be
			set(id)
		}
		fxExec(t, c, "SET TimeZone = 'Asia/Tokyo'")
		set(1)
		var note string
		if err := f.d.QueryRow(ctxT(t), fmt.Sprintf("SELECT note FROM public.%s WHERE id = 1", f.name)).Scan(&note); err != nil {
			t.Fatal(err)
		}
		if note != "2023-12-31 15:00:00" {
			t.Fatalf("note %q, want 2023-12-31 15:00:00: midnight in Tokyo, the TimeZone in force when the statement ran", note)
		}
	})
}

// TestPreparedAttackEviction: more shapes than upstream.prepared_fences allows, used in turn: the proxy keeps at
// most that many statements on the connection (deallocating the least recently used at idle points), and every
// statement, prepared or not, does what its SQL says.
func TestPreparedAttackEviction(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "  prepared_fences: 2\n")
		c := f.simple(t, "5")
		shapes := []string{
			"UPDATE public.%s SET balance = balance + %d WHERE id = 1",
			"UPDATE public.%s SET note = 'n%d' WHERE id = 2",
			"UPDATE public.%s SET balance = balance - %d WHERE id = 2",
			"DELETE FROM public.%s WHERE id = %d + 1000",
		}
		balance1, balance2 := 0, 0
		for round := 1; round <= 6; round++ {
			for s, shape := range shapes {
				before := serverStatements(t, c)
				for i := range 3 {
					delta := round*10 + i
					fxTransaction(t, c, fmt.Sprintf(shape, f.name, delta))
					switch s {
					case 0:
						balance1 += delta
					case 2:
						balance2 -= delta
					}
				}
				now := serverStatements(t, c)
				if n := len(now); n > 2 {
					t.Fatalf("round %d, shape %d: %d statements of the proxy's on the server, want at most 2", round, s, n)
				}
				// Three shapes take turns in two places, so each is evicted before its next turn: its first use
				// queues the PREPARE, the second sends it, the third runs as EXECUTE (from round 2: in round 1 a
				// shape's texts build its template). A string constant (shape 1) is never prepared.
				switch n := runsSince(before, now); {
				case s == 1 && n != 0:
					t.Fatalf("round %d, shape %d: the server ran %d statements as EXECUTE, of a shape with a string constant (%v)", round, s, n, now)
				case s != 1 && round > 1 && n < 1:
					t.Fatalf("round %d, shape %d: the server ran %d of its three statements as EXECUTE, want at least 1 (%v)", round, s, n, now)
				}
			}
		}
		f.wantRows(t, fmt.Sprintf("1:%d:5 2:%d:5", balance1, balance2))
	})
}

// fxTransaction runs sql in a transaction of its own (BEGIN, sql, COMMIT, each a Query): prepared fences run as
// EXECUTE only after a BEGIN (prepared.go).
func fxTransaction(t *testing.T, c *pgx.Conn, sql string) {
	t.Helper()
	fxExec(t, c, "BEGIN")
	fxExec(t, c, sql)
	fxExec(t, c, "COMMIT")
}

// rawTransaction sends BEGIN, q and COMMIT on c, each after the answer to the one before, and checks the
// answers (q updates one row).
func rawTransaction(t *testing.T, c *rawClient, q *pgproto3.Query) {
	t.Helper()
	for _, step := range []struct {
		q    *pgproto3.Query
		want string
	}{{&pgproto3.Query{String: "BEGIN"}, "C BEGIN|Z T"}, {q, "C UPDATE 1|Z T"}, {&pgproto3.Query{String: "COMMIT"}, "C COMMIT|Z I"}} {
		c.send(t, step.q)
		if got := strings.Join(transcript(t, c), "|"); got != step.want {
			t.Fatalf("%s: the client saw %s, want %s", step.q.String, got, step.want)
		}
	}
}

// serverExecutions is how many times the server ran the proxy's prepared statements on c's connection
// (generic and custom plans of every statement named with the proxy's prefix), read through c itself.
func serverExecutions(t *testing.T, c *pgx.Conn) int64 {
	t.Helper()
	var n int64
	if err := c.QueryRow(ctxT(t), `SELECT coalesce(sum(generic_plans + custom_plans), 0)::int8 FROM pg_prepared_statements
		WHERE name LIKE 'fenceproxy\_p%' AND statement LIKE '%fenceproxy_stmt%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// createSwapFunction creates a function (dropped when the test ends) that deallocates every statement named with
// the proxy's prefix on the connection that calls it and prepares, under the same name and parameter types, an
// unfenced UPDATE of table's balance; it returns how many it replaced. It returns the function's name.
func createSwapFunction(t *testing.T, d *pgx.Conn, table string) string {
	t.Helper()
	fn := fxName(t, "swap")
	fxExec(t, d, fmt.Sprintf(`CREATE FUNCTION public.%s() RETURNS int LANGUAGE plpgsql AS $$
DECLARE r record; n int := 0;
BEGIN
	FOR r IN SELECT name, parameter_types FROM pg_prepared_statements WHERE name LIKE 'fenceproxy\_p%%' LOOP
		EXECUTE format('DEALLOCATE %%I', r.name);
		EXECUTE format('PREPARE %%I(%%s) AS UPDATE %s SET balance = balance + $1 WHERE id = $2',
			r.name, array_to_string(r.parameter_types, ','));
		n := n + 1;
	END LOOP;
	RETURN n;
END $$`, fn, table))
	t.Cleanup(func() { d.Exec(context.Background(), "DROP FUNCTION IF EXISTS public."+fn+"()") })
	return fn
}

// TestPreparedAttackFunctionSwap (issue 27): a function, which the proxy cannot read, deallocates every
// statement of the proxy's and prepares an unfenced UPDATE under the same name and parameter types. Without the
// guard, a statement of that shape sent as EXECUTE would run it. The proxy verifies its names before it
// trusts them again: the stale holder's next statements are refused (55F01), nothing is written, and the proxy
// prepares its own statement again and runs it.
func TestPreparedAttackFunctionSwap(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		fn := createSwapFunction(t, f.d, "public."+f.name)
		c := f.simple(t, "5")
		balance := 0
		for i := 1; i <= 6; i++ {
			if err := f.transaction(t, c, 1, i); err != nil {
				t.Fatalf("transaction %d: %v", i, err)
			}
			balance += i
		}
		before := serverExecutions(t, c)
		if before == 0 {
			t.Fatal("no statement ran as EXECUTE before the attack (counted by the server)")
		}
		// A newer holder writes row 1; the stale holder's statements of the same shape must be refused.
		if err := f.transaction(t, f.simple(t, "9"), 1, 100); err != nil {
			t.Fatal(err)
		}
		balance += 100
		swap := func() {
			t.Helper()
			var swapped int
			if err := c.QueryRow(ctxT(t), "SELECT public."+fn+"()").Scan(&swapped); err != nil || swapped == 0 {
				t.Fatalf("the function replaced %d statements (%v)", swapped, err)
			}
		}
		// In the transaction of the statement itself, after the names were verified at its BEGIN.
		fxExec(t, c, "BEGIN")
		swap()
		var pgErr *pgconn.PgError
		if _, err := c.Exec(ctxT(t), fmt.Sprintf("UPDATE public.%s SET balance = balance + 1000 WHERE id = 1", f.name)); !errors.As(err, &pgErr) || pgErr.Code != "55F01" {
			t.Fatalf("stale holder after the swap in its transaction: %v, want 55F01 (an unfenced statement ran?)", err)
		}
		fxExec(t, c, "ROLLBACK")
		// Between transactions (the swapped statements outlive the ROLLBACK).
		swap()
		for i := range 3 {
			if err := f.transaction(t, c, 1, 1000); !errors.As(err, &pgErr) || pgErr.Code != "55F01" {
				t.Fatalf("stale holder after the swap, statement %d: %v, want 55F01 (an unfenced statement ran?)", i, err)
			}
		}
		f.wantRows(t, fmt.Sprintf("1:%d:9 2:0:1", balance))
		// The swapped statement is gone and the proxy's own runs again (re-prepared, executed by the server).
		var foreign int
		if err := c.QueryRow(ctxT(t), `SELECT count(*) FROM pg_prepared_statements WHERE statement NOT LIKE '%fenceproxy_stmt%'`).Scan(&foreign); err != nil || foreign != 0 {
			t.Fatalf("%d statements not the proxy's left on the connection (%v)", foreign, err)
		}
		after := serverExecutions(t, c)
		for i := 1; i <= 4; i++ {
			if err := f.transaction(t, c, 2, i); err != nil {
				t.Fatalf("transaction %d on row 2: %v", i, err)
			}
		}
		if serverExecutions(t, c) <= after {
			t.Fatal("the proxy did not prepare and run its statement again after the swap")
		}
		f.wantRows(t, fmt.Sprintf("1:%d:9 2:10:5", balance))
	})
}

// TestPreparedAttackFunctionSwapsOne: the function replaces one statement of the proxy's and leaves another in
// place. The verification then lists the other name, and only that one: the replaced name must not be taken
// for verified because the answer was not empty (each name counts only when the server lists it).
func TestPreparedAttackFunctionSwapsOne(t *testing.T) {
	forTransports(t, func(t *testing.T, tr preparedTransport) {
		f := newPreparedFixture(t, tr, "")
		fn := fxName(t, "swap1")
		fxExec(t, f.d, fmt.Sprintf(`CREATE FUNCTION public.%s(n text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE types text;
BEGIN
	SELECT array_to_string(parameter_types, ',') INTO types FROM pg_prepared_statements WHERE name = n;
	EXECUTE format('DEALLOCATE %%I', n);
	EXECUTE format('PREPARE %%I(%%s) AS UPDATE public.%s SET balance = balance + $1 WHERE id = $2', n, types);
	RETURN 1;
END $$`, fn, f.name))
		t.Cleanup(func() { f.d.Exec(ctxT(t), "DROP FUNCTION IF EXISTS public."+fn+"(text)") })
		c := f.simple(t, "5")
		// Two shapes, each prepared and run as EXECUTE: balance + d, and balance - d.
		subtract := func(c *pgx.Conn, id, delta int) error {
			for _, q := range []string{"BEGIN", fmt.Sprintf("UPDATE public.%s SET balance = balance - %d WHERE id = %d", f.name, delta, id), "COMMIT"} {
				if _, err := c.Exec(ctxT(t), q); err != nil {
					c.Exec(ctxT(t), "ROLLBACK")
					return fmt.Errorf("%s: %w", q, err)
				}
			}
			return nil
		}
		balance := 0
		for i := 1; i <= 4; i++ {
			if err := f.transaction(t, c, 1, i); err != nil {
				t.Fatalf("transaction %d: %v", i, err)
			}
			if err := subtract(c, 1, 1); err != nil {
				t.Fatalf("transaction %d: %v", i, err)
			}
			balance += i - 1
		}
		statements := serverStatements(t, c)
		if len(statements) != 2 || runsSince(nil, statements) == 0 {
			t.Fatalf("want two statements of the proxy's, run as EXECUTE: %v", statements)
		}
		var added string
		if err := c.QueryRow(ctxT(t), `SELECT name FROM pg_prepared_statements WHERE name LIKE 'fenceproxy\_p%' AND statement LIKE '%balance + %'`).Scan(&added); err != nil {
			t.Fatal(err)
		}
		// A newer holder writes row 1; the stale holder's statements of the swapped shape must be refused.
		if err := f.transaction(t, f.simple(t, "9"), 1, 100); err != nil {
			t.Fatal(err)
		}
		balance += 100
		var swapped int
		if err := c.QueryRow(ctxT(t), "SELECT public."+fn+"($1)", added).Scan(&swapped); err != nil || swapped != 1 {
			t.Fatalf("the function replaced %d statements (%v)", swapped, err)
		}
		var pgErr *pgconn.PgError
		for i := range 3 {
			if err := f.transaction(t, c, 1, 1000); !errors.As(err, &pgErr) || pgErr.Code != "55F01" {
				t.Fatalf("stale holder after the swap of %s, statement %d: %v, want 55F01 (an unfenced statement ran?)", added, i, err)
			}
		}
		f.wantRows(t, fmt.Sprintf("1:%d:9 2:0:1", balance))
	})
}
