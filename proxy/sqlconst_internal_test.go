package proxy

import (
	"testing"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

func TestSetConstant(t *testing.T) {
	for _, c := range []struct {
		v, enc     string
		serverUTF8 bool
		want       string
		ok         bool
	}{
		{"42", "UTF8", true, "'42'", true},
		{"o'k", "SJIS", false, "'o''k'", true},
		{`a\b`, "UTF8", false, `E'a\\b'`, true},
		{"\x95\x5c'x", "SJIS", true, `E'\u8868''x'`, true}, // 表 then a quote: ASCII only, nothing for SJIS to join
		{"é", "UTF8", true, `E'\u00E9'`, true},
		{"é", "UTF8", false, "", false},
		{"\U0001F600", "UTF8", true, `E'\U0001F600'`, true},
		{"\x95", "SJIS", true, "", false}, // half a character
		{"\xff", "UTF8", true, "", false},
		{"tab\there", "UTF8", false, "'tab\there'", true}, // a control character is ASCII: as it is
	} {
		server := "LATIN1"
		if c.serverUTF8 {
			server = "UTF8"
		}
		got, ok := setConstant(c.v, rewrite.Settings{ClientEncoding: c.enc, ServerEncoding: server, StandardConformingStrings: true})
		if got != c.want || ok != c.ok {
			t.Errorf("setConstant(%q, %s, %v) = %q, %v; want %q, %v", c.v, c.enc, c.serverUTF8, got, ok, c.want, c.ok)
		}
	}
}
