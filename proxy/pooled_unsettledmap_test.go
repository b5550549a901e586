package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// unsettledAttack is a text that, read with standard_conforming_strings on, is a SELECT of two strings, and,
// read with it off (the backslash escapes the quote), a SELECT of one string, then EXECUTE of the proxy's
// settings statement (fenceproxy_c, set_config at session level) with a token of the client's choosing, then a
// comment. Nothing in it names the setting or holds a single quote where the server reads code.
const unsettledAttack = `SELECT 'a\', '; EXECUTE fenceproxy_c(ARRAY[concat($$ap$$, $$p.token$$)], ARRAY[$$98$$]); --'`

// sendAll sends msgs on pc and reads the answers up to the rfq-th ReadyForQuery, returning every CommandComplete
// tag, DataRow's first column and error SQLSTATE in order.
func sendAll(t *testing.T, pc *pgconn.PgConn, rfq int, msgs ...pgproto3.FrontendMessage) []string {
	t.Helper()
	pc.Conn().SetDeadline(time.Now().Add(30 * time.Second))
	var got []string
	err := exchange(pc.Frontend(), msgs, func(m pgproto3.BackendMessage) bool {
		switch m := m.(type) {
		case *pgproto3.CommandComplete:
			got = append(got, string(m.CommandTag))
		case *pgproto3.DataRow:
			got = append(got, "row "+string(m.Values[0]))
		case *pgproto3.ErrorResponse:
			got = append(got, "ERROR "+m.Code)
		case *pgproto3.ReadyForQuery:
			rfq--
			return rfq == 0
		}
		return false
	})
	if err != nil {
		t.Fatalf("%v (so far %q)", err, got)
	}
	return got
}

// A text sent while an earlier one that turns standard_conforming_strings off is still unanswered is read by the
// server with it off, and the mapping of SQL-level statement names reads it under the settings last reported
// (sqlRefs, which sets Unsettled aside). That holds only because the pool takes the client's next Query, or
// next batch, once what was sent before is answered (forwardPooled waits at each unit's start): read with the
// setting on, the attack text uses no names and would go as it is, and the server would run EXECUTE
// fenceproxy_c, the settings statement, with a token of the client's choosing (SHOW then gives 98, and a write
// is stamped with it). Pipelined Queries, the same inside a block, and a Query pipelined behind an
// extended-protocol batch. The token setting here is app.token: with the default name the proxy's statement
// names (fenceproxy_) hold its first part, and the core refuses the text as one that may touch a protected
// table before the mapping reads it.
func TestPooledUnsettledSettingsDoNotHideNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		rfq  int
		msgs []pgproto3.FrontendMessage
	}{
		{"pipelined Queries", 2, []pgproto3.FrontendMessage{
			&pgproto3.Query{String: "SET standard_conforming_strings = off"},
			&pgproto3.Query{String: unsettledAttack},
		}},
		{"pipelined Queries in a block", 2, []pgproto3.FrontendMessage{
			&pgproto3.Query{String: "BEGIN; SET standard_conforming_strings = off"},
			&pgproto3.Query{String: unsettledAttack},
		}},
		{"a batch, then a Query", 2, []pgproto3.FrontendMessage{
			&pgproto3.Parse{Query: "SET standard_conforming_strings = off"},
			&pgproto3.Bind{},
			&pgproto3.Execute{},
			&pgproto3.Sync{},
			&pgproto3.Query{String: unsettledAttack},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newPooledFenced(t, 1, "token:\n  setting: app.token\n")
			ctx := ctxT(t)
			fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
			upd := "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1 RETURNING fence_token"
			other := pooledPgConn(t, f, "")
			hostile := pooledPgConn(t, f, "")
			step := func(c *pgconn.PgConn, sql, want string) {
				t.Helper()
				if got := simpleOutcome(ctx, c, sql); got != want {
					t.Fatalf("%s\n got  %s\n want %s", sql, got, want)
				}
			}
			// Another client's settings on the one server connection: the hostile client's transaction puts its
			// own there first by the settings statement, which is then there.
			step(other, "SET work_mem = '5MB'", "SET; ")
			step(other, "SELECT 1", `SELECT 1 "1"; `)
			got := sendAll(t, hostile, tc.rfq, tc.msgs...)
			if strings.Contains(strings.Join(got, ","), "row 98") {
				t.Errorf("the settings statement ran: %q", got)
			}
			step(hostile, "ROLLBACK", "ROLLBACK; ")
			step(hostile, "SHOW app.token", `SHOW ""; `)
			step(hostile, upd, "ERROR 55F02")
			f.wantToken(t, 1, 1)
		})
	}
}
