package rewrite

import (
	"strconv"
	"strings"
)

// ValidToken reports whether s is a valid fencing token and returns its value.
//
// The rule, which the SQL check in every fenced statement applies to the
// setting's value too: s is 1 to 19 ASCII digits (leading zeros allowed, no
// sign, no spaces) and its value is in 1..9223372036854775807. In SQL:
// s ~ '^[0-9]{1,19}$' and not s ~ '^0+$' and not (length(s) = 19 and
// s > '9223372036854775807' in the C collation).
func ValidToken(s string) (int64, bool) {
	if len(s) < 1 || len(s) > 19 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 1 {
		return 0, false
	}
	return v, true
}

// tokenDigits is a regular expression (the syntax PostgreSQL's and Go's
// engines share) matching exactly the strings of 1 to 19 ASCII digits whose
// value is at most 9223372036854775807, leading zeros allowed: any 1 to 18
// digits, or 19 digits that are, digit by digit from the left, equal to the
// maximum's up to one that is smaller.
func tokenDigits() string {
	const max = "9223372036854775807"
	alts := []string{"[0-9]{1,18}"}
	for i := 0; i < len(max); i++ {
		if max[i] == '0' {
			continue // no smaller digit here
		}
		alt := max[:i] + "[0-" + string(max[i]-1) + "]"
		if rest := len(max) - 1 - i; rest > 0 {
			alt += "[0-9]{" + strconv.Itoa(rest) + "}"
		}
		alts = append(alts, alt)
	}
	return "(" + strings.Join(append(alts, max), "|") + ")"
}

// tokenPattern is ValidToken as one PostgreSQL regular expression (an ARE):
// not all zeros, and tokenDigits. The fence's SQL matches the setting's value
// against it: one operator and one constant for the server to parse and
// plan, where a check built from string functions costs several function
// lookups in every statement; PostgreSQL compiles it once per session.
func tokenPattern() string { return "^(?!0+$)" + tokenDigits() + "$" }
