package proxy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// A client's named statement that PostgreSQL no longer holds (DISCARD ALL or DEALLOCATE ALL deallocated it, its
// Parse failed, or a failed batch skipped its Parse) gets 26000 at its next Bind or Describe, as directly. Until
// 2026-12-03 the pool prepared it again from the text it kept, and the Bind ran.
func TestPooledStatementGoneAsDirectly(t *testing.T) {
	parse := func(name, text string) *pgproto3.Parse { return &pgproto3.Parse{Name: name, Query: text} }
	run := func(name string) []pgproto3.FrontendMessage {
		return []pgproto3.FrontendMessage{&pgproto3.Bind{PreparedStatement: name}, &pgproto3.Execute{}, &pgproto3.Sync{}}
	}
	describe := func(name string) []pgproto3.FrontendMessage {
		return []pgproto3.FrontendMessage{&pgproto3.Describe{ObjectType: 'S', Name: name}, &pgproto3.Sync{}}
	}
	badBind := func(name string) *pgproto3.Bind { // a parameter the statement has not: 08P01
		return &pgproto3.Bind{PreparedStatement: name, Parameters: [][]byte{[]byte("1")}}
	}
	sync := &pgproto3.Sync{}
	for _, c := range []struct {
		name  string
		steps [][]pgproto3.FrontendMessage
	}{
		{"discard all", [][]pgproto3.FrontendMessage{
			{parse("g1", "SELECT 1 AS one"), sync}, run("g1"),
			{&pgproto3.Query{String: "DISCARD ALL"}}, run("g1"), describe("g1"),
			{parse("g1", "SELECT 2 AS two"), sync}, run("g1"),
		}},
		{"deallocate all", [][]pgproto3.FrontendMessage{
			{parse("g2", "SELECT 1 AS one"), sync},
			{&pgproto3.Query{String: "DEALLOCATE ALL"}}, run("g2"), describe("g2"),
		}},
		{"deallocate all in a block", [][]pgproto3.FrontendMessage{
			{parse("g3", "SELECT 1 AS one"), sync},
			{&pgproto3.Query{String: "BEGIN; DEALLOCATE ALL"}}, run("g3"), {&pgproto3.Query{String: "ROLLBACK"}}, run("g3"),
		}},
		{"pipelined after the discard", [][]pgproto3.FrontendMessage{
			{parse("g4", "SELECT 1 AS one"), sync},
			append(append([]pgproto3.FrontendMessage{&pgproto3.Query{String: "DISCARD ALL"}}, run("g4")...), run("g4")...),
			{&pgproto3.Query{String: "DISCARD ALL"}, parse("g4", "SELECT 3 AS three"), sync}, run("g4"),
		}},
		{"failed parse", [][]pgproto3.FrontendMessage{
			{parse("g5", "SELECT FROM nowhere_at_all"), sync}, run("g5"), describe("g5"),
		}},
		{"parse skipped by a failed batch", [][]pgproto3.FrontendMessage{
			{parse("", "SELECT 1/0"), &pgproto3.Bind{}, &pgproto3.Execute{}, parse("g6", "SELECT 1 AS one"), sync}, run("g6"),
			{parse("g6", "SELECT 4 AS four"), sync}, run("g6"),
		}},
		{"a failed discard in a block", [][]pgproto3.FrontendMessage{
			{parse("g7", "SELECT 1 AS one"), sync},
			{&pgproto3.Query{String: "BEGIN"}}, {&pgproto3.Query{String: "DISCARD ALL"}}, {&pgproto3.Query{String: "ROLLBACK"}}, run("g7"),
		}},
		// From a review of the change on 2026-12-03. Two failed before their mends: "parse and close in one
		// batch" (a Close sent before its Parse was answered left the name counted prepared: every later Parse of
		// it got the failed Parse's error) and "sql deallocate of a protocol name" (26000, and the name went on
		// running; psycopg 3 with libpq before 17 deallocates its statements so).
		{"discard all pipelined before a parse of a prepared name", [][]pgproto3.FrontendMessage{
			{parse("r1", "SELECT 1 AS one"), sync}, run("r1"),
			{&pgproto3.Query{String: "DISCARD ALL"}, parse("r1", "SELECT 2 AS two"), sync}, run("r1"), run("r1"),
		}},
		{"deallocate all pipelined before a parse of a prepared name", [][]pgproto3.FrontendMessage{
			{parse("r2", "SELECT 1 AS one"), sync},
			{&pgproto3.Query{String: "DEALLOCATE ALL"}, parse("r2", "SELECT 2 AS two"), sync}, run("r2"),
		}},
		{"extended discard all then parse of a prepared name", [][]pgproto3.FrontendMessage{
			{parse("r3", "SELECT 1 AS one"), sync},
			{parse("", "DISCARD ALL"), &pgproto3.Bind{}, &pgproto3.Execute{}, sync, parse("r3", "SELECT 2 AS two"), sync}, run("r3"),
		}},
		{"parse and close in one batch, then a failing parse, then parse again", [][]pgproto3.FrontendMessage{
			{parse("r4", "SELECT 1 AS one"), &pgproto3.Close{ObjectType: 'S', Name: "r4"}, sync},
			{parse("r4", "SELECT * FROM rev_no_such_table"), sync},
			run("r4"),
			{parse("r4", "SELECT 3 AS three"), sync}, run("r4"),
		}},
		{"close skipped by a failed bind", [][]pgproto3.FrontendMessage{
			{parse("r5", "SELECT 1 AS one"), sync},
			{badBind("r5"), &pgproto3.Close{ObjectType: 'S', Name: "r5"}, sync}, run("r5"),
		}},
		{"close skipped, parse in the same batch", [][]pgproto3.FrontendMessage{
			{parse("r6", "SELECT 1 AS one"), badBind("r6"), &pgproto3.Close{ObjectType: 'S', Name: "r6"}, sync}, run("r6"),
		}},
		{"parse skipped, bind of it pipelined in a later batch, server statement left from before", [][]pgproto3.FrontendMessage{
			{parse("r7", "SELECT 1 AS one"), sync}, {&pgproto3.Close{ObjectType: 'S', Name: "r7"}, sync},
			{parse("", "SELECT 1/0"), &pgproto3.Bind{}, &pgproto3.Execute{}, parse("r7", "SELECT 1 AS one"), sync, &pgproto3.Bind{PreparedStatement: "r7"}, &pgproto3.Execute{}, sync},
		}},
		{"sql deallocate of a protocol name", [][]pgproto3.FrontendMessage{
			{parse("r8", "SELECT 1 AS one"), sync},
			{&pgproto3.Query{String: "DEALLOCATE r8"}}, run("r8"),
		}},
		{"deallocate all in a block rolled back", [][]pgproto3.FrontendMessage{
			{parse("r9", "SELECT 1 AS one"), sync},
			{&pgproto3.Query{String: "BEGIN"}}, {&pgproto3.Query{String: "DEALLOCATE ALL"}}, {&pgproto3.Query{String: "SELECT 1/0"}}, {&pgproto3.Query{String: "ROLLBACK"}}, run("r9"),
			{parse("r9", "SELECT 2 AS two"), sync}, run("r9"),
		}},
		{"parse in a failed block, bind after rollback", [][]pgproto3.FrontendMessage{
			{&pgproto3.Query{String: "BEGIN"}}, {&pgproto3.Query{String: "SELECT 1/0"}},
			{parse("r10", "SELECT 1 AS one"), sync}, {&pgproto3.Query{String: "ROLLBACK"}}, run("r10"),
		}},
		{"parse in a block that rolls back", [][]pgproto3.FrontendMessage{
			{&pgproto3.Query{String: "BEGIN"}}, {parse("r11", "SELECT 1 AS one"), sync}, {&pgproto3.Query{String: "ROLLBACK"}}, run("r11"),
		}},
		{"parse with flush, bind before the answer", [][]pgproto3.FrontendMessage{
			{parse("r12", "SELECT 1 AS one"), &pgproto3.Flush{}, &pgproto3.Bind{PreparedStatement: "r12"}, &pgproto3.Execute{}, sync},
		}},
		{"deallocate all pipelined before a parse of a prepared name, in a block", [][]pgproto3.FrontendMessage{
			{parse("r14", "SELECT 1 AS one"), sync}, {&pgproto3.Query{String: "BEGIN"}},
			{&pgproto3.Query{String: "DEALLOCATE ALL"}, parse("r14", "SELECT 2 AS two"), sync}, run("r14"), {&pgproto3.Query{String: "COMMIT"}}, run("r14"),
		}},
		{"extended deallocate all, sync, parse of a prepared name, pipelined", [][]pgproto3.FrontendMessage{
			{parse("r17", "SELECT 1 AS one"), sync},
			{parse("", "DEALLOCATE ALL"), &pgproto3.Bind{}, &pgproto3.Execute{}, sync, parse("r17", "SELECT 2 AS two"), sync}, run("r17"),
		}},
		{"42P05 then bind", [][]pgproto3.FrontendMessage{
			{parse("r13", "SELECT 1 AS one"), sync}, {parse("r13", "SELECT 2 AS two"), sync}, run("r13"),
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newPooledFenced(t, 1, "")
			sameAsDirect(t, pooledPgConn(t, f, ""), c.steps...)
		})
	}
}

// A DEALLOCATE ALL or DISCARD ALL run by the extended protocol, and a Parse of a name already parsed, in the
// same batch. Exact: a second Parse of one name gets 42P05 (the first still unanswered), and a Parse an error
// before it skips leaves the name what it was (until 2026-12-04 the second Parse took the name, and a skipped
// one left its text to run: a review's finding). A known difference, pinned (docs/pooling.md): the drop is seen
// only when it is answered, so a Parse of a dropped name after it in the batch is taken for one of a name in
// use, and the name's Bind gets 26000 where directly it runs the new text: a loud error, never a statement the
// client does not have. (Following the drop when it is sent was tried on 2026-12-04 and withdrawn: a review
// found sequences of drops, failures and portals where it ran a statement the client no longer had.)
func TestPooledParseAfterUnansweredDeallocateAll(t *testing.T) {
	parse := func(name, text string) *pgproto3.Parse { return &pgproto3.Parse{Name: name, Query: text} }
	run := func(name string) []pgproto3.FrontendMessage {
		return []pgproto3.FrontendMessage{&pgproto3.Bind{PreparedStatement: name}, &pgproto3.Execute{}, &pgproto3.Sync{}}
	}
	dropAll := func(text string) []pgproto3.FrontendMessage {
		return []pgproto3.FrontendMessage{parse("", text), &pgproto3.Bind{}, &pgproto3.Execute{}}
	}
	batch := func(parts ...[]pgproto3.FrontendMessage) []pgproto3.FrontendMessage {
		var b []pgproto3.FrontendMessage
		for _, p := range parts {
			b = append(b, p...)
		}
		return append(b, &pgproto3.Sync{})
	}
	one := func(m pgproto3.FrontendMessage) []pgproto3.FrontendMessage { return []pgproto3.FrontendMessage{m} }
	sync := &pgproto3.Sync{}
	begin, commit, rollback := one(&pgproto3.Query{String: "BEGIN"}), one(&pgproto3.Query{String: "COMMIT"}), one(&pgproto3.Query{String: "ROLLBACK"})
	type shape struct {
		name  string
		steps [][]pgproto3.FrontendMessage
	}
	for _, c := range []shape{
		{"two parses of one name in a batch", [][]pgproto3.FrontendMessage{
			batch(one(parse("d5", "SELECT 1 AS one")), one(parse("d5", "SELECT 2 AS two"))), run("d5"),
		}},
		{"a parse, an error, a parse of the name again", [][]pgproto3.FrontendMessage{
			batch(one(parse("a1", "SELECT 1 AS one")), dropAll("SELECT 1/0"), one(parse("a1", "SELECT 2 AS two"))), run("a1"),
		}},
		{"a parse, a failed discard all, a parse of the name again", [][]pgproto3.FrontendMessage{
			begin, batch(one(parse("a2", "SELECT 1 AS one")), dropAll("DISCARD ALL"), one(parse("a2", "SELECT 2 AS two"))), rollback, run("a2"),
		}},
		{"a parse, a failed discard all in a pipeline, a parse again", [][]pgproto3.FrontendMessage{
			batch(one(parse("a3", "SELECT 1 AS one")), dropAll("SELECT 1"), dropAll("DISCARD ALL"), one(parse("a3", "SELECT 2 AS two"))), run("a3"),
		}},
		{"extended deallocate all then bind and describe of a prepared name, same batch", [][]pgproto3.FrontendMessage{
			{parse("d2", "SELECT 1 AS one"), sync},
			batch(dropAll("DEALLOCATE PREPARE ALL"), run("d2")[:2]), run("d2"),
			{parse("d2", "SELECT 1 AS one"), sync},
			batch(dropAll("DEALLOCATE ALL"), one(&pgproto3.Describe{ObjectType: 'S', Name: "d2"})), run("d2"),
		}},
		{"parse, extended deallocate all, bind, in one batch", [][]pgproto3.FrontendMessage{
			batch(one(parse("d3", "SELECT 1 AS one")), dropAll("DEALLOCATE ALL"), run("d3")[:2]), run("d3"),
		}},
		{"extended deallocate all that fails, then parse of a prepared name", [][]pgproto3.FrontendMessage{
			{parse("d6", "SELECT 1 AS one"), sync}, begin, one(&pgproto3.Query{String: "SELECT 1/0"}),
			batch(dropAll("DEALLOCATE ALL"), one(parse("d6", "SELECT 2 AS two"))), rollback, run("d6"),
		}},
		{"extended deallocate all, then an error, then parse of a prepared name", [][]pgproto3.FrontendMessage{
			{parse("d9", "SELECT 1 AS one"), sync},
			batch(dropAll("DEALLOCATE ALL"), dropAll("SELECT 1/0"), one(parse("d9", "SELECT 2 AS two"))), run("d9"),
			{parse("d9", "SELECT 3 AS three"), sync}, run("d9"),
		}},
		{"two drops, the second fails, then a parse of a prepared name", [][]pgproto3.FrontendMessage{
			{parse("b1", "SELECT 1 AS one"), sync}, begin,
			batch(dropAll("DEALLOCATE ALL"), dropAll("DISCARD ALL"), one(parse("b1", "SELECT 2 AS two"))), rollback, run("b1"),
		}},
		{"two drops and two parses, the first drop fails", [][]pgproto3.FrontendMessage{
			{parse("b2", "SELECT 1 AS one"), sync}, begin,
			batch(dropAll("DISCARD ALL"), one(parse("b2", "SELECT 2 AS two")), dropAll("DEALLOCATE ALL"), one(parse("b2", "SELECT 3 AS three"))), rollback, run("b2"),
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newPooledFenced(t, 1, "")
			sameAsDirect(t, pooledPgConn(t, f, ""), c.steps...)
		})
	}
	for _, c := range []shape{
		{"extended deallocate all then parse of a prepared name, same batch", [][]pgproto3.FrontendMessage{
			{parse("r16", "SELECT 1 AS one"), sync},
			batch(dropAll("DEALLOCATE ALL"), one(parse("r16", "SELECT 2 AS two"))), run("r16"),
		}},
		{"extended discard all then parse of a prepared name, in a block", [][]pgproto3.FrontendMessage{
			{parse("r15", "SELECT 1 AS one"), sync}, begin,
			batch(dropAll("DEALLOCATE ALL"), one(parse("r15", "SELECT 2 AS two"))), run("r15"), commit, run("r15"),
		}},
		{"deallocate all bound in one batch, executed in the next", [][]pgproto3.FrontendMessage{
			{parse("d7", "SELECT 1 AS one"), sync}, begin,
			{parse("", "DEALLOCATE ALL"), &pgproto3.Bind{DestinationPortal: "pd"}, sync},
			{&pgproto3.Execute{Portal: "pd"}, parse("d7", "SELECT 2 AS two"), sync}, run("d7"), commit, run("d7"),
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newPooledFenced(t, 1, "")
			d := wireSteps(t, directPgConn(t), 700*time.Millisecond, nil, c.steps...)
			p := wireSteps(t, pooledPgConn(t, f, ""), 150*time.Millisecond, d, c.steps...)
			if fmt.Sprint(d) == fmt.Sprint(p) || strings.Contains(fmt.Sprint(d), "E26000") || !strings.Contains(fmt.Sprint(p), "E26000") ||
				strings.Contains(fmt.Sprint(p), "D1") {
				t.Fatalf("mended? Update docs/pooling.md and this test\n direct: %q\n pooled: %q", d, p)
			}
		})
	}
}

// A SQL DEALLOCATE of a protocol-level name on a server connection another client used since (so the proxy
// cannot know its statement is there: it prepares one right before the DEALLOCATE) drops the name as directly,
// also after a ROLLBACK of a failed block in its Query, and the statement stays the other clients' to use.
func TestPooledSQLDeallocateOfANamedStatementElsewhere(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	a, b := pooledPgConn(t, f, ""), pooledPgConn(t, f, "")
	for _, pc := range []*pgconn.PgConn{a, b} {
		if _, err := pc.Prepare(ctx, "s", "SELECT 'shared' AS v", nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, "DEALLOCATE s").ReadAll(); err != nil {
		t.Fatalf("DEALLOCATE of a's named statement: %v", err)
	}
	r := a.ExecPrepared(ctx, "s", nil, nil, nil).Read()
	var pgErr *pgconn.PgError
	if !errors.As(r.Err, &pgErr) || pgErr.Code != "26000" {
		t.Fatalf("a's statement after its DEALLOCATE: %v, %v; want 26000", r.Rows, r.Err)
	}
	if r := b.ExecPrepared(ctx, "s", nil, nil, nil).Read(); r.Err != nil || len(r.Rows) != 1 || string(r.Rows[0][0]) != "shared" {
		t.Fatalf("b's statement of the same text after a's DEALLOCATE: %v, %v", r.Rows, r.Err)
	}
	if _, err := a.Prepare(ctx, "s", "SELECT 'again' AS v", nil); err != nil {
		t.Fatalf("a prepares the name again: %v", err)
	}
	if r := a.ExecPrepared(ctx, "s", nil, nil, nil).Read(); r.Err != nil || len(r.Rows) != 1 || string(r.Rows[0][0]) != "again" {
		t.Fatalf("a's new statement: %v, %v", r.Rows, r.Err)
	}
	// In a failed block, after a ROLLBACK in the same Query: the PREPARE goes right before the DEALLOCATE (in
	// front of the ROLLBACK it would be refused, 25P02, and the Query with it).
	if _, err := b.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, "BEGIN; SELECT 1/0").ReadAll(); err == nil {
		t.Fatal("no error")
	}
	if _, err := a.Exec(ctx, "ROLLBACK; SELECT 'é'; DEALLOCATE s").ReadAll(); err != nil {
		t.Fatalf("DEALLOCATE after ROLLBACK: %v", err)
	}
	r = a.ExecPrepared(ctx, "s", nil, nil, nil).Read()
	if !errors.As(r.Err, &pgErr) || pgErr.Code != "26000" {
		t.Fatalf("a's statement after its DEALLOCATE after ROLLBACK: %v, %v; want 26000", r.Rows, r.Err)
	}
}

// pgx's statement cache modes after a DISCARD ALL or DEALLOCATE ALL it runs with Exec: the same outcomes as on a
// direct connection (a review of 2026-12-03 of pooledStmts.holds).
func TestPooledPgxModesAfterDiscard(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec"} {
		for _, reset := range []string{"DISCARD ALL", "DEALLOCATE ALL"} {
			outcome := func(dsn string) string {
				c, err := pgx.Connect(ctx, dsn)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close(ctx)
				var s []string
				for i := 0; i < 3; i++ {
					var n int
					err := c.QueryRow(ctx, "SELECT $1::int + 1", i).Scan(&n)
					s = append(s, fmt.Sprint(n, " ", sqlstate(err)))
					if i == 0 {
						_, err := c.Exec(ctx, reset)
						s = append(s, sqlstate(err))
					}
				}
				return strings.Join(s, "|")
			}
			dOut := outcome(pg.SuperDSN() + "&default_query_exec_mode=" + mode)
			pOut := outcome(f.dsn() + "&default_query_exec_mode=" + mode)
			if dOut != pOut {
				t.Errorf("%s after %s: direct %s, pooled %s", mode, reset, dOut, pOut)
			}
		}
	}
}
