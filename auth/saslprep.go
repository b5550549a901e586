package auth

import (
	"slices"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

//go:generate sh -c "python3 gen_saslprep_tables.py > saslprep_tables.go"

// runeRanges is a sorted list of inclusive code point ranges, one of RFC 3454's tables.
type runeRanges [][2]rune

func (t runeRanges) has(r rune) bool {
	_, found := slices.BinarySearchFunc(t, r, func(rg [2]rune, r rune) int {
		switch {
		case rg[1] < r:
			return -1
		case rg[0] > r:
			return 1
		}
		return 0
	})
	return found
}

// SASLprep is the password PostgreSQL derives SCRAM keys from (its pg_saslprep, RFC 4013), so that a password
// the server prepared logs in from here too: ASCII as it is; otherwise non-ASCII spaces mapped to U+0020, the
// characters of RFC 3454 B.1 removed (U+00AD, zero-width joiners), then NFKC. Where PostgreSQL gives up (not
// UTF-8, nothing left after mapping, a prohibited or Unicode 3.2 unassigned character, a string that breaks the
// bidirectional rule) it uses the password's raw bytes, and so does SASLprep: a result other than the server's
// fails the login. As in PostgreSQL the checks look at the mapped string before NFKC, not at the output.
func SASLprep(password string) string {
	ascii := true
	for i := 0; i < len(password); i++ {
		if password[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii || !utf8.ValidString(password) {
		return password
	}
	mapped := make([]rune, 0, len(password))
	for _, r := range password {
		switch {
		case saslprepSpaces.has(r):
			mapped = append(mapped, ' ')
		case saslprepNothing.has(r):
		default:
			mapped = append(mapped, r)
		}
	}
	if len(mapped) == 0 {
		return password
	}
	randAL := false
	for _, r := range mapped {
		if saslprepProhibited.has(r) || saslprepUnassigned.has(r) {
			return password
		}
		randAL = randAL || saslprepRandAL.has(r)
	}
	if randAL {
		// RFC 3454 section 6: right-to-left text has no left-to-right character and starts and ends right-to-left.
		if !saslprepRandAL.has(mapped[0]) || !saslprepRandAL.has(mapped[len(mapped)-1]) {
			return password
		}
		for _, r := range mapped {
			if saslprepL.has(r) {
				return password
			}
		}
	}
	return norm.NFKC.String(string(mapped))
}
