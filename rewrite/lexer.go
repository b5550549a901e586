package rewrite

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"
)

// The lexer reads SQL text with PostgreSQL's own scanner rules
// (src/backend/parser/scan.l, and the UESCAPE look-ahead of parser.c), so
// that the proxy splits a text into the same tokens and statements the server
// does. It is pure and does not allocate: a token is a kind and a byte span of
// the text; values are decoded on demand (identValue, stringValue).
//
// The text it reads is the client's text converted to UTF-8 (see reading.go):
// the server converts a Query from client_encoding to server_encoding before
// it lexes, and every server encoding is ASCII-safe (a byte below 0x80 is
// always that ASCII character), so the structure (quotes, backslashes,
// comments, semicolons) is found at the same characters.

// tokenKind is the lexical class of a token.
type tokenKind uint8

const (
	tokEOF       tokenKind = iota
	tokIdent               // unquoted identifier or keyword (value: ASCII-downcased, truncated)
	tokQIdent              // "quoted identifier" ("" is one ")
	tokUIdent              // U&"..." identifier, with its UESCAPE clause if any
	tokString              // '...': standard, or with backslash escapes when standard_conforming_strings is off
	tokEString             // E'...': backslash escapes
	tokNString             // N'...': a national character string (NCHAR '...')
	tokUString             // U&'...', with its UESCAPE clause if any
	tokBitString           // B'...'
	tokHexString           // X'...'
	tokDollar              // $tag$...$tag$
	tokNumber              // integer or decimal constant
	tokParam               // $n
	tokOp                  // operator (one or more operator characters, ::, and the like)
	tokSelf                // one of , ( ) [ ] . : + - * / % ^ < > =
	tokSemicolon           // ;
	tokOther               // any other single character (a syntax error for the server)
)

// token is one lexical token: its kind and the byte span [start, end) of the
// text. A string continued over lines ('a' <newline> 'b') is one token.
type token struct {
	kind       tokenKind
	start, end int
	// bodyStart is where the body of a quoted token starts (after the
	// opening quote or dollar tag); for U& tokens also where the UESCAPE
	// clause begins (uescEnd is the end of the quoted part).
	bodyStart int
	uescEnd   int
	// escapes: the body is read with backslash escapes (E'', or '' and N''
	// when standard_conforming_strings is off).
	escapes bool
	// backslash: the body holds a backslash (for a '...' or N'...' token:
	// it reads differently under the other standard_conforming_strings).
	backslash bool
	// esc is the escape character of a U& token ('\\' unless UESCAPE).
	esc byte
}

// isString reports whether the token is a string constant of any form.
func (t token) isString() bool {
	switch t.kind {
	case tokString, tokEString, tokNString, tokUString, tokBitString, tokHexString, tokDollar:
		return true
	}
	return false
}

// isIdent reports whether the token is an identifier of any form.
func (t token) isIdent() bool {
	return t.kind == tokIdent || t.kind == tokQIdent || t.kind == tokUIdent
}

// namedatalen is PostgreSQL's NAMEDATALEN: identifiers are truncated to
// namedatalen-1 bytes.
const namedatalen = 64

// lexer scans one text. The zero value is not usable: use newLexer.
type lexer struct {
	src []byte
	pos int
	// scs is standard_conforming_strings.
	scs bool
	err error
	// signs is the tail of + and - an operator lost (operator): from anywhere in it the operator is one sign.
	// Known, it makes a long run of signs one pass, not a pass per sign.
	signs struct{ start, end int }
}

func newLexer(src []byte, scs bool) lexer { return lexer{src: src, scs: scs} }

// errLex is wrapped by every lexical error: the server rejects such a text
// (unless the lexer is wrong, which callers treat as unreadable).
var errLex = errors.New("lexical error")

func (l *lexer) fail(format string, args ...any) token {
	if l.err == nil {
		l.err = fmt.Errorf("%w at byte %d: %s", errLex, l.pos, fmt.Sprintf(format, args...))
	}
	l.pos = len(l.src)
	return token{kind: tokEOF, start: len(l.src), end: len(l.src)}
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

func isIdentCont(c byte) bool {
	return isIdentStart(c) || c >= '0' && c <= '9' || c == '$'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isHexDigit(c byte) bool {
	return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func isOpChar(c byte) bool {
	switch c {
	case '~', '!', '@', '#', '^', '&', '|', '`', '?', '+', '-', '*', '/', '%', '<', '>', '=':
		return true
	}
	return false
}

func isSelf(c byte) bool {
	switch c {
	case ',', '(', ')', '[', ']', '.', ';', ':', '+', '-', '*', '/', '%', '^', '<', '>', '=':
		return true
	}
	return false
}

// skipSpace skips white space and comments (-- to the end of the line,
// nested /* */).
func (l *lexer) skipSpace() {
	s := l.src
	for l.pos < len(s) {
		c := s[l.pos]
		switch {
		case isSpace(c):
			l.pos++
		case c == '-' && l.pos+1 < len(s) && s[l.pos+1] == '-':
			for l.pos < len(s) && s[l.pos] != '\n' && s[l.pos] != '\r' {
				l.pos++
			}
		case c == '/' && l.pos+1 < len(s) && s[l.pos+1] == '*':
			depth := 0
			i := l.pos + 2
			for {
				if i+1 >= len(s) {
					l.fail("unterminated /* comment")
					return
				}
				if s[i] == '/' && s[i+1] == '*' {
					depth++
					i += 2
				} else if s[i] == '*' && s[i+1] == '/' {
					i += 2
					if depth == 0 {
						break
					}
					depth--
				} else {
					i++
				}
			}
			l.pos = i
		default:
			return
		}
	}
}

// next returns the next token; tokEOF at the end or after an error (l.err).
func (l *lexer) next() token {
	l.skipSpace()
	s := l.src
	if l.pos >= len(s) {
		return token{kind: tokEOF, start: len(s), end: len(s)}
	}
	start := l.pos
	c := s[start]
	peek := func(i int) byte {
		if start+i < len(s) {
			return s[start+i]
		}
		return 0
	}
	switch {
	case (c == 'b' || c == 'B') && peek(1) == '\'':
		return l.quoted(token{kind: tokBitString, start: start, bodyStart: start + 2})
	case (c == 'x' || c == 'X') && peek(1) == '\'':
		return l.quoted(token{kind: tokHexString, start: start, bodyStart: start + 2})
	case (c == 'e' || c == 'E') && peek(1) == '\'':
		return l.quoted(token{kind: tokEString, start: start, bodyStart: start + 2, escapes: true})
	case (c == 'n' || c == 'N') && peek(1) == '\'':
		return l.quoted(token{kind: tokNString, start: start, bodyStart: start + 2, escapes: !l.scs})
	case (c == 'u' || c == 'U') && peek(1) == '&' && peek(2) == '\'':
		if !l.scs {
			l.pos = start
			return l.fail("unsafe use of string constant with Unicode escapes")
		}
		return l.uescape(l.quoted(token{kind: tokUString, start: start, bodyStart: start + 3, esc: '\\'}))
	case (c == 'u' || c == 'U') && peek(1) == '&' && peek(2) == '"':
		return l.uescape(l.quotedIdent(token{kind: tokUIdent, start: start, bodyStart: start + 3, esc: '\\'}))
	case c == '\'':
		return l.quoted(token{kind: tokString, start: start, bodyStart: start + 1, escapes: !l.scs})
	case c == '"':
		return l.quotedIdent(token{kind: tokQIdent, start: start, bodyStart: start + 1})
	case isIdentStart(c):
		i := start + 1
		for i < len(s) && isIdentCont(s[i]) {
			i++
		}
		l.pos = i
		return token{kind: tokIdent, start: start, end: i}
	case c == '$':
		if isDigit(peek(1)) {
			i := start + 1
			for i < len(s) && isDigit(s[i]) {
				i++
			}
			if i < len(s) && isIdentStart(s[i]) {
				l.pos = i
				return l.fail("trailing junk after parameter")
			}
			l.pos = i
			return token{kind: tokParam, start: start, end: i}
		}
		return l.dollar(start)
	case isDigit(c) || c == '.' && isDigit(peek(1)):
		return l.number(start)
	case c == ':' && peek(1) == ':':
		l.pos = start + 2
		return token{kind: tokOp, start: start, end: l.pos}
	case c == ';':
		l.pos = start + 1
		return token{kind: tokSemicolon, start: start, end: l.pos}
	case isOpChar(c):
		return l.operator(start)
	case isSelf(c):
		l.pos = start + 1
		return token{kind: tokSelf, start: start, end: l.pos}
	}
	l.pos = start + 1
	return token{kind: tokOther, start: start, end: l.pos}
}

// quoted scans a single-quoted literal whose body starts at t.bodyStart,
// including its continuations ('a' <white space with a newline> 'b'), which
// are read in the same mode as the first part.
func (l *lexer) quoted(t token) token {
	s := l.src
	i := t.bodyStart
	for {
		if i >= len(s) {
			l.pos = t.start
			return l.fail("unterminated quoted string")
		}
		c := s[i]
		switch {
		case c == '\\':
			t.backslash = true
			if t.escapes {
				if i+1 >= len(s) {
					l.pos = t.start
					return l.fail("unterminated quoted string")
				}
				i += 2 // the escaped byte, whatever it is (a quote included)
				continue
			}
			i++
		case c == '\'':
			if t.kind != tokBitString && t.kind != tokHexString && i+1 < len(s) && s[i+1] == '\'' {
				i += 2 // '' is a quote
				continue
			}
			// The closing quote, unless the literal continues after white
			// space holding a newline (comments allowed, /* */ not).
			j, newline := i+1, false
			for j < len(s) {
				if isSpace(s[j]) { // \v too, as since PostgreSQL 16 (and pg_query)
					if s[j] == '\n' || s[j] == '\r' {
						newline = true
					}
					j++
				} else if s[j] == '-' && j+1 < len(s) && s[j+1] == '-' {
					for j < len(s) && s[j] != '\n' && s[j] != '\r' {
						j++
					}
				} else {
					break
				}
			}
			if newline && j < len(s) && s[j] == '\'' {
				i = j + 1
				continue
			}
			t.end = i + 1
			l.pos = t.end
			return t
		default:
			i++
		}
	}
}

// quotedIdent scans "..." (also the quoted part of U&"...").
func (l *lexer) quotedIdent(t token) token {
	s := l.src
	i := t.bodyStart
	for {
		if i >= len(s) {
			l.pos = t.start
			return l.fail("unterminated quoted identifier")
		}
		if s[i] == '"' {
			if i+1 < len(s) && s[i+1] == '"' {
				i += 2
				continue
			}
			break
		}
		i++
	}
	if i == t.bodyStart {
		l.pos = t.start
		return l.fail("zero-length delimited identifier")
	}
	t.end = i + 1
	l.pos = t.end
	return t
}

// uescape extends a U& token over a following UESCAPE 'c' clause, as the
// grammar's look-ahead does (comments and white space may come between).
func (l *lexer) uescape(t token) token {
	if l.err != nil {
		return t
	}
	t.uescEnd = t.end
	save := l.pos
	l.skipSpace()
	s, i := l.src, l.pos
	if l.err != nil || i+7 > len(s) || !equalFoldASCII(s[i:i+7], "uescape") || i+7 < len(s) && isIdentCont(s[i+7]) {
		if l.err == nil {
			l.pos = save
		}
		return t
	}
	l.pos = i + 7
	l.skipSpace()
	if l.pos < len(s) && s[l.pos] != '\'' && s[l.pos] != '$' && !(s[l.pos]|0x20 == 'e' && l.pos+1 < len(s) && s[l.pos+1] == '\'') {
		l.fail("UESCAPE must be followed by a simple string literal")
		return t
	}
	str := l.next() // a string token: it does not look ahead itself
	if l.err != nil {
		return t
	}
	if str.kind != tokString && str.kind != tokEString && str.kind != tokDollar {
		l.pos = i
		l.fail("UESCAPE must be followed by a simple string literal")
		return t
	}
	var buf [8]byte
	v, err := l.stringValue(str, buf[:0])
	if err != nil || len(v) != 1 || isHexDigit(v[0]) || v[0] == '+' || v[0] == '\'' || v[0] == '"' || isSpace(v[0]) {
		l.pos = str.start
		l.fail("invalid Unicode escape character")
		return t
	}
	t.esc = v[0]
	t.end = str.end
	return t
}

// dollar scans $tag$...$tag$ starting at start, or returns '$' alone when no
// delimiter starts there.
func (l *lexer) dollar(start int) token {
	s := l.src
	i := start + 1
	if i < len(s) && isIdentStart(s[i]) {
		i++
		for i < len(s) && isIdentStart(s[i]) || i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	if i >= len(s) || s[i] != '$' {
		l.pos = start + 1
		return token{kind: tokOther, start: start, end: l.pos}
	}
	delim := s[start : i+1]
	body := i + 1
	for j := body; j+len(delim) <= len(s); j++ {
		if s[j] == '$' && string(s[j:j+len(delim)]) == string(delim) {
			l.pos = j + len(delim)
			return token{kind: tokDollar, start: start, end: l.pos, bodyStart: body, uescEnd: j}
		}
	}
	l.pos = start
	return l.fail("unterminated dollar-quoted string")
}

// number scans a numeric constant (PostgreSQL 16's forms: decimal with
// underscores, 0x, 0o, 0b, exponent); trailing identifier characters are an
// error, as in the server since PostgreSQL 15.
func (l *lexer) number(start int) token {
	s := l.src
	i := start
	digits := func(ok func(byte) bool) {
		for i < len(s) && (ok(s[i]) || s[i] == '_' && i+1 < len(s) && ok(s[i+1])) {
			i++
		}
	}
	isOct := func(c byte) bool { return c >= '0' && c <= '7' }
	isBin := func(c byte) bool { return c == '0' || c == '1' }
	if s[i] == '0' && i+2 < len(s) && (s[i+1]|0x20 == 'x' && isHexDigit(s[i+2]) || s[i+1]|0x20 == 'o' && isOct(s[i+2]) || s[i+1]|0x20 == 'b' && isBin(s[i+2])) {
		f := isHexDigit
		switch s[i+1] | 0x20 {
		case 'o':
			f = isOct
		case 'b':
			f = isBin
		}
		i += 2
		digits(f)
	} else {
		digits(isDigit)
		if i+1 < len(s) && s[i] == '.' && s[i+1] == '.' {
			l.pos = i // 1..2: an integer, then ..
			return token{kind: tokNumber, start: start, end: i}
		}
		if i < len(s) && s[i] == '.' {
			i++
			digits(isDigit)
		}
		if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
			j := i + 1
			if j < len(s) && (s[j] == '+' || s[j] == '-') {
				j++
			}
			if j < len(s) && isDigit(s[j]) {
				i = j
				digits(isDigit)
			}
		}
	}
	if i < len(s) && isIdentStart(s[i]) {
		l.pos = i
		return l.fail("trailing junk after numeric literal")
	}
	l.pos = i
	return token{kind: tokNumber, start: start, end: i}
}

// operator scans a run of operator characters, stopped at a comment start,
// with the server's rule for a trailing + or -.
func (l *lexer) operator(start int) token {
	s := l.src
	if l.signs.start <= start && start < l.signs.end {
		l.pos = start + 1
		return token{kind: tokSelf, start: start, end: l.pos}
	}
	i := start
	for i < len(s) && isOpChar(s[i]) {
		if i > start && (s[i] == '*' && s[i-1] == '/' || s[i] == '-' && s[i-1] == '-') {
			i--
			break
		}
		i++
	}
	n := i - start
	// As the server's scanner: an operator of several characters ending in + or - loses its trailing signs
	// unless one of ~!@#^&|`?% comes before its last character.
	if n > 1 && (s[i-1] == '+' || s[i-1] == '-') && !bytes.ContainsAny(s[start:i-1], "~!@#^&|`?%") {
		for n > 1 && (s[start+n-1] == '+' || s[start+n-1] == '-') {
			n--
		}
		l.signs.start, l.signs.end = start+n, i
	}
	l.pos = start + n
	if n == 1 && isSelf(s[start]) {
		return token{kind: tokSelf, start: start, end: l.pos}
	}
	return token{kind: tokOp, start: start, end: l.pos}
}

func equalFoldASCII(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		if lower(b[i]) != s[i] {
			return false
		}
	}
	return true
}

// identValue appends the identifier's value, as the server stores it, to buf:
// unquoted ones ASCII-downcased, quoted ones with "" undoubled, U& ones with
// their escapes decoded; all truncated to namedatalen-1 bytes at a character
// boundary (the text is UTF-8). It reports false for a U& identifier with an
// invalid escape (the server rejects the text).
func (l *lexer) identValue(t token, buf []byte) ([]byte, bool) {
	s := l.src
	switch t.kind {
	case tokIdent:
		for _, c := range s[t.start:t.end] {
			buf = append(buf, lower(c))
		}
	case tokQIdent:
		buf = appendUndoubled(buf, s[t.bodyStart:t.end-1], '"')
	case tokUIdent:
		end := t.uescEnd - 1
		var ok bool
		if buf, ok = appendUnicodeEscaped(buf, s[t.bodyStart:end], '"', t.esc); !ok {
			return buf, false
		}
	default:
		return buf, false
	}
	return clipIdent(buf), true
}

// clipIdent truncates an identifier to namedatalen-1 bytes without splitting
// a UTF-8 character (pg_mbcliplen).
func clipIdent(b []byte) []byte {
	if len(b) < namedatalen {
		return b
	}
	n := namedatalen - 1
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return b[:n]
}

func appendUndoubled(buf, body []byte, q byte) []byte {
	for i := 0; i < len(body); i++ {
		buf = append(buf, body[i])
		if body[i] == q && i+1 < len(body) && body[i+1] == q {
			i++
		}
	}
	return buf
}

// appendUnicodeEscaped decodes the body of U&"..." or U&'...': doubled
// quotes, esc esc for esc, esc XXXX and esc + XXXXXX code points (surrogate
// pairs combined).
func appendUnicodeEscaped(buf, body []byte, q, esc byte) ([]byte, bool) {
	var high rune
	for i := 0; i < len(body); i++ {
		c := body[i]
		if c == q && i+1 < len(body) && body[i+1] == q {
			i++
		}
		if c != esc {
			if high != 0 {
				return buf, false
			}
			buf = append(buf, c)
			continue
		}
		if i+1 < len(body) && body[i+1] == esc {
			if high != 0 {
				return buf, false
			}
			buf = append(buf, esc)
			i++
			continue
		}
		n := 4
		j := i + 1
		if j < len(body) && body[j] == '+' {
			n, j = 6, j+1
		}
		if j+n > len(body) {
			return buf, false
		}
		var r rune
		for _, h := range body[j : j+n] {
			if !isHexDigit(h) {
				return buf, false
			}
			r = r<<4 | rune(hexVal(h))
		}
		i = j + n - 1
		switch {
		case r >= 0xD800 && r <= 0xDBFF:
			if high != 0 {
				return buf, false
			}
			high = r
			continue
		case r >= 0xDC00 && r <= 0xDFFF:
			if high == 0 {
				return buf, false
			}
			r = 0x10000 + (high-0xD800)<<10 + (r - 0xDC00)
			high = 0
		case high != 0:
			return buf, false
		}
		if r == 0 || r > utf8.MaxRune {
			return buf, false
		}
		buf = utf8.AppendRune(buf, r)
	}
	return buf, high == 0
}

func hexVal(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// stringValue appends the value of a string constant to buf, decoding escapes
// as the server does for its kind; the continuation white space between parts
// is dropped. bit and hex string values are their digits. The error is the server's
// refusal of the literal (an invalid escape, or bytes that are not UTF-8).
func (l *lexer) stringValue(t token, buf []byte) ([]byte, error) {
	s := l.src
	switch t.kind {
	case tokDollar:
		return append(buf, s[t.bodyStart:t.uescEnd]...), nil
	case tokUString:
		var raw []byte
		var small [64]byte
		raw = l.appendParts(small[:0], t, t.uescEnd)
		v, ok := appendUnicodeEscaped(buf, raw, 0, t.esc)
		if !ok {
			return v, fmt.Errorf("%w: invalid Unicode escape", errLex)
		}
		return v, nil
	case tokString, tokNString, tokEString, tokBitString, tokHexString:
	default:
		return buf, fmt.Errorf("%w: not a string", errLex)
	}
	if !t.escapes {
		return l.appendParts(buf, t, t.end), nil
	}
	var small [64]byte
	raw := l.appendParts(small[:0], t, t.end)
	start := len(buf)
	var high rune
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' || i+1 >= len(raw) {
			if high != 0 {
				return buf, fmt.Errorf("%w: invalid Unicode surrogate pair", errLex)
			}
			buf = append(buf, c)
			continue
		}
		i++
		c = raw[i]
		switch {
		case c >= '0' && c <= '7':
			v, n := 0, 0
			for n < 3 && i < len(raw) && raw[i] >= '0' && raw[i] <= '7' {
				v = v<<3 | int(raw[i]-'0')
				i++
				n++
			}
			i--
			buf = append(buf, byte(v))
		case c == 'x' && i+1 < len(raw) && isHexDigit(raw[i+1]):
			v := hexVal(raw[i+1])
			i++
			if i+1 < len(raw) && isHexDigit(raw[i+1]) {
				v = v<<4 | hexVal(raw[i+1])
				i++
			}
			buf = append(buf, v)
		case c == 'u' || c == 'U':
			n := 4
			if c == 'U' {
				n = 8
			}
			if i+1+n > len(raw) {
				return buf, fmt.Errorf("%w: invalid Unicode escape", errLex)
			}
			var r rune
			for _, h := range raw[i+1 : i+1+n] {
				if !isHexDigit(h) {
					return buf, fmt.Errorf("%w: invalid Unicode escape", errLex)
				}
				r = r<<4 | rune(hexVal(h))
			}
			i += n
			switch {
			case r >= 0xD800 && r <= 0xDBFF:
				if high != 0 {
					return buf, fmt.Errorf("%w: invalid Unicode surrogate pair", errLex)
				}
				high = r
				continue
			case r >= 0xDC00 && r <= 0xDFFF:
				if high == 0 {
					return buf, fmt.Errorf("%w: invalid Unicode surrogate pair", errLex)
				}
				r = 0x10000 + (high-0xD800)<<10 + (r - 0xDC00)
				high = 0
			case high != 0:
				return buf, fmt.Errorf("%w: invalid Unicode surrogate pair", errLex)
			}
			if r == 0 || r > utf8.MaxRune {
				return buf, fmt.Errorf("%w: invalid Unicode escape value", errLex)
			}
			buf = utf8.AppendRune(buf, r)
		case c == 'b':
			buf = append(buf, '\b')
		case c == 'f':
			buf = append(buf, '\f')
		case c == 'n':
			buf = append(buf, '\n')
		case c == 'r':
			buf = append(buf, '\r')
		case c == 't':
			buf = append(buf, '\t')
		default:
			buf = append(buf, c)
		}
	}
	if high != 0 {
		return buf, fmt.Errorf("%w: invalid Unicode surrogate pair", errLex)
	}
	if v := buf[start:]; !utf8.Valid(v) {
		return buf, fmt.Errorf("%w: invalid byte sequence for encoding \"UTF8\"", errLex)
	}
	for _, c := range buf[start:] {
		if c == 0 {
			return buf, fmt.Errorf("%w: invalid null character", errLex)
		}
	}
	return buf, nil
}

// appendParts appends the raw bodies of a quoted literal's parts (its
// continuations joined, quotes not undoubled for escape strings; doubled
// quotes undoubled otherwise) between t.bodyStart and end.
func (l *lexer) appendParts(buf []byte, t token, end int) []byte {
	s := l.src
	i := t.bodyStart
	for i < end {
		c := s[i]
		switch {
		case c == '\\' && t.escapes:
			buf = append(buf, c, s[i+1])
			i += 2
		case c == '\'':
			if t.kind != tokBitString && t.kind != tokHexString && i+1 < end && s[i+1] == '\'' {
				buf = append(buf, '\'')
				i += 2
				continue
			}
			// end of a part: skip to the next part's opening quote
			j := i + 1
			for j < end && s[j] != '\'' {
				if s[j] == '-' && j+1 < end && s[j+1] == '-' {
					for j < end && s[j] != '\n' && s[j] != '\r' {
						j++
					}
					continue
				}
				j++
			}
			i = j + 1
		default:
			buf = append(buf, c)
			i++
		}
	}
	return buf
}
