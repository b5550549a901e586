package rewrite

import (
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// TestDeparseNegativeIndirection: a negative number with a subscript or field selection keeps its meaning
// through the rewrite: the rewritten text parses, and each client expression in it is the client's (the
// deparser alone prints (-1)[1] as -1[1], a syntax error, and (-1.5).f as -1.5.f).
func TestDeparseNegativeIndirection(t *testing.T) {
	r := testRewriter(t)
	for _, expr := range []string{"(-1)[1]", "(-1.5).f", "(-2147483648)[1]", "(-9223372036854775808)[1:2]", "(-1)[1][2]", "((-1))[1]", "(-1e3).x"} {
		sql := "UPDATE accounts SET balance = " + expr + " WHERE id = 1"
		p := r.Plan(sql)
		if p.Action != Rewrite {
			t.Errorf("%s: %v %s", expr, p.Action, p.Message)
			continue
		}
		want := clientValue(t, sql)
		got := clientValue(t, p.SQL)
		if want == nil || got == nil || !proto.Equal(want, got) {
			t.Errorf("%s: rewritten as\n%s\nwhose SET value is %v, want %v", expr, p.SQL, got, want)
		}
	}
}

// clientValue is the value of the first SET item of the UPDATE in sql, locations cleared.
func clientValue(t *testing.T, sql string) *pg.Node {
	t.Helper()
	tree, err := pg.Parse(sql)
	if err != nil {
		t.Errorf("parse %q: %v", sql, err)
		return nil
	}
	clearLocations(tree)
	return tree.Stmts[0].Stmt.GetUpdateStmt().TargetList[0].GetResTarget().Val
}

// TestDeparseConstantIndirectionRefused: other constants with a subscript or field have no spelling the deparser
// prints as written; PostgreSQL rejects them anyway, so the rewrite refuses them (55F04), in full and through the
// shape cache alike.
func TestDeparseConstantIndirectionRefused(t *testing.T) {
	r := testRewriter(t)
	c := NewCache(r, 64)
	for _, expr := range []string{"(1)[1]", "(-0)[1]", "('{1}')[1]", "(NULL).f", "(true).x", "((2)).f", "(B'10')[1]"} {
		sql := "UPDATE accounts SET balance = " + expr + " WHERE id = 1"
		for _, p := range []Plan{r.Plan(sql), c.Plan([]byte(sql), DefaultSettings), c.Plan([]byte(sql), DefaultSettings), c.Plan([]byte(sql), DefaultSettings)} {
			if p.Action != Refuse || p.Code != CodeUnfenceable {
				t.Errorf("%s: %v %s %s", expr, p.Action, p.Code, p.SQL)
			}
		}
	}
}
