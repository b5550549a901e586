package rewrite

import "strings"

// prefilter is a case-insensitive multi-substring search over the SQL text.
// A needle is found when some position matches it byte for byte after ASCII
// lower-casing. Needles: every protected table name (also with its double
// quotes doubled, as written inside a quoted identifier), the token setting's
// first part (SET "fence"."token" and SET fence . token are the same setting),
// set_config (whose arguments may be any string expression), and u&" (a
// unicode-escaped identifier can spell any name).
type prefilter struct {
	needles []string // lower-cased, non-empty
	// pair has bit (a<<8|b) set when some needle starts with bytes a, b
	// (lower-cased); single has a set when a needle is the one byte a.
	pair   [65536 / 8]byte
	single [256]bool
}

func newPrefilter(tables []Table, setting string) prefilter {
	var p prefilter
	add := func(s string) {
		s = lowerASCII(s)
		if s == "" {
			return
		}
		for _, n := range p.needles {
			if n == s {
				return
			}
		}
		p.needles = append(p.needles, s)
		if len(s) == 1 {
			p.single[s[0]] = true
		} else {
			i := int(s[0])<<8 | int(s[1])
			p.pair[i>>3] |= 1 << (i & 7)
		}
	}
	for _, t := range tables {
		add(t.Name)
		if strings.Contains(t.Name, `"`) {
			add(strings.ReplaceAll(t.Name, `"`, `""`))
		}
	}
	first, _, _ := strings.Cut(setting, ".")
	add(first)
	add("set_config")
	add(`u&"`)
	return p
}

func lowerASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		b[i] = lower(c)
	}
	return string(b)
}

func lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// mayTouch reports whether text contains a needle. It does not allocate.
func mayTouch[T string | []byte](p *prefilter, text T) bool {
	n := len(text)
	if n == 0 {
		return false
	}
	for i := 0; i < n-1; i++ {
		a := lower(text[i])
		if p.single[a] {
			return true
		}
		pi := int(a)<<8 | int(lower(text[i+1]))
		if p.pair[pi>>3]&(1<<(pi&7)) == 0 {
			continue
		}
		for _, nd := range p.needles {
			if len(nd) < 2 || nd[0] != a || len(nd) > n-i {
				continue
			}
			j := 1
			for j < len(nd) && lower(text[i+j]) == nd[j] {
				j++
			}
			if j == len(nd) {
				return true
			}
		}
	}
	return p.single[lower(text[n-1])]
}

// mentions returns the label of the first protected table whose name appears
// in text (as mayTouch would find it), or "".
func (r *Rewriter) mentions(text string) string {
	for _, e := range r.tables {
		if containsFold(text, e.Name) || containsFold(text, strings.ReplaceAll(e.Name, `"`, `""`)) {
			return e.label
		}
	}
	return ""
}
