package rewrite

import (
	"fmt"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The fixed SQL fragments grafted into statements. They are parsed once per
// table in New; @setting@ and @table@ inside string constants are replaced by
// the configured names (in the constant's value, so the deparser quotes them),
// and single-name column references fenceproxy_* are placeholders replaced by
// nodes. No SQL text is ever spliced.
//
// Every operator, function, type and collation in them is qualified with
// pg_catalog (OPERATOR(pg_catalog.<=), pg_catalog.int8, pg_catalog."C"), so
// no search_path, user operator, function, type or collation can change what
// the fence means; COALESCE, CASE, IS [NOT] NULL, AND and OR are syntax. The
// deparser prints pg_catalog.int8 as bigint, a type keyword that always means
// pg_catalog's.
//
// Marker strings, raised as 22P02 "invalid input syntax for type bigint" and
// translated by the proxy (see DecodeMarker):
//
//	fenceproxy|55F01|<row token>|<session token>|<table>|.
//	fenceproxy|55F03|<setting>|<hex of the setting's value>|<table>|.
//
// A 55F03 marker with an empty value is a missing token (55F02): one marker
// for both keeps the token check, which PostgreSQL sets up at every
// execution, small. Markers are built with pg_catalog.concat, which never
// yields NULL (a NULL part is empty), so a marker always raises.
//
// Each marker has a part that is not a constant (a column or the setting's
// value): PostgreSQL folds constant casts even in CASE arms that are never
// taken, so a constant marker would raise at plan time.
const (
	// k: the session token s (the setting's value, read in the CTE's FROM),
	// validated: s itself when it is a valid token (ValidToken), else the
	// 55F03 marker with s in hex (55F02 when s is unset or empty: concat
	// makes a NULL part empty). Validity is one regular expression match,
	// tokenPattern (@pattern@): the server parses, analyses and plans it in
	// every statement, and one operator on one constant costs it far less
	// than a check built of string functions, each a function lookup
	// (measured: bench/fence-sql-phases, docs/fence-sql.md). The match cannot
	// fail, and CASE runs s::int8 only when it holds.
	tmplToken = `SELECT CASE WHEN s COLLATE pg_catalog."C" OPERATOR(pg_catalog.~) '@pattern@' THEN s::pg_catalog.int8
		ELSE pg_catalog.concat('fenceproxy|55F03|@setting@|', pg_catalog.encode(pg_catalog.convert_to(s, 'UTF8'), 'hex'), '|@table@|.')::pg_catalog.int8 END`

	// The statement's token: one MATERIALIZED CTE holding k, attached to the
	// fenced write's own WITH. A CTE is evaluated once, at its first read,
	// and every later read sees the stored row, so every reference below
	// (the one-time filter, SET C, the row check, the marker) sees one value,
	// whatever the statement runs after the first read (a set_config in a
	// SET list, in the WHERE, in a function). Its name is reserved: a
	// statement that defines a CTE of that name is refused. The setting is
	// read once, by the function in its FROM (one row, NULL when unset).
	tmplStmtToken = `WITH fenceproxy_stmt AS MATERIALIZED (SELECT fenceproxy_k AS token
		FROM pg_catalog.current_setting('@setting@', true) AS fenceproxy_token(s)) SELECT 1`

	// A reference to the statement's token: an uncorrelated scalar subquery
	// over the CTE (an InitPlan: evaluated once per execution, cheap).
	tmplRef = `SELECT (SELECT fenceproxy_stmt.token FROM fenceproxy_stmt)`

	// The setting's value read directly, for the rows after the first of a
	// multi-row VALUES whose items run no code (constants, parameters,
	// DEFAULT, casts to built-in types): nothing can change the setting
	// between rows there, and a reference per row would be one InitPlan per
	// row, whose planning time grows quadratically with the number of rows.
	tmplLight = `SELECT pg_catalog.current_setting('@setting@')::pg_catalog.int8`

	// The row check: true when the row's token is not newer than the
	// statement's token fenceproxy_t, else the 55F01 marker (which raises).
	// fenceproxy_c is the row's token column.
	tmplCheck = `SELECT CASE WHEN COALESCE(fenceproxy_c, 0) OPERATOR(pg_catalog.<=) fenceproxy_t THEN true
		ELSE pg_catalog.concat('fenceproxy|55F01|', fenceproxy_c, '|', fenceproxy_t, '|@table@|.')::pg_catalog.int8 IS NULL END`

	// An UPDATE's value for the token column: the statement's token when the
	// row's token is not newer, else the 55F01 marker (which raises).
	// PostgreSQL computes an UPDATE's SET list only for the rows it writes,
	// after every condition of the WHERE has held (and again, on the newest
	// row version, when it re-checks a row it waited for), so no row the
	// statement does not write reaches the check, whatever order the
	// planner gives the WHERE's conditions; and the check is one subquery
	// (a SubPlan reading the CTE's stored row) that also supplies the value
	// written. fenceproxy_c is the row's token column.
	tmplSetCheck = `SELECT (SELECT CASE WHEN COALESCE(fenceproxy_c, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token
		ELSE pg_catalog.concat('fenceproxy|55F01|', fenceproxy_c, '|', fenceproxy_stmt.token, '|@table@|.')::pg_catalog.int8 END
		FROM fenceproxy_stmt)`

	// The check only for rows matching the statement's own condition, so a
	// row the statement does not write never raises, whatever order the
	// planner evaluates the quals in.
	tmplGuard = `SELECT CASE WHEN fenceproxy_cond THEN fenceproxy_check ELSE false END`

	// No column references: planned as a one-time filter, evaluated before
	// any row is read, so a missing or invalid token raises even when no row
	// matches, and the statement's token is read before anything else the
	// write evaluates.
	tmplOnce = `SELECT fenceproxy_t IS NOT NULL`

	// What a value the client supplies for the token column becomes: never
	// evaluated (WHEN false is folded away at plan time), but still there,
	// so PostgreSQL infers the same parameter types as for the client's
	// statement (the cast to int8 is the assignment to a bigint column); the
	// token is what is written.
	tmplIgnored = `SELECT CASE WHEN false THEN (fenceproxy_v)::pg_catalog.int8 ELSE fenceproxy_t END`
)

// stmtTokenName is the reserved name of the statement-token CTE.
const stmtTokenName = "fenceproxy_stmt"

// Placeholder names in the templates.
const (
	phToken = "fenceproxy_k"
	phTok   = "fenceproxy_t"
	phCol   = "fenceproxy_c"
	phCond  = "fenceproxy_cond"
	phCheck = "fenceproxy_check"
	phValue = "fenceproxy_v"
)

func newTableEntry(t Table, setting string) (*tableEntry, error) {
	e := &tableEntry{Table: t, label: t.Label()}
	fs := &fragmentSet{consts: strings.NewReplacer("@setting@", setting, "@table@", e.label, "@pattern@", tokenPattern())}
	parse := fs.parse
	e.token = parse(tmplToken)
	e.ref = parse(tmplRef)
	e.light = parse(tmplLight)
	e.check = parse(tmplCheck)
	e.setCheck = parse(tmplSetCheck)
	e.guard = parse(tmplGuard)
	e.ignored = parse(tmplIgnored)
	once := parse(tmplOnce)
	if fs.err != nil {
		return nil, fs.err
	}
	e.notNull = once
	e.once = substitute(once, map[string]*pg.Node{phTok: e.ref})
	tree, err := pg.Parse(tmplStmtToken)
	if err != nil {
		return nil, fmt.Errorf("fragment %q: %w", tmplStmtToken, err)
	}
	cte := tree.Stmts[0].Stmt.GetSelectStmt().GetWithClause().GetCtes()[0]
	replaceConsts(cte, fs.consts)
	clearLocations(cte)
	e.cte = substitute(cte, map[string]*pg.Node{phToken: e.token})
	return e, nil
}

// fragmentSet parses fragments with one set of constants, keeping the first error (err) and giving nil after it.
type fragmentSet struct {
	consts *strings.Replacer
	err    error
}

func (fs *fragmentSet) parse(sql string) *pg.Node {
	if fs.err != nil {
		return nil
	}
	var n *pg.Node
	n, fs.err = parseFragment(sql, fs.consts)
	return n
}

// parseFragment parses "SELECT <expr>" and returns expr with constants
// substituted and locations cleared.
func parseFragment(sql string, consts *strings.Replacer) (*pg.Node, error) {
	tree, err := pg.Parse(sql)
	if err != nil {
		return nil, fmt.Errorf("fragment %q: %w", sql, err)
	}
	sel := tree.Stmts[0].Stmt.GetSelectStmt()
	if len(tree.Stmts) != 1 || sel == nil || len(sel.TargetList) != 1 {
		return nil, fmt.Errorf("fragment %q: not a single-expression SELECT", sql)
	}
	expr := sel.TargetList[0].GetResTarget().Val
	replaceConsts(expr, consts)
	clearLocations(expr)
	return expr, nil
}

// replaceConsts applies consts to the value of every string constant under m.
func replaceConsts(m proto.Message, consts *strings.Replacer) {
	eachNode(m, func(n *pg.Node) {
		if c := n.GetAConst(); c != nil {
			if s := c.GetSval(); s != nil {
				s.Sval = consts.Replace(s.Sval)
			}
		}
	})
}

// substitute returns a copy of the template tmpl with each placeholder column
// reference replaced by its node. Replacement nodes are shared, not copied,
// and never searched for placeholders (they may hold the client's SQL).
func substitute(tmpl *pg.Node, repl map[string]*pg.Node) *pg.Node {
	n := proto.Clone(tmpl).(*pg.Node)
	var holes []*pg.Node
	eachNode(n, func(x *pg.Node) {
		if placeholder(x) != "" {
			holes = append(holes, x)
		}
	})
	for _, x := range holes {
		if r, ok := repl[placeholder(x)]; ok {
			x.Node = r.Node
		}
	}
	return n
}

// placeholder returns the name of a single-name column reference fenceproxy_*.
func placeholder(n *pg.Node) string {
	cr := n.GetColumnRef()
	if cr == nil || len(cr.Fields) != 1 {
		return ""
	}
	s := cr.Fields[0].GetString_()
	if s == nil || !strings.HasPrefix(s.Sval, "fenceproxy_") {
		return ""
	}
	return s.Sval
}

// columnRef builds ref...col.
func columnRef(ref []string, col string) *pg.Node {
	fields := make([]*pg.Node, 0, len(ref)+1)
	for _, f := range ref {
		fields = append(fields, pg.MakeStrNode(f))
	}
	fields = append(fields, pg.MakeStrNode(col))
	return pg.MakeColumnRefNode(fields, 0)
}

// checkFor is the row check for the table referenced as ref, against the
// token expression tok (the statement's token, or excluded.C in ON CONFLICT).
func (e *tableEntry) checkFor(ref []string, tok *pg.Node) *pg.Node {
	return substitute(e.check, map[string]*pg.Node{phCol: columnRef(ref, e.TokenColumn), phTok: tok})
}

// setCheckFor is the value an UPDATE of the table referenced as ref writes
// to the token column: the statement's token, checked against the row's.
func (e *tableEntry) setCheckFor(ref []string) *pg.Node {
	return substitute(e.setCheck, map[string]*pg.Node{phCol: columnRef(ref, e.TokenColumn)})
}

// ignoring is the value written for a token column the client names: the
// client's expression v kept for its parameter types, never evaluated, and
// tok written.
func (e *tableEntry) ignoring(v, tok *pg.Node) *pg.Node {
	return substitute(e.ignored, map[string]*pg.Node{phValue: v, phTok: tok})
}

// guardFor is the row check against tok (ON CONFLICT DO UPDATE's, against
// excluded.C), guarded by cond.
func (e *tableEntry) guardFor(ref []string, cond, tok *pg.Node) *pg.Node {
	return e.guarded(cond, e.checkFor(ref, tok))
}

// guarded is CASE WHEN cond THEN check ELSE false END, or the check alone
// when there is no condition.
func (e *tableEntry) guarded(cond, check *pg.Node) *pg.Node {
	if cond == nil {
		return check
	}
	return substitute(e.guard, map[string]*pg.Node{phCond: cond, phCheck: check})
}

// deleteCheckFor is a DELETE's row check for the table referenced as ref:
// the UPDATE's checked token (setCheckFor), which is the statement's token
// or raises 55F01, IS NOT NULL (the token never is). One subquery over the
// statement-token CTE, where a check comparing with t and naming t in its
// marker would be two, each planned in every statement.
func (e *tableEntry) deleteCheckFor(ref []string) *pg.Node {
	return substitute(e.notNull, map[string]*pg.Node{phTok: e.setCheckFor(ref)})
}

// fencedWhere is the WHERE of a fenced DELETE:
// (cond) AND CASE WHEN (cond) THEN check ELSE false END AND t IS NOT NULL.
//
// The leading copy of cond is there for the planner (index scans); the CASE
// makes rows that do not match cond never reach the check. A conjunct of cond
// that calls a function not known to be free of side effects (nextval(),
// random(), a user function) is left out of the leading copy, so that it is
// evaluated once per row, as in the client's statement. (An UPDATE needs
// none of this: its check is the value it writes, see tmplSetCheck.)
func (e *tableEntry) fencedWhere(ref []string, cond *pg.Node) *pg.Node {
	args := make([]*pg.Node, 0, 3)
	if cond != nil {
		for _, c := range conjuncts(cond, nil) {
			if repeatable(c) {
				args = append(args, c)
			}
		}
	}
	args = append(args, e.guarded(cond, e.deleteCheckFor(ref)), e.once)
	return pg.MakeBoolExprNode(pg.BoolExprType_AND_EXPR, args, 0)
}

// repeatableFuncs are functions that give the same result when evaluated
// twice in one statement and have no side effects (immutable or stable).
var repeatableFuncs = map[string]bool{
	"lower": true, "upper": true, "length": true, "char_length": true, "abs": true, "btrim": true,
	"ltrim": true, "rtrim": true, "trim": true, "substring": true, "substr": true, "concat": true,
	"now": true, "current_setting": true, "date_trunc": true, "date_part": true, "extract": true,
	"to_char": true, "to_date": true, "to_timestamp": true, "age": true, "round": true, "floor": true,
	"ceil": true, "mod": true, "md5": true, "left": true, "right": true, "replace": true, "position": true,
	"array_length": true, "cardinality": true, "jsonb_extract_path_text": true, "json_extract_path_text": true,
	"transaction_timestamp": true, "statement_timestamp": true, "starts_with": true, "coalesce": true,
	"nullif": true, "greatest": true, "least": true, "int4": true, "int8": true, "text": true, "numeric": true,
}

// repeatable reports whether n can be evaluated twice without changing the
// statement's meaning: it calls no function outside repeatableFuncs.
func repeatable(n *pg.Node) bool {
	ok := true
	eachNode(n, func(x *pg.Node) {
		f := x.GetFuncCall()
		if f == nil || !ok {
			return
		}
		name := f.Funcname[len(f.Funcname)-1].GetString_().GetSval()
		if len(f.Funcname) > 2 || len(f.Funcname) == 2 && f.Funcname[0].GetString_().GetSval() != "pg_catalog" || !repeatableFuncs[name] {
			ok = false
		}
	})
	return ok
}

// andOnce adds the one-time filter to a SELECT's WHERE.
func (e *tableEntry) andOnce(where *pg.Node) *pg.Node {
	if where == nil {
		return e.once
	}
	return pg.MakeBoolExprNode(pg.BoolExprType_AND_EXPR, []*pg.Node{where, e.once}, 0)
}

// eachNode calls fn for every *pg.Node in the tree under m (m included when it
// is a Node), parents before children.
func eachNode(m proto.Message, fn func(*pg.Node)) {
	eachMessage(m.ProtoReflect(), func(x protoreflect.Message) {
		if n, ok := x.Interface().(*pg.Node); ok {
			fn(n)
		}
	})
}

// eachMessage visits every message under m, parents first.
func eachMessage(m protoreflect.Message, fn func(protoreflect.Message)) {
	fn(m)
	eachChild(m, func(c protoreflect.Message) { eachMessage(c, fn) })
}

// nodeOneof is the oneof of pg.Node holding the actual node.
var nodeOneof = (&pg.Node{}).ProtoReflect().Descriptor().Oneofs().ByName("node")

// eachChild calls fn for each message directly under m, in field declaration
// order. A pg.Node (a oneof of some 270 fields) is handled directly: testing
// every field for presence would dominate the cost of walking a tree.
func eachChild(m protoreflect.Message, fn func(protoreflect.Message)) {
	if _, ok := m.Interface().(*pg.Node); ok {
		if fd := m.WhichOneof(nodeOneof); fd != nil {
			fn(m.Get(fd).Message())
		}
		return
	}
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() || !m.Has(fd) {
			continue
		}
		if fd.IsList() {
			l := m.Get(fd).List()
			for j := 0; j < l.Len(); j++ {
				fn(l.Get(j).Message())
			}
			continue
		}
		fn(m.Get(fd).Message())
	}
}

// clearLocations zeroes every location field under m, so that trees can be
// compared with proto.Equal.
func clearLocations(m proto.Message) {
	eachMessage(m.ProtoReflect(), func(x protoreflect.Message) {
		if fd := x.Descriptor().Fields().ByName("location"); fd != nil && x.Has(fd) {
			x.Clear(fd)
		}
	})
}
