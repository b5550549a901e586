package rewrite

// Statements counts the statements of a text as the lexer splits it at its semicolons (empty ones not
// counted); ok is false when the text cannot be read exactly as the server would read it under s. It may count
// more than the server runs (a BEGIN ATOMIC body holds semicolons), never fewer: a caller that must know a text
// is one statement treats more as several.
func Statements(raw []byte, s Settings) (n int, ok bool) {
	text, why := decode(raw, s)
	if why != "" {
		return 0, false
	}
	l := newLexer(text, s.StandardConformingStrings)
	inStmt := false
	for t := l.next(); t.kind != tokEOF; t = l.next() {
		if t.kind == tokSemicolon {
			inStmt = false
			continue
		}
		if !inStmt {
			n++
			inStmt = true
		}
	}
	return n, l.err == nil
}
