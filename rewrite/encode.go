package rewrite

import (
	"bytes"
	"unicode/utf8"
)

// ToUTF8 is b, text in the PostgreSQL client encoding named clientEncoding (as ParameterStatus reports it), as
// UTF-8; ok is false for an encoding the proxy cannot read or bytes that are not valid in it.
func ToUTF8(clientEncoding string, b []byte) (string, bool) {
	switch clientEncoding {
	case "UTF8":
		return string(b), utf8.Valid(b)
	case "SQL_ASCII":
		for _, c := range b {
			if c >= 0x80 {
				return "", false
			}
		}
		return string(b), true
	}
	enc, ok := pgEncoding(clientEncoding)
	if !ok {
		return "", false
	}
	// A decoder replaces what it cannot read; encoding the result back tells an exact reading from that.
	out, err := enc.NewDecoder().Bytes(b)
	if err != nil || !utf8.Valid(out) {
		return "", false
	}
	if back, err := enc.NewEncoder().Bytes(out); err != nil || !bytes.Equal(back, b) {
		return "", false
	}
	return string(out), true
}
