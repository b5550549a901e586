package rewrite

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// TestTokenPattern: the regular expression the fence's SQL checks the token with (sqlRuleValid) accepts exactly
// what ValidToken accepts, near the maximum and at every length; internal/hostile runs the pattern itself in
// PostgreSQL at the bounds.
func TestTokenPattern(t *testing.T) {
	if p := tokenPattern(); p != "^(?!0+$)"+tokenDigits()+"$" {
		t.Fatalf("tokenPattern is %q", p)
	}
	cases := []string{"", "0", "00", "1", "01", "007", "9223372036854775807", "9223372036854775808", "09223372036854775807",
		"0000000000000000001", "00000000000000000001", "922337203685477580", "9999999999999999999", "10000000000000000000",
		"-1", "+1", " 1", "1 ", "1\n", "1a", "٣", "1.0", "1e3", "0x10", "9223372036854775806", "9223372036854775800",
		"9223372036854775799", "9223372036854775810", "9223372036854775900", "9223372036854776807", "9223372036954775807",
		"9300000000000000000", "8999999999999999999", "999999999999999999"}
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		// Numbers near the maximum, and digit strings of every length with leading zeros.
		v := uint64(9223372036854775807) - uint64(rnd.IntN(2000000)) + 1000000
		cases = append(cases, strconv.FormatUint(v, 10), strings.Repeat("0", rnd.IntN(4))+strconv.FormatUint(rnd.Uint64()>>rnd.IntN(64), 10))
		b := []byte(strconv.FormatUint(v, 10))
		b[rnd.IntN(len(b))] = byte('0' + rnd.IntN(10))
		cases = append(cases, string(b))
	}
	for _, s := range cases {
		_, valid := ValidToken(s)
		if got := sqlRuleValid(s); got != valid {
			t.Errorf("%q: pattern says %v, ValidToken %v", s, got, valid)
		}
	}
}
