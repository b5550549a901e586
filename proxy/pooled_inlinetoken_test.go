package proxy_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// inlineFixture is a pool of one over a protected table whose row 1 has token 1, with a trigger that records the
// text the server ran for every row an UPDATE writes, and a function (tok) that sets the token transaction-locally
// behind the proxy's back. wrote says which text wrote since its last call.
func inlineFixture(t *testing.T) (f *fenced, tok string, wrote func(step, want string, none bool)) {
	t.Helper()
	f = newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
	seen := "public." + f.name + "_seen"
	tok = "public." + f.name + "_tok"
	fxExec(t, f.d, "CREATE TABLE "+seen+" (q text)")
	fxExec(t, f.d, "CREATE FUNCTION "+seen+"_log() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN INSERT INTO "+seen+" VALUES (pg_catalog.current_query()); RETURN NEW; END$$")
	fxExec(t, f.d, "CREATE TRIGGER seen BEFORE UPDATE ON "+f.label+" FOR EACH ROW EXECUTE FUNCTION "+seen+"_log()")
	fxExec(t, f.d, "CREATE FUNCTION "+tok+"(v text) RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config('fence.token', v, true) $$")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		f.d.Exec(ctx, "DROP TRIGGER IF EXISTS seen ON "+f.label)
		f.d.Exec(ctx, "DROP TABLE IF EXISTS "+seen)
		f.d.Exec(ctx, "DROP FUNCTION IF EXISTS "+seen+"_log(), "+tok+"(text)")
	})
	// wrote says which text wrote the row since the last call: the inline form with want in it, the usual form
	// (want ""), or none (nothing written: nothing is recorded).
	wrote = func(step, want string, none bool) {
		t.Helper()
		rows, err := f.d.Query(ctxT(t), "DELETE FROM "+seen+" RETURNING q")
		if err != nil {
			t.Fatal(err)
		}
		var texts []string
		for rows.Next() {
			var q string
			if err := rows.Scan(&q); err != nil {
				t.Fatal(err)
			}
			texts = append(texts, q)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		switch {
		case none && len(texts) != 0:
			t.Fatalf("%s: a row was written by %q", step, texts)
		case none:
		case len(texts) != 1:
			t.Fatalf("%s: %d writes recorded, want 1: %q", step, len(texts), texts)
		case want != "" && (strings.Contains(texts[0], "fenceproxy_stmt") || !strings.Contains(texts[0], want)):
			t.Fatalf("%s: not the inline form with %s: %s", step, want, texts[0])
		case want == "" && !strings.Contains(texts[0], "fenceproxy_stmt"):
			t.Fatalf("%s: not the usual form: %s", step, texts[0])
		}
	}
	return f, tok, wrote
}

// In transaction mode a fenced write carries the token the proxy gave its transaction as a constant, checked once
// against the setting (rewrite/inline.go): a simple Query's, and an extended-protocol Parse of the unnamed
// statement's. The attack first: a function that changes the token behind the proxy's back (set_config with
// is_local true) inside the transaction, in an earlier statement and in the same text: refused with 55F03,
// nothing written. Then what the proxy must follow: SET LOCAL in an earlier statement of the block, a savepoint
// rolled back to, set_config in the text itself or bound; and a stale holder. A trigger records the text the
// server ran for every row the statement writes, so the test sees which form wrote.
func TestPooledInlineToken(t *testing.T) {
	for _, mode := range []string{"simple_protocol", "exec"} {
		t.Run(mode, func(t *testing.T) {
			f, tok, wrote := inlineFixture(t)
			ctx := ctxT(t)
			upd := "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1"
			q := "&default_query_exec_mode=" + mode
			a := pooledConn(t, f, q+"&options=-c%20fence.token%3D5")

			fxExec(t, a, upd) // a transaction of its own
			wrote("autocommit", "'5'::bigint", false)
			f.wantToken(t, 1, 5)
			fxExec(t, a, "BEGIN") // TPC-B's shape: a lone BEGIN, then the statements
			fxExec(t, a, upd)
			fxExec(t, a, "COMMIT")
			wrote("block", "'5'::bigint", false)

			// Behind the proxy's back, in an earlier statement of the block and in the same text.
			fxExec(t, a, "BEGIN")
			fxExec(t, a, "SELECT "+tok+"('9')")
			_, err := a.Exec(ctx, upd)
			wantPgErr(t, err, "55F03", "fencing token changed behind the proxy for a write to "+f.label)
			fxExec(t, a, "ROLLBACK")
			if mode == "simple_protocol" {
				_, err = a.Exec(ctx, "SELECT "+tok+"('9'); "+upd)
				wantPgErr(t, err, "55F03", "fencing token changed behind the proxy for a write to "+f.label)
			}
			wrote("token changed by a function", "", true)
			f.wantToken(t, 1, 5)

			// What the client says in its own statements is followed.
			fxExec(t, a, "BEGIN")
			fxExec(t, a, "SET LOCAL fence.token = 9")
			fxExec(t, a, upd)
			fxExec(t, a, "COMMIT")
			wrote("SET LOCAL in the block", "", false)
			f.wantToken(t, 1, 9)
			b := pooledConn(t, f, q+"&options=-c%20fence.token%3D10")
			fxExec(t, b, "BEGIN")
			fxExec(t, b, "SAVEPOINT s")
			fxExec(t, b, "SET LOCAL fence.token = 11")
			fxExec(t, b, "ROLLBACK TO SAVEPOINT s")
			fxExec(t, b, upd)
			fxExec(t, b, "COMMIT")
			wrote("savepoint", "", false)
			f.wantToken(t, 1, 10)
			if mode == "simple_protocol" {
				fxExec(t, b, "SELECT pg_catalog.set_config('fence.token', '12', false); "+upd)
				wrote("set_config in the text", "", false)
			} else {
				fxExec(t, b, "BEGIN")
				fxExec(t, b, "SELECT pg_catalog.set_config('fence.token', $1, true)", "12")
				fxExec(t, b, upd)
				fxExec(t, b, "COMMIT")
				wrote("bound set_config", "", false)
				fxExec(t, b, "SELECT pg_catalog.set_config('fence.token', $1, false)", "12")
			}
			f.wantToken(t, 1, 12)
			fxExec(t, b, upd) // b's session token is 12 now, given to its next transaction
			wrote("after set_config", "'12'::bigint", false)

			// A stale holder on the same server connection.
			_, err = a.Exec(ctx, upd)
			wantStale(t, err, f.label, 12, 5)
			wrote("stale", "", true)
			c := pooledConn(t, f, q+"&options=-c%20fence.token%3D13")
			fxExec(t, c, upd)
			wrote("newer holder", "'13'::bigint", false)
			f.wantToken(t, 1, 13)
			if backendPID(t, a) != backendPID(t, c) {
				t.Fatal("the clients did not share the server connection")
			}
		})
	}
}

// The client's unnamed statement, parsed carrying the token then in force, is bound later where another token
// is in force: after a bound set_config in the same block, and in a later transaction after the session's token
// changed. The proxy fences it again before the Bind, so it runs with the token in force, as directly.
func TestPooledInlineUnnamedStatementRebound(t *testing.T) {
	f, _, wrote := inlineFixture(t)
	ctx := ctxT(t)
	pc := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	exec := func(sql string) {
		t.Helper()
		if _, err := pc.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	run := func(name string, args ...string) {
		t.Helper()
		params := make([][]byte, len(args))
		for i, a := range args {
			params[i] = []byte(a)
		}
		if r := pc.ExecPrepared(ctx, name, params, nil, nil).Read(); r.Err != nil {
			t.Fatalf("execute %q: %v", name, r.Err)
		}
	}
	prepare := func(name, sql string) {
		t.Helper()
		if _, err := pc.Prepare(ctx, name, sql, nil); err != nil {
			t.Fatalf("prepare %q: %v", name, err)
		}
	}
	upd := "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1"
	exec("BEGIN")
	prepare("", upd)
	prepare("setcfg", "SELECT pg_catalog.set_config('fence.token', $1, true)")
	run("setcfg", "9")
	run("")
	exec("COMMIT")
	wrote("rebound after a bound set_config", "", false)
	f.wantToken(t, 1, 9)
	// A simple Query drops the unnamed statement (as directly): it is parsed again, carrying the session's token
	// 5, and the session's token is set to 20 by a named statement before it is bound, in a transaction of its own.
	prepare("", upd)
	prepare("settok", "SELECT pg_catalog.set_config('fence.token', $1, false)")
	run("settok", "20")
	run("")
	wrote("rebound in a later transaction", "'20'::bigint", false)
	f.wantToken(t, 1, 20)
}

// A named statement that sets the token at session level (bound set_config), executed again in a later
// transaction by its Bind alone (pgx's statement cache does so), is followed like its first run: the proxy reads
// the token back at that transaction's end, and the client's next transactions have it.
func TestPooledNamedSetConfigFollowed(t *testing.T) {
	f, _, _ := inlineFixture(t)
	c := pooledConn(t, f, "&default_query_exec_mode=cache_statement&options=-c%20fence.token%3D5")
	for _, tok := range []string{"7", "8"} {
		fxExec(t, c, "SELECT pg_catalog.set_config('fence.token', $1, false)", tok)
		if got := showToken(t, c); got != tok {
			t.Fatalf("after set_config to %s: SHOW fence.token = %q", tok, got)
		}
		fxExec(t, c, "UPDATE "+f.label+" SET balance = balance + 1 WHERE id = 1")
	}
	f.wantToken(t, 1, 8)
}

// With fence.synchronous_commit the inline check runs set_config (volatile), yet it is still checked once, before
// any row: a token changed behind the proxy fails the statement also when no row matches, as without it; and a
// write that matches runs with the level set.
func TestPooledInlineSyncCommit(t *testing.T) {
	f := newPooledFenced(t, 1, "fence:\n  synchronous_commit: local\n")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
	tok := "public." + f.name + "_tok"
	fxExec(t, f.d, "CREATE FUNCTION "+tok+"(v text) RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config('fence.token', v, true) $$")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS "+tok+"(text)") })
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol&options=-c%20fence.token%3D5")
	_, err := a.Exec(ctxT(t), "SELECT "+tok+"('6'); UPDATE "+f.label+" SET balance = 1 WHERE id = 12345")
	wantPgErr(t, err, "55F03", "fencing token changed behind the proxy for a write to "+f.label)
	var level string
	if err := a.QueryRow(ctxT(t), "UPDATE "+f.label+" SET balance = 2 WHERE id = 1 RETURNING pg_catalog.current_setting('synchronous_commit')").Scan(&level); err != nil || level != "local" {
		t.Fatalf("synchronous_commit %q, %v", level, err)
	}
	f.wantToken(t, 1, 5)
	// By the extended protocol the unnamed statement keeps its inline form through its Bind: the proxy's own
	// set_config in its fenced text does not make the token unknown.
	e := pooledConn(t, f, "&default_query_exec_mode=exec&options=-c%20fence.token%3D6")
	var text string
	if err := e.QueryRow(ctxT(t), "UPDATE "+f.label+" SET balance = 3 WHERE id = 1 RETURNING pg_catalog.current_query()").Scan(&text); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text, "fenceproxy_stmt") || !strings.Contains(text, "'6'::bigint") {
		t.Fatalf("not the inline form: %s", text)
	}
	f.wantToken(t, 1, 6)
}

// The unnamed statement that carries a token is the client's only while the client has it: after a simple Query
// or a Close of it, a Bind gets 26000 as directly, whatever token is then in force (it is never parsed again from
// what the proxy kept). Bound to a named portal, which may be executed after the token changed, it is fenced in the
// usual form first: that portal, executed after a SET LOCAL, runs with the new token, as directly.
func TestPooledInlineUnnamedStatementDroppedAndNamedPortal(t *testing.T) {
	f, _, wrote := inlineFixture(t)
	ctx := ctxT(t)
	pc := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	upd := "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1 RETURNING fence_token"
	exec := func(sql string) {
		t.Helper()
		if _, err := pc.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for _, drop := range []struct {
		name string
		do   func()
	}{
		{"a simple Query", func() { exec("SELECT 1") }},
		{"a Close", func() { rawBatch(t, pc, &pgproto3.Close{ObjectType: 'S'}) }},
	} {
		if _, codes := rawBatch(t, pc, &pgproto3.Parse{Query: upd}); len(codes) != 0 {
			t.Fatalf("Parse: %v", codes)
		}
		drop.do()
		exec("SET fence.token = 20")
		rows, codes := rawBatch(t, pc, &pgproto3.Bind{}, &pgproto3.Execute{})
		if len(rows) != 0 || !slices.Equal(codes, []string{"26000"}) {
			t.Fatalf("Bind after %s dropped the statement: rows %q, errors %q, want 26000", drop.name, rows, codes)
		}
		wrote("dropped by "+drop.name, "", true)
		exec("SET fence.token = 5")
	}
	f.wantToken(t, 1, 1)

	exec("BEGIN")
	if _, codes := rawBatch(t, pc, &pgproto3.Parse{Query: upd}, &pgproto3.Bind{DestinationPortal: "p1"}); len(codes) != 0 {
		t.Fatalf("Parse and Bind: %v", codes)
	}
	exec("SET LOCAL fence.token = 9")
	rows, codes := rawBatch(t, pc, &pgproto3.Execute{Portal: "p1"})
	if len(codes) != 0 || !slices.Equal(rows, []string{"9"}) {
		t.Fatalf("the named portal: rows %q, errors %q, want token 9", rows, codes)
	}
	exec("COMMIT")
	wrote("named portal", "", false)
	f.wantToken(t, 1, 9)
}

// TestPooledUnnamedStatementAfterAnError: after an error the server skips the rest of the batch, a Parse or
// Close of the unnamed statement too, and a Parse that fails has dropped the statement before it. The client's
// unnamed statement is then what the server left, PostgreSQL judging: each script runs on a direct connection
// and through the pool, where another client's unnamed statement comes between on the one server connection,
// and the last Bind of each must give the same rows and errors both ways (never the skipped Parse's statement,
// nor a refusal as if the skipped Close had run, nor the statement a failed Parse dropped).
func TestPooledUnnamedStatementAfterAnError(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	a := pooledPgConn(t, f, "")
	b := pooledPgConn(t, f, "")
	d := f.d.PgConn()
	type batch []pgproto3.FrontendMessage
	run := &pgproto3.Execute{}
	for _, sc := range []struct {
		name    string
		batches []batch
	}{
		{"a Parse after an error", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Bind{PreparedStatement: "nosuch"}, &pgproto3.Parse{Query: "SELECT 2"}}}},
		{"a Close after an error", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Bind{PreparedStatement: "nosuch"}, &pgproto3.Close{ObjectType: 'S'}}}},
		{"a Parse and a Close after an error", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Describe{ObjectType: 'S', Name: "nosuch"}, &pgproto3.Parse{Query: "SELECT 2"}, &pgproto3.Close{ObjectType: 'S'}}}},
		{"a Parse that fails", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Parse{Query: "SELEC 2"}}}},
		{"a Parse that fails after one that ran", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Parse{Query: "SELECT 5"}, &pgproto3.Bind{}, run, &pgproto3.Parse{Query: "SELECT 1/"}}}},
		{"a Parse that fails, then one skipped", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Parse{Query: "SELEC 2"}, &pgproto3.Parse{Query: "SELECT 3"}}}},
		{"a Close, then an error, then a Parse", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Close{ObjectType: 'S'}, &pgproto3.Bind{PreparedStatement: "nosuch"}, &pgproto3.Parse{Query: "SELECT 2"}}}},
		{"an Execute that fails, then a Parse", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Parse{Query: "SELECT 1/0"}, &pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'}, run, &pgproto3.Parse{Query: "SELECT 7"}}}},
		{"a skipped Parse, then one in the next batch of the pipeline", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Bind{PreparedStatement: "nosuch"}, &pgproto3.Parse{Query: "SELECT 2"}, &pgproto3.Sync{}, &pgproto3.Parse{Query: "SELECT 4"}}}},
		{"a skipped Parse, then the next batch of the pipeline binds", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Bind{PreparedStatement: "nosuch"}, &pgproto3.Parse{Query: "SELECT 2"}, &pgproto3.Sync{}, &pgproto3.Bind{}, run}}},
		// The client has read the error when it sends the rest of the batch (with a Flush, or without: the
		// server sends an error at once).
		{"an error read, then a Parse", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Bind{PreparedStatement: "nosuch"}, &pgproto3.Flush{}, &awaitError{}, &pgproto3.Parse{Query: "SELECT 2"}}}},
		{"a failed Parse read, then a Parse", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Parse{Query: "SELEC 2"}, &pgproto3.Flush{}, &awaitError{}, &pgproto3.Parse{Query: "SELECT 3"}}}},
		{"an error read without a Flush, then a Parse", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Bind{PreparedStatement: "nosuch"}, &awaitError{}, &pgproto3.Parse{Query: "SELECT 2"}}}},
		{"an error read without a Flush, then a Close", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Bind{PreparedStatement: "nosuch"}, &awaitError{}, &pgproto3.Close{ObjectType: 'S'}}}},
		{"a Parse skipped after an error read, then one in the next batch binds", []batch{{&pgproto3.Parse{Query: "SELECT 1"}}, {&pgproto3.Bind{PreparedStatement: "nosuch"}, &awaitError{}, &pgproto3.Parse{Query: "SELECT 2"}, &pgproto3.Sync{}, &pgproto3.Bind{}, run}}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			outcome := func(pc *pgconn.PgConn, between func()) string {
				var got []string
				for _, msgs := range sc.batches {
					rows, codes := pipeline(t, pc, msgs...)
					got = append(got, fmt.Sprint(rows, codes))
				}
				between()
				rows, codes := rawBatch(t, pc, &pgproto3.Bind{}, run)
				return fmt.Sprint(got, " then ", rows, codes)
			}
			want := outcome(d, func() {})
			got := outcome(a, func() {
				if rows, codes := rawBatch(t, b, &pgproto3.Parse{Query: "SELECT 33"}, &pgproto3.Bind{}, run); len(codes) != 0 || !slices.Equal(rows, []string{"33"}) {
					t.Fatalf("the other client: rows %q, errors %q", rows, codes)
				}
			})
			if got != want {
				t.Errorf("through the pool %s, directly %s", got, want)
			}
			t.Logf("%s", want)
		})
	}
}

// TestPooledUnnamedStatementAfterAnErrorPinned: a pinned client's connection is its own, and the proxy's probe
// of what a batch left (a Query, which drops the unnamed statement) may run after a batch that failed. The
// verdict on the unnamed statement judged before the probe must not say it is still on the server: the last
// Bind gets what it gets directly.
func TestPooledUnnamedStatementAfterAnErrorPinned(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	type batch []pgproto3.FrontendMessage
	run := &pgproto3.Execute{}
	for _, sc := range []struct {
		name    string
		batches []batch
	}{
		{"a named Parse in the failed batch", []batch{{&pgproto3.Parse{Query: "(SELECT 1)"}}, {&pgproto3.Parse{Name: "s1", Query: "SELECT 9"}, &pgproto3.Bind{PreparedStatement: "nosuch"}, &pgproto3.Parse{Query: "SELECT 2"}}}},
		{"the skipped text may leave session state", []batch{{&pgproto3.Parse{Query: "(SELECT 1)"}}, {&pgproto3.Bind{PreparedStatement: "nosuch"}, &pgproto3.Parse{Query: "SELECT 2 AS temp"}}}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			outcome := func(pc *pgconn.PgConn) string {
				if err := pc.Exec(context.Background(), "CREATE TEMP TABLE pinned_here (a int)").Close(); err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, msgs := range sc.batches {
					rows, codes := pipeline(t, pc, msgs...)
					got = append(got, fmt.Sprint(rows, codes))
				}
				rows, codes := rawBatch(t, pc, &pgproto3.Bind{}, run)
				return fmt.Sprint(got, " then ", rows, codes)
			}
			want := outcome(direct(t).PgConn())
			if got := outcome(pooledPgConn(t, f, "")); got != want {
				t.Errorf("through the pool %s, directly %s", got, want)
			}
			t.Logf("%s", want)
		})
	}
}

// TestPooledStatementsAfterAnErrorInATransaction: inside a transaction block the lend goes on across Syncs, and
// a savepoint makes the transaction usable again after an error. The proxy's own Parse that puts a statement
// on the connection before a Bind of it (the client's unnamed statement, or a named one the connection does not
// have) is skipped when an error of its batch comes first; the statement is then not there, and a later Bind
// must get it prepared again: never the statement another client left (the unnamed one: b's SELECT 33), never
// 26000 for a named one that is the client's, never 42P05 for one still there. PostgreSQL judges: each script runs directly and through a pool
// of one, where client b comes between.
func TestPooledStatementsAfterAnErrorInATransaction(t *testing.T) {
	run := &pgproto3.Execute{}
	type msgs = []pgproto3.FrontendMessage
	for _, sc := range []struct {
		name  string
		other msgs // client b's batch, between the first batch and the transaction
		bind  pgproto3.FrontendMessage
		after msgs // sent after the error of the failed batch
	}{
		{"unnamed, pipelined Bind", msgs{&pgproto3.Parse{Query: "SELECT 33"}, &pgproto3.Bind{}, run}, &pgproto3.Bind{}, msgs{&pgproto3.Bind{}, run}},
		{"unnamed, error read, then Bind", msgs{&pgproto3.Parse{Query: "SELECT 33"}, &pgproto3.Bind{}, run}, &pgproto3.Bind{}, msgs{&awaitError{}, &pgproto3.Bind{}, run}},
		{"unnamed, error read, then Describe and Parse", msgs{&pgproto3.Parse{Query: "SELECT 33"}, &pgproto3.Bind{}, run}, &pgproto3.Bind{}, msgs{&awaitError{}, &pgproto3.Describe{ObjectType: 'S'}, &pgproto3.Parse{Query: "SELECT 2"}}},
		{"named, pipelined Bind", msgs{&pgproto3.Query{String: "DEALLOCATE ALL"}}, &pgproto3.Bind{PreparedStatement: "n1"}, msgs{&pgproto3.Bind{PreparedStatement: "n1"}, run}},
		{"named, error read, then Bind", msgs{&pgproto3.Query{String: "DEALLOCATE ALL"}}, &pgproto3.Bind{PreparedStatement: "n1"}, msgs{&awaitError{}, &pgproto3.Bind{PreparedStatement: "n1"}, run}},
		{"named, the same text under another name after the error", msgs{&pgproto3.Parse{Query: "SELECT 33"}, &pgproto3.Bind{}, run}, &pgproto3.Bind{PreparedStatement: "n1"}, msgs{&pgproto3.Parse{Name: "n2", Query: "SELECT 1"}, &pgproto3.Bind{PreparedStatement: "n2"}, run}},
		{"named, the same new text twice after the error", msgs{&pgproto3.Query{String: "DEALLOCATE ALL"}}, &pgproto3.Bind{PreparedStatement: "n1"}, msgs{&pgproto3.Parse{Name: "n3", Query: "SELECT 1"}, &pgproto3.Parse{Name: "n4", Query: "SELECT 1"}}},
		{"named, placed hidden, then its text under another name after the error", msgs{&pgproto3.Query{String: "DEALLOCATE ALL"}}, &pgproto3.Bind{PreparedStatement: "n1"}, msgs{&pgproto3.Bind{PreparedStatement: "n1"}, run, &pgproto3.Parse{Name: "n2", Query: "SELECT 1"}}},
		{"named, its Close after the error", msgs{&pgproto3.Parse{Query: "SELECT 33"}, &pgproto3.Bind{}, run}, &pgproto3.Bind{PreparedStatement: "n1"}, msgs{&pgproto3.Close{ObjectType: 'S', Name: "n1"}}},
		{"named, its Close after the error read", msgs{&pgproto3.Parse{Query: "SELECT 33"}, &pgproto3.Bind{}, run}, &pgproto3.Bind{PreparedStatement: "n1"}, msgs{&awaitError{}, &pgproto3.Close{ObjectType: 'S', Name: "n1"}}},
		{"named, its Close after the error, then its Parse again", msgs{&pgproto3.Parse{Query: "SELECT 33"}, &pgproto3.Bind{}, run}, &pgproto3.Bind{PreparedStatement: "n1"}, msgs{&awaitError{}, &pgproto3.Close{ObjectType: 'S', Name: "n1"}, &pgproto3.Sync{}, &pgproto3.Parse{Name: "n1", Query: "SELECT 1"}}},
		{"named, Parse again in a failed transaction", msgs{&pgproto3.Query{String: "DEALLOCATE ALL"}}, &pgproto3.Bind{PreparedStatement: "n1"}, msgs{&awaitError{}, &pgproto3.Close{ObjectType: 'S', Name: "n1"}, &pgproto3.Sync{}, &pgproto3.Parse{Name: "n1", Query: "SELECT 1"}}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			f := newPooledFenced(t, 1, "")
			a, b, d := pooledPgConn(t, f, ""), pooledPgConn(t, f, ""), direct(t).PgConn()
			outcome := func(pc *pgconn.PgConn, between func()) string {
				var got []string
				add := func(m ...pgproto3.FrontendMessage) {
					rows, codes := pipeline(t, pc, m...)
					got = append(got, fmt.Sprint(rows, codes))
				}
				add(&pgproto3.Parse{Query: "SELECT 1"}, &pgproto3.Parse{Name: "n1", Query: "SELECT 1"})
				between()
				failing := msgs{&pgproto3.Parse{Name: "b", Query: "BEGIN"}, &pgproto3.Bind{PreparedStatement: "b"}, run,
					&pgproto3.Parse{Name: "sp", Query: "SAVEPOINT sp"}, &pgproto3.Bind{PreparedStatement: "sp"}, run,
					&pgproto3.Parse{Name: "r", Query: "ROLLBACK TO sp"},
					&pgproto3.Bind{PreparedStatement: "nosuch"}} // fails: the rest of the batch is skipped
				add(append(failing, sc.after...)...)
				add(&pgproto3.Bind{PreparedStatement: "r"}, run) // the transaction is usable again
				add(sc.bind, run)                                // the client's statement: SELECT 1
				add(&pgproto3.Query{String: "ROLLBACK"})
				return fmt.Sprint(got)
			}
			want := outcome(d, func() {})
			got := outcome(a, func() {
				if _, codes := pipeline(t, b, sc.other...); len(codes) != 0 {
					t.Fatalf("the other client: errors %q", codes)
				}
			})
			if got != want {
				t.Errorf("through the pool %s\ndirectly         %s", got, want)
			}
			t.Logf("%s", want)
		})
	}
}

// awaitError, among the messages of pipeline, sends the messages before it and reads their answers up to an
// ErrorResponse before the rest go: the client knows its batch failed when it sends the rest of the batch.
// PostgreSQL sends an error at once, Flush or not.
type awaitError struct{ pgproto3.Flush }

// pipeline sends msgs and a Sync on pc and reads the answers up to the ReadyForQuery of each Sync, gathering
// the first column of every row and the SQLSTATE of every error.
func pipeline(t *testing.T, pc *pgconn.PgConn, msgs ...pgproto3.FrontendMessage) (rows, codes []string) {
	t.Helper()
	msgs = append(slices.Clip(msgs), &pgproto3.Sync{})
	syncs := 0
	for _, m := range msgs {
		if _, ok := m.(*pgproto3.Sync); ok {
			syncs++
		}
	}
	for len(msgs) > 0 {
		part := msgs
		toError := false
		if i := slices.IndexFunc(msgs, func(m pgproto3.FrontendMessage) bool { _, ok := m.(*awaitError); return ok }); i >= 0 {
			part, msgs, toError = msgs[:i], msgs[i+1:], true
		} else {
			msgs = nil
		}
		err := exchange(pc.Frontend(), part, func(m pgproto3.BackendMessage) bool {
			switch m := m.(type) {
			case *pgproto3.DataRow:
				rows = append(rows, string(m.Values[0]))
			case *pgproto3.ErrorResponse:
				codes = append(codes, m.Code)
				return toError
			case *pgproto3.ReadyForQuery:
				syncs--
				return syncs == 0
			}
			return false
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return rows, codes
}
