package rewrite

import "strings"

// prefilter is a case-insensitive multi-substring search over the SQL text.
// A needle is found when some position matches it byte for byte after ASCII
// lower-casing. A text may touch a protected table when it holds
//
//   - a write keyword (insert, update, delete, merge, copy) and a
//     protected table's name (also with its double quotes doubled, as written
//     inside a quoted identifier) or u& (a unicode-escaped identifier can spell
//     any name): only those statements can write a table, and keywords cannot
//     be quoted or escaped; or
//   - create and a protected name, or alter, drop, truncate or reassign alone
//     (DDL, ddl.go); or
//   - the token setting's first part (SET "fence"."token" and SET fence . token
//     are the same setting) or set_config, which the analysis must see.
//
// The keyword condition keeps reads of a protected table, which pgbench's
// select-only workload issues with a new literal every time, off the parser.
type prefilter struct {
	needles []needle
	// pair has bit (a<<8|b) set when some needle starts with bytes a, b
	// (lower-cased); single has a set when a needle is the one byte a.
	pair   [65536 / 8]byte
	single [256]uint8 // group bits of one-byte needles
}

type needle struct {
	text  string // lower-cased, non-empty
	group uint8
}

// Needle groups: a text may touch a protected table when it has needles of
// both groupName and groupWrite, or any needle of groupAlone.
const (
	groupName  uint8 = 1 << iota // protected table names, u&
	groupWrite                   // write keywords
	groupAlone                   // the token setting, set_config
)

func newPrefilter(tables []Table, setting string) prefilter {
	var p prefilter
	add := func(s string, group uint8) {
		s = lowerASCII(s)
		if s == "" {
			return
		}
		for i, n := range p.needles {
			if n.text == s {
				p.needles[i].group |= group
				if len(s) == 1 {
					p.single[s[0]] |= group
				}
				return
			}
		}
		p.needles = append(p.needles, needle{s, group})
		if len(s) == 1 {
			p.single[s[0]] |= group
		} else {
			i := int(s[0])<<8 | int(s[1])
			p.pair[i>>3] |= 1 << (i & 7)
		}
	}
	for _, t := range tables {
		add(t.Name, groupName)
		if strings.Contains(t.Name, `"`) {
			add(strings.ReplaceAll(t.Name, `"`, `""`), groupName)
		}
	}
	add("u&", groupName)
	for _, kw := range []string{"insert", "update", "delete", "merge", "copy", "create"} {
		add(kw, groupWrite)
	}
	// DDL must reach the DDL rule (ddl.go). CREATE matters only with a
	// protected name; ALTER, DROP, TRUNCATE and REASSIGN (matched as "ssign")
	// can reach a protected table without naming it (a schema rename, DROP ...
	// CASCADE, TRUNCATE ... CASCADE, DROP/REASSIGN OWNED), so any text with
	// them is parsed; they are rare outside migrations. Few new first-two-byte
	// pairs (al, cr, dr, ss) keep the scan of reads cheap.
	for _, kw := range []string{"alter", "drop", "truncate", "ssign"} {
		add(kw, groupAlone)
	}
	first, _, _ := strings.Cut(setting, ".")
	add(first, groupAlone)
	add("set_config", groupAlone)
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

// enough reports whether the groups found so far make the text one to parse.
func enough(found uint8) bool {
	return found&groupAlone != 0 || found&(groupName|groupWrite) == groupName|groupWrite
}

// mayTouch reports whether text may touch a protected table or the token
// setting (see prefilter). It does not allocate.
func mayTouch[T string | []byte](p *prefilter, text T) bool {
	n := len(text)
	var found uint8
	for i := 0; i < n; i++ {
		a := lower(text[i])
		if g := p.single[a]; g != 0 {
			if found |= g; enough(found) {
				return true
			}
		}
		if i == n-1 {
			break
		}
		pi := int(a)<<8 | int(lower(text[i+1]))
		if p.pair[pi>>3]&(1<<(pi&7)) == 0 {
			continue
		}
		for _, nd := range p.needles {
			if len(nd.text) < 2 || nd.text[0] != a || len(nd.text) > n-i || found&nd.group == nd.group {
				continue
			}
			j := 1
			for j < len(nd.text) && lower(text[i+j]) == nd.text[j] {
				j++
			}
			if j == len(nd.text) {
				if found |= nd.group; enough(found) {
					return true
				}
			}
		}
	}
	return false
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
