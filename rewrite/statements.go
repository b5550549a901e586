package rewrite

// Statements counts the statements of a text as the lexer splits it at its semicolons (empty ones not
// counted); ok is false when the text cannot be read exactly as the server would read it under s. It may count
// more than the server runs (a BEGIN ATOMIC body holds semicolons), never fewer: a caller that must know a text
// is one statement treats more as several.
func Statements(raw []byte, s Settings) (n int, ok bool) {
	lx, err := Lex(raw, s) // the planner's own reading: one loop over the tokens counts statements for both
	return lx.Statements, err == nil
}

// CommitsPrepared reports whether a text may end a prepared transaction (COMMIT PREPARED or ROLLBACK PREPARED)
// when the server reads it under s: whether, among its tokens as the lexer reads them (comments and white space
// between, any case), the keyword COMMIT or ROLLBACK is followed by the keyword PREPARED. A prepared
// transaction's writes were made by a transaction that has ended (PREPARE TRANSACTION), so only the text that
// ends it shows them, and only a top-level statement can: PostgreSQL refuses both inside a transaction block
// and from a function, a procedure or a DO block, and PREPARE cannot hold them. The words inside a string, a
// quoted identifier, a comment or a column named prepared_at are not these keywords. True also when the text
// cannot be read exactly as the server would read it (fail closed).
func CommitsPrepared(raw []byte, s Settings) bool {
	text, why := decode(raw, s)
	if why != "" {
		return true
	}
	l := newLexer(text, s.StandardConformingStrings)
	ending := false // the token before was the keyword COMMIT or ROLLBACK
	for t := l.next(); t.kind != tokEOF; t = l.next() {
		word := text[t.start:t.end]
		if t.kind == tokIdent && ending && equalFoldASCII(word, "prepared") {
			return true
		}
		ending = t.kind == tokIdent && (equalFoldASCII(word, "commit") || equalFoldASCII(word, "rollback"))
	}
	return l.err != nil
}
