package proxy_test

import (
	"context"
	"strings"
	"testing"
)

// A client's named statement is prepared again from its text on a server connection another client used since
// (pooledstmts.go: serverStmt). The server lexes that text under the standard_conforming_strings in force then,
// which need not be the one the client's Parse was read under: PostgreSQL parses a statement once, at its Parse.
// The text below is, read with the setting off (as at the client's Parse), a SELECT of one string; read with it
// on, a CTE that updates the protected table. The client parses it with the setting off, turns the setting on,
// another client takes the connection, and the client binds its statement: directly that runs the SELECT (the
// statement was parsed with the setting off); until 2026-12-05 the proxy prepared the text again with the
// setting on and the UPDATE ran unfenced (no token: directly 55F02 for any write). The settings fuzzer's
// finding (TestPooledSettingsFuzz seed 13, where the same re-parse turned a SELECT into a syntax error). The
// same for the client's unnamed statement, which the proxy also sends again (placeUnnamed). Now the proxy
// refuses (55F04) to prepare a text whose reading depends on the settings under others than at its Parse.
func TestPooledNamedStatementNeverReparsedUnderOtherStrings(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token, balance) VALUES (1, 1, 0)")
	text := `WITH w AS (SELECT 'a\'), d AS (UPDATE ` + f.label + ` SET balance = balance + 1 WHERE id = 1 RETURNING 1) SELECT 1 /*') SELECT 2 --*/`
	for _, c := range []struct {
		name, stmt string // the client's statement: named, or the unnamed one
	}{{"named", "s1"}, {"unnamed", ""}} {
		t.Run(c.name, func(t *testing.T) {
			a, err := sfConnect(f.dsn())
			if err != nil {
				t.Fatal(err)
			}
			defer a.close()
			if got, st := a.send([]woMsg{woQ("SET standard_conforming_strings = off")}); st != 'I' {
				t.Fatalf("SET off: %v", got)
			}
			if got, st := a.send([]woMsg{woP(c.stmt, text), woS}); st != 'I' || strings.Contains(strings.Join(got, " "), "E:") {
				t.Fatalf("the Parse: %v", got)
			}
			// By a named statement: a Query, or a Parse of the unnamed one, would drop the unnamed statement.
			on := []woMsg{woP("on", "SET standard_conforming_strings = on"), woB("", "on"), woE("", 0), woS}
			if got, st := a.send(on); st != 'I' || strings.Contains(strings.Join(got, " "), "E:") {
				t.Fatalf("SET on: %v", got)
			}
			b, err := sfConnect(f.dsn())
			if err != nil {
				t.Fatal(err)
			}
			if got, st := b.send([]woMsg{woQ("SELECT 1")}); st != 'I' {
				t.Fatalf("the other client: %v", got)
			}
			b.close()
			got, _ := a.send([]woMsg{woB("", c.stmt), woE("", 0), woS})
			var balance int
			if err := f.d.QueryRow(context.Background(), "SELECT balance FROM "+f.label+" WHERE id = 1").Scan(&balance); err != nil {
				t.Fatal(err)
			}
			if balance != 0 {
				t.Fatalf("the statement parsed as a SELECT ran as an unfenced UPDATE: %v (balance %d)", got, balance)
			}
			f.wantToken(t, 1, 1)
			t.Logf("the Bind after another client: %v", got)
			// Directly it is the SELECT; the proxy may refuse it (55F04), never run anything else.
			if s := strings.Join(got, " "); !strings.Contains(s, "D[2]") && !strings.Contains(s, "E:55F04") {
				t.Errorf("the Bind: %v, want the SELECT's row or 55F04", got)
			}
			// Under the setting it was parsed under again, the statement is the client's, as directly.
			off := []woMsg{woP("off", "SET standard_conforming_strings = off"), woB("", "off"), woE("", 0), woS}
			if got, st := a.send(off); st != 'I' || strings.Contains(strings.Join(got, " "), "E:") {
				t.Fatalf("SET off again: %v", got)
			}
			if got, _ := a.send([]woMsg{woB("", c.stmt), woE("", 0), woS}); !strings.Contains(strings.Join(got, " "), "D[2]") {
				t.Errorf("the Bind under the setting of its Parse: %v, want the SELECT's row", got)
			}
		})
	}
}
