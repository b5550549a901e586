package rewrite

import (
	"bytes"
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

	inline       bool // fence with the inline variants (inline.go) where a table has one
	inlined      bool // a write was fenced with one
	reservedName bool // the text defines a CTE named stmtTokenName
	paramZero    bool // the text has a parameter $0

	tokenSet     bool
	token        int64
	tokenDynamic bool
	// effects: what the text's statements may do to the session values of the token, the lock and application_name
	// (SessionEffects).
	effects SessionEffects
	tables  []string
	scope   tokenScope // scope.go

	checked   []checked      // statements sent as checking DO blocks (bycheck.go)
	bodies    []checkedBlock // their blocks as built, in order
	stmtCount int            // the top-level statements of the text they are in
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

		Tokens:          a.scope.tokens,
		TokenSession:    a.scope.session,
		TokenPersistent: a.scope.persistent,
		LockPersistent:  a.scope.persistentLock,
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
	a.checkDDL(stmt) // ddl.go
	if v := stmt.GetVariableSetStmt(); v != nil {
		a.setStatement(v, true)
		return
	}
	if runsNow(stmt) {
		walkStatement(stmt, a.visit)
		return
	}
	// What it holds may run after the statements that follow it (SessionEffects.Later).
	before := a.effects
	a.effects = SessionEffects{}
	walkStatement(stmt, a.visit)
	a.effects = before.Then(a.effects.Later())
}

// runsNow: a top-level statement whose expressions run while it does and never after it: a query, a write, a
// CALL's arguments, COPY, EXECUTE, DISCARD, a DO block (whose cursors doBlock reads), CREATE TABLE AS (not a
// materialized view, which runs its query again at each REFRESH), EXPLAIN of one of them. The others keep what
// they hold for later: a cursor's query runs at each FETCH, a view's when it is read, a column default or an
// index expression at each write, a prepared statement at each EXECUTE.
func runsNow(stmt *pg.Node) bool {
	switch x := stmt.GetNode().(type) {
	case *pg.Node_SelectStmt, *pg.Node_InsertStmt, *pg.Node_UpdateStmt, *pg.Node_DeleteStmt, *pg.Node_MergeStmt,
		*pg.Node_CallStmt, *pg.Node_CopyStmt, *pg.Node_ExecuteStmt, *pg.Node_DiscardStmt, *pg.Node_DoStmt:
		return true
	case *pg.Node_CreateTableAsStmt:
		return x.CreateTableAsStmt.Objtype == pg.ObjectType_OBJECT_TABLE && runsNow(x.CreateTableAsStmt.Query)
	case *pg.Node_ExplainStmt:
		return runsNow(x.ExplainStmt.Query)
	}
	return false
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
	case *pg.CommonTableExpr:
		if x.Ctename == stmtTokenName {
			a.reservedName = true
		}
	case *pg.ParamRef:
		if x.Number < 1 {
			a.paramZero = true // $0: PostgreSQL rejects it, and the deparser cannot print it
		}
	case *pg.VariableSetStmt:
		a.setStatement(x, false)
	case *pg.DiscardStmt:
		if x.Target == pg.DiscardMode_DISCARD_ALL {
			a.effects.note(allTargets, false, true, true)
		}
	case *pg.ExecuteStmt:
		a.effects.note(allTargets, true, true, false) // an SQL-level prepared statement may run set_config
	case *pg.FuncCall:
		a.setConfigCall(x)
	case *pg.AlterRoleSetStmt:
		a.persistentSet(x.Setstmt) // scope.go
	case *pg.AlterDatabaseSetStmt:
		a.persistentSet(x.Setstmt)
	case *pg.AlterSystemStmt:
		a.persistentSet(x.Setstmt)
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
	if top && !v.IsLocal {
		a.sessionSet(v)
	}
	if isSearchPath(v.Name) {
		a.checkSearchPathSet(v) // guardpath.go
	}
	if !strings.EqualFold(v.Name, a.r.setting) || v.Kind != pg.VariableSetKind_VAR_SET_VALUE {
		return // RESET, SET ... TO DEFAULT, FROM CURRENT, other settings
	}
	if top && !v.IsLocal {
		a.scope.session = true
	}
	value, ok := setValue(v.Args)
	if !ok {
		a.refuse(CodeInvalid, "", fmt.Sprintf("invalid fencing token: the value of %s must be a single integer constant", a.r.setting))
		return
	}
	a.tokenValue(value, top)
}

// sessionSet notes what a top-level SET or RESET that is not LOCAL does to the session values of
// SessionEffects' settings (effects).
func (a *analysis) sessionSet(v *pg.VariableSetStmt) {
	t := a.r.targets(v.Name)
	switch v.Kind {
	case pg.VariableSetKind_VAR_RESET_ALL:
		a.effects.note(allTargets, false, true, true)
	case pg.VariableSetKind_VAR_SET_VALUE, pg.VariableSetKind_VAR_SET_CURRENT:
		a.effects.note(t, true, false, true)
	case pg.VariableSetKind_VAR_SET_DEFAULT, pg.VariableSetKind_VAR_RESET:
		a.effects.note(t, false, true, true)
	}
}

// SessionEffects is what a text's statements may do to the session values of the settings whose reset value on
// a pooled server connection is not the client's: the token and lock (a startup option's value) and
// application_name (a startup parameter, not part of a pool's key). Each may be given a value (Effect.Set) or
// reset (Effect.Reset): SET and RESET that are not LOCAL, SET ... TO DEFAULT, RESET ALL, DISCARD ALL, set_config
// whose is_local is not the literal true (a literal NULL resets, a constant sets, anything else may do either; a
// computed name may be any of them), also in a DO block; an SQL EXECUTE may do anything. What functions do is
// not seen. The transaction pooler reads by them a value after a transaction that only a reset gives on its
// connections: there a reset, and a set to that value, both leave it (and a reset followed by a SET LOCAL leaves
// it at session level, as PostgreSQL restores a value SET LOCAL masked).
type SessionEffects struct {
	Token, Lock, App Effect
}

// Effect is what texts may do to one setting's session value: give it a value (Set) or reset it (Reset),
// anywhere in them; and what they may leave when every statement runs, in order, and nothing rolls back
// (NetSet, NetReset): a top-level SET, RESET, RESET ALL or DISCARD ALL then surely runs, so it replaces what
// came before it (Replaces: one did), where a set_config or a statement in a DO block may not run. What may
// run after the statements that follow its text (LaterSet, LaterReset: a cursor's query runs at each FETCH, a
// portal's at each Execute, a view's when it is read) is never replaced: it may come after the replacing
// statement.
type Effect struct {
	Set, Reset                 bool
	NetSet, NetReset, Replaces bool
	LaterSet, LaterReset       bool
}

// ResetOnly: the texts may reset the setting and cannot set it at session level, so a value after them that
// only a reset gives is a reset (a SET LOCAL after the reset is undone at the transaction's end).
func (e Effect) ResetOnly() bool { return e.Reset && !e.Set }

// SetOnly: the texts may set the setting at session level and cannot reset it.
func (e Effect) SetOnly() bool { return e.Set && !e.Reset }

// NetResetOnly is ResetOnly of what the texts leave when nothing rolls back: RESET ALL after a SET of the
// setting, with only SET LOCAL of it after, leaves it reset.
func (e Effect) NetResetOnly() bool { return e.NetReset && !e.NetSet }

// then is what e and then o may do: o's net replaces e's where o replaces what came before it.
func (e Effect) then(o Effect) Effect {
	r := Effect{Set: e.Set || o.Set, Reset: e.Reset || o.Reset, LaterSet: e.LaterSet || o.LaterSet, LaterReset: e.LaterReset || o.LaterReset}
	if o.Replaces {
		// Not what e may do later: that may run after o.
		r.NetSet, r.NetReset, r.Replaces = o.NetSet || e.LaterSet, o.NetReset || e.LaterReset, true
	} else {
		r.NetSet, r.NetReset, r.Replaces = e.NetSet || o.NetSet, e.NetReset || o.NetReset, e.Replaces
	}
	return r
}

// may is e as what a text may or may not do (a DO block's statements, whose control flow is not read): nothing
// of it replaces.
func (e Effect) may() Effect {
	return Effect{Set: e.Set, Reset: e.Reset, NetSet: e.Set, NetReset: e.Reset, LaterSet: e.LaterSet, LaterReset: e.LaterReset}
}

// later is e as what a text may do at any time after it, also after the statements that follow it: nothing
// replaces it.
func (e Effect) later() Effect {
	m := e.may()
	m.LaterSet, m.LaterReset = e.Set, e.Reset
	return m
}

// anyEffects is what a text the analysis cannot read may do: anything.
var anyEffects = SessionEffects{anyEffect, anyEffect, anyEffect}

var anyEffect = Effect{Set: true, Reset: true, NetSet: true, NetReset: true}

// Then is what e and then o may do (a transaction's texts, in the order they run).
func (e SessionEffects) Then(o SessionEffects) SessionEffects {
	return SessionEffects{e.Token.then(o.Token), e.Lock.then(o.Lock), e.App.then(o.App)}
}

// May is e as what a text may or may not do (a DO block's statements): nothing of it replaces.
func (e SessionEffects) May() SessionEffects {
	return SessionEffects{e.Token.may(), e.Lock.may(), e.App.may()}
}

// Later is e as what a text may do at any time after it, or not at all: nothing of it replaces, and nothing
// after it replaces it (a Parse's or Bind's text runs at each Execute of a portal of it, and one a row limit
// suspended runs again at the next Execute, after what the client sent between; a cursor's query, a view's).
func (e SessionEffects) Later() SessionEffects {
	return SessionEffects{e.Token.later(), e.Lock.later(), e.App.later()}
}

// AppSetting is the one PostgreSQL setting whose startup value a pooled client keeps as its own (SessionEffects.App).
const AppSetting = "application_name"

// effectTargets says which of SessionEffects' settings a statement names (all three: RESET ALL, DISCARD ALL, a
// computed name).
type effectTargets struct{ token, lock, app bool }

var allTargets = effectTargets{true, true, true}

// note adds a statement's effect on the settings it targets, after what came before it: sure, a statement
// that runs when its text does (top-level SET, RESET, RESET ALL, DISCARD ALL), which replaces it.
func (e *SessionEffects) note(t effectTargets, set, reset, sure bool) {
	o := Effect{Set: set, Reset: reset, NetSet: set, NetReset: reset, Replaces: sure}
	add := func(x *Effect, on bool) {
		if on {
			*x = x.then(o)
		}
	}
	add(&e.Token, t.token)
	add(&e.Lock, t.lock)
	add(&e.App, t.app)
}

// targets says which of SessionEffects' settings name is.
func (r *Rewriter) targets(name string) effectTargets {
	return effectTargets{
		token: strings.EqualFold(name, r.setting),
		lock:  r.lockSetting != "" && strings.EqualFold(name, r.lockSetting),
		app:   strings.EqualFold(name, AppSetting),
	}
}

// SessionEffects reads raw as the server would under s and reports what its statements may do to the session
// values of the token, the lock and application_name. Unlike Plan it reads every text (no prefilter); a text it
// cannot decode or parse may do anything.
func (r *Rewriter) SessionEffects(raw []byte, s Settings) SessionEffects {
	if !s.StandardConformingStrings && bytes.IndexByte(raw, '\\') >= 0 {
		// pg_query reads backslashes as standard_conforming_strings on does. Without one a text reads the same
		// under both (a RESET ALL after SET standard_conforming_strings = off is a reset, not "anything").
		return anyEffects
	}
	text, why := decode(raw, s)
	if why != "" {
		return anyEffects
	}
	tree, err := pg.Parse(string(text))
	if err != nil {
		return anyEffects
	}
	a := &analysis{r: r}
	for _, raw := range tree.Stmts {
		a.statement(raw.Stmt)
	}
	return a.effects
}

func (a *analysis) tokenValue(value string, effective bool) {
	tok, ok := ValidToken(value)
	if !ok {
		a.refuse(CodeInvalid, "", InvalidTokenMessage(value))
		return
	}
	a.scope.tokens = append(a.scope.tokens, tok)
	if effective {
		a.tokenSet, a.token = true, tok
	}
}

// InvalidTokenMessage is the message of a refusal of a token that is not an integer in 1..2^63-1.
func InvalidTokenMessage(value string) string {
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
	// A guard schema never enters the search_path through the proxy (guardpath.go).
	a.checkSearchPathConfig(f, name, ok)
	if !constTrue(f.Args[2]) { // is_local the literal true leaves the session value alone
		t := allTargets
		if ok {
			t = a.r.targets(name)
		}
		value := unwrapCast(f.Args[1]).GetAConst()
		// A literal NULL resets, a constant sets; anything else (a parameter bound to NULL, an expression) may
		// do either.
		reset, set := value != nil && value.Isnull, value != nil && !value.Isnull
		if value == nil {
			reset, set = true, true
		}
		a.effects.note(t, set, reset, false)
	}
	if !ok {
		a.tokenDynamic = true // may be the token setting
		a.scope.setConfig(f)
		return
	}
	if !strings.EqualFold(name, a.r.setting) {
		return
	}
	a.scope.setConfig(f)
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

// isFunc matches name, pg_catalog.name and db.pg_catalog.name: PostgreSQL takes a three-part function name
// whose first part is the current database (any other fails), so that form calls the same function. Missing it
// let db.pg_catalog.set_config set a token no check saw (a review's finding).
func isFunc(names []*pg.Node, name string) bool {
	switch len(names) {
	case 1:
		return strings.EqualFold(names[0].GetString_().GetSval(), name)
	case 2, 3:
		n := len(names)
		return names[n-2].GetString_().GetSval() == "pg_catalog" && strings.EqualFold(names[n-1].GetString_().GetSval(), name)
	}
	return false
}

// unwrapCast is n without the casts around it: for what no cast changes (a NULL stays NULL, a constant that is
// not NULL stays one). What a constant's value is after its casts: constArg.
func unwrapCast(n *pg.Node) *pg.Node {
	for n.GetTypeCast() != nil {
		n = n.GetTypeCast().Arg
	}
	return n
}

// constArg is the constant n is, read through the casts that keep a constant's value as PostgreSQL passes it to
// a text or boolean parameter (text, varchar without a length, bool; unqualified or in pg_catalog), or nil. Any
// other cast may change it: varchar(n) and char(n) cut, char drops trailing spaces, name cuts at 63 bytes, a
// domain or another schema's type may do anything, so set_config('fence.token.x'::varchar(11), ...) sets the
// token. Reading through them let such a call set the token where the analysis saw another setting (a review's
// finding): the pool then took the token cleared so for a reset and gave back the startup token.
func constArg(n *pg.Node) *pg.A_Const {
	for n.GetTypeCast() != nil {
		tc := n.GetTypeCast()
		if !valueCast(tc.TypeName) {
			return nil
		}
		n = tc.Arg
	}
	return n.GetAConst()
}

// valueCast: a cast to tn keeps a string's or a boolean's value (constArg).
func valueCast(tn *pg.TypeName) bool {
	if tn == nil || len(tn.Typmods) > 0 || len(tn.ArrayBounds) > 0 || tn.Setof || tn.PctType {
		return false
	}
	names := tn.Names
	if len(names) == 2 && names[0].GetString_().GetSval() == "pg_catalog" {
		names = names[1:]
	}
	if len(names) != 1 {
		return false
	}
	switch names[0].GetString_().GetSval() {
	case "text", "varchar", "bool":
		return true
	}
	return false
}

// constString returns the value of a string constant, possibly cast (constArg).
func constString(n *pg.Node) (string, bool) {
	c := constArg(n)
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
	if a.inline && e.inline != nil {
		e = e.inline
		a.inlined = true
	}
	switch s := w.stmt.(type) {
	case *pg.UpdateStmt:
		if s.WhereClause.GetCurrentOfExpr() != nil {
			a.unfenceable(e, "UPDATE of %s with WHERE CURRENT OF cannot be fenced; use a key in the WHERE clause", e.label)
			return
		}
		if e.RefuseTokenColumnWrites && assignsColumn(s.TargetList, e.TokenColumn) {
			a.unfenceable(e, "UPDATE of %s sets the token column %s, which only the proxy sets", e.label, e.TokenColumn)
			return
		}
		// The row check is the value written to C (tmplSetCheck): PostgreSQL
		// computes it only for the rows the WHERE lets through, so the
		// WHERE needs only the one-time filter, the statement's first read
		// of its token.
		check := e.setCheckFor(ref(s.Relation))
		if !a.overrideToken(e, s.TargetList, check, "UPDATE of") {
			return
		}
		if !assignsColumn(s.TargetList, e.TokenColumn) {
			s.TargetList = append(s.TargetList, pg.MakeResTargetNodeWithNameAndVal(e.TokenColumn, check, 0))
		}
		s.WhereClause = e.andOnce(s.WhereClause)
		s.WithClause = e.withStmtToken(s.WithClause)
	case *pg.DeleteStmt:
		if s.WhereClause.GetCurrentOfExpr() != nil {
			a.unfenceable(e, "DELETE from %s with WHERE CURRENT OF cannot be fenced; use a key in the WHERE clause", e.label)
			return
		}
		s.WhereClause = e.fencedWhere(ref(s.Relation), s.WhereClause)
		s.WithClause = e.withStmtToken(s.WithClause)
	case *pg.InsertStmt:
		a.fenceInsert(e, s)
	}
}

// withStmtToken puts the statement-token CTE first in a write's own WITH
// (created if absent), the innermost scope of every reference to it.
func (e *tableEntry) withStmtToken(w *pg.WithClause) *pg.WithClause {
	if e.cte == nil { // the inline variant: no CTE
		return w
	}
	if w == nil {
		w = &pg.WithClause{}
	}
	w.Ctes = append([]*pg.Node{e.cte}, w.Ctes...)
	return w
}

// overrideToken rewrites every assignment of the token column in a SET list
// (UPDATE, ON CONFLICT DO UPDATE) to write tok, keeping the client's value
// only for its parameter types (see tmplIgnored). It refuses assignments it
// cannot rewrite that way.
func (a *analysis) overrideToken(e *tableEntry, targets []*pg.Node, tok *pg.Node, what string) bool {
	for _, n := range targets {
		rt := n.GetResTarget()
		if rt == nil || rt.Name != e.TokenColumn {
			continue
		}
		switch {
		case len(rt.Indirection) != 0:
			a.unfenceable(e, "%s %s assigns part of the token column %s", what, e.label, e.TokenColumn)
			return false
		case rt.Val.GetMultiAssignRef() != nil:
			a.unfenceable(e, "%s %s assigns the token column %s in a multiple-column assignment; assign it alone (SET %s = ...)", what, e.label, e.TokenColumn, e.TokenColumn)
			return false
		}
		rt.Val = e.tokenFor(rt.Val, tok)
	}
	return true
}

// tokenFor is what replaces a client's value v for the token column.
func (e *tableEntry) tokenFor(v, tok *pg.Node) *pg.Node {
	if v.GetSetToDefault() != nil {
		return tok
	}
	return e.ignoring(v, tok)
}

// columnIndex is the position of col in an INSERT column list, or -1; more
// reports a second occurrence or one with indirection (C[1], C.f).
func columnIndex(cols []*pg.Node, col string) (pos int, bad bool) {
	pos = -1
	for i, n := range cols {
		rt := n.GetResTarget()
		if rt == nil || rt.Name != col {
			continue
		}
		if pos >= 0 || len(rt.Indirection) != 0 {
			return pos, true
		}
		pos = i
	}
	return pos, false
}

// inert reports whether evaluating a VALUES item runs no code that could
// change a setting: constants, parameters, DEFAULT, NULL, arrays of those and
// casts of those to types the grammar qualifies with pg_catalog (int,
// bigint, numeric, boolean, varchar, timestamp, ...). A cast to any other
// type name may reach a domain whose CHECK calls a function.
func inert(n *pg.Node) bool {
	switch {
	case n.GetAConst() != nil, n.GetParamRef() != nil, n.GetSetToDefault() != nil:
		return true
	case n.GetTypeCast() != nil:
		tc := n.GetTypeCast()
		names := tc.GetTypeName().GetNames()
		return len(names) == 2 && names[0].GetString_().GetSval() == "pg_catalog" && inert(tc.Arg)
	case n.GetAArrayExpr() != nil:
		for _, x := range n.GetAArrayExpr().Elements {
			if !inert(x) {
				return false
			}
		}
		return true
	}
	return false
}

func (a *analysis) fenceInsert(e *tableEntry, s *pg.InsertStmt) {
	oc := s.OnConflictClause
	upsert := oc != nil && oc.Action == pg.OnConflictAction_ONCONFLICT_UPDATE
	if e.RefuseTokenColumnWrites {
		if upsert && assignsColumn(oc.TargetList, e.TokenColumn) {
			a.unfenceable(e, "INSERT into %s ... ON CONFLICT DO UPDATE sets the token column %s, which only the proxy sets", e.label, e.TokenColumn)
			return
		}
		if assignsColumn(s.Cols, e.TokenColumn) {
			a.unfenceable(e, "INSERT into %s names the token column %s, which only the proxy sets", e.label, e.TokenColumn)
			return
		}
	}
	pos, bad := columnIndex(s.Cols, e.TokenColumn)
	prepend := false // C goes first (multi-row VALUES not naming it)
	if bad {
		a.unfenceable(e, "INSERT into %s names the token column %s more than once or in part", e.label, e.TokenColumn)
		return
	}
	switch {
	case s.SelectStmt == nil: // DEFAULT VALUES
		s.SelectStmt = &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: &pg.SelectStmt{
			ValuesLists: []*pg.Node{pg.MakeListNode([]*pg.Node{e.ref})},
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
			// The first row reads the statement's token. With several rows
			// C goes first: PostgreSQL builds them in the order written, so
			// the CTE's first read comes before anything the VALUES runs (a
			// single row is built in the table's column order). Later rows
			// read the setting directly when nothing in the VALUES can
			// change it, else the statement's token too (one InitPlan per
			// row).
			prepend = pos < 0 && len(sel.ValuesLists) > 1
			later := e.light
			for _, row := range sel.ValuesLists {
				for _, x := range row.GetList().GetItems() {
					if !inert(x) {
						later = e.ref
					}
				}
			}
			for i, row := range sel.ValuesLists {
				l := row.GetList()
				if l == nil {
					a.unfenceable(e, "INSERT into %s: cannot analyse its VALUES", e.label)
					return
				}
				if len(l.Items) != len(s.Cols) {
					// PostgreSQL rejects it too; C's value could not be placed.
					a.unfenceable(e, "INSERT into %s: a VALUES row has %d values for %d columns", e.label, len(l.Items), len(s.Cols))
					return
				}
				tok := later
				if i == 0 {
					tok = e.ref
				}
				if prepend {
					l.Items = append([]*pg.Node{tok}, l.Items...)
					continue
				}
				if pos < 0 {
					l.Items = append(l.Items, tok)
					continue
				}
				if pos >= len(l.Items) {
					a.unfenceable(e, "INSERT into %s: a VALUES row has no value for the token column %s", e.label, e.TokenColumn)
					return
				}
				l.Items[pos] = e.tokenFor(l.Items[pos], tok)
			}
		case sel.Op == pg.SetOperation_SETOP_NONE:
			if pos < 0 {
				sel.TargetList = append(sel.TargetList, pg.MakeResTargetNodeWithVal(e.ref, 0))
			} else {
				rt := outputAt(sel.TargetList, pos)
				if rt == nil || len(sel.TargetList) != len(s.Cols) || len(sel.DistinctClause) > 0 || hasOrdinal(sel.GroupClause) || hasOrdinal(sel.SortClause) {
					a.unfenceable(e, "INSERT into %s ... SELECT: cannot replace the output for the token column %s (a *, DISTINCT, or GROUP BY/ORDER BY by position); list the outputs or leave the column out", e.label, e.TokenColumn)
					return
				}
				rt.Val = e.ignoring(rt.Val, e.ref)
			}
			sel.WhereClause = e.andOnce(sel.WhereClause)
		default:
			if pos >= 0 {
				a.unfenceable(e, "INSERT into %s names the token column %s and takes its rows from a set operation; leave the column out", e.label, e.TokenColumn)
				return
			}
			// SELECT fenceproxy_src.*, t FROM (<set operation>) AS
			// fenceproxy_src WHERE t IS NOT NULL; its WITH moves up, where a
			// data-modifying CTE must stay.
			with := sel.WithClause
			sel.WithClause = nil
			s.SelectStmt = &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: &pg.SelectStmt{
				TargetList: []*pg.Node{
					pg.MakeResTargetNodeWithVal(pg.MakeColumnRefNode([]*pg.Node{pg.MakeStrNode(srcAlias), pg.MakeAStarNode()}, 0), 0),
					pg.MakeResTargetNodeWithVal(e.ref, 0),
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
	switch {
	case prepend:
		s.Cols = append([]*pg.Node{pg.MakeResTargetNodeWithName(e.TokenColumn, 0)}, s.Cols...)
	case pos < 0:
		s.Cols = append(s.Cols, pg.MakeResTargetNodeWithName(e.TokenColumn, 0))
	}
	if upsert {
		// The conflicting row is checked against, and gets, the token of the
		// row that was to be inserted (excluded.C, which is the statement's
		// token): what is checked is what is written.
		excl := columnRef([]string{"excluded"}, e.TokenColumn)
		if !a.overrideToken(e, oc.TargetList, excl, "INSERT ... ON CONFLICT DO UPDATE of") {
			return
		}
		if !assignsColumn(oc.TargetList, e.TokenColumn) {
			oc.TargetList = append(oc.TargetList, pg.MakeResTargetNodeWithNameAndVal(e.TokenColumn, excl, 0))
		}
		oc.WhereClause = e.guardFor(ref(s.Relation), oc.WhereClause, excl)
	}
	s.WithClause = e.withStmtToken(s.WithClause)
}

// hasOrdinal reports a GROUP BY or ORDER BY item that names an output by its
// position, which may be the one replaced by the token.
func hasOrdinal(items []*pg.Node) bool {
	for _, n := range items {
		if sb := n.GetSortBy(); sb != nil {
			n = sb.Node
		}
		if c := n.GetAConst(); c != nil && c.GetIval() != nil {
			return true
		}
	}
	return false
}

// outputAt is the pos-th output of a SELECT list, or nil when it cannot be
// told (a * before or at it, or too few outputs).
func outputAt(targets []*pg.Node, pos int) *pg.ResTarget {
	for i, n := range targets {
		rt := n.GetResTarget()
		if rt == nil {
			return nil
		}
		if cr := rt.Val.GetColumnRef(); cr != nil && len(cr.Fields) > 0 && cr.Fields[len(cr.Fields)-1].GetAStar() != nil {
			return nil
		}
		if i == pos {
			return rt
		}
	}
	return nil
}

// srcAlias names the wrapped source of INSERT ... SELECT with a set operation.
const srcAlias = "fenceproxy_src"
