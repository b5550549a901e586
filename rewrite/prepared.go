package rewrite

import (
	"strings"
	"sync/atomic"

	pg "github.com/pganalyze/pg_query_go/v6"
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
//   - '...', E'...', U&'...' and dollar-quoted strings: pg_catalog.unknown,
//     which the server resolves from the parameter's context exactly as it
//     resolves an untyped literal there (an argument that does not convert
//     fails as the literal would);
//   - N'...', B'...' and X'...' constants: not prepared (the text is sent as
//     SQL).
//
// A template that the server cannot prepare (a constant where the grammar
// needs a literal, such as a type modifier; a string whose type nothing
// decides) fails its PREPARE, which the proxy sends only outside any
// transaction block, on its own: nothing of the client's is affected, and
// the shape is sent as SQL from then on (MarkFailed).
//
// A string parameter is not always read as the string literal it stands
// for: PostgreSQL gives the input function of an interval the type modifier
// of its context only for a literal (interval '1' assigned to an interval
// day column is a day, the parameter a second, truncated to 0), and checks a
// domain's constraints when the literal's value is used (per row) but when
// EXECUTE's argument is read (so a failing CHECK fails even an UPDATE of no
// row). The rewrite cannot know which type a parameter takes, the server
// can: the proxy sends VetQuery right after a successful PREPARE and, when
// it returns false (a parameter of an interval or domain type), deallocates
// the statement and marks it failed (the oracle test in proxy shows both
// differences and that the vetting excludes them).
//
// One difference remains, by design of PostgreSQL's plan cache: a generic
// plan (which PostgreSQL may choose from a prepared statement's sixth
// execution on) does not fold constant subexpressions, so an error that the
// filled template raises only while planning (a constant too long for a
// column that no row receives, a division by zero in a branch not taken) is
// not raised: EXECUTE then does what the statement does without that
// premature error, as it would for a client's own prepared statement.
//
// Only templates of one statement, in ASCII without a backslash, are
// prepared: such a text reads the same under every client_encoding and
// standard_conforming_strings, so a PREPARE sent later, under other settings,
// means what it meant when the template was built.

// VetQuery is the query the proxy sends right after PREPARE name succeeded
// (in the same simple Query, or on its own): one row with one boolean, false
// when a parameter took a type whose literals the server reads otherwise
// than its parameters (an interval: the literal's input sees the context's
// type modifier; a domain: the literal's constraints are checked when its
// value is used). name is the statement's name as the server stores it
// (lower case for an unquoted name). Every name is schema-qualified: the
// session's search_path is the client's.
func VetQuery(name string) string {
	return "SELECT pg_catalog.count(*) OPERATOR(pg_catalog.=) 0 FROM pg_catalog.pg_prepared_statements s, " +
		"pg_catalog.unnest(s.parameter_types) p(t), pg_catalog.pg_type y WHERE s.name OPERATOR(pg_catalog.=) " +
		quoteLiteral(name) + " AND y.oid OPERATOR(pg_catalog.=) p.t::pg_catalog.oid AND " +
		"(y.typtype OPERATOR(pg_catalog.=) 'd' OR y.oid OPERATOR(pg_catalog.=) 'pg_catalog.interval'::pg_catalog.regtype)"
}

// quoteLiteral is s as a string literal that reads the same whatever
// standard_conforming_strings is.
func quoteLiteral(s string) string {
	q := "'" + strings.ReplaceAll(s, "'", "''") + "'"
	if strings.IndexByte(s, '\\') >= 0 {
		q = "E" + strings.ReplaceAll(q, `\`, `\\`)
	}
	return q
}

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
	case 's', 'e', 'u', 'd':
		return "pg_catalog.unknown"
	}
	return ""
}

// preparedOf returns the template SQL sql (parameters $1..$n standing for
// constants of the given classes) as a statement to prepare, or nil when it
// cannot be one.
func preparedOf(sql string, classes []byte) *Prepared {
	if !isASCIIString(sql) || strings.IndexByte(sql, '\\') >= 0 {
		return nil
	}
	if tree, err := pg.Parse(sql); err != nil || len(tree.Stmts) != 1 {
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
