package auth

import "testing"

// TestSASLprep: RFC 4013's examples (section 3), where PostgreSQL's rule differs from the RFC's error (the raw
// password is used instead), and the checks made before NFKC as pg_saslprep makes them.
func TestSASLprep(t *testing.T) {
	for _, c := range []struct{ in, want, why string }{
		{"I\u00adX", "IX", "RFC 4013: SOFT HYPHEN mapped to nothing"},
		{"user", "user", "RFC 4013: no transformation"},
		{"USER", "USER", "RFC 4013: case preserved"},
		{"\u00aa", "a", "RFC 4013: output is NFKC"},
		{"\u2168", "IX", "RFC 4013: output is NFKC"},
		{"\u0007", "\u0007", "RFC 4013: prohibited character (ASCII: taken as it is)"},
		{"\u0627\u0031", "\u0627\u0031", "RFC 4013: bidi check fails, raw bytes"},
		{"pass\u00a0wo\u00adrd", "pass word", "non-ASCII space to a space, soft hyphen removed"},
		{"\u3000\u1680\u200b", "   ", "spaces of C.1.2 (U+200B is in B.1 too; mapping to a space wins)"},
		{"\xffpass\u00a0", "\xffpass\u00a0", "not UTF-8, raw bytes"},
		{"\u00ad", "\u00ad", "nothing left after mapping, raw bytes"},
		{"\u00e9\u0007", "\u00e9\u0007", "prohibited control character, raw bytes"},
		{"a\u0221", "a\u0221", "unassigned in Unicode 3.2, raw bytes"},
		{"\u00e9\ue000", "\u00e9\ue000", "private use, raw bytes"},
		{"\u0627x\u0628", "\u0627x\u0628", "right-to-left text with a left-to-right letter, raw bytes"},
		{"\u0627\u0628", "\u0627\u0628", "right-to-left text"},
		{"\u0627\u2100\u0627", "\u0627a/c\u0627", "checked before NFKC: U+2100 is no letter until normalized"},
		{"e\u0301", "\u00e9", "composed"},
	} {
		if got := SASLprep(c.in); got != c.want {
			t.Errorf("SASLprep(%+q) = %+q, want %+q (%s)", c.in, got, c.want, c.why)
		}
	}
}

// TestSCRAMKeysPrepped: the keys of a password are those of its SASLprepped form, as the server's secret is.
func TestSCRAMKeysPrepped(t *testing.T) {
	salt := []byte("sixteen byte slt")
	ck1, sk1, err := SCRAMKeys("pass\u00a0wo\u00adrd", salt, 4096)
	if err != nil {
		t.Fatal(err)
	}
	ck2, sk2, err := SCRAMKeys("pass word", salt, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if ck1 != ck2 || sk1 != sk2 {
		t.Fatal("the keys of a password differ from those of its SASLprepped form")
	}
}
