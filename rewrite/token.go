package rewrite

import "strconv"

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
