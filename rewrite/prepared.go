package rewrite

import (
	"strings"
	"sync/atomic"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Server-side prepared templates (issue 20). A fenced statement sent as SQL
// costs the server a parse, an analysis and a plan of the whole fence every
// time: about three times the client's own statement. A shape template is the
// same statement for every text of the shape with the constants as
// parameters, so the proxy can PREPARE it once per upstream connection and
// send each later text of the shape as EXECUTE name(constants): the server
// parses only the EXECUTE, and runs a cached plan.
//
// Why EXECUTE gives the same statement as the filled template: each
// parameter is declared with the type the parser gives the constant it
// stands for (constClass), and EXECUTE's arguments are those constants as
// the client spelled them, so each argument is a constant of its parameter's
// own type and no coercion happens on the way in:
//
//   - an integer that fits 32 bits: pg_catalog.int4; one that fits 64 bits:
//     pg_catalog.int8; any other number: pg_catalog.numeric; a unary minus is
//     folded into the constant and typed with it (-2147483648 is an int4);
//     a number in parentheses after a unary minus is not prepared: the
//     parser folds that minus too, -(2147483648) is an int4 -2147483648,
//     which -($1) with an int8 $1 is not (shapeOf);
//   - strings of every form ('...', E'...', U&'...', dollar-quoted, N'...',
//     B'...', X'...'): not prepared (the text is sent as SQL).
//
// A number's type is its own, wherever it stands; a string literal's type is
// its context's, and a parameter standing for it would not be read as the
// literal is. A parameter declared pg_catalog.unknown takes its type from its
// context once, at PREPARE, and keeps it: when the context changes under
// the prepared statement (a migration changes the column's type, another
// table of the same name comes first in the search_path), PostgreSQL
// analyses the statement again with the old type, so '2024-1-1' written to a
// column that was a date and is now text is stored as 2024-01-01, and '007'
// written to an int column in one schema and a text column in another is 7.
// Even in an unchanged context, an interval's input sees the context's type
// modifier only for a literal (interval '1' for an interval day column is a
// day, the parameter a second, truncated to 0), and a domain's constraints
// are checked when the literal's value is used (per row) but when EXECUTE's
// argument is read (so a failing CHECK fails an UPDATE of no row). The
// oracle test in proxy (prepared_oracle_test.go) showed each of these.
//
// A statement that returns rows (RETURNING, or a SELECT at the top) is not
// prepared either: PostgreSQL refuses to run a prepared statement whose
// result columns changed since PREPARE (SQLSTATE 0A000, cached plan must not
// change result type), which a migration as common as ADD COLUMN does to a
// RETURNING *; the text sent as SQL would not fail.
//
// A prepared statement is analysed once, at PREPARE (and again only when a
// table it uses changes, or the search_path), with the session's settings
// of that moment; the text sent as SQL is analysed with those of its own.
// So no statement is prepared whose analysis reads settings that may change
// in between: one with a typed literal kept as written in the template
// (DATE '01/02/2024' reads DateStyle, TIMESTAMPTZ '2024-01-01 12:00'
// TimeZone, INTERVAL '-1 2:03:04' IntervalStyle, DATE 'today' the day of
// the PREPARE), or with = NULL (transform_null_equals).
//
// Nor is a statement with a parameter where PostgreSQL reads a constant as
// more than its value: as an output column number (ORDER BY b, 2; GROUP BY
// 2; DISTINCT ON (2): a parameter there is a value, and the rows are sorted
// or grouped by it), or in an ON CONFLICT target, whose expressions and
// predicate the planner matches against the indexes' own (a generic plan
// never matches a parameter: SQLSTATE 42P10, no unique or exclusion
// constraint matching the ON CONFLICT specification).
//
// A string constant that the shape keeps as written (a typed literal such as
// TIMESTAMPTZ '2024-01-01', DATE 'today', INTERVAL '1' DAY) stays a constant of
// the template, and the server converts it when it analyses the statement:
// prepared, it would keep the value read at the PREPARE (the time of then for
// 'now', the TimeZone, DateStyle and IntervalStyle of then), where the SQL is
// read again each time. Shapes with such a constant are not prepared
// (shaped.unprepared).
//
// A template that the server cannot prepare (a constant where the grammar
// needs a literal, such as a type modifier) fails its PREPARE, which the
// proxy sends only outside any transaction block, on its own: nothing of the
// client's is affected, and the shape is sent as SQL from then on
// (MarkFailed).
//
// Shadowed: PostgreSQL analyses a prepared statement again when a table it
// uses changes or the search_path does, not when a new table would be found
// first by the same name: after CREATE TEMP TABLE accounts (or CREATE TABLE
// early.accounts, with early before public in the search_path), the text sent
// as SQL writes the new table and EXECUTE would still write public.accounts.
// The proxy forgets its prepared statements when a client's text holds
// CREATE or ALTER (MayDropPrepared; proxy/prepared.go) and prepares again, so
// its own clients' DDL is followed; a table created by another session or
// inside a function is not seen (README Limits: prepared_fences: 0 for
// clients whose tables are shadowed that way).
//
// Another remains, by design of PostgreSQL's plan cache: a generic
// plan (which PostgreSQL may choose from a prepared statement's sixth
// execution on) does not fold constant subexpressions, so an error that the
// filled template raises only while planning (a number too large for a
// column that no row receives, a division by zero in a branch not taken) is
// not raised: EXECUTE then does what the statement does without that
// premature error (to its end, or to another error, a fence's among them),
// as it would for a client's own prepared statement. No fence error is among
// the premature ones: the fence raises its errors when the statement runs.
//
// Only templates of one statement, in ASCII without a backslash, are
// prepared: such a text reads the same under every client_encoding and
// standard_conforming_strings, so a PREPARE sent later, under other settings,
// means what it meant when the template was built.

// Prepared is a shape template as a statement to prepare: immutable but for
// its failed mark, and shared by every text of the shape.
type Prepared struct {
	// Body is what follows PREPARE name: the parameter types and AS with the
	// fenced statement.
	Body   string
	failed atomic.Bool
}

// MarkFailed records that the server refused to prepare the template, so that
// no connection tries again.
func (p *Prepared) MarkFailed() { p.failed.Store(true) }

// Failed reports whether MarkFailed was called.
func (p *Prepared) Failed() bool { return p.failed.Load() }

// paramType is the type of the parameter standing for a constant of class c,
// "" for a class that is not prepared.
func paramType(c byte) string {
	switch c {
	case 'i', 'j':
		return "pg_catalog.int4"
	case 'l', 'k':
		return "pg_catalog.int8"
	case 'f', '-':
		return "pg_catalog.numeric"
	}
	return "" // strings (see above)
}

// preparedOf returns the template SQL sql (parameters $1..$n standing for
// constants of the given classes) as a statement to prepare, or nil when it
// cannot be one.
func preparedOf(sql string, classes []byte) *Prepared {
	if !isASCIIString(sql) || strings.IndexByte(sql, '\\') >= 0 {
		return nil
	}
	tree, err := pg.Parse(sql)
	if err != nil || len(tree.Stmts) != 1 || returnsRows(tree.Stmts[0].Stmt) || paramAsGrammar(tree.Stmts[0].Stmt) ||
		equalsNull(tree.Stmts[0].Stmt) {
		return nil
	}
	var b strings.Builder
	b.WriteByte('(')
	for i, c := range classes {
		t := paramType(c)
		if t == "" {
			return nil
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(t)
	}
	b.WriteString(") AS ")
	b.WriteString(sql)
	return &Prepared{Body: b.String()}
}

// returnsRows reports whether the statement stmt returns rows: anything but
// an INSERT, UPDATE or DELETE without RETURNING (a data-modifying WITH's
// RETURNING feeds the statement, not the client).
func returnsRows(stmt *pg.Node) bool {
	switch n := stmt.GetNode().(type) {
	case *pg.Node_InsertStmt:
		return len(n.InsertStmt.ReturningList) > 0
	case *pg.Node_UpdateStmt:
		return len(n.UpdateStmt.ReturningList) > 0
	case *pg.Node_DeleteStmt:
		return len(n.DeleteStmt.ReturningList) > 0
	}
	return true
}

// paramAsGrammar reports whether a parameter of the statement stmt stands
// where a constant is more than a value (see above): directly as a sort key
// (ORDER BY, conservatively also in windows and aggregates, where it is a
// value either way), a GROUP BY or DISTINCT ON item, anywhere in a grouping
// set, or anywhere in an ON CONFLICT target.
func paramAsGrammar(stmt *pg.Node) bool {
	found := false
	direct := func(nodes ...*pg.Node) {
		for _, n := range nodes {
			found = found || n.GetParamRef() != nil
		}
	}
	anywhere := func(m protoreflect.Message) {
		eachMessage(m, func(x protoreflect.Message) {
			if _, ok := x.Interface().(*pg.ParamRef); ok {
				found = true
			}
		})
	}
	walkStatement(stmt, func(m protoreflect.Message) {
		switch x := m.Interface().(type) {
		case *pg.SortBy:
			direct(x.Node)
		case *pg.SelectStmt:
			direct(x.GroupClause...)
			direct(x.DistinctClause...)
		case *pg.GroupingSet, *pg.InferClause:
			anywhere(m)
		}
	})
	return found
}

// equalsNull reports whether the statement stmt compares with = to a NULL
// constant, which its analysis makes IS NULL when transform_null_equals is
// on (the test of PostgreSQL's transformAExprOp).
func equalsNull(stmt *pg.Node) bool {
	isNull := func(n *pg.Node) bool { return n.GetAConst().GetIsnull() }
	found := false
	walkStatement(stmt, func(m protoreflect.Message) {
		if e, ok := m.Interface().(*pg.A_Expr); ok && e.Kind == pg.A_Expr_Kind_AEXPR_OP && len(e.Name) == 1 &&
			e.Name[0].GetString_().GetSval() == "=" && (isNull(e.Lexpr) || isNull(e.Rexpr)) {
			found = true
		}
	})
	return found
}

// executeArgs is the argument list of an EXECUTE of a shape's prepared
// template for text: its constants (at spans) as the client spelled them.
func executeArgs(text []byte, spans [][2]int) string {
	n := 2
	for _, sp := range spans {
		n += sp[1] - sp[0] + 1
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteByte('(')
	for i, sp := range spans {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(text[sp[0]:sp[1]])
	}
	b.WriteByte(')')
	return b.String()
}

// MayDropPrepared reports whether text, a client's Query or Parse, may drop
// statements the proxy prepared (their names start with prefix) or change
// what they mean: it holds one of the words DISCARD, CREATE, ALTER (a table
// created or renamed later that an unqualified name now finds is not seen by
// a prepared statement), transform_null_equals (read at PREPARE), or
// DEALLOCATE other than one DEALLOCATE of a name of the client's own
// (deallocatesAnother). It errs toward true: a word in a string or a comment
// counts, since a string run by EXECUTE may put it anywhere. One pass over
// the text: it runs for every Query and Parse of a session with prepared
// statements.
func MayDropPrepared(text []byte, prefix string) bool {
	dealloc := false
	for i := 0; i < len(text); i++ {
		switch lower(text[i]) {
		case 'd':
			if wordAt(text, i, "discard") {
				return true
			}
			dealloc = dealloc || wordAt(text, i, "deallocate")
		case 'c':
			if wordAt(text, i, "create") {
				return true
			}
		case 'a':
			if wordAt(text, i, "alter") {
				return true
			}
		case 't':
			if wordAt(text, i, "transform_null_equals") {
				return true
			}
		}
	}
	return dealloc && !deallocatesAnother(text, prefix)
}

// wordAt reports whether text holds word (lower case) at i, ASCII
// case-insensitively, not followed by a character that continues an
// identifier: "discarded" and "deallocated" do not hold it.
func wordAt(text []byte, i int, word string) bool {
	n := len(word)
	return i+n <= len(text) && equalFoldASCII(text[i:i+n], word) && (i+n == len(text) || !isIdentCont(text[i+n]))
}

// deallocatesAnother reports whether text is one DEALLOCATE [PREPARE] of a
// statement whose name does not start with prefix: a name written plainly
// (an identifier, or one in double quotes) that is not ALL. Drivers that
// inline constants deallocate their own statements so (psycopg 3); anything
// else holding the word counts as dropping the proxy's statements.
func deallocatesAnother(text []byte, prefix string) bool {
	words := strings.Fields(strings.TrimSuffix(strings.TrimSpace(string(text)), ";"))
	if len(words) == 3 && strings.EqualFold(words[1], "prepare") {
		words = []string{words[0], words[2]}
	}
	if len(words) != 2 || !strings.EqualFold(words[0], "deallocate") {
		return false
	}
	name := words[1]
	if len(name) > 2 && name[0] == '"' && name[len(name)-1] == '"' {
		name = name[1 : len(name)-1] // quoted: as written
		return !strings.Contains(name, `"`) && !strings.HasPrefix(name, prefix)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c >= 0x80 || !isIdentCont(c) || i == 0 && !isIdentStart(c) {
			return false
		}
	}
	folded := strings.ToLower(name) // unquoted: folded
	return folded != "all" && folded != "prepare" && !strings.HasPrefix(folded, prefix)
}
