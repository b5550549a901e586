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

// TestSASLprepTables: the generated tables are what runeRanges.has's binary search needs (sorted ranges that
// neither overlap nor run backwards), and hold what RFC 3454 lists at their edges.
func TestSASLprepTables(t *testing.T) {
	for name, tab := range map[string]runeRanges{"spaces": saslprepSpaces, "nothing": saslprepNothing,
		"prohibited": saslprepProhibited, "unassigned": saslprepUnassigned, "RandAL": saslprepRandAL, "L": saslprepL} {
		for i, rg := range tab {
			if rg[0] > rg[1] || i > 0 && tab[i-1][1] >= rg[0] {
				t.Errorf("table %s: range %d %X unsorted or overlapping", name, i, rg)
			}
		}
	}
	for _, c := range []struct {
		tab  runeRanges
		r    rune
		want bool
	}{
		{saslprepSpaces, 0x00A0, true}, {saslprepSpaces, 0x0020, false}, {saslprepSpaces, 0x3000, true},
		{saslprepNothing, 0x00AD, true}, {saslprepNothing, 0xFEFF, true}, {saslprepNothing, 0x00AC, false},
		{saslprepProhibited, 0x0000, true}, {saslprepProhibited, 0x10FFFF, true}, {saslprepProhibited, 'a', false},
		{saslprepUnassigned, 0x0221, true}, {saslprepUnassigned, 0xEFFFD, true}, {saslprepUnassigned, 0x0220, false},
		{saslprepRandAL, 0x05BE, true}, {saslprepRandAL, 0xFEFC, true}, {saslprepRandAL, 'a', false},
		{saslprepL, 'A', true}, {saslprepL, 0x10FFFD, true}, {saslprepL, '1', false},
	} {
		if got := c.tab.has(c.r); got != c.want {
			t.Errorf("has(%U) = %v, want %v", c.r, got, c.want)
		}
	}
}
