package rewrite

import (
	"errors"
	"fmt"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// verifyFenced checks a parse tree (of SQL we are about to send) and returns
// an error unless every write to a protected table in it carries the fence.
// With t the statement's token, (SELECT token FROM fenceproxy_stmt):
//
//   - every write's own WITH holds the statement-token CTE, and every CTE of
//     that name anywhere is a statement-token CTE (no client CTE shadows it);
//   - UPDATE: exactly one assignment of C, whose value is t, or the client's
//     value made inert: CASE WHEN false THEN (v)::int8 ELSE t END; among the
//     WHERE's conjuncts the row check against t (alone or as CASE WHEN ...
//     THEN check ELSE false END) for the target as referenced, and the
//     one-time filter t IS NOT NULL;
//   - DELETE: the same WHERE;
//   - INSERT: C named exactly once in the column list; in every VALUES row
//     its value is t (or the client's made inert), except that rows after
//     the first may read the setting directly when every item of the VALUES
//     is inert; or the (simple) SELECT's output for C is t and its WHERE
//     has the one-time filter; ON CONFLICT DO UPDATE assigns C exactly once,
//     as excluded.C, and its WHERE is the row check against excluded.C,
//     alone or guarded;
//   - no MERGE, TRUNCATE or COPY FROM on a protected table.
//
// Fragments are compared structurally (locations ignored) with the ones the
// Rewriter builds, so any change in what deparse emits is caught. It walks the
// tree exactly as the rewriter does (not entering rule and function bodies).
// It clears the locations in tree. With inline, a table's writes must carry
// its inline variant's fragments (inline.go) instead, with no CTE.
func verifyFenced(r *Rewriter, tree *pg.ParseResult, inline bool) error {
	clearLocations(tree)
	var errs []error
	v := verifier{r: r, inline: inline}
	for i, raw := range tree.Stmts {
		walkStatement(raw.Stmt, func(m protoreflect.Message) {
			if err := v.check(m); err != nil {
				errs = append(errs, fmt.Errorf("statement %d: %w", i+1, err))
			}
		})
	}
	return errors.Join(errs...)
}

type verifier struct {
	r      *Rewriter
	inline bool
}

func (v verifier) lookup(rv *pg.RangeVar) (*tableEntry, error) {
	e, p := v.r.lookup(rv)
	if p != nil {
		return nil, errors.New(p.Message)
	}
	if e != nil && v.inline && e.inline != nil {
		return e.inline, nil
	}
	return e, nil
}

func (v verifier) check(m protoreflect.Message) error {
	switch x := m.Interface().(type) {
	case *pg.CommonTableExpr:
		if x.Ctename != stmtTokenName {
			break
		}
		for _, e := range v.r.tables {
			if proto.Equal(x, e.cte.GetCommonTableExpr()) {
				return nil
			}
		}
		return fmt.Errorf("a WITH query named %s is not the statement's token", stmtTokenName)
	case *pg.UpdateStmt:
		e, err := v.lookup(x.Relation)
		if e == nil {
			return err
		}
		if err := hasStmtToken(e, x.WithClause); err != nil {
			return fmt.Errorf("UPDATE of %s: %w", e.label, err)
		}
		if err := assignsToken(e, x.TargetList, e.setCheckFor(ref(x.Relation))); err != nil {
			return fmt.Errorf("UPDATE of %s: %w", e.label, err)
		}
		if !containsTree(conjuncts(x.WhereClause, nil), e.once) {
			return fmt.Errorf("UPDATE of %s: WHERE lacks the one-time token check", e.label)
		}
	case *pg.DeleteStmt:
		e, err := v.lookup(x.Relation)
		if e == nil {
			return err
		}
		if err := hasStmtToken(e, x.WithClause); err != nil {
			return fmt.Errorf("DELETE from %s: %w", e.label, err)
		}
		if err := fencedWhere(e, ref(x.Relation), x.WhereClause); err != nil {
			return fmt.Errorf("DELETE from %s: %w", e.label, err)
		}
	case *pg.InsertStmt:
		e, err := v.lookup(x.Relation)
		if e == nil {
			return err
		}
		if err := hasStmtToken(e, x.WithClause); err != nil {
			return fmt.Errorf("INSERT into %s: %w", e.label, err)
		}
		if err := fencedInsert(e, x); err != nil {
			return fmt.Errorf("INSERT into %s: %w", e.label, err)
		}
	case *pg.MergeStmt:
		if e, err := v.lookup(x.Relation); e != nil || err != nil {
			return fmt.Errorf("MERGE into a protected table (%v)", err)
		}
	case *pg.TruncateStmt:
		for _, n := range x.Relations {
			if e, err := v.lookup(n.GetRangeVar()); e != nil || err != nil {
				return fmt.Errorf("TRUNCATE of a protected table (%v)", err)
			}
		}
	case *pg.CopyStmt:
		if !x.IsFrom {
			break
		}
		if e, err := v.lookup(x.Relation); e != nil || err != nil {
			return fmt.Errorf("COPY FROM into a protected table (%v)", err)
		}
	}
	return nil
}

// hasStmtToken checks that a write's own WITH defines the statement's token.
func hasStmtToken(e *tableEntry, w *pg.WithClause) error {
	if e.cte == nil {
		return nil // the inline variant: the token is checked in the one-time filter
	}
	if w == nil || !containsTree(w.Ctes, e.cte) {
		return fmt.Errorf("its WITH lacks the statement's token %s", stmtTokenName)
	}
	return nil
}

// isToken reports whether x writes tok: tok itself, or a client's value made
// inert, CASE WHEN false THEN (v)::int8 ELSE tok END.
func isToken(e *tableEntry, x, tok *pg.Node) bool {
	if sameTree(x, tok) {
		return true
	}
	c := x.GetCaseExpr()
	if c == nil || len(c.Args) != 1 {
		return false
	}
	w := c.Args[0].GetCaseWhen()
	if w == nil {
		return false
	}
	v := w.Result.GetTypeCast().GetArg()
	return v != nil && sameTree(x, e.ignoring(v, tok))
}

// assignsToken checks for exactly one SET C = tok (or the client's value made
// inert).
func assignsToken(e *tableEntry, targets []*pg.Node, tok *pg.Node) error {
	n := 0
	for _, t := range targets {
		rt := t.GetResTarget()
		if rt == nil || rt.Name != e.TokenColumn {
			continue
		}
		n++
		if len(rt.Indirection) != 0 || !isToken(e, rt.Val, tok) {
			return fmt.Errorf("%s is assigned something other than the statement's token", e.TokenColumn)
		}
	}
	if n != 1 {
		return fmt.Errorf("%s is assigned %d times, want once", e.TokenColumn, n)
	}
	return nil
}

// fencedWhere checks a fenced DELETE's WHERE clause.
func fencedWhere(e *tableEntry, ref []string, where *pg.Node) error {
	conj := conjuncts(where, nil)
	if !containsTree(conj, e.once) {
		return errors.New("WHERE lacks the one-time token check")
	}
	if !hasRowCheck(conj, e.deleteCheckFor(ref)) {
		return errors.New("WHERE lacks the row token check")
	}
	return nil
}

// hasRowCheck reports whether one of the expressions is the row check or
// CASE WHEN <anything> THEN check ELSE false END.
func hasRowCheck(exprs []*pg.Node, check *pg.Node) bool {
	for _, x := range exprs {
		if sameTree(x, check) {
			return true
		}
		c := x.GetCaseExpr()
		if c == nil || c.Arg != nil || len(c.Args) != 1 || !isFalse(c.Defresult) {
			continue
		}
		if w := c.Args[0].GetCaseWhen(); w != nil && sameTree(w.Result, check) {
			return true
		}
	}
	return false
}

func isFalse(n *pg.Node) bool {
	c := n.GetAConst()
	if c == nil || c.Isnull {
		return false
	}
	b, ok := c.Val.(*pg.A_Const_Boolval)
	return ok && !b.Boolval.GetBoolval()
}

// conjuncts flattens nested ANDs.
func conjuncts(n *pg.Node, out []*pg.Node) []*pg.Node {
	if n == nil {
		return out
	}
	if b := n.GetBoolExpr(); b != nil && b.Boolop == pg.BoolExprType_AND_EXPR {
		for _, a := range b.Args {
			out = conjuncts(a, out)
		}
		return out
	}
	return append(out, n)
}

func fencedInsert(e *tableEntry, s *pg.InsertStmt) error {
	pos, bad := columnIndex(s.Cols, e.TokenColumn)
	if bad || pos < 0 {
		return fmt.Errorf("the column list must name %s exactly once", e.TokenColumn)
	}
	sel := s.SelectStmt.GetSelectStmt()
	switch {
	case sel == nil:
		return errors.New("no VALUES or SELECT")
	case sel.Op == pg.SetOperation_SETOP_NONE && len(sel.ValuesLists) > 0:
		light := false
		allInert := true
		for i, row := range sel.ValuesLists {
			items := row.GetList().GetItems()
			if pos >= len(items) {
				return fmt.Errorf("VALUES row %d has no value for %s", i+1, e.TokenColumn)
			}
			for j, x := range items {
				if j != pos && !inert(x) {
					allInert = false
				}
			}
			tok := e.ref
			if i > 0 && (sameTree(items[pos], e.light) || isToken(e, items[pos], e.light)) {
				tok, light = e.light, true
			}
			if !isToken(e, items[pos], tok) {
				return fmt.Errorf("VALUES row %d does not write the statement's token", i+1)
			}
			// A client's value made inert (CASE WHEN false THEN (v)::int8 ...); not the token itself, which in the
			// inline form is a CASE too (inline.go).
			if ignored := items[pos].GetCaseExpr(); ignored != nil && !sameTree(items[pos], tok) && !inert(ignored.Args[0].GetCaseWhen().Result.GetTypeCast().GetArg()) {
				allInert = false
			}
		}
		if light && !allInert {
			return errors.New("VALUES rows read the setting directly although an item may run code")
		}
	case sel.Op == pg.SetOperation_SETOP_NONE:
		// The last output fills the last column whatever a * expands to;
		// another position only counts when no * precedes it.
		var out *pg.ResTarget
		if pos == len(s.Cols)-1 && len(sel.TargetList) > 0 {
			out = sel.TargetList[len(sel.TargetList)-1].GetResTarget()
		} else {
			out = outputAt(sel.TargetList, pos)
		}
		if out == nil || !isToken(e, out.GetVal(), e.ref) {
			return errors.New("SELECT does not output the statement's token for the token column")
		}
		if !containsTree(conjuncts(sel.WhereClause, nil), e.once) {
			return errors.New("SELECT lacks the one-time token check")
		}
	default:
		return errors.New("source is a set operation")
	}
	if oc := s.OnConflictClause; oc != nil && oc.Action == pg.OnConflictAction_ONCONFLICT_UPDATE {
		excl := columnRef([]string{"excluded"}, e.TokenColumn)
		if err := assignsToken(e, oc.TargetList, excl); err != nil {
			return fmt.Errorf("ON CONFLICT DO UPDATE: %w", err)
		}
		if !hasRowCheck(conjuncts(oc.WhereClause, nil), e.checkFor(ref(s.Relation), excl)) {
			return errors.New("ON CONFLICT DO UPDATE: WHERE lacks the row token check")
		}
	}
	return nil
}

// sameTree compares two expression trees, both without locations (the tree
// under verification has had them cleared, fragments never have them).
func sameTree(a, b *pg.Node) bool {
	if a == nil || b == nil {
		return a == b
	}
	return proto.Equal(a, b)
}

func containsTree(list []*pg.Node, n *pg.Node) bool {
	for _, x := range list {
		if sameTree(x, n) {
			return true
		}
	}
	return false
}
