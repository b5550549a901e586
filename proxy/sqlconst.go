package proxy

import (
	"fmt"
	"strings"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// setConstant is v, a value of the client's in its client encoding (set), as a string constant for SET
// (where an expression, textExpr's form, cannot go) that reads the same whatever the session's client_encoding,
// standard_conforming_strings and backslash_quote: ASCII without a backslash, quoted as it is; anything else an
// escape string constant of ASCII, its backslashes doubled and its other characters Unicode escapes, which the
// server takes when its encoding is UTF8. ok is false when there is no such constant: v cannot be read exactly in
// the client encoding, or holds a character beyond ASCII and the server's encoding is not UTF8.
func setConstant(v string, set rewrite.Settings) (string, bool) {
	if plainASCII(v) {
		return "'" + strings.ReplaceAll(v, "'", "''") + "'", true
	}
	u, ok := rewrite.ToUTF8([]byte(v), set)
	if !ok {
		return "", false
	}
	var b strings.Builder
	b.WriteString("E'")
	for _, r := range u {
		switch {
		case r == '\'':
			b.WriteString("''")
		case r == '\\':
			b.WriteString(`\\`)
		case r >= 0x20 && r < 0x7f:
			b.WriteRune(r)
		case r == 0 || r >= 0x80 && set.ServerEncoding != "UTF8":
			return "", false
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			fmt.Fprintf(&b, `\U%08X`, r)
		}
	}
	b.WriteString("'")
	return b.String(), true
}

// plainASCII reports whether s is ASCII without a backslash or a zero byte: quoted with its quotes doubled, it
// reads the same in every client encoding and under every setting.
func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 0x80 || c == '\\' || c == 0 {
			return false
		}
	}
	return true
}
