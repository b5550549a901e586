package rewrite

import "strings"

// prefilter holds what the token-level prefilter (Rewriter.scan) looks for:
// the protected tables' names as PostgreSQL stores them, and the token
// setting's first part (SET "fence"."token" and SET fence . token are the
// same setting). It is immutable after newPrefilter.
type prefilter struct {
	relnames     []string
	lengths      uint64 // bit n set: some name has n bytes (names of 64 bytes or more are never matched whole)
	settingFirst string // lower-cased
}

func newPrefilter(tables []Table, setting string) prefilter {
	var p prefilter
	for _, t := range tables {
		p.relnames = append(p.relnames, t.Name)
		if len(t.Name) < 64 {
			p.lengths |= 1 << len(t.Name)
		}
	}
	first, _, _ := strings.Cut(setting, ".")
	p.settingFirst = lowerASCII(first)
	return p
}

// names reports whether an identifier's value is a protected table's name.
func (p *prefilter) names(v []byte) bool {
	if len(v) >= 64 || p.lengths&(1<<len(v)) == 0 {
		return false
	}
	for _, n := range p.relnames {
		if n == string(v) {
			return true
		}
	}
	return false
}

// namesFolded is names for the value of an unquoted identifier shorter than
// namedatalen: word ASCII-downcased.
func (p *prefilter) namesFolded(word []byte) bool {
	if p.lengths&(1<<len(word)) == 0 {
		return false
	}
	for _, n := range p.relnames {
		if len(n) == len(word) && equalFoldASCII(word, n) {
			return true
		}
	}
	return false
}

// alone reports whether an identifier's value makes the text one to analyse
// by itself: set_config, a name holding the token setting's first part, the
// name of a schema of the in-database guard (DDL on it is refused: ddl.go),
// whatever the token setting is called, or search_path and SCHEMA (SET SCHEMA
// 'x' sets it), which may not name that schema (guardpath.go).
func (p *prefilter) alone(v []byte) bool {
	return len(v) >= len(p.settingFirst) && (equalFoldASCII(v, "set_config") || containsFoldBytes(v, p.settingFirst)) ||
		(len(v) == len("fenceproxy") || len(v) == len("fenceproxy_ddl")) && isGuardSchema(string(v)) ||
		equalFoldASCII(v, "search_path") || equalFoldASCII(v, "schema")
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

// mentions returns the label of the first protected table whose name appears
// in text (ASCII case-insensitively, also with its double quotes doubled), or
// "".
func (r *Rewriter) mentions(text string) string {
	for _, e := range r.tables {
		if containsFold(text, e.Name) || containsFold(text, strings.ReplaceAll(e.Name, `"`, `""`)) {
			return e.label
		}
	}
	return ""
}
