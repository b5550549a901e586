package rewrite

// ToUTF8 is b, text in the session's client encoding (s), as UTF-8, read as the server reads it (decode, the
// lexer's own rule); ok is false where decode refuses: an encoding the proxy cannot read, bytes not valid in it,
// or a reading that is not exact.
func ToUTF8(b []byte, s Settings) (string, bool) {
	text, why := decode(b, s)
	return string(text), why == ""
}
