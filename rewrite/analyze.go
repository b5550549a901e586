package rewrite

import (
	"fmt"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// walkStatement visits every message of one statement's tree, children before
// parents (so writes nested in a statement's WITH come before it), fields in
// declaration order. It does not enter the bodies of CREATE RULE and CREATE
// FUNCTION/PROCEDURE (BEGIN ATOMIC): they are stored, not run, and analysing
// them is a documented limit. DO blocks and other function bodies are strings.
func walkStatement(stmt *pg.Node, fn func(protoreflect.Message)) {
	if stmt != nil {
		walkMessage(stmt.ProtoReflect(), fn)
	}
}

func walkMessage(m protoreflect.Message, fn func(protoreflect.Message)) {
	switch x := m.Interface().(type) {
	case *pg.RuleStmt:
		fn(m)
		return
	case *pg.CreateFunctionStmt:
		// Its options may hold SET clauses, which are checked.
		for _, o := range x.Options {
			walkMessage(o.ProtoReflect(), fn)
		}
		fn(m)
		return
	}
	eachChild(m, func(c protoreflect.Message) { walkMessage(c, fn) })
	fn(m)
}

// analysis collects what one SQL text does.
type analysis struct {
	r       *Rewriter
	scsOff  bool // the server reads '...' with backslash escapes (standard_conforming_strings off)
	refusal *Plan
	writes  []write

	tokenSet     bool
	token        string
	tokenDynamic bool
	tables       []string
}

// write is a protected write to fence once the whole tree has been walked.
type write struct {
	table *tableEntry
	stmt  protoreflect.ProtoMessage // *pg.UpdateStmt, *pg.DeleteStmt or *pg.InsertStmt
}

func (a *analysis) refuse(code, table, msg string) {
	if a.refusal == nil {
		p := refusal(code, table, msg)
		a.refusal = &p
	}
}

func (a *analysis) unfenceable(e *tableEntry, format string, args ...any) {
	a.refuse(CodeUnfenceable, e.label, "unfenceable write: "+fmt.Sprintf(format, args...))
}

func (a *analysis) internal(err error) Plan {
	label := ""
	if len(a.tables) > 0 {
		label = a.tables[0]
	}
	return refusal(CodeUnfenceable, label,
		fmt.Sprintf("unfenceable write: internal error fencing %s: %v", strings.Join(a.tables, ", "), err))
}

func (a *analysis) result(action Action, sql string) Plan {
	return Plan{
		Action:       action,
		SQL:          sql,
		TokenSet:     a.tokenSet,
		Token:        a.token,
		TokenDynamic: a.tokenDynamic,
		Tables:       a.tables,
	}
}

func (a *analysis) noteTable(label string) {
	for _, t := range a.tables {
		if t == label {
			return
		}
	}
	a.tables = append(a.tables, label)
}

// lookup is Rewriter.lookup, recording an ambiguity as a refusal.
func (a *analysis) lookup(rv *pg.RangeVar) *tableEntry {
	e, p := a.r.lookup(rv)
	if p != nil && a.refusal == nil {
		a.refusal = p
	}
	return e
}

// statement analyses one top-level statement.
func (a *analysis) statement(stmt *pg.Node) {
	if v := stmt.GetVariableSetStmt(); v != nil {
		a.setStatement(v, true)
		return
	}
	walkStatement(stmt, a.visit)
}

func (a *analysis) visit(m protoreflect.Message) {
	switch x := m.Interface().(type) {
	case *pg.UpdateStmt:
		a.addWrite(x.Relation, x)
	case *pg.DeleteStmt:
		a.addWrite(x.Relation, x)
	case *pg.InsertStmt:
		a.addWrite(x.Relation, x)
	case *pg.MergeStmt:
		if e := a.lookup(x.Relation); e != nil {
			a.unfenceable(e, "MERGE into %s cannot be fenced; use INSERT ... ON CONFLICT, UPDATE or DELETE", e.label)
		}
	case *pg.TruncateStmt:
		for _, n := range x.Relations {
			if e := a.lookup(n.GetRangeVar()); e != nil {
				a.unfenceable(e, "TRUNCATE of %s cannot be fenced", e.label)
			}
		}
	case *pg.CopyStmt:
		if !x.IsFrom {
			break // COPY ... TO reads; COPY (query) TO is walked like any query
		}
		if e := a.lookup(x.Relation); e != nil {
			a.unfenceable(e, "COPY FROM into %s cannot be fenced; use INSERT", e.label)
		}
	case *pg.DoStmt:
		a.doBlock(x) // do.go
	case *pg.VariableSetStmt:
		a.setStatement(x, false)
	case *pg.FuncCall:
		a.setConfigCall(x)
	}
}

func (a *analysis) addWrite(rv *pg.RangeVar, stmt protoreflect.ProtoMessage) {
	if e := a.lookup(rv); e != nil {
		a.noteTable(e.label)
		a.writes = append(a.writes, write{table: e, stmt: stmt})
	}
}

// setStatement checks SET of the token setting. Only a top-level SET changes
// the session's token; the others (ALTER ROLE ... SET, a function's SET
// clause) are only validated.
func (a *analysis) setStatement(v *pg.VariableSetStmt, top bool) {
	if !strings.EqualFold(v.Name, a.r.setting) || v.Kind != pg.VariableSetKind_VAR_SET_VALUE {
		return // RESET, SET ... TO DEFAULT, FROM CURRENT, other settings
	}
	value, ok := setValue(v.Args)
	if !ok {
		a.refuse(CodeInvalid, "", fmt.Sprintf("invalid fencing token: the value of %s must be a single integer constant", a.r.setting))
		return
	}
	a.tokenValue(value, top)
}

func (a *analysis) tokenValue(value string, effective bool) {
	if _, ok := ValidToken(value); !ok {
		a.refuse(CodeInvalid, "", invalidTokenMessage(value))
		return
	}
	if effective {
		a.tokenSet, a.token = true, value
	}
}

func invalidTokenMessage(value string) string {
	return fmt.Sprintf("invalid fencing token: %q is not an integer in 1..9223372036854775807", value)
}

// setValue is the text PostgreSQL stores for SET name = args on a custom
// setting (flatten_set_variable_args): integers in decimal, other constants
// as written.
func setValue(args []*pg.Node) (string, bool) {
	if len(args) != 1 {
		return "", false
	}
	c := args[0].GetAConst()
	if c == nil || c.Isnull {
		return "", false
	}
	switch v := c.Val.(type) {
	case *pg.A_Const_Ival:
		return strconv.FormatInt(int64(v.Ival.GetIval()), 10), true
	case *pg.A_Const_Fval:
		return v.Fval.GetFval(), true
	case *pg.A_Const_Sval:
		return v.Sval.GetSval(), true
	case *pg.A_Const_Boolval:
		return strconv.FormatBool(v.Boolval.GetBoolval()), true
	}
	return "", false
}

// setConfigCall checks set_config(name, value, is_local) calls that may set
// the token setting.
func (a *analysis) setConfigCall(f *pg.FuncCall) {
	if !isFunc(f.Funcname, "set_config") || len(f.Args) != 3 {
		return
	}
	name, ok := constString(f.Args[0])
	if !ok {
		a.tokenDynamic = true // may be the token setting
		return
	}
	if !strings.EqualFold(name, a.r.setting) {
		return
	}
	if c := unwrapCast(f.Args[1]).GetAConst(); c != nil && c.Isnull {
		return // NULL resets the setting
	}
	value, ok := constString(f.Args[1])
	if !ok {
		a.tokenDynamic = true
		return
	}
	a.tokenValue(value, true)
}

// isFunc matches name and pg_catalog.name.
func isFunc(names []*pg.Node, name string) bool {
	switch len(names) {
	case 1:
		return strings.EqualFold(names[0].GetString_().GetSval(), name)
	case 2:
		return names[0].GetString_().GetSval() == "pg_catalog" && strings.EqualFold(names[1].GetString_().GetSval(), name)
	}
	return false
}

func unwrapCast(n *pg.Node) *pg.Node {
	for n.GetTypeCast() != nil {
		n = n.GetTypeCast().Arg
	}
	return n
}

// constString returns the value of a string constant, possibly cast.
func constString(n *pg.Node) (string, bool) {
	c := unwrapCast(n).GetAConst()
	if c == nil || c.Isnull {
		return "", false
	}
	if s, ok := c.Val.(*pg.A_Const_Sval); ok {
		return s.Sval.GetSval(), true
	}
	return "", false
}

// ref is how the statement's target table is referenced in column references:
// its alias, else its name as written (schema-qualified when it was).
func ref(rv *pg.RangeVar) []string {
	if rv.Alias != nil && rv.Alias.Aliasname != "" {
		return []string{rv.Alias.Aliasname}
	}
	var r []string
	if rv.Catalogname != "" {
		r = append(r, rv.Catalogname)
	}
	if rv.Schemaname != "" {
		r = append(r, rv.Schemaname)
	}
	return append(r, rv.Relname)
}

// assignsColumn reports whether a SET list or INSERT column list names col.
func assignsColumn(targets []*pg.Node, col string) bool {
	for _, n := range targets {
		if rt := n.GetResTarget(); rt != nil && rt.Name == col {
			return true
		}
	}
	return false
}

func (w write) fence(a *analysis) {
	e := w.table
	switch s := w.stmt.(type) {
	case *pg.UpdateStmt:
		if s.WhereClause.GetCurrentOfExpr() != nil {
			a.unfenceable(e, "UPDATE of %s with WHERE CURRENT OF cannot be fenced; use a key in the WHERE clause", e.label)
			return
		}
		if assignsColumn(s.TargetList, e.TokenColumn) {
			a.unfenceable(e, "UPDATE of %s sets the token column %s, which only the proxy sets", e.label, e.TokenColumn)
			return
		}
		s.TargetList = append(s.TargetList, pg.MakeResTargetNodeWithNameAndVal(e.TokenColumn, e.light, 0))
		s.WhereClause = e.fencedWhere(ref(s.Relation), s.WhereClause)
	case *pg.DeleteStmt:
		if s.WhereClause.GetCurrentOfExpr() != nil {
			a.unfenceable(e, "DELETE from %s with WHERE CURRENT OF cannot be fenced; use a key in the WHERE clause", e.label)
			return
		}
		s.WhereClause = e.fencedWhere(ref(s.Relation), s.WhereClause)
	case *pg.InsertStmt:
		a.fenceInsert(e, s)
	}
}

func (a *analysis) fenceInsert(e *tableEntry, s *pg.InsertStmt) {
	oc := s.OnConflictClause
	if oc != nil && oc.Action == pg.OnConflictAction_ONCONFLICT_UPDATE && assignsColumn(oc.TargetList, e.TokenColumn) {
		a.unfenceable(e, "INSERT into %s ... ON CONFLICT DO UPDATE sets the token column %s, which only the proxy sets", e.label, e.TokenColumn)
		return
	}
	if assignsColumn(s.Cols, e.TokenColumn) {
		a.unfenceable(e, "INSERT into %s names the token column %s, which only the proxy sets", e.label, e.TokenColumn)
		return
	}
	switch {
	case s.SelectStmt == nil: // DEFAULT VALUES
		s.SelectStmt = &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: &pg.SelectStmt{
			ValuesLists: []*pg.Node{pg.MakeListNode([]*pg.Node{e.token})},
			LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT,
			Op:          pg.SetOperation_SETOP_NONE,
		}}}
	case len(s.Cols) == 0:
		a.unfenceable(e, "INSERT into %s without a column list cannot be fenced; name the columns", e.label)
		return
	default:
		sel := s.SelectStmt.GetSelectStmt()
		if sel == nil {
			a.unfenceable(e, "INSERT into %s: cannot analyse its source", e.label)
			return
		}
		switch {
		case sel.Op == pg.SetOperation_SETOP_NONE && len(sel.ValuesLists) > 0:
			for i, row := range sel.ValuesLists {
				l := row.GetList()
				if l == nil {
					a.unfenceable(e, "INSERT into %s: cannot analyse its VALUES", e.label)
					return
				}
				if i == 0 {
					l.Items = append(l.Items, e.token)
				} else {
					l.Items = append(l.Items, e.light)
				}
			}
		case sel.Op == pg.SetOperation_SETOP_NONE:
			sel.TargetList = append(sel.TargetList, pg.MakeResTargetNodeWithVal(e.token, 0))
			sel.WhereClause = e.andOnce(sel.WhereClause)
		default:
			// SELECT fenceproxy_src.*, k FROM (<set operation>) AS
			// fenceproxy_src WHERE k IS NOT NULL; its WITH moves up, where a
			// data-modifying CTE must stay.
			with := sel.WithClause
			sel.WithClause = nil
			s.SelectStmt = &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: &pg.SelectStmt{
				TargetList: []*pg.Node{
					pg.MakeResTargetNodeWithVal(pg.MakeColumnRefNode([]*pg.Node{pg.MakeStrNode(srcAlias), pg.MakeAStarNode()}, 0), 0),
					pg.MakeResTargetNodeWithVal(e.token, 0),
				},
				FromClause: []*pg.Node{{Node: &pg.Node_RangeSubselect{RangeSubselect: &pg.RangeSubselect{
					Subquery: &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: sel}},
					Alias:    &pg.Alias{Aliasname: srcAlias},
				}}}},
				WhereClause: e.once,
				WithClause:  with,
				LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT,
				Op:          pg.SetOperation_SETOP_NONE,
			}}}
		}
	}
	s.Cols = append(s.Cols, pg.MakeResTargetNodeWithName(e.TokenColumn, 0))
	if oc != nil && oc.Action == pg.OnConflictAction_ONCONFLICT_UPDATE {
		oc.TargetList = append(oc.TargetList, pg.MakeResTargetNodeWithNameAndVal(e.TokenColumn, e.light, 0))
		oc.WhereClause = e.guardFor(ref(s.Relation), oc.WhereClause)
	}
}

// srcAlias names the wrapped source of INSERT ... SELECT with a set operation.
const srcAlias = "fenceproxy_src"
