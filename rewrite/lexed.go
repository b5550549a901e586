package rewrite

import (
	"errors"
	"fmt"
	"strconv"
)

// Lexed is a text as the proxy reads it under a session's settings: what a
// test compares with the server's own reading (PostgreSQL is the oracle: a
// multi-statement Query gets one CommandComplete per non-empty statement, and
// SELECT of a literal returns its value).
type Lexed struct {
	// Statements is the number of non-empty statements.
	Statements int
	// Strings are the values of the string constants ('...', E'...',
	// N'...', U&'...', $$...$$), in order, in UTF-8. Bit and hex strings
	// are left out.
	Strings []string
}

// ErrUnreadable is returned by Lex for text the proxy cannot read exactly
// (wrapped with the reason).
var ErrUnreadable = errors.New("unreadable text")

// Lex reads raw (client-encoded) under s as the planner does.
func Lex(raw []byte, s Settings) (Lexed, error) {
	text, why := decode(raw, s)
	if why != "" {
		return Lexed{}, fmt.Errorf("%w: %s", ErrUnreadable, why)
	}
	l := newLexer(text, s.StandardConformingStrings)
	var out Lexed
	inStmt := false
	for t := l.next(); t.kind != tokEOF; t = l.next() {
		if t.kind == tokSemicolon {
			inStmt = false
			continue
		}
		if !inStmt {
			out.Statements++
			inStmt = true
		}
		switch t.kind {
		case tokString, tokEString, tokNString, tokUString, tokDollar:
			v, err := l.stringValue(t, nil)
			if err != nil {
				return out, err
			}
			out.Strings = append(out.Strings, string(v))
		}
	}
	if l.err != nil {
		return out, l.err
	}
	return out, nil
}

// shape is the text with every constant (numbers and strings of every form)
// replaced by a numbered placeholder, and the byte spans of the constants in
// the text: the key of a plan cache that serves statements differing only in
// their constants (issue 20). The placeholder is a NUL byte and the
// constant's number and another NUL, which no client text can hold (the protocol ends texts
// at NUL), so two texts have the same shape only when they differ in
// constants alone. It reads the text as decoded UTF-8 under
// standard_conforming_strings scs.
func shape(text []byte, scs bool) (key []byte, spans [][2]int, err error) {
	l := newLexer(text, scs)
	last := 0
	for t := l.next(); t.kind != tokEOF; t = l.next() {
		if t.kind != tokNumber && !t.isString() {
			continue
		}
		key = append(key, text[last:t.start]...)
		key = append(key, 0)
		key = strconv.AppendInt(key, int64(len(spans)), 10)
		key = append(key, 0)
		spans = append(spans, [2]int{t.start, t.end})
		last = t.end
	}
	if l.err != nil {
		return nil, nil, l.err
	}
	return append(key, text[last:]...), spans, nil
}
