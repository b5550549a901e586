package proxy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// shortAnswers sends msgs and returns every answer in short form ("1" ParseComplete, "2" BindComplete, "3"
// CloseComplete, "t", "T", "n", "D<cols>", command tags, "E<code>", "Z<status>") up to the ReadyForQuery of
// each Sync and Query; "HANG" after 5 s without one.
func shortAnswers(t *testing.T, pc *pgconn.PgConn, msgs ...pgproto3.FrontendMessage) []string {
	t.Helper()
	want := 0
	for _, m := range msgs {
		switch m.(type) {
		case *pgproto3.Sync, *pgproto3.Query:
			want++
		}
	}
	pc.Conn().SetDeadline(time.Now().Add(5 * time.Second))
	defer pc.Conn().SetDeadline(time.Time{})
	var got []string
	err := exchange(pc.Frontend(), msgs, func(m pgproto3.BackendMessage) bool {
		switch m := m.(type) {
		case *pgproto3.ParseComplete:
			got = append(got, "1")
		case *pgproto3.BindComplete:
			got = append(got, "2")
		case *pgproto3.CloseComplete:
			got = append(got, "3")
		case *pgproto3.ParameterDescription:
			got = append(got, "t")
		case *pgproto3.RowDescription:
			got = append(got, "T")
		case *pgproto3.NoData:
			got = append(got, "n")
		case *pgproto3.DataRow:
			var vs []string
			for _, v := range m.Values {
				vs = append(vs, string(v))
			}
			got = append(got, "D"+strings.Join(vs, ","))
		case *pgproto3.CommandComplete:
			got = append(got, string(m.CommandTag))
		case *pgproto3.ErrorResponse:
			got = append(got, "E"+m.Code)
		case *pgproto3.ReadyForQuery:
			got = append(got, "Z"+string(m.TxStatus))
			want--
			return want == 0
		}
		return false
	})
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return append(got, "HANG")
	}
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// An extended-protocol batch that starts with a Parse of no statement ("", ";", a comment) and goes on to run
// a named statement of another client's, whose function leaves token 77 at session level: the connection was
// checked for client A before, and A's next lone BEGIN (by a Query, by a batch, with prepared fences on) must
// still have what B's function left put back. A's probe then never takes 77 for A's token, and A's write goes
// with 5 (third review of the put-back: a start of no token statement kept the connection marked checked).
func TestPooledEmptyParseLeavesNoCheckForAnother(t *testing.T) {
	for _, form := range []string{"extended", "query", "query, prepared fences"} {
		t.Run(form, func(t *testing.T) {
			upstream := ""
			if strings.HasSuffix(form, "prepared fences") {
				upstream = "  prepared_fences: 64\n"
			}
			f := newPooledFencedUpstream(t, 1, "", upstream)
			fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token, balance) VALUES (1, 1, 0)")
			fxExec(t, f.d, "CREATE OR REPLACE FUNCTION pooled_snk() RETURNS int LANGUAGE sql AS $$ SELECT length(pg_catalog.set_config('fence.token', '77', false)) $$")
			t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_snk()") })
			b := pooledPgConn(t, f, "")
			shortAnswers(t, b, &pgproto3.Parse{Name: "sn", Query: "SELECT pooled_snk()"}, &pgproto3.Sync{})
			a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
			begin := []pgproto3.FrontendMessage{&pgproto3.Parse{Query: "BEGIN"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}}
			if strings.HasPrefix(form, "query") {
				begin = []pgproto3.FrontendMessage{&pgproto3.Query{String: "BEGIN"}}
			}
			shortAnswers(t, a, append(slices.Clone(begin), &pgproto3.Query{String: "COMMIT"})...) // checked for A
			shortAnswers(t, b, &pgproto3.Parse{}, &pgproto3.Bind{PreparedStatement: "sn"}, &pgproto3.Execute{}, &pgproto3.Sync{})
			shortAnswers(t, a, append(slices.Clone(begin), &pgproto3.Query{String: "SET application_name = 'a2'"}, &pgproto3.Query{String: "COMMIT"})...)
			got := shortAnswers(t, a, &pgproto3.Query{String: "SHOW fence.token"},
				&pgproto3.Query{String: "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1 RETURNING fence_token"})
			if slices.Contains(got, "D77") || f.token(t, 1) != 5 {
				t.Fatalf("client A took the token B's function left (77) for its own: %q; row 1 token %d, want 5", got, f.token(t, 1))
			}
		})
	}
}

// The same with the role: a login that is not a superuser (its role changes go unreported), another client's
// function that sets the role at session level by a batch that starts with a Parse of no statement; the role
// never becomes client A's.
func TestPooledEmptyParseRoleDoesNotCrossClients(t *testing.T) {
	for _, form := range []string{"extended", "query"} {
		t.Run(form, func(t *testing.T) {
			f := newPooledFenced(t, 1, "")
			for _, sql := range []string{
				"DROP ROLE IF EXISTS pooled_member41", "DROP ROLE IF EXISTS pooled_plain41",
				"CREATE ROLE pooled_plain41", "CREATE ROLE pooled_member41 LOGIN IN ROLE pooled_plain41",
				"CREATE OR REPLACE FUNCTION pooled_become41() RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config('role', 'pooled_plain41', false) $$",
			} {
				fxExec(t, f.d, sql)
			}
			t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_become41()") })
			dsn := f.p.DSN("pooled_member41", "", "fenceproxy_test")
			conn := func(q string) *pgconn.PgConn {
				pc, err := pgconn.Connect(ctxT(t), dsn+q)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { pc.Close(context.Background()) })
				return pc
			}
			b := conn("")
			shortAnswers(t, b, &pgproto3.Parse{Name: "sn", Query: "SELECT pooled_become41()"}, &pgproto3.Sync{})
			a := conn("&options=-c%20fence.token%3D5")
			begin := []pgproto3.FrontendMessage{&pgproto3.Parse{Query: "BEGIN"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}}
			if form == "query" {
				begin = []pgproto3.FrontendMessage{&pgproto3.Query{String: "BEGIN"}}
			}
			shortAnswers(t, a, append(slices.Clone(begin), &pgproto3.Query{String: "COMMIT"})...)
			shortAnswers(t, b, &pgproto3.Parse{}, &pgproto3.Bind{PreparedStatement: "sn"}, &pgproto3.Execute{}, &pgproto3.Sync{})
			shortAnswers(t, a, append(slices.Clone(begin), &pgproto3.Query{String: "SET application_name = 'a2'"}, &pgproto3.Query{String: "COMMIT"})...)
			if got := shortAnswers(t, a, &pgproto3.Query{String: "SELECT current_user"}); !slices.Equal(got, []string{"T", "Dpooled_member41", "SELECT 1", "ZI"}) {
				t.Fatalf("A's next transaction: %q (the role B's function chose crossed to A)", got)
			}
		})
	}
}

// A batch that starts with a Parse of no statement and binds a named write of the client's gets the client's
// token statement, on a connection another client's function left token 77 on: the write goes with the
// client's token, never 77 (it went without any token statement before: third review of the put-back).
func TestPooledEmptyParseBatchGetsTheClientsToken(t *testing.T) {
	for _, empty := range []string{"", ";", "/* nothing */"} {
		t.Run(fmt.Sprintf("%q", empty), func(t *testing.T) {
			f := newPooledFenced(t, 1, "")
			fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token, balance) VALUES (1, 1, 0)")
			b := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
			upd := "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1 RETURNING fence_token"
			shortAnswers(t, b, &pgproto3.Parse{Name: "upd", Query: upd}, &pgproto3.Sync{})
			dirtyPooledConnection(t, f, "pooled_sneak_empty")
			got := shortAnswers(t, b, &pgproto3.Parse{Query: empty}, &pgproto3.Bind{PreparedStatement: "upd"}, &pgproto3.Execute{}, &pgproto3.Sync{})
			if tok := f.token(t, 1); tok != 5 || !slices.Contains(got, "D5") {
				t.Fatalf("the client's write: row 1 token %d (%q), want 5 (77 is another client's)", tok, got)
			}
		})
	}
}

// Client B's function replaces the proxy's statement that carries client A's unnamed one (DEALLOCATE
// fenceproxy_u, then PREPARE of the name with a token of its choosing) in a plain transaction, on the
// connection client A's checked batch used. A's next checked batch, and a Bind of its unnamed statement with no
// Parse after B did it again, run A's statement with A's token, never the one B's statement would set: the
// token statement is the server's unnamed statement, which no SQL reaches, and A's unnamed statement is parsed
// again, closed first, on a connection another client held. (Until the twentieth pass the token statement was
// a named one, fenceproxy_t, which this replaced; the second review of the thirteenth pass found the mark of
// whom it was prepared for outlived another client's lend.)
func TestPooledTokenStatementReplacedByAnotherClient(t *testing.T) {
	f, a, batch := tokenStatementSwapped(t, func(*pgconn.PgConn) {})
	got := shortAnswers(t, a, batch...)
	if tok := f.token(t, 1); tok != 5 || !slices.Contains(got, "D5") {
		t.Fatalf("A's write went with token %d (B's statement sets 99); answers %q", tok, got)
	}
	b := pooledPgConn(t, f, "&options=-c%20fence.token%3D6")
	if got := shortAnswers(t, b, &pgproto3.Query{String: "SELECT pooled_swap_tokenstmt()"}); !slices.Contains(got, "D1") {
		t.Fatalf("B's function again: %q", got)
	}
	got = shortAnswers(t, a, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}) // A's unnamed statement: the UPDATE
	if !slices.Equal(got, []string{"2", "D5", "UPDATE 1", "ZI"}) || f.token(t, 1) != 5 {
		t.Fatalf("A's Bind of its unnamed statement: %q, row 1 token %d (B's statement sets 99)", got, f.token(t, 1))
	}
}

// tokenStatementSwapped has client A (token 5) run a checked batch on the pool's one connection, then client B
// (token 6) call a function that puts a statement setting token 99 under the name of the proxy's statement that
// carries A's unnamed one, then A run between (after B, before its next checked batch). It returns the fixture, A and that
// batch.
func tokenStatementSwapped(t *testing.T, between func(a *pgconn.PgConn)) (*fenced, *pgconn.PgConn, []pgproto3.FrontendMessage) {
	t.Helper()
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token, balance) VALUES (1, 1, 0)")
	fxExec(t, f.d, `CREATE OR REPLACE FUNCTION pooled_swap_tokenstmt() RETURNS int LANGUAGE plpgsql AS $f$
BEGIN
  IF EXISTS (SELECT FROM pg_catalog.pg_prepared_statements WHERE name = 'fenceproxy_u') THEN
    EXECUTE 'DEALLOCATE fenceproxy_u';
  END IF;
  EXECUTE 'PREPARE fenceproxy_u(text, text) AS SELECT pg_catalog.set_config(''fence.token'', ''99'', true), pg_catalog.set_config(''fence.lock'', $2, true)';
  RETURN 1;
END $f$`)
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_swap_tokenstmt()") })
	a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	upd := "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1 RETURNING fence_token"
	// A set_config in the batch makes it checked: the prepared token statement goes in front.
	batch := []pgproto3.FrontendMessage{
		&pgproto3.Parse{Query: "SELECT pg_catalog.set_config('application_name', 'a', true)"}, &pgproto3.Bind{}, &pgproto3.Execute{},
		&pgproto3.Parse{Query: upd}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
	}
	shortAnswers(t, a, batch...)
	b := pooledPgConn(t, f, "&options=-c%20fence.token%3D6")
	if got := shortAnswers(t, b, &pgproto3.Query{String: "SELECT pooled_swap_tokenstmt()"}); !slices.Contains(got, "D1") {
		t.Fatalf("B's function: %q", got)
	}
	between(a)
	return f, a, batch
}

// Client B's function replaces the server statement that carries client A's named statement (DEALLOCATE, then
// PREPARE of its fenceproxy_s name, read from pg_prepared_statements) in a plain transaction: A's next Bind of
// its statement on that connection runs A's statement, prepared again, never B's (second review of the
// thirteenth pass: a server statement prepared before another client held the connection was bound as it was).
func TestPooledNamedStatementReplacedByAnotherClient(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, `CREATE OR REPLACE FUNCTION pooled_swap_named() RETURNS int LANGUAGE plpgsql AS $f$
DECLARE n text;
BEGIN
  FOR n IN SELECT name FROM pg_catalog.pg_prepared_statements WHERE name LIKE 'fenceproxy\_s%' LOOP
    EXECUTE 'DEALLOCATE ' || pg_catalog.quote_ident(n);
    EXECUTE 'PREPARE ' || pg_catalog.quote_ident(n) || ' AS SELECT 99';
  END LOOP;
  RETURN 1;
END $f$`)
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_swap_named()") })
	a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	if got := shortAnswers(t, a, &pgproto3.Parse{Name: "one", Query: "SELECT 1"}, &pgproto3.Bind{PreparedStatement: "one"}, &pgproto3.Execute{}, &pgproto3.Sync{}); !slices.Contains(got, "D1") {
		t.Fatalf("A's statement: %q", got)
	}
	b := pooledPgConn(t, f, "&options=-c%20fence.token%3D6")
	shortAnswers(t, b, &pgproto3.Query{String: "SELECT pooled_swap_named()"})
	for i := range 2 { // the second time on a connection A prepared it on again
		if got := shortAnswers(t, a, &pgproto3.Bind{PreparedStatement: "one"}, &pgproto3.Execute{}, &pgproto3.Sync{}); !slices.Equal(got, []string{"2", "D1", "SELECT 1", "ZI"}) {
			t.Fatalf("A's Bind %d of its statement: %q (B's function put SELECT 99 under its server name)", i, got)
		}
		if got := shortAnswers(t, a, &pgproto3.Describe{ObjectType: 'S', Name: "one"}, &pgproto3.Sync{}); !slices.Equal(got, []string{"t", "T", "ZI"}) {
			t.Fatalf("A's Describe %d of its statement: %q", i, got)
		}
	}
}

// The token statement's Close and Parse, sent after the BEGIN of a batch with transaction modes, skipped by the
// server because a message before them failed (a Bind with a parameter too many; a Parse naming a type that
// does not exist): the connection does not count it prepared for the client, so another client's statement put
// under its name never runs in the client's next checked transaction (third review of the thirteenth pass).
func TestPooledSkippedTokenStatementIsPreparedAgain(t *testing.T) {
	for _, shape := range []string{"bad bind", "bad parse"} {
		t.Run(shape, func(t *testing.T) {
			fail := []pgproto3.FrontendMessage{&pgproto3.Parse{Query: "BEGIN ISOLATION LEVEL REPEATABLE READ"}, &pgproto3.Bind{Parameters: [][]byte{[]byte("1")}}, &pgproto3.Execute{}, &pgproto3.Sync{}}
			if shape == "bad parse" {
				fail = []pgproto3.FrontendMessage{&pgproto3.Parse{Query: "BEGIN ISOLATION LEVEL REPEATABLE READ", ParameterOIDs: []uint32{999999}}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}}
			}
			f, a, batch := tokenStatementSwapped(t, func(a *pgconn.PgConn) {
				if got := shortAnswers(t, a, fail...); !slices.Contains(got, "ZI") {
					t.Fatalf("the failing batch: %q", got)
				}
			})
			got := shortAnswers(t, a, batch...)
			if tok := f.token(t, 1); tok != 5 || !slices.Contains(got, "D5") {
				t.Fatalf("A's write went with token %d (B's statement sets 99); answers %q", tok, got)
			}
		})
	}
}

// Another client's function prepares a statement under the server name of a client's statement text on a
// connection where the proxy never prepared it: the client's Parse and Bind of that text work, and run the
// client's text (they failed 42P05 every time: third review of the thirteenth pass).
func TestPooledServerNamePlantedByAnotherClient(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	// The server name of "SELECT 1" with no parameter types (serverStmtName: the text, its terminator and a
	// count of zero types).
	h := sha256.Sum256([]byte("SELECT 1\x00\x00\x00"))
	name := "fenceproxy_s" + hex.EncodeToString(h[:10])
	fxExec(t, f.d, `CREATE OR REPLACE FUNCTION pooled_plant() RETURNS int LANGUAGE plpgsql AS $f$
BEGIN
  EXECUTE 'PREPARE `+name+` AS SELECT 99';
  RETURN 1;
END $f$`)
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_plant()") })
	b := pooledPgConn(t, f, "&options=-c%20fence.token%3D6")
	shortAnswers(t, b, &pgproto3.Query{String: "SELECT pooled_plant()"})
	a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	if got := shortAnswers(t, a, &pgproto3.Parse{Name: "one", Query: "SELECT 1"}, &pgproto3.Bind{PreparedStatement: "one"}, &pgproto3.Execute{}, &pgproto3.Sync{}); !slices.Equal(got, []string{"1", "2", "D1", "SELECT 1", "ZI"}) {
		t.Fatalf("A's Parse and Bind: %q", got)
	}
	if got := shortAnswers(t, a, &pgproto3.Bind{PreparedStatement: "one"}, &pgproto3.Execute{}, &pgproto3.Sync{}); !slices.Equal(got, []string{"2", "D1", "SELECT 1", "ZI"}) {
		t.Fatalf("A's Bind again: %q", got)
	}
}
