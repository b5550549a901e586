package rewrite

import (
	"errors"
	"fmt"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// verifyFenced checks a parse tree (of SQL we are about to send) and returns
// an error unless every write to a protected table in it carries the fence:
//
//   - UPDATE: exactly one assignment C = k, and among the WHERE's conjuncts
//     the row check (alone or as CASE WHEN ... THEN check ELSE false END)
//     for the target as referenced, and the one-time filter k IS NOT NULL;
//   - DELETE: the same WHERE;
//   - INSERT: C is the last column and not named otherwise; the first VALUES
//     row ends with k and every other row with k or the light token, or the
//     (simple) SELECT's last output is k; ON CONFLICT DO UPDATE assigns C = k
//     exactly once and its WHERE is the row check, alone or guarded;
//   - no MERGE, TRUNCATE or COPY FROM on a protected table.
//
// Fragments are compared structurally (locations ignored) with the ones the
// Rewriter builds, so any change in what deparse emits is caught. It walks the
// tree exactly as the rewriter does (not entering rule and function bodies).
// It clears the locations in tree.
func verifyFenced(r *Rewriter, tree *pg.ParseResult) error {
	clearLocations(tree)
	var errs []error
	v := verifier{r: r}
	for i, raw := range tree.Stmts {
		walkStatement(raw.Stmt, func(m protoreflect.Message) {
			if err := v.check(m); err != nil {
				errs = append(errs, fmt.Errorf("statement %d: %w", i+1, err))
			}
		})
	}
	return errors.Join(errs...)
}

type verifier struct{ r *Rewriter }

func (v verifier) lookup(rv *pg.RangeVar) (*tableEntry, error) {
	e, p := v.r.lookup(rv)
	if p != nil {
		return nil, errors.New(p.Message)
	}
	return e, nil
}

func (v verifier) check(m protoreflect.Message) error {
	switch x := m.Interface().(type) {
	case *pg.UpdateStmt:
		e, err := v.lookup(x.Relation)
		if e == nil {
			return err
		}
		if err := assignsToken(e, x.TargetList); err != nil {
			return fmt.Errorf("UPDATE of %s: %w", e.label, err)
		}
		if err := fencedWhere(e, ref(x.Relation), x.WhereClause); err != nil {
			return fmt.Errorf("UPDATE of %s: %w", e.label, err)
		}
	case *pg.DeleteStmt:
		e, err := v.lookup(x.Relation)
		if e == nil {
			return err
		}
		if err := fencedWhere(e, ref(x.Relation), x.WhereClause); err != nil {
			return fmt.Errorf("DELETE from %s: %w", e.label, err)
		}
	case *pg.InsertStmt:
		e, err := v.lookup(x.Relation)
		if e == nil {
			return err
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

// assignsToken checks for exactly one SET C = <the setting's value> (validated by k before any row is
// written: the one-time filter of UPDATE, the inserted row of ON CONFLICT).
func assignsToken(e *tableEntry, targets []*pg.Node) error {
	n := 0
	for _, t := range targets {
		rt := t.GetResTarget()
		if rt == nil || rt.Name != e.TokenColumn {
			continue
		}
		n++
		if len(rt.Indirection) != 0 || !sameTree(rt.Val, e.light) {
			return fmt.Errorf("%s is assigned something other than the session token", e.TokenColumn)
		}
	}
	if n != 1 {
		return fmt.Errorf("%s is assigned %d times, want once", e.TokenColumn, n)
	}
	return nil
}

// fencedWhere checks a fenced UPDATE or DELETE WHERE clause.
func fencedWhere(e *tableEntry, ref []string, where *pg.Node) error {
	conj := conjuncts(where, nil)
	if !containsTree(conj, e.once) {
		return errors.New("WHERE lacks the one-time token check")
	}
	if !hasRowCheck(e, ref, conj) {
		return errors.New("WHERE lacks the row token check")
	}
	return nil
}

// hasRowCheck reports whether one of the expressions is the row check or
// CASE WHEN <anything> THEN check ELSE false END.
func hasRowCheck(e *tableEntry, ref []string, exprs []*pg.Node) bool {
	check := e.checkFor(ref)
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
	for i, c := range s.Cols {
		rt := c.GetResTarget()
		if rt == nil || rt.Name != e.TokenColumn {
			continue
		}
		if i != len(s.Cols)-1 || len(rt.Indirection) != 0 {
			return fmt.Errorf("%s must be the last column, once", e.TokenColumn)
		}
	}
	if len(s.Cols) == 0 || s.Cols[len(s.Cols)-1].GetResTarget().GetName() != e.TokenColumn {
		return fmt.Errorf("column list does not end with %s", e.TokenColumn)
	}
	sel := s.SelectStmt.GetSelectStmt()
	switch {
	case sel == nil:
		return errors.New("no VALUES or SELECT")
	case sel.Op == pg.SetOperation_SETOP_NONE && len(sel.ValuesLists) > 0:
		for i, row := range sel.ValuesLists {
			items := row.GetList().GetItems()
			if len(items) == 0 {
				return fmt.Errorf("VALUES row %d is empty", i+1)
			}
			last := items[len(items)-1]
			if !sameTree(last, e.token) && (i == 0 || !sameTree(last, e.light)) {
				return fmt.Errorf("VALUES row %d does not end with the session token", i+1)
			}
		}
	case sel.Op == pg.SetOperation_SETOP_NONE:
		if len(sel.TargetList) == 0 || !sameTree(sel.TargetList[len(sel.TargetList)-1].GetResTarget().GetVal(), e.token) {
			return errors.New("SELECT does not end with the session token")
		}
	default:
		return errors.New("source is a set operation")
	}
	if oc := s.OnConflictClause; oc != nil && oc.Action == pg.OnConflictAction_ONCONFLICT_UPDATE {
		if err := assignsToken(e, oc.TargetList); err != nil {
			return fmt.Errorf("ON CONFLICT DO UPDATE: %w", err)
		}
		if !hasRowCheck(e, ref(s.Relation), conjuncts(oc.WhereClause, nil)) {
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
