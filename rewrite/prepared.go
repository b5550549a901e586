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
// A string constant that the shape keeps as written (a typed literal such as
// TIMESTAMPTZ '2024-01-01', DATE 'today', INTERVAL '1' DAY) stays a constant of
// the template, and the server converts it when it analyses the statement:
// prepared, it would keep the value read at the PREPARE (the time of then for
// 'now', the TimeZone, DateStyle and IntervalStyle of then), where the SQL is
// read again each time. Shapes with such a constant are not prepared
// (shaped.keptString).
//
// A template that the server cannot prepare (a constant where the grammar
// needs a literal, such as a type modifier; a string whose type nothing
// decides) fails its PREPARE, which the proxy sends only outside any
// transaction block, on its own: nothing of the client's is affected, and
// the shape is sent as SQL from then on (MarkFailed).
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
