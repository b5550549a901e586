package proxy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// rawRound sends msgs on pc's frontend and reads until a ReadyForQuery (or the connection ends, as after a
// FATAL); it returns the first error the server (or the proxy) answered, nil when none. until, when not nil,
// ends the read at the first message it accepts instead (a batch without Sync).
func rawRound(t *testing.T, pc *pgconn.PgConn, msgs []pgproto3.FrontendMessage, until func(pgproto3.BackendMessage) bool) error {
	t.Helper()
	fe := pc.Frontend()
	for _, m := range msgs {
		fe.Send(m)
	}
	if err := fe.Flush(); err != nil {
		return err
	}
	deadline := time.AfterFunc(20*time.Second, func() { pc.Conn().Close() })
	defer deadline.Stop()
	var first error
	for {
		m, err := fe.Receive()
		if err != nil {
			if first != nil {
				return first
			}
			return err
		}
		switch m := m.(type) {
		case *pgproto3.ErrorResponse:
			if first == nil {
				first = &pgconn.PgError{Severity: m.Severity, Code: m.Code, Message: m.Message, Detail: m.Detail}
			}
		case *pgproto3.ReadyForQuery:
			if until == nil {
				return first
			}
		}
		if until != nil && until(m) {
			return first
		}
	}
}

// Session mode (both transports): what the server holds for a client from before a reload that protects a table
// must not write that table unfenced after it, whichever way the client runs it. Each case prepares on a
// session with the stale token 5 while the table is not protected, reloads the list to protect it (the row holds
// 9), and runs it: it must be refused (55F04 or 55F01) and write nothing.
func TestReview52cSessionReloadHeldByServer(t *testing.T) {
	for _, mode := range []struct {
		name       string
		goroutines bool
	}{{"event loop", false}, {"goroutines", true}} {
		t.Run(mode.name, func(t *testing.T) { review52cHeldByServer(t, mode.goroutines) })
	}
}

func review52cHeldByServer(t *testing.T, goroutines bool) {
	d := direct(t)
	name := fxName(t, "rc")
	fxCreateTable(t, d, "public."+name)
	fxExec(t, d, fmt.Sprintf("INSERT INTO public.%s (id, balance, fence_token) VALUES (1, 0, 9)", name))
	upd := fmt.Sprintf("UPDATE public.%s SET balance = balance + 1 WHERE id = $1", name)
	one := [][]byte{[]byte("1")}
	ok := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name   string
		before func(t *testing.T, pc *pgconn.PgConn)
		after  []pgproto3.FrontendMessage
	}{
		// A portal bound before the reload and executed after: the Bind was judged under the old list.
		{"portal bound before, executed after", func(t *testing.T, pc *pgconn.PgConn) {
			ok(t, rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Parse{Query: upd},
				&pgproto3.Bind{DestinationPortal: "p", Parameters: one},
				&pgproto3.Flush{},
			}, func(m pgproto3.BackendMessage) bool { _, ok := m.(*pgproto3.BindComplete); return ok }))
		}, []pgproto3.FrontendMessage{&pgproto3.Execute{Portal: "p"}, &pgproto3.Sync{}}},
		// A portal whose statement the client replaced before the reload (the unnamed one, parsed again as a read):
		// the statement the session holds now is not the one the portal runs.
		{"portal of a statement replaced since its Bind", func(t *testing.T, pc *pgconn.PgConn) {
			parses := 0
			ok(t, rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Parse{Query: upd},
				&pgproto3.Bind{DestinationPortal: "p", Parameters: one},
				&pgproto3.Parse{Query: "SELECT 1"},
				&pgproto3.Flush{},
			}, func(m pgproto3.BackendMessage) bool {
				_, ok := m.(*pgproto3.ParseComplete)
				parses += map[bool]int{true: 1}[ok]
				return parses == 2
			}))
		}, []pgproto3.FrontendMessage{&pgproto3.Execute{Portal: "p"}, &pgproto3.Sync{}}},
		// A statement whose text reads otherwise under the settings of its Bind than under those of its Parse
		// (standard_conforming_strings): judged again under those of the Bind it looks like a read, while the
		// server parsed the write.
		{"settings changed between the Parse and the judgement", func(t *testing.T, pc *pgconn.PgConn) {
			q := `WITH a AS (SELECT '\'), b AS (` + upd + ` RETURNING 1) SELECT 1 --') SELECT 1`
			ok(t, rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Parse{Name: "s", Query: q}, &pgproto3.Sync{},
			}, nil))
			ok(t, rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Query{String: "SET standard_conforming_strings = off"},
			}, nil))
		}, []pgproto3.FrontendMessage{
			&pgproto3.Bind{PreparedStatement: "s", Parameters: one}, &pgproto3.Execute{}, &pgproto3.Sync{}}},
		// A named portal of an explicit transaction, bound in an earlier batch (Sync) before the reload.
		{"named portal in a transaction block", func(t *testing.T, pc *pgconn.PgConn) {
			ok(t, rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Query{String: "BEGIN"},
			}, nil))
			ok(t, rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Parse{Name: "w", Query: upd},
				&pgproto3.Bind{PreparedStatement: "w", DestinationPortal: "p", Parameters: one},
				&pgproto3.Sync{},
			}, nil))
		}, []pgproto3.FrontendMessage{&pgproto3.Execute{Portal: "p"}, &pgproto3.Sync{}}},
		// The same portal, with a Bind of another statement after the reload before its Execute: that Bind is
		// judged under the new list, but the portal is still the one bound under the old.
		{"named portal in a transaction block, another Bind after", func(t *testing.T, pc *pgconn.PgConn) {
			ok(t, rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Query{String: "BEGIN"},
			}, nil))
			ok(t, rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Parse{Name: "w", Query: upd},
				&pgproto3.Bind{PreparedStatement: "w", DestinationPortal: "p", Parameters: one},
				&pgproto3.Sync{},
			}, nil))
		}, []pgproto3.FrontendMessage{
			&pgproto3.Parse{Query: "SELECT 1"}, &pgproto3.Bind{}, &pgproto3.Execute{Portal: "p"}, &pgproto3.Sync{}}},
		// An SQL PREPARE (a simple Query) bound by the protocol's Bind: the server has one namespace for both.
		{"SQL PREPARE, then a Bind of it", func(t *testing.T, pc *pgconn.PgConn) {
			ok(t, rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Query{String: "PREPARE sp(int) AS " + upd},
			}, nil))
		}, []pgproto3.FrontendMessage{
			&pgproto3.Bind{PreparedStatement: "sp", Parameters: one}, &pgproto3.Execute{}, &pgproto3.Sync{}}},
		// A Parse of an EXECUTE of an SQL PREPARE of before the reload, sent after a Bind that judged the
		// statements the session held: the judgement at the next Bind is done, so the Parse itself must mark it.
		{"Parse of EXECUTE after the judgement", func(t *testing.T, pc *pgconn.PgConn) {
			ok(t, rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Query{String: "PREPARE sp(int) AS " + upd},
			}, nil))
		}, []pgproto3.FrontendMessage{
			&pgproto3.Parse{Query: "SELECT 1"}, &pgproto3.Bind{}, &pgproto3.Execute{},
			&pgproto3.Parse{Name: "e", Query: "EXECUTE sp(1)"}, &pgproto3.Bind{PreparedStatement: "e"}, &pgproto3.Execute{}, &pgproto3.Sync{}}},
		// An SQL PREPARE sent in a Parse, run after the reload by a Query EXECUTE.
		{"PREPARE in a Parse, then a Query EXECUTE", func(t *testing.T, pc *pgconn.PgConn) {
			ok(t, rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Parse{Query: "PREPARE sq(int) AS " + upd},
				&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
			}, nil))
		}, []pgproto3.FrontendMessage{&pgproto3.Query{String: "EXECUTE sq(1)"}}},
		// A Close the server skips (an error earlier in the batch): the proxy must not forget the statement the
		// server still holds.
		{"Close skipped after an error", func(t *testing.T, pc *pgconn.PgConn) {
			ok(t, rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Parse{Name: "s", Query: upd}, &pgproto3.Sync{},
			}, nil))
			err := rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Parse{Query: "SELECT 1/0"}, &pgproto3.Bind{}, &pgproto3.Execute{},
				&pgproto3.Close{ObjectType: 'S', Name: "s"}, &pgproto3.Sync{},
			}, nil)
			wantPgErr(t, err, "22012", "division by zero")
		}, []pgproto3.FrontendMessage{
			&pgproto3.Bind{PreparedStatement: "s", Parameters: one}, &pgproto3.Execute{}, &pgproto3.Sync{}}},
		// PostgreSQL keys prepared statements by their first 63 bytes (NAMEDATALEN): a Bind of another long name
		// with the same first 63 bytes runs the statement the proxy kept under the first.
		{"a long name bound by another with the same first 63 bytes", func(t *testing.T, pc *pgconn.PgConn) {
			ok(t, rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Parse{Name: strings.Repeat("n", 63) + "1", Query: upd}, &pgproto3.Sync{},
			}, nil))
		}, []pgproto3.FrontendMessage{
			&pgproto3.Bind{PreparedStatement: strings.Repeat("n", 63) + "2", Parameters: one}, &pgproto3.Execute{}, &pgproto3.Sync{}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fxExec(t, d, fmt.Sprintf("UPDATE public.%s SET balance = 0, fence_token = 9 WHERE id = 1", name))
			p := startProxy(t, proxytest.Options{YAML: fxTables("public." + name + "_other"), DisableEventLoop: goroutines})
			f := &fenced{p: p, d: d, name: name, label: "public." + name}
			pc := pooledPgConn(t, f, "")
			ok(t, rawRound(t, pc, []pgproto3.FrontendMessage{&pgproto3.Query{String: "SET fence.token = 5"}}, nil))
			c.before(t, pc)
			reloadTables(t, f, "public."+name)
			err := rawRound(t, pc, c.after, nil)
			t.Logf("answer: %v", err)
			if snap := f.snapshot(t); snap != "1:0:9" {
				t.Fatalf("rows: %s, want 1:0:9: a statement held from before the reload wrote the table it protects unfenced (answer: %v)", snap, err)
			}
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || (pe.Code != "55F04" && pe.Code != "55F01") {
				t.Fatalf("want 55F04 or 55F01, got %v", err)
			}
		})
	}
}

// A reload that changes only a protected table's token column keeps the statement's tables: a statement
// prepared before it still checks the old column, so its Bind after it must be refused, not run under the old
// fence (the row's newer token 9 is in the column the new list names).
func TestReview52cSessionReloadTokenColumnChange(t *testing.T) {
	for _, mode := range []struct {
		name       string
		goroutines bool
	}{{"event loop", false}, {"goroutines", true}} {
		t.Run(mode.name, func(t *testing.T) {
			d := direct(t)
			name := fxName(t, "rt")
			fxCreateTable(t, d, "public."+name)
			fxExec(t, d, fmt.Sprintf("ALTER TABLE public.%s ADD COLUMN old_token bigint", name))
			fxExec(t, d, fmt.Sprintf("INSERT INTO public.%s (id, balance, fence_token, old_token) VALUES (1, 0, 9, 1)", name))
			p := startProxy(t, proxytest.Options{
				YAML:             fmt.Sprintf("tables:\n  - name: public.%s\n    token_column: old_token\n", name),
				DisableEventLoop: mode.goroutines})
			f := &fenced{p: p, d: d, name: name, label: "public." + name}
			pc := pooledPgConn(t, f, "")
			if err := rawRound(t, pc, []pgproto3.FrontendMessage{&pgproto3.Query{String: "SET fence.token = 5"}}, nil); err != nil {
				t.Fatal(err)
			}
			upd := fmt.Sprintf("UPDATE public.%s SET balance = balance + 1 WHERE id = $1", name)
			if err := rawRound(t, pc, []pgproto3.FrontendMessage{&pgproto3.Parse{Name: "u", Query: upd}, &pgproto3.Sync{}}, nil); err != nil {
				t.Fatal(err)
			}
			reloadTables(t, f, "public."+name) // token_column: fence_token
			err := rawRound(t, pc, []pgproto3.FrontendMessage{
				&pgproto3.Bind{PreparedStatement: "u", Parameters: [][]byte{[]byte("1")}}, &pgproto3.Execute{}, &pgproto3.Sync{}}, nil)
			if snap := f.snapshot(t); snap != "1:0:9" {
				t.Fatalf("rows: %s, want 1:0:9: the statement ran the fence of the old token column (answer: %v)", snap, err)
			}
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || (pe.Code != "55F04" && pe.Code != "55F01") {
				t.Fatalf("want 55F04 or 55F01, got %v", err)
			}
		})
	}
}

// The other side of the judgement: a fenced statement prepared before a reload that leaves its table as it was
// runs on after it, fenced (the new planner makes of its text what the server holds).
func TestReview52cSessionReloadKeepsUnchangedFencedStatement(t *testing.T) {
	for _, mode := range []struct {
		name       string
		goroutines bool
	}{{"event loop", false}, {"goroutines", true}} {
		t.Run(mode.name, func(t *testing.T) {
			d := direct(t)
			name := fxName(t, "rk")
			fxCreateTable(t, d, "public."+name)
			fxExec(t, d, fmt.Sprintf("INSERT INTO public.%s (id, balance, fence_token) VALUES (1, 0, 9)", name))
			p := startProxy(t, proxytest.Options{YAML: fxTables("public." + name), DisableEventLoop: mode.goroutines})
			f := &fenced{p: p, d: d, name: name, label: "public." + name}
			pc := pooledPgConn(t, f, "")
			upd := fmt.Sprintf("UPDATE public.%s SET balance = balance + 1 WHERE id = $1", name)
			if err := rawRound(t, pc, []pgproto3.FrontendMessage{&pgproto3.Query{String: "SET fence.token = 10"}}, nil); err != nil {
				t.Fatal(err)
			}
			if err := rawRound(t, pc, []pgproto3.FrontendMessage{&pgproto3.Parse{Name: "u", Query: upd}, &pgproto3.Sync{}}, nil); err != nil {
				t.Fatal(err)
			}
			reloadTables(t, f, "public."+name, "public."+name+"_other")
			run := []pgproto3.FrontendMessage{
				&pgproto3.Bind{PreparedStatement: "u", Parameters: [][]byte{[]byte("1")}}, &pgproto3.Execute{}, &pgproto3.Sync{}}
			if err := rawRound(t, pc, run, nil); err != nil {
				t.Fatalf("a statement the reload does not change: %v", err)
			}
			if snap := f.snapshot(t); snap != "1:1:10" {
				t.Fatalf("rows: %s, want 1:1:10 (fenced with the token 10)", snap)
			}
		})
	}
}

// A kept statement is judged again under the reading settings of its Parse, as the server read it, not under
// every setting at once (as the Bind's, whose settings the proxy counts unknown while its batch runs): a fenced
// statement with a backslash in a literal, which reads otherwise with standard_conforming_strings off, runs on
// after a reload that leaves its table as it was, fenced (length of a\b: 3). Read under every setting, it was
// judged otherwise and the session refused (found by mutation, pass 53).
func TestSessionReloadKeepsUnchangedStatementReadUnderItsParseSettings(t *testing.T) {
	for _, mode := range []struct {
		name       string
		goroutines bool
	}{{"event loop", false}, {"goroutines", true}} {
		t.Run(mode.name, func(t *testing.T) {
			d := direct(t)
			name := fxName(t, "rb")
			fxCreateTable(t, d, "public."+name)
			fxExec(t, d, fmt.Sprintf("INSERT INTO public.%s (id, balance, fence_token) VALUES (1, 0, 9)", name))
			p := startProxy(t, proxytest.Options{YAML: fxTables("public." + name), DisableEventLoop: mode.goroutines})
			f := &fenced{p: p, d: d, name: name, label: "public." + name}
			pc := pooledPgConn(t, f, "")
			upd := fmt.Sprintf(`UPDATE public.%s SET balance = balance + length('a\b') WHERE id = $1`, name)
			if err := rawRound(t, pc, []pgproto3.FrontendMessage{&pgproto3.Query{String: "SET fence.token = 10"}}, nil); err != nil {
				t.Fatal(err)
			}
			if err := rawRound(t, pc, []pgproto3.FrontendMessage{&pgproto3.Parse{Name: "u", Query: upd}, &pgproto3.Sync{}}, nil); err != nil {
				t.Fatal(err)
			}
			reloadTables(t, f, "public."+name, "public."+name+"_other")
			run := []pgproto3.FrontendMessage{
				&pgproto3.Bind{PreparedStatement: "u", Parameters: [][]byte{[]byte("1")}}, &pgproto3.Execute{}, &pgproto3.Sync{}}
			if err := rawRound(t, pc, run, nil); err != nil {
				t.Fatalf("a statement the reload does not change: %v", err)
			}
			if snap := f.snapshot(t); snap != "1:3:10" {
				t.Fatalf("rows: %s, want 1:3:10 (fenced with the token 10)", snap)
			}
		})
	}
}
