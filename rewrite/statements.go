package rewrite

// Statements counts the statements of a text as the lexer splits it at its semicolons (empty ones not
// counted); ok is false when the text cannot be read exactly as the server would read it under s. It may count
// more than the server runs (a BEGIN ATOMIC body holds semicolons), never fewer: a caller that must know a text
// is one statement treats more as several.
func Statements(raw []byte, s Settings) (n int, ok bool) {
	lx, err := Lex(raw, s) // the planner's own reading: one loop over the tokens counts statements for both
	return lx.Statements, err == nil
}
