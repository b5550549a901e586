package rewrite

import (
	"fmt"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// Inline tokens: the fence with the token the proxy knows, for a transaction pool (Settings.InlineToken).
//
// A transaction pool gives every transaction its client's token itself (SET LOCAL, proxy/pooled.go), so at the
// start of a transaction, and until the client sends something that may change the token, the proxy knows the
// token in force: the text T it just set. A simple-query text planned then can carry T as a constant, where the
// statement-token CTE reads and validates the setting. Measured on PostgreSQL 15 (bench/fence-sql-phases,
// docs/fence-sql.md), the server's CPU for a primary-key UPDATE sent as a simple Query is about half: no CTE, no
// InitPlans, no regular expression to parse, plan and run.
//
// The form is exact, not trusting: the token is checked against the setting's value where the CTE form reads it
// first, before any row (and again in every row whose building may run code, as the CTE form reads it there).
// With checked(T) =
//
//	CASE WHEN pg_catalog.current_setting(setting, true) COLLATE pg_catalog."C" OPERATOR(pg_catalog.=) 'T'
//	     THEN 'T'::bigint ELSE <55F03 marker with the setting's value>::bigint END
//
// the statement's token t is checked(T) where the CTE form reads the CTE (the one-time filter, checked(T) IS
// NOT NULL; the first VALUES row and every row of a VALUES that may run code; an INSERT ... SELECT's output) and
// the constant 'T'::bigint everywhere else (the row check, the value written, the later rows of an inert VALUES).
// With fence.synchronous_commit the check holds set_config, which is volatile, so the one-time filter is a
// scalar subquery of it (synccommit.go): PostgreSQL makes only a condition without volatile functions one.
//
// So a statement runs with T only when the setting is exactly T as it starts, which is when the CTE form would
// have read T: the two forms accept the same writes and write the same tokens. When the setting is anything else
// (a function changed it behind the proxy, a COMMIT inside the text ended the transaction that had T) the
// statement fails with 55F03 before it touches a row: a change the proxy cannot follow is refused, as the
// contract says for transaction mode, and nothing is ever written with a token the setting does not hold. Lock
// and synchronous_commit checks go into checked(T)'s valid arm, as they go into the CTE's.
//
// T is a constant of the rewritten text, not of the plan: a plan is cached for every token. The rewrite puts
// the parameter $inlineSlot where T goes (a text with a parameter of that number or above is not inlined, so
// every one in the rewrite is the proxy's own), and the plan keeps the text cut there (Plan.TokenSegs);
// Plan.WithToken puts 'T' into the cuts. A text with a PREPARE is not inlined either: its body runs later,
// under whatever token is then in force.
const (
	// The token checked against the setting: T when the setting is exactly T, else the 55F03 marker (55F02 when
	// the setting is unset or empty), with the setting's value in hex as the CTE form's marker has it.
	tmplInlineChecked = `SELECT CASE WHEN pg_catalog.current_setting('@setting@', true) COLLATE pg_catalog."C" OPERATOR(pg_catalog.=) $999999
		THEN $999999::pg_catalog.int8
		ELSE pg_catalog.concat('fenceproxy|55F03|@setting@|', pg_catalog.encode(pg_catalog.convert_to(pg_catalog.current_setting('@setting@', true), 'UTF8'), 'hex'), '|@table@|.')::pg_catalog.int8 END`

	// The token as a constant.
	tmplInlinePlain = `SELECT $999999::pg_catalog.int8`

	// The one-time filter when the check runs a volatile function (synccommit.go): a scalar subquery.
	tmplInlineOnceSubquery = `SELECT (SELECT fenceproxy_t) IS NOT NULL`

	// An UPDATE's value for the token column (tmplSetCheck without the CTE): T when the row's token is not
	// newer, else the 55F01 marker.
	tmplInlineSetCheck = `SELECT CASE WHEN COALESCE(fenceproxy_c, 0) OPERATOR(pg_catalog.<=) fenceproxy_t THEN fenceproxy_t
		ELSE pg_catalog.concat('fenceproxy|55F01|', fenceproxy_c, '|', fenceproxy_t, '|@table@|.')::pg_catalog.int8 END`
)

// inlineSlot is the number of the parameter that stands for the token in an inline rewrite. The fragments above
// spell it; a text with a parameter of that number or above is never inlined (inlineable), and a shape's
// normalised text numbers its constants from 1 up to far fewer than this (maxCachedSQL), so every parameter of
// that number in a rewrite is the token. The extended protocol's own parameters stop at 65535.
const inlineSlot = 999999

// inlineable reports whether a parsed text may be fenced in the inline form: no PREPARE, no parameter
// numbered inlineSlot or above (the lexer already refuses a text with a parameter above 65535: this holds
// whatever the lexer does).
func inlineable(tree *pg.ParseResult) bool {
	ok := true
	for _, raw := range tree.Stmts {
		if raw.Stmt.GetPrepareStmt() != nil {
			return false
		}
		eachNode(raw.Stmt, func(n *pg.Node) {
			if p := n.GetParamRef(); p != nil && p.Number >= inlineSlot {
				ok = false
			}
		})
	}
	return ok
}

// inlineSlotText is the parameter as the deparser prints it.
const inlineSlotText = "$999999"

// newInlineEntry is e's inline variant: the same table, with the fragments that read the token replaced by the
// inline ones. cte is nil: an inline write has no statement-token CTE.
func newInlineEntry(e *tableEntry, setting string) (*tableEntry, error) {
	fs := &fragmentSet{consts: strings.NewReplacer("@setting@", setting, "@table@", e.label)}
	checked := fs.parse(tmplInlineChecked)
	plain := fs.parse(tmplInlinePlain)
	setCheck := fs.parse(tmplInlineSetCheck)
	if fs.err != nil {
		return nil, fs.err
	}
	in := *e
	in.inline = nil
	in.token, in.cte = checked, nil
	in.ref, in.light = checked, plain
	in.setCheck = substitute(setCheck, map[string]*pg.Node{phTok: plain})
	in.once = substitute(e.notNull, map[string]*pg.Node{phTok: checked})
	return &in, nil
}

// wrapValidArms replaces the valid arm v of the table's token checks (the CTE's k, CASE WHEN <valid> THEN v
// ELSE <marker> END, and the inline variant's checked(T)) with wrap(v). The checks are shared, not copied, by
// every fragment that uses them (see substitute), so this changes every use.
func (e *tableEntry) wrapValidArms(wrap func(valid *pg.Node) *pg.Node) error {
	for _, tok := range []*pg.Node{e.token, e.inlineToken()} {
		if tok == nil {
			continue
		}
		cs := tok.GetCaseExpr()
		if cs == nil || len(cs.Args) != 1 || cs.Args[0].GetCaseWhen() == nil {
			return fmt.Errorf("unexpected token fragment")
		}
		arm := cs.Args[0].GetCaseWhen()
		arm.Result = wrap(arm.Result)
	}
	return nil
}

func (e *tableEntry) inlineToken() *pg.Node {
	if e.inline == nil {
		return nil
	}
	return e.inline.token
}

// tokenSegments cuts the deparsed (UTF-8) text of an inline rewrite at each parameter $inlineSlot (other
// parameters are a shape's constants, filled before). ok is false when the text cannot be lexed.
func tokenSegments(sql string) (segs []string, ok bool) {
	b := []byte(sql)
	l := newLexer(b, true)
	last := 0
	for t := l.next(); t.kind != tokEOF; t = l.next() {
		if t.kind != tokParam {
			continue
		}
		if n, err := strconv.Atoi(sql[t.start+1 : t.end]); err != nil || n != inlineSlot {
			continue
		}
		segs = append(segs, sql[last:t.start])
		last = t.end
	}
	if l.err != nil {
		return nil, false
	}
	return append(segs, sql[last:]), true
}

// WithToken is the text to send for a plan: SQL, or for an inline rewrite (TokenSegs) the text with the token
// in force, tok (a ValidToken), in each of its places as a string constant.
func (p Plan) WithToken(tok string) string {
	if len(p.TokenSegs) == 0 {
		return p.SQL
	}
	n := len(p.TokenSegs[0])
	for _, s := range p.TokenSegs[1:] {
		n += len(s) + len(tok) + 2
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(p.TokenSegs[0])
	for _, s := range p.TokenSegs[1:] {
		b.WriteByte('\'')
		b.WriteString(tok)
		b.WriteByte('\'')
		b.WriteString(s)
	}
	return b.String()
}
