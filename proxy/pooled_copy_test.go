package proxy_test

import (
	"context"
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

// Transaction pooling against a direct connection, message by message: COPY (whose data PostgreSQL reads with
// Sync and Flush ignored), FunctionCall, batches of a lone Flush, Describe, Execute or Sync, and VACUUM bound in
// a later batch. From a review on 2026-12-03: the tests of what it found failed before their mends (COPY's
// Syncs counted as units hung the session and held its connection; a lone Flush held a connection; a portal
// batch found the token statement's portal; a bound VACUUM failed 25001).

// wireShort is one answer in short form (shortAnswers' forms, plus G/H copy-in/out, d copy data, c copy done,
// V function call result, N notice).
func wireShort(m pgproto3.BackendMessage) string {
	switch m := m.(type) {
	case *pgproto3.ParseComplete:
		return "1"
	case *pgproto3.BindComplete:
		return "2"
	case *pgproto3.CloseComplete:
		return "3"
	case *pgproto3.ParameterDescription:
		return "t"
	case *pgproto3.RowDescription:
		var cols []string
		for _, f := range m.Fields {
			cols = append(cols, string(f.Name))
		}
		return "T(" + strings.Join(cols, ",") + ")"
	case *pgproto3.NoData:
		return "n"
	case *pgproto3.DataRow:
		var vs []string
		for _, v := range m.Values {
			vs = append(vs, string(v))
		}
		return "D" + strings.Join(vs, ",")
	case *pgproto3.CommandComplete:
		return string(m.CommandTag)
	case *pgproto3.ErrorResponse:
		return "E" + m.Code
	case *pgproto3.ReadyForQuery:
		return "Z" + string(m.TxStatus)
	case *pgproto3.CopyInResponse:
		return "G"
	case *pgproto3.CopyOutResponse:
		return "H"
	case *pgproto3.CopyData:
		return "d" + string(m.Data)
	case *pgproto3.CopyDone:
		return "c"
	case *pgproto3.FunctionCallResponse:
		return "V" + string(m.Result)
	case *pgproto3.EmptyQueryResponse:
		return "I"
	case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus:
		return ""
	case *pgproto3.PortalSuspended:
		return "s"
	}
	return fmt.Sprintf("?%T", m)
}

// wireSteps sends each step's messages, then reads every answer until nothing comes for quiet. It returns the
// answers in short form, one slice per step ("EOF" when the connection closed). With want (the answers another
// connection gave to the same steps), it first waits up to 5 s for as many answers as want has for the step,
// and only then for quiet: an answer that comes late is not taken for a missing one.
func wireSteps(t *testing.T, pc *pgconn.PgConn, quiet time.Duration, want [][]string, steps ...[]pgproto3.FrontendMessage) [][]string {
	t.Helper()
	fe := pc.Frontend()
	var out [][]string
	for _, step := range steps {
		for _, m := range step {
			fe.Send(m)
		}
		if err := fe.Flush(); err != nil {
			out = append(out, []string{"SENDFAIL"})
			continue
		}
		var got []string
		for {
			wait := quiet
			if i := len(out); i < len(want) && len(got) < len(want[i]) {
				wait = 5 * time.Second
			}
			pc.Conn().SetReadDeadline(time.Now().Add(wait))
			m, err := fe.Receive()
			if err != nil {
				var ne net.Error
				if !(errors.As(err, &ne) && ne.Timeout()) {
					got = append(got, "EOF")
				}
				break
			}
			if s := wireShort(m); s != "" {
				got = append(got, s)
			}
		}
		pc.Conn().SetReadDeadline(time.Time{})
		out = append(out, got)
	}
	return out
}

// sameAsDirect runs the steps on a direct connection and through the pool, and fails when they differ.
func sameAsDirect(t *testing.T, pooled *pgconn.PgConn, steps ...[]pgproto3.FrontendMessage) {
	t.Helper()
	d := wireSteps(t, directPgConn(t), 700*time.Millisecond, nil, steps...)
	p := wireSteps(t, pooled, 150*time.Millisecond, d, steps...)
	if fmt.Sprint(d) != fmt.Sprint(p) {
		t.Fatalf("answers differ\n direct: %q\n pooled: %q", d, p)
	}
}

// copySameAsDirect makes the tables, runs steps through a pool of one as a client with token 5 and on a direct
// connection, and fails when the answers differ; then another client of the pool must get its own answer (the
// connection is not held, nor left with answers that are not its).
func copySameAsDirect(t *testing.T, tables []string, steps ...[]pgproto3.FrontendMessage) {
	t.Helper()
	f := newPooledFenced(t, 1, "  max_client_wait: 10s\n")
	for _, tbl := range tables {
		plainTable(t, f, tbl)
	}
	sameAsDirect(t, pooledPgConn(t, f, "&options=-c%20fence.token%3D5"), steps...)
	b := pooledPgConn(t, f, "&options=-c%20fence.token%3D7")
	bq := []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 2 AS b_two"}}
	if got := fmt.Sprint(wireSteps(t, b, 300*time.Millisecond, [][]string{{"", "", "", ""}}, bq)); got != fmt.Sprint([][]string{{"T(b_two)", "D2", "SELECT 1", "ZI"}}) {
		t.Fatalf("the next client of the pool: %s", got)
	}
}

func plainTable(t *testing.T, f *fenced, name string) {
	t.Helper()
	fxExec(t, f.d, "DROP TABLE IF EXISTS "+name)
	fxExec(t, f.d, "CREATE TABLE "+name+" (a int)")
	t.Cleanup(func() {
		// A stuck pooled transaction may hold a lock on the table: give up rather than wait for it.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		f.d.Exec(ctx, "DROP TABLE IF EXISTS "+name)
	})
}

// COPY FROM STDIN sent by the extended protocol as libpq (PQexecParams), tokio-postgres and others send it:
// Parse, Bind, Describe, Execute, Sync; then, after CopyInResponse, CopyData..., CopyDone (or CopyFail), Sync.
// PostgreSQL ignores the first Sync (it arrives in copy-in mode) and answers the second: one ReadyForQuery.
// The proxy counts two units and, after the server's only ReadyForQuery, sends the second Sync as a new unit
// on a new lend: the client gets a ReadyForQuery it never asked for, and its next statement's answer is off by
// one.
func TestPooledCopyInExtendedDoubleSync(t *testing.T) {
	start := []pgproto3.FrontendMessage{
		&pgproto3.Parse{Query: "COPY pcopy_copy1 FROM STDIN"}, &pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'},
		&pgproto3.Execute{}, &pgproto3.Sync{},
	}
	for name, rest := range map[string][]pgproto3.FrontendMessage{
		"done": {&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, &pgproto3.Sync{}},
		"fail": {&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyFail{Message: "client says no"}, &pgproto3.Sync{}},
		"bad":  {&pgproto3.CopyData{Data: []byte("x\n")}, &pgproto3.CopyDone{}, &pgproto3.Sync{}},
	} {
		t.Run(name, func(t *testing.T) {
			f := newPooledFenced(t, 1, "")
			plainTable(t, f, "pcopy_copy1")
			next := []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 42 AS answer"}}
			sameAsDirect(t, pooledPgConn(t, f, ""), start, rest, next)
		})
	}
}

// A Flush or Sync sent while a simple Query's COPY FROM STDIN waits for data (PostgreSQL ignores both in
// copy-in mode, "for the convenience of client libraries"): the proxy takes it for the start of the next unit
// and waits for the COPY's ReadyForQuery before reading the client's CopyDone, which the server waits for.
func TestPooledCopyInSimpleFlushOrSync(t *testing.T) {
	for name, m := range map[string]pgproto3.FrontendMessage{"flush": &pgproto3.Flush{}, "sync": &pgproto3.Sync{}} {
		t.Run(name, func(t *testing.T) {
			f := newPooledFenced(t, 1, "")
			plainTable(t, f, "pcopy_copy2")
			sameAsDirect(t, pooledPgConn(t, f, ""),
				[]pgproto3.FrontendMessage{&pgproto3.Query{String: "COPY pcopy_copy2 FROM STDIN"}},
				[]pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("1\n")}, m, &pgproto3.CopyDone{}},
				[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 42 AS answer"}})
		})
	}
}

// COPY in the other shapes, against a direct connection: these held.
func TestPooledCopyShapes(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	plainTable(t, f, "pcopy_copy3")
	for name, steps := range map[string][][]pgproto3.FrontendMessage{
		"simple in, done": {
			{&pgproto3.Query{String: "COPY pcopy_copy3 FROM STDIN"}},
			{&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}},
			{&pgproto3.Query{String: "SELECT count(*) >= 0 FROM pcopy_copy3"}},
		},
		"simple in, fail, pipelined": {
			{&pgproto3.Query{String: "COPY pcopy_copy3 FROM STDIN"}, &pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyFail{Message: "no"}, &pgproto3.Query{String: "SELECT 1"}},
		},
		"simple in, bad data, pipelined": {
			{&pgproto3.Query{String: "COPY pcopy_copy3 FROM STDIN; SELECT 2"}, &pgproto3.CopyData{Data: []byte("zz\n")}, &pgproto3.CopyData{Data: []byte("3\n")}, &pgproto3.CopyDone{}, &pgproto3.Query{String: "SELECT 1"}},
		},
		"in a block": {
			{&pgproto3.Query{String: "BEGIN"}},
			{&pgproto3.Query{String: "COPY pcopy_copy3 FROM STDIN"}},
			{&pgproto3.CopyData{Data: []byte("5\n")}, &pgproto3.CopyDone{}},
			{&pgproto3.Query{String: "SELECT 1"}, &pgproto3.Query{String: "ROLLBACK"}},
		},
		"to stdout": {
			{&pgproto3.Query{String: "COPY (SELECT 7) TO STDOUT"}, &pgproto3.Query{String: "SELECT 1"}},
		},
		"to stdout extended": {
			{&pgproto3.Parse{Query: "COPY (SELECT 8) TO STDOUT"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}, &pgproto3.Query{String: "SELECT 1"}},
		},
		"extended in, single sync": {
			{&pgproto3.Parse{Query: "COPY pcopy_copy3 FROM STDIN"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Flush{}},
			{&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, &pgproto3.Sync{}},
			{&pgproto3.Query{String: "SELECT 1"}},
		},
		"stray copy messages": {
			{&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, &pgproto3.CopyFail{Message: "x"}, &pgproto3.Query{String: "SELECT 1"}},
		},
	} {
		t.Run(name, func(t *testing.T) { sameAsDirect(t, pooledPgConn(t, f, ""), steps...) })
	}
}

// A lone Flush between transactions: PostgreSQL does nothing. The proxy lends a server connection, sends the
// token statement in front of the Flush (an extended-protocol Execute with no Sync: an open transaction), and
// keeps the connection lent until the client's next unit, so another client of a pool of one waits for it
// (here past 5 s; pool.max_client_wait, then FATAL 53300).
func TestPooledLoneFlushHoldsNothing(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 30s\n")
	a := pooledPgConn(t, f, "")
	b := pooledPgConn(t, f, "")
	if got := shortAnswers(t, a, &pgproto3.Query{String: "SELECT 1"}); !slices.Equal(got, []string{"T", "D1", "SELECT 1", "ZI"}) {
		t.Fatalf("warm-up: %q", got)
	}
	a.Frontend().Send(&pgproto3.Flush{})
	if err := a.Frontend().Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if got := shortAnswers(t, b, &pgproto3.Query{String: "SELECT 2"}); !slices.Equal(got, []string{"T", "D2", "SELECT 1", "ZI"}) {
		t.Fatalf("client B after client A sent a lone Flush: %q (A holds the pool's only server connection)", got)
	}
}

// A Describe or Execute of the unnamed portal as a batch of its own (after a Sync, which ended the portal):
// PostgreSQL answers 34000. The proxy puts its token statement in the unnamed portal in front, so the client
// describes or runs the proxy's statement.
func TestPooledUnnamedPortalBatchFindsNoPortal(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	for name, m := range map[string]pgproto3.FrontendMessage{
		"describe": &pgproto3.Describe{ObjectType: 'P'},
		"execute":  &pgproto3.Execute{},
	} {
		t.Run(name, func(t *testing.T) {
			sameAsDirect(t, pooledPgConn(t, f, "&options=-c%20fence.token%3D5"),
				[]pgproto3.FrontendMessage{&pgproto3.Parse{Query: "SELECT 1"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}},
				[]pgproto3.FrontendMessage{m, &pgproto3.Sync{}})
		})
	}
}

// VACUUM and CREATE INDEX CONCURRENTLY prepared in one batch and bound and executed in the next (a named
// statement, or the unnamed one as pgx's describe-exec mode does): directly they run; through the pool the
// checked token statement goes in front in the same batch, which makes it a transaction block (25001).
func TestPooledOwnTransactionBoundLater(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	plainTable(t, f, "pcopy_vac")
	for name, stmt := range map[string]string{
		"vacuum named":   "v",
		"vacuum unnamed": "",
		"cic named":      "c",
	} {
		t.Run(name, func(t *testing.T) {
			text := "VACUUM pcopy_vac"
			if strings.HasPrefix(name, "cic") {
				text = "CREATE INDEX CONCURRENTLY IF NOT EXISTS pcopy_vac_i ON pcopy_vac (a)"
			}
			sameAsDirect(t, pooledPgConn(t, f, ""),
				[]pgproto3.FrontendMessage{&pgproto3.Parse{Name: stmt, Query: text}, &pgproto3.Describe{ObjectType: 'S', Name: stmt}, &pgproto3.Sync{}},
				[]pgproto3.FrontendMessage{&pgproto3.Bind{PreparedStatement: stmt}, &pgproto3.Execute{}, &pgproto3.Sync{}})
		})
	}
}

// FunctionCall as a unit of its own and inside a block; Close-, Describe-, Sync-only batches, also after an
// error: against a direct connection (these held).
func TestPooledFunctionCallAndBareBatches(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	var upper uint32
	if err := f.d.QueryRow(ctxT(t), "SELECT 'pg_catalog.upper(text)'::regprocedure::oid").Scan(&upper); err != nil {
		t.Fatal(err)
	}
	fc := &pgproto3.FunctionCall{Function: upper, Arguments: [][]byte{[]byte("abc")}}
	for name, steps := range map[string][][]pgproto3.FrontendMessage{
		"functioncall alone":        {{fc}, {fc, &pgproto3.Query{String: "SELECT 1"}}},
		"functioncall in block":     {{&pgproto3.Query{String: "BEGIN"}}, {fc}, {&pgproto3.Query{String: "COMMIT"}}},
		"functioncall failed block": {{&pgproto3.Query{String: "BEGIN; SELECT 1/0"}}, {fc}, {&pgproto3.Query{String: "ROLLBACK"}, fc}},
		"sync only":                 {{&pgproto3.Sync{}}, {&pgproto3.Sync{}, &pgproto3.Sync{}}, {&pgproto3.Query{String: "SELECT 1"}}},
		"flush in block":            {{&pgproto3.Query{String: "BEGIN"}}, {&pgproto3.Flush{}}, {&pgproto3.Query{String: "SELECT 1"}, &pgproto3.Query{String: "COMMIT"}}},
		"flush between units":       {{&pgproto3.Flush{}}, {&pgproto3.Query{String: "SELECT 1"}}, {&pgproto3.Flush{}, &pgproto3.Sync{}}},
		"close only":                {{&pgproto3.Close{ObjectType: 'S', Name: "nope"}, &pgproto3.Sync{}}, {&pgproto3.Close{ObjectType: 'P'}, &pgproto3.Sync{}}},
		"describe stmt only":        {{&pgproto3.Parse{Name: "ds", Query: "SELECT 1 AS x"}, &pgproto3.Sync{}}, {&pgproto3.Describe{ObjectType: 'S', Name: "ds"}, &pgproto3.Sync{}}, {&pgproto3.Describe{ObjectType: 'S', Name: "nope"}, &pgproto3.Sync{}}},
		"sync after error": {
			{&pgproto3.Parse{Query: "SELEC 1"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}},
			{&pgproto3.Sync{}},
			{&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}, &pgproto3.Sync{}},
			{&pgproto3.Query{String: "SELECT 1"}},
		},
	} {
		t.Run(name, func(t *testing.T) { sameAsDirect(t, pooledPgConn(t, f, ""), steps...) })
	}
}

// The same COPY (libpq's double Sync), then the client goes away: the session goroutine waits for a
// ReadyForQuery the server never sends (it ignored the first Sync), so it never reads the client's second Sync,
// nor its Terminate or close. The server connection stays lent, its transaction open (COPY's RowExclusiveLock
// held: DDL on the table waits), and another client of the pool of one gets nothing.
func TestPooledCopyInExtendedLeavesNothingHeld(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	plainTable(t, f, "pcopy_copy4")
	a, err := pgconn.Connect(ctxT(t), f.dsn())
	if err != nil {
		t.Fatal(err)
	}
	wireSteps(t, a, 300*time.Millisecond, nil,
		[]pgproto3.FrontendMessage{&pgproto3.Parse{Query: "COPY pcopy_copy4 FROM STDIN"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}},
		[]pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, &pgproto3.Sync{}})
	a.Conn().Close() // the client leaves
	eventually(t, 5*time.Second, "the COPY's locks on its table released", func() bool {
		var held int
		err := f.d.QueryRow(ctxT(t), "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'pcopy_copy4' AND l.pid <> pg_backend_pid()").Scan(&held)
		return err == nil && held == 0
	})
	b := pooledPgConn(t, f, "")
	if got := shortAnswers(t, b, &pgproto3.Query{String: "SELECT 2"}); !slices.Equal(got, []string{"T", "D2", "SELECT 1", "ZI"}) {
		t.Fatalf("client B after client A left: %q", got)
	}
}
