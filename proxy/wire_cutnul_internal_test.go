package proxy

import (
	"bytes"
	"testing"
)

// cutNul is the one split of protocol strings (startup parameters, SASL mechanisms, Query and Parse texts): the
// first NUL ends the string, whatever follows it, and a body with none is malformed.
func TestCutNulSplitsAtTheFirstNul(t *testing.T) {
	for _, c := range []struct {
		in            string
		before, after string
		ok            bool
	}{
		{"", "", "", false},
		{"no end", "", "", false},
		{"\x00", "", "", true},
		{"SELECT 1\x00", "SELECT 1", "", true},
		{"name\x00SELECT 1\x00\x00\x01", "name", "SELECT 1\x00\x00\x01", true},
		{"\x00\x00", "", "\x00", true},
		{string(bytes.Repeat([]byte("x"), 300)) + "\x00tail", string(bytes.Repeat([]byte("x"), 300)), "tail", true},
	} {
		before, after, ok := cutNul([]byte(c.in))
		if ok != c.ok || string(before) != c.before || string(after) != c.after {
			t.Errorf("cutNul(%q) = %q, %q, %v; want %q, %q, %v", c.in, before, after, ok, c.before, c.after, c.ok)
		}
	}
}
