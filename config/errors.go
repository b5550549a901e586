package config

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// A configuration is checked in one pass that collects every problem it finds (unknown keys, values of the wrong
// type, values out of range, required keys that are missing) and reports them all, sorted by line, one a line, in
// one form: FILE:LINE: KEY: PROBLEM (FILE:LINE: PROBLEM for YAML syntax, which has no key and stops the pass).
// An operator who fixes the first of four mistakes must not meet the second only on the next start.

// problem is one thing wrong with a configuration.
type problem struct {
	line int
	key  string // dotted key ("upstream.address", "tables[0].name"); "" for YAML syntax
	text string
	// absent marks a problem with a key the file does not contain (a required key that is missing): an unknown
	// key that is a near miss of it explains it, so the two are reported as one line.
	absent bool
}

func (p problem) render(file string) string {
	if p.key == "" {
		return fmt.Sprintf("%s:%d: %s", file, p.line, p.text)
	}
	return fmt.Sprintf("%s:%d: %s: %s", file, p.line, p.key, p.text)
}

// unknownKey is a key the configuration does not have, and the one it probably meant ("" when none is close).
type unknownKey struct {
	problem
	meant string // full dotted key of the suggestion
}

// report collects the problems of one configuration.
type report struct {
	file      string
	lines     map[string]int // the line of every key the file contains
	structure []problem      // wrong shapes and duplicate keys (checkKeys) and values of the wrong type (decode)
	unknown   []unknownKey
	invalid   []problem // validation of the decoded values
}

// add records a validation problem with key, at the key's line or, when the file does not contain it, at the
// nearest enclosing key the file contains (line 1 when none).
func (r *report) add(key, format string, args ...any) {
	p := problem{key: key, text: fmt.Sprintf(format, args...), line: 1}
	_, present := r.lines[key]
	p.absent = !present
	for k := key; k != ""; {
		if line, ok := r.lines[k]; ok {
			p.line = line
			break
		}
		i := strings.LastIndexAny(k, ".[")
		if i < 0 {
			break
		}
		k = k[:i]
	}
	r.invalid = append(r.invalid, p)
}

// err renders the collected problems, nil when there are none.
func (r *report) err() error {
	var all []problem
	all = append(all, r.structure...)
	folded := make([]bool, len(r.invalid))
	for _, u := range r.unknown {
		p := u.problem
		if u.meant != "" {
			p.text += fmt.Sprintf("; did you mean %q?", u.meant[lastKeyStart(u.meant):])
			// The required keys the misspelling left missing are this mistake, not another one.
			for i, v := range r.invalid {
				if v.absent && !folded[i] && within(v.key, u.meant) {
					p.text += fmt.Sprintf(" (so %s is missing: %s)", v.key, v.text)
					folded[i] = true
				}
			}
		}
		all = append(all, p)
	}
	for i, v := range r.invalid {
		if folded[i] || r.explained(v.key) {
			continue
		}
		all = append(all, v)
	}
	if len(all) == 0 {
		return nil
	}
	slices.SortStableFunc(all, func(a, b problem) int { return cmp.Compare(a.line, b.line) })
	errs := make([]error, len(all))
	for i, p := range all {
		errs[i] = errors.New(p.render(r.file))
	}
	return errors.Join(errs...)
}

// explained reports whether key's value could not be read (a wrong shape or type at it or around it): what
// validation says about the zero value left there is a consequence, not a second mistake.
func (r *report) explained(key string) bool {
	for _, p := range r.structure {
		if p.key != "" && within(key, p.key) {
			return true
		}
	}
	return false
}

// within reports whether key is outer or inside it (outer.x, outer[0]).
func within(key, outer string) bool {
	return key == outer || strings.HasPrefix(key, outer+".") || strings.HasPrefix(key, outer+"[")
}

// lastKeyStart is where the last component of a dotted key starts.
func lastKeyStart(key string) int {
	return strings.LastIndexAny(key, ".]") + 1
}

// checkKeys walks the YAML tree alongside the Go type, records the line of every key it sees so that validation
// can point at it, and reports keys the type does not have (with the nearest key it has), duplicate keys and
// values of the wrong shape. It knows no key by name: a field added to Config is checked the same way.
func (r *report) checkKeys(n *yaml.Node, t reflect.Type, path string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	isNull := n.Kind == yaml.ScalarNode && n.Tag == "!!null"
	switch t.Kind() {
	case reflect.Struct:
		if t == reflect.TypeOf(time.Duration(0)) || isNull {
			return
		}
		if n.Kind != yaml.MappingNode {
			r.structure = append(r.structure, problem{line: n.Line, key: displayPath(path), text: "expected a mapping"})
			return
		}
		fields := map[string]reflect.Type{}
		var names []string
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if tag != "" && tag != "-" {
				fields[tag] = f.Type
				names = append(names, tag)
			}
		}
		present := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			present[n.Content[i].Value] = true
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			key := joinPath(path, k.Value)
			ft, ok := fields[k.Value]
			if !ok {
				u := unknownKey{problem: problem{line: k.Line, key: key, text: "unknown key"}}
				if s := nearest(k.Value, names, present); s != "" {
					u.meant = joinPath(path, s)
				}
				r.unknown = append(r.unknown, u)
				continue
			}
			if _, dup := r.lines[key]; dup {
				r.structure = append(r.structure, problem{line: k.Line, key: key, text: fmt.Sprintf("duplicate key (first at line %d)", r.lines[key])})
				continue
			}
			r.lines[key] = k.Line
			r.checkKeys(v, ft, key)
		}
	case reflect.Slice:
		if isNull {
			return
		}
		if n.Kind != yaml.SequenceNode {
			r.structure = append(r.structure, problem{line: n.Line, key: displayPath(path), text: "expected a list"})
			return
		}
		for i, item := range n.Content {
			ip := fmt.Sprintf("%s[%d]", path, i)
			r.lines[ip] = item.Line
			r.checkKeys(item, t.Elem(), ip)
		}
	}
}

// nearest is the key among names (not already in the mapping) that key is most likely a misspelling of: within a
// few edits (a transposition is one), or "" when none is that close.
func nearest(key string, names []string, present map[string]bool) string {
	limit := max(1, min(3, len(key)/3))
	best, bestDist := "", limit+1
	for _, name := range names {
		if present[name] {
			continue
		}
		if d := editDistance(strings.ToLower(key), name); d < bestDist {
			best, bestDist = name, d
		}
	}
	return best
}

// editDistance is the optimal string alignment distance: insertions, deletions, substitutions and transpositions
// of adjacent bytes each count one.
func editDistance(a, b string) int {
	rows := make([][]int, len(a)+1)
	for i := range rows {
		rows[i] = make([]int, len(b)+1)
		rows[i][0] = i
	}
	for j := range rows[0] {
		rows[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d := min(rows[i-1][j]+1, rows[i][j-1]+1, rows[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d = min(d, rows[i-2][j-2]+1)
			}
			rows[i][j] = d
		}
	}
	return rows[len(a)][len(b)]
}

// The YAML library reports problems as "yaml: line N: problem" (syntax) and, for values that do not fit their
// Go type, as a list of "line N: cannot unmarshal ..." entries. Both are rewritten here into the form above.

var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// syntaxError rewrites an error of yaml.Unmarshal.
func syntaxError(file string, err error) error {
	msg := err.Error()
	m := yamlLine.FindStringSubmatch(msg)
	if m == nil {
		return fmt.Errorf("%s:1: %s", file, strings.TrimPrefix(msg, "yaml: "))
	}
	problem := m[2]
	switch {
	case strings.Contains(problem, "did not find expected"), strings.Contains(problem, "mapping values are not allowed"),
		strings.Contains(problem, "violates indentation"), strings.Contains(problem, "cannot start any token"):
		// The library's line is where it noticed, which can be the line before the mistake.
		problem += " (YAML syntax, at or just after this line: check the indentation; use spaces, not tabs)"
	default:
		problem += " (YAML syntax)"
	}
	return fmt.Errorf("%s:%s: %s", file, m[1], problem)
}

// decodeProblems records the errors of yaml.Node.Decode, naming the key whose value is on the reported line; a
// line that already has a wrong-shape problem is not reported twice.
func (r *report) decodeProblems(err error) {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		r.structure = append(r.structure, problem{line: 1, text: strings.TrimPrefix(err.Error(), "yaml: ")})
		return
	}
	keyAt := map[int]string{}
	for k, l := range r.lines {
		// The deepest key on a line is the one whose value is there (tables[0] and tables[0].name share one).
		if cur, ok := keyAt[l]; !ok || len(k) > len(cur) {
			keyAt[l] = k
		}
	}
	reported := map[int]bool{}
	for _, p := range r.structure {
		reported[p.line] = true
	}
	for _, e := range te.Errors {
		m := yamlLine.FindStringSubmatch(e)
		if m == nil {
			r.structure = append(r.structure, problem{line: 1, text: e})
			continue
		}
		line, _ := strconv.Atoi(m[1])
		if reported[line] {
			continue
		}
		text := strings.ReplaceAll(m[2], "`", "")
		if strings.HasSuffix(text, "into time.Duration") {
			text += " (write a duration with its unit: 10s, 500ms, 1m)"
		}
		r.structure = append(r.structure, problem{line: line, key: keyAt[line], text: text})
	}
}
