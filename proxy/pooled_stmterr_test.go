package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// seStep is one write of a client's messages (seClient), read up to the answer of its last Sync or Query.
type seStep struct {
	client int
	what   string
	msgs   []pgproto3.FrontendMessage
}

// seBind is a Bind of stmt to the unnamed portal with n text parameters, and its Execute.
func seBind(stmt string, n int) []pgproto3.FrontendMessage {
	ps := make([][]byte, n)
	for i := range ps {
		ps[i] = []byte("1")
	}
	return []pgproto3.FrontendMessage{&pgproto3.Bind{PreparedStatement: stmt, Parameters: ps}, &pgproto3.Execute{}}
}

// seMsgs joins messages and groups of them.
func seMsgs(parts ...any) []pgproto3.FrontendMessage {
	var out []pgproto3.FrontendMessage
	for _, p := range parts {
		switch p := p.(type) {
		case pgproto3.FrontendMessage:
			out = append(out, p)
		case []pgproto3.FrontendMessage:
			out = append(out, p...)
		}
	}
	return out
}

// seAnswers sends each step on its client's connection and returns the answers, every error in whole
// (severity, code, message, detail, hint, position), the other messages in short form (woShort).
func seAnswers(t *testing.T, conns []*pgconn.PgConn, steps []seStep) [][]string {
	out := make([][]string, len(steps))
	for i, s := range steps {
		pc := conns[s.client]
		fe := pc.Frontend()
		pc.Conn().SetDeadline(time.Now().Add(10 * time.Second))
		want := 0
		for _, m := range s.msgs {
			fe.Send(m)
			switch m.(type) {
			case *pgproto3.Sync, *pgproto3.Query:
				want++
			}
		}
		if err := fe.Flush(); err != nil {
			t.Fatalf("%s: send: %v", s.what, err)
		}
		for want > 0 {
			m, err := fe.Receive()
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					out[i] = append(out[i], "HANG")
				} else {
					out[i] = append(out[i], "RECVERR")
				}
				break
			}
			switch m := m.(type) {
			case *pgproto3.ErrorResponse:
				out[i] = append(out[i], fmt.Sprintf("%s %s %q detail %q hint %q position %d", m.Severity, m.Code, m.Message, m.Detail, m.Hint, m.Position))
			case *pgproto3.ReadyForQuery:
				want--
				out[i] = append(out[i], woShort(m))
			default:
				if s := woShort(m); s != "" && !strings.HasPrefix(s, "S:") {
					out[i] = append(out[i], s)
				}
			}
		}
		pc.Conn().SetDeadline(time.Time{})
	}
	return out
}

// The server's errors about a client's protocol-level statement name it as the client did in the message the
// error answers, as on a connection of its own, not by the server statement that carries it (fenceproxy_s...,
// shared by every name of the same text, this client's and others'): a Bind with too few or too many
// parameters of a named statement and of the unnamed one, a Bind after a Describe, a Bind in a pipeline of
// several Syncs and in one batch after other names of the same text were bound, a Bind after rows, a Parse of
// a name in use (42P05), a Bind or Describe of a name of the proxy's the client never prepared (26000), and two
// clients sharing a text under different names. Every answer is compared in whole with direct connections'.
func TestPooledStatementErrorsNameTheClientsStatement(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	const two = "SELECT $1::int + $2::int"
	parse := func(name, text string) *pgproto3.Parse { return &pgproto3.Parse{Name: name, Query: text} }
	sync := &pgproto3.Sync{}
	steps := []seStep{
		{0, "Parse a", seMsgs(parse("a", two), sync)},
		{0, "a, too few", seMsgs(seBind("a", 1), sync)},
		{0, "a, too many", seMsgs(seBind("a", 3), sync)},
		{0, "a, right", seMsgs(seBind("a", 2), sync)},
		{0, "unnamed, too few", seMsgs(parse("", two), seBind("", 1), sync)},
		{0, "unnamed, too many", seMsgs(parse("", two), seBind("", 3), sync)},
		{0, "unnamed, again", seMsgs(seBind("", 1), sync)},
		{0, "after a Describe", seMsgs(parse("b", two), &pgproto3.Describe{ObjectType: 'S', Name: "b"}, seBind("b", 1), sync)},
		{0, "Describe, then too many", seMsgs(&pgproto3.Describe{ObjectType: 'S', Name: "a"}, seBind("a", 3), sync)},
		{0, "a pipeline of three batches, one text", seMsgs(
			parse("c", two), seBind("c", 2), sync,
			parse("d", two), seBind("d", 1), sync,
			seBind("c", 3), sync,
			seBind("a", 2), seBind("d", 2), seBind("b", 0), sync)},
		{0, "one batch, the second name", seMsgs(parse("e", two), parse("f", two), seBind("e", 2), seBind("f", 1), sync)},
		{0, "after rows", seMsgs(parse("g", "SELECT generate_series(1,3)"), seBind("g", 0), seBind("e", 3), sync)},
		{0, "after a portal's rows in parts", seMsgs(
			&pgproto3.Bind{PreparedStatement: "g"}, &pgproto3.Execute{MaxRows: 1}, &pgproto3.Execute{MaxRows: 1},
			&pgproto3.Describe{ObjectType: 'P'}, seBind("f", 3), sync)},
		{0, "a name in use", seMsgs(parse("a", two), sync)},
		{0, "a name in use, other text", seMsgs(parse("e", "SELECT 1"), sync)},
		{0, "a name in use, after Binds of others", seMsgs(seBind("b", 2), seBind("c", 2), parse("d", two), sync)},
		{0, "a name of the proxy's", seMsgs(seBind("fenceproxy_sdeadbeef", 0), sync)},
		{0, "a name of the proxy's, described", seMsgs(&pgproto3.Describe{ObjectType: 'S', Name: "fenceproxy_u"}, sync)},
		{1, "another client, Parse x", seMsgs(parse("x", two), sync)},
		{0, "a after x", seMsgs(seBind("a", 1), sync)},
		{1, "x, too few", seMsgs(seBind("x", 1), sync)},
		{1, "x in use", seMsgs(parse("x", two), sync)},
		{0, "a pipeline after x", seMsgs(seBind("a", 3), sync, seBind("b", 1), sync)},
		{1, "x, pipelined", seMsgs(seBind("x", 2), sync, seBind("x", 3), sync)},
		{1, "the unnamed, never parsed", seMsgs(&pgproto3.Describe{ObjectType: 'S'}, sync)},
		{0, "in a block", seMsgs(&pgproto3.Query{String: "BEGIN"}, seBind("a", 2), sync, seBind("c", 1), sync, &pgproto3.Query{String: "ROLLBACK"})},
		{0, "gone", seMsgs(&pgproto3.Query{String: "DEALLOCATE ALL"}, seBind("a", 2), sync)},
	}
	ctx := ctxT(t)
	run := func(dsn string) [][]string {
		var conns []*pgconn.PgConn
		for range 2 {
			pc, err := pgconn.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close(context.Background())
			conns = append(conns, pc)
		}
		return seAnswers(t, conns, steps)
	}
	want := run(pg.SuperDSN())
	got := run(f.dsn())
	for i, s := range steps {
		if g, w := strings.Join(got[i], "\n   "), strings.Join(want[i], "\n   "); g != w {
			t.Errorf("%d %s (client %d):\n pooled\n   %s\n direct\n   %s", i, s.what, s.client, g, w)
		}
	}
}
