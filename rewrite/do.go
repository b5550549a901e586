package rewrite

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// A DO block runs its body, a string the server decodes (E'' escapes, U&''
// escapes, dollar quotes), as a function. Its body is analysed after pg_query
// has decoded it: PL/pgSQL is parsed (pg_query wraps PL/pgSQL's own parser)
// and every SQL text in it (static statements, PERFORM, expressions,
// assignments, cursor and loop queries) is read and analysed like top-level
// SQL. A block whose static SQL would write a protected table, set the token
// or be refused is refused as a whole: the proxy cannot fence statements
// inside a function body. Dynamic SQL (EXECUTE of a string built at run time)
// cannot be seen: the in-database guard covers it.

// doBlock analyses a DO statement.
func (a *analysis) doBlock(x *pg.DoStmt) {
	var body, language string
	hasBody := false
	for _, arg := range x.Args {
		d := arg.GetDefElem()
		if d == nil {
			continue
		}
		switch d.Defname {
		case "as":
			body, hasBody = d.Arg.GetString_().GetSval(), true
		case "language":
			language = d.Arg.GetString_().GetSval()
		}
	}
	if !hasBody {
		return
	}
	if language != "" && !strings.EqualFold(language, "plpgsql") {
		if label := a.r.mentions(body); label != "" {
			a.refuse(CodeUnfenceable, label, fmt.Sprintf(
				"unfenceable write: a DO block in LANGUAGE %s that names %s cannot be analysed; run its statements through the proxy as plain SQL", language, label))
		}
		return
	}
	queries, opens, err := plpgsqlQueries(body)
	if err != nil {
		if label := a.r.mentions(body); label != "" {
			a.refuse(CodeUnfenceable, label, fmt.Sprintf(
				"unfenceable write: cannot parse a DO block that names %s: %v", label, err))
		}
		return
	}
	if opens {
		// A cursor the block opens stays open after it, to the transaction's end: its query runs at each FETCH,
		// after the statements that follow the block. What the block's statements may do is what may come later.
		before := a.effects
		a.effects = SessionEffects{}
		defer func() { a.effects = before.Then(a.effects.Later()) }()
	}
	for _, q := range queries {
		msg, label, setsToken := a.doQuery(q)
		if setsToken {
			a.refuse(CodeInvalid, "", fmt.Sprintf(
				"invalid fencing token: a DO block that sets %s cannot have its token checked; use SET %s = <token>", a.r.setting, a.r.setting))
			return
		}
		if msg != "" {
			a.refuse(CodeUnfenceable, label, "unfenceable write: a DO block that "+msg+
				" cannot be fenced; run its statements through the proxy as plain SQL")
			return
		}
	}
}

// plQuery is one SQL text of a PL/pgSQL body and how PL/pgSQL parses it.
type plQuery struct {
	text string
	mode int // 0: a statement; 2: an expression; 3-5: an assignment (target := expression)
}

// plpgsqlQueries parses body as the body of a PL/pgSQL function and returns
// every SQL text in it, and whether it opens a cursor (OPEN).
func plpgsqlQueries(body string) (qs []plQuery, opens bool, err error) {
	tag := "$fenceproxy$"
	for i := 0; strings.Contains(body, tag); i++ {
		tag = fmt.Sprintf("$fenceproxy%d$", i)
	}
	qs, _, opens, err = plpgsqlDefQueries("CREATE FUNCTION fenceproxy_do() RETURNS void LANGUAGE plpgsql AS " + tag + body + tag)
	return qs, opens, err
}

// plpgsqlDefQueries parses a PL/pgSQL CREATE FUNCTION (or PROCEDURE) text with
// pg_query's PL/pgSQL parser and returns every SQL text in its body, and
// whether the body runs dynamic SQL (EXECUTE, FOR ... IN EXECUTE), whose text
// is known only at run time, and whether it opens a cursor (OPEN), which stays
// open after the body returns.
func plpgsqlDefQueries(def string) (qs []plQuery, dynamic, opens bool, err error) {
	out, err := pg.ParsePlPgSqlToJSON(def)
	if err != nil {
		return nil, false, false, fmt.Errorf("PL/pgSQL: %w", err)
	}
	var tree any
	if err := json.Unmarshal([]byte(out), &tree); err != nil {
		return nil, false, false, fmt.Errorf("PL/pgSQL parse tree: %w", err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if _, ok := x["PLpgSQL_stmt_dynexecute"]; ok {
				dynamic = true
			}
			if _, ok := x["PLpgSQL_stmt_dynfors"]; ok {
				dynamic = true
			}
			if _, ok := x["PLpgSQL_stmt_open"]; ok {
				opens = true
			}
			if e, ok := x["PLpgSQL_expr"].(map[string]any); ok {
				q, _ := e["query"].(string)
				mode, _ := e["parseMode"].(float64)
				qs = append(qs, plQuery{text: q, mode: int(mode)})
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(tree)
	return qs, dynamic, opens, nil
}

// PLpgSQLWrites reads a PL/pgSQL function or procedure definition (as
// pg_get_functiondef gives it) the way a DO block's body is read: every static
// SQL text in it is analysed like top-level SQL. It returns the protected
// tables that static SQL writes (or would be refused for), and whether the
// body runs dynamic SQL, which no reader of the text can judge. For
// `fenceproxy check`'s audit of in-server write paths.
func (r *Rewriter) PLpgSQLWrites(def string) (tables []string, dynamic bool, err error) {
	qs, dynamic, _, err := plpgsqlDefQueries(def)
	if err != nil {
		return nil, false, err
	}
	a := &analysis{r: r}
	for _, q := range qs {
		msg, label, _ := a.doQuery(q)
		if msg != "" && label != "" && !slices.Contains(tables, label) && r.isLabel(label) {
			tables = append(tables, label)
		}
	}
	return tables, dynamic, nil
}

// isLabel reports whether label is a protected table's label (doQuery names "a
// protected table" when it cannot tell which).
func (r *Rewriter) isLabel(label string) bool {
	for _, e := range r.tables {
		if e.label == label {
			return true
		}
	}
	return false
}

// bodyEffectWords are the words of a DO body's statement that may change a SessionEffects setting the prefilter
// (scan) does not look for: application_name's name, and RESET (ALL), which resets the token and lock too.
var bodyEffectWords = NewFoldWords(AppSetting, "reset")

// bodyEffects notes what a statement of a DO body that the prefilter passes may do to SessionEffects' settings
// (a SET or RESET of application_name, a RESET ALL), as what the block may or may not do. Nothing else of it
// is read: it names no protected table and no token setting. One that does not parse may do anything (the
// server would refuse the block).
func (a *analysis) bodyEffects(sql string) {
	tree, err := pg.Parse(sql)
	if err != nil {
		a.effects = a.effects.Then(anyEffects.May())
		return
	}
	sub := &analysis{r: a.r}
	for _, raw := range tree.Stmts {
		if v := raw.Stmt.GetVariableSetStmt(); v != nil && !v.IsLocal {
			sub.sessionSet(v)
		}
	}
	a.effects = a.effects.Then(sub.effects.May())
}

// doQuery analyses one SQL text of a DO body. It returns what makes the block
// unfenceable ("" when nothing does) and the protected table concerned, or
// that it may set the token setting.
func (a *analysis) doQuery(q plQuery) (msg, label string, setsToken bool) {
	text := []byte(q.text)
	if a.scsOff {
		// PL/pgSQL reads its body with the session's
		// standard_conforming_strings, as the core scanner does.
		text = []byte(normalise(text))
	}
	if sc := a.r.scan(text, true); !sc.touch && sc.err == nil {
		if q.mode == 0 && bodyEffectWords.In(text) {
			a.bodyEffects(string(text))
		}
		return "", "", false
	}
	sql := string(text)
	switch {
	case q.mode == 2:
		sql = "SELECT " + sql
	case q.mode >= 3:
		// target := expression (or target = expression)
		l := newLexer(text, true)
		rest := -1
		for t := l.next(); t.kind != tokEOF; t = l.next() {
			if w := string(text[t.start:t.end]); w == ":=" || w == "=" {
				rest = t.end
				break
			}
		}
		if rest < 0 {
			label := a.r.mentions(sql)
			if label == "" {
				label = "a protected table"
			}
			return fmt.Sprintf("holds an assignment that cannot be read (%q)", q.text), label, false
		}
		sql = "SELECT " + sql[rest:]
	}
	tree, err := pg.Parse(sql)
	if err != nil {
		label := a.r.mentions(sql)
		if label == "" {
			label = "a protected table"
		}
		return fmt.Sprintf("holds SQL that cannot be parsed and may write %s (%v)", label, err), label, false
	}
	sub := &analysis{r: a.r, scsOff: a.scsOff}
	for _, raw := range tree.Stmts {
		sub.statement(raw.Stmt)
	}
	// SessionEffects covers the block's statements too, as what it may or may not do: its control flow is not read.
	a.effects = a.effects.Then(sub.effects.May())
	switch {
	case sub.tokenSet || sub.tokenDynamic:
		return "", "", true
	case sub.refusal != nil && sub.refusal.Code == CodeInvalid:
		return "", "", true
	case sub.refusal != nil:
		return fmt.Sprintf("holds a statement the proxy refuses (%s)", sub.refusal.Message), sub.refusal.Table, false
	case len(sub.writes) > 0:
		return "writes " + sub.writes[0].table.label, sub.writes[0].table.label, false
	case len(sub.checked) > 0:
		// Only a top-level statement can be sent as a checking block (bycheck.go); inside a body it would run
		// unchecked.
		return "holds " + sub.checked[0].what + ", which may reach a protected table and is checked only as a statement of its own",
			a.r.tables[0].label, false
	}
	return "", "", false
}
