package config

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The YAML library reports problems as "yaml: line N: problem" (syntax) and, for values that do not fit their
// Go type, as a list of "line N: cannot unmarshal ..." entries. Both are rewritten here into the form every
// other configuration error has, FILE:LINE: KEY: PROBLEM (FILE:LINE: PROBLEM for syntax, which has no key),
// one problem a line.

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

// decodeError rewrites an error of yaml.Node.Decode, naming the key whose value is on the reported line.
func decodeError(file string, err error, lines map[string]int) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return fmt.Errorf("%s:1: %s", file, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	keyAt := map[int]string{}
	for k, l := range lines {
		// The deepest key on a line is the one whose value is there (tables[0] and tables[0].name share one).
		if cur, ok := keyAt[l]; !ok || len(k) > len(cur) {
			keyAt[l] = k
		}
	}
	var errs []error
	for _, e := range te.Errors {
		m := yamlLine.FindStringSubmatch(e)
		if m == nil {
			errs = append(errs, fmt.Errorf("%s:1: %s", file, e))
			continue
		}
		line, _ := strconv.Atoi(m[1])
		problem := strings.ReplaceAll(m[2], "`", "")
		if strings.HasSuffix(problem, "into time.Duration") {
			problem += " (write a duration with its unit: 10s, 500ms, 1m)"
		}
		key, ok := keyAt[line]
		if !ok {
			errs = append(errs, fmt.Errorf("%s:%d: %s", file, line, problem))
			continue
		}
		errs = append(errs, fmt.Errorf("%s:%d: %s: %s", file, line, key, problem))
	}
	return errors.Join(errs...)
}
