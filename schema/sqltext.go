package schema

import (
	"fmt"
	"strings"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// The guard raises the same errors as the proxy: its message, DETAIL and HINT are generated from
// rewrite.Marker.Describe, the one place those texts live. Describe is called with sentinel strings in the
// fields known only at run time (the session's token, the row's token, ...); each text is then split at the
// sentinels into a SQL expression: the constant parts as string literals, the sentinels replaced by the
// PL/pgSQL expressions that hold those values.

// sentinel marks a run-time part in a text from Describe. Printable ASCII, so that Describe's %q leaves it as
// it is.
func sentinel(name string) string { return "{{fenceproxy:" + name + "}}" }

// Run-time parts of the guard's errors.
const (
	partToken    = "token"     // the session's token (55F01: as digits; 55F03: the raw setting value)
	partRowToken = "row_token" // 55F01: the row's token, or the lock's accepted token
	partTable    = "table"     // the table's label, when it is a run-time value (lock_accept)
	partLock     = "lock"      // the lock's name
)

// errorSQL is the PL/pgSQL RAISE statement for marker m, whose fields may hold sentinels; exprs maps each
// sentinel's part name to its PL/pgSQL expression. The error's TABLE field holds the table's label too, so
// that the proxy can count the guard's refusals by table without reading the message.
func errorSQL(m rewrite.Marker, exprs map[string]string) (string, error) {
	msg, detail, hint := m.Describe()
	if msg == "" {
		return "", fmt.Errorf("no error text for SQLSTATE %s", m.Code)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "RAISE EXCEPTION USING ERRCODE = %s", quoteLiteral(m.Code))
	for _, f := range []struct{ key, text string }{{"MESSAGE", msg}, {"DETAIL", detail}, {"HINT", hint}} {
		if f.text == "" {
			continue
		}
		e, err := textSQL(f.text, exprs)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, ", %s = %s", f.key, e)
	}
	table, err := textSQL(m.Table, exprs)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(&b, ", TABLE = %s", table)
	b.WriteString(";")
	return b.String(), nil
}

// textSQL turns text holding sentinels into a SQL expression of type text.
func textSQL(text string, exprs map[string]string) (string, error) {
	var args []string
	for text != "" {
		i := strings.Index(text, "{{fenceproxy:")
		if i < 0 {
			args = append(args, quoteLiteral(text))
			break
		}
		if i > 0 {
			args = append(args, quoteLiteral(text[:i]))
		}
		j := strings.Index(text[i:], "}}")
		if j < 0 {
			return "", fmt.Errorf("unterminated sentinel in %q", text)
		}
		name := text[i+len("{{fenceproxy:") : i+j]
		e, ok := exprs[name]
		if !ok {
			return "", fmt.Errorf("no expression for %s in %q", name, text)
		}
		args = append(args, e)
		text = text[i+j+2:]
	}
	if len(args) == 1 && strings.HasPrefix(args[0], "E'") {
		return args[0], nil
	}
	return "pg_catalog.concat(" + strings.Join(args, ", ") + ")", nil
}

// quoteLiteral quotes s as an E'...' string literal, which reads the same whatever standard_conforming_strings is.
// A quote is doubled, never written \': PL/pgSQL compiles a function in the session that first calls it, and
// there, under the default backslash_quote (safe_encoding), a client_encoding PostgreSQL accepts only from clients
// (SJIS, BIG5, GBK, UHC, GB18030, JOHAB) makes the scanner refuse \' (22P06), so no such session could write a
// guarded table.
func quoteLiteral(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	s = strings.ReplaceAll(s, `'`, `''`)
	return "E'" + s + "'"
}

// quoteIdent quotes a PostgreSQL identifier.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// quoteQualified quotes schema.name.
func quoteQualified(schema, name string) string { return quoteIdent(schema) + "." + quoteIdent(name) }

// goQuoted is the PL/pgSQL expression for Go's %q of the text expression e, exact for printable ASCII (the
// proxy formats 55F03's value with %q; a value with control or non-ASCII characters is shown differently).
func goQuoted(e string) string {
	return `pg_catalog.replace(pg_catalog.replace(` + e + `, E'\\', E'\\\\'), E'"', E'\\"')`
}
