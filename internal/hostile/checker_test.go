package hostile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// The corpus's judges, fed crafted outcomes: each violation the invariant (check) and the expect lines
// (expectation) know must be reported, and what they allow must not be. Without this, a judge that says nothing
// passes every case of the corpus.

// row is a protected row for the crafted snapshots: balance b and token tok (nil: NULL).
func row(b int, tok *int64) prow {
	return prow{data: map[string]json.RawMessage{"balance": json.RawMessage(fmt.Sprint(b))}, token: tok}
}

func tok(v int64) *int64 { return &v }

func TestCheckReportsEveryViolation(t *testing.T) {
	base := map[string]prow{
		"accounts:1": row(100, tok(50)),
		"accounts:2": row(200, tok(100)),
		"accounts:3": row(300, nil),
	}
	with := func(key string, r *prow) map[string]prow {
		out := map[string]prow{}
		for k, v := range base {
			out[k] = v
		}
		if r == nil {
			delete(out, key)
		} else {
			out[key] = *r
		}
		return out
	}
	p := func(r prow) *prow { return &r }
	addedColumn := row(100, tok(50))
	addedColumn.data["extra"] = json.RawMessage(`true`)
	for _, tc := range []struct {
		name    string
		after   map[string]prow
		k       int64
		changed int
		want    string // a fragment of the one violation, "" for none
	}{
		{"nothing changed", base, 0, 0, ""},
		{"a column added by DDL", with("accounts:1", &addedColumn), 0, 0, ""},
		{"a fenced update", with("accounts:1", p(row(1, tok(70)))), 70, 1, ""},
		{"a fenced insert", with("accounts:9", p(row(1, tok(70)))), 70, 1, ""},
		{"a fenced delete", with("accounts:1", nil), 70, 1, ""},
		{"a change without a valid token", with("accounts:3", p(row(1, nil))), 0, 1, "changed (token NULL -> NULL) without a valid token"},
		{"a delete without a valid token", with("accounts:3", nil), 0, 1, "disappeared (token NULL -> NULL) without a valid token"},
		{"a newer row written by a stale session", with("accounts:2", p(row(1, tok(70)))), 70, 1, "holding token 100 changed by a session with token 70"},
		{"a newer row deleted by a stale session", with("accounts:2", nil), 70, 1, "holding token 100 disappeared by a session with token 70"},
		{"a token lowered", with("accounts:1", p(row(100, tok(20)))), 1000, 1, "holds token 20, not the session's 1000"},
		{"a token raised beyond the session's", with("accounts:1", p(row(100, tok(2000)))), 1000, 1, "holds token 2000, not the session's 1000"},
		{"a row written without its token", with("accounts:1", p(row(1, nil))), 1000, 1, "holds token NULL, not the session's 1000"},
		{"a row inserted without a token", with("ledger:7", p(row(1, nil))), 1000, 1, "appeared and holds token NULL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed, bad := check(base, tc.after, tc.k)
			if changed != tc.changed {
				t.Errorf("%d rows changed, want %d", changed, tc.changed)
			}
			switch {
			case tc.want == "" && len(bad) > 0:
				t.Errorf("violations %q, want none", bad)
			case tc.want != "" && (len(bad) != 1 || !strings.Contains(bad[0], tc.want)):
				t.Errorf("violations %q, want one saying %q", bad, tc.want)
			}
		})
	}
}

func TestExpectationReportsEveryMismatch(t *testing.T) {
	refusal := func(code, msg string) error { return &pgconn.PgError{Code: code, Message: msg} }
	unparsed := refusal("55F04", "unfenceable write: cannot parse a statement that mentions accounts: syntax error at or near \"#\"")
	unread := refusal("55F04", "unfenceable write: cannot read this text exactly as the server will (x), and it may write accounts")
	syntax := refusal("42601", "syntax error at or near \"#\"")
	stale := refusal("55F01", "fenceproxy|55F01 stale token")
	for _, tc := range []struct {
		expect  string // the expect line's value
		errs    []error
		changed int
		want    string // a fragment of the one problem, "" for none
	}{
		{"refused 55F01", []error{nil, stale}, 0, ""},
		{"refused 55F01", []error{nil, refusal("55F02", "no token")}, 0, "want SQLSTATE 55F01"},
		{"refused 55F01", []error{errors.New("connection reset")}, 0, "want SQLSTATE 55F01"},
		{"refused 55F01 stale token", []error{stale}, 0, ""},
		{"refused 55F01 lock", []error{stale}, 0, `want SQLSTATE 55F01 "lock"`},
		// A text that cannot be read counts only when the case says so.
		{"refused 55F04", []error{unparsed}, 0, "refused because the text cannot be read (55F04"},
		{"refused 55F04", []error{unread}, 0, "refused because the text cannot be read (55F04"},
		{"untouched", []error{unparsed}, 0, "refused because the text cannot be read (55F04"},
		{"untouched", []error{syntax}, 0, "refused because the text cannot be read (42601"},
		{"refused 42601", []error{syntax}, 0, "refused because the text cannot be read (42601"},
		{"refused 55F04 cannot parse", []error{unparsed}, 0, ""},
		{"refused 55F04 cannot read", []error{unread}, 0, ""},
		{"refused 42601 syntax error", []error{syntax}, 0, ""},
		{"refused 55F04 cannot read", []error{unparsed}, 0, "refused because the text cannot be read (55F04"},
		{"refused 55F04", []error{refusal("55F04", "unfenceable write: TRUNCATE of accounts")}, 0, ""},
		{"fenced", []error{nil}, 2, ""},
		{"fenced", []error{nil}, 0, "no protected row changed"},
		{"fenced", []error{stale}, 0, "want the write fenced and applied"},
		{"untouched", []error{stale}, 0, ""},
		{"untouched", nil, 1, "want no protected row changed, 1 did"},
		{"ok", []error{nil}, 3, ""},
		{"ok", []error{stale}, 0, "want no error"},
	} {
		c := &hcase{name: "x", file: "f.txt", line: 1, token: "fresh", tokenVia: "set", sql: "SELECT 1"}
		f := strings.Fields(tc.expect)
		c.expect = f[0]
		if len(f) > 1 {
			c.expectCode = f[1]
		}
		if len(f) > 2 {
			c.expectText = strings.Join(f[2:], " ")
		}
		if err := c.validate(); err != nil {
			t.Fatalf("expect: %s: %v", tc.expect, err)
		}
		got := expectation(c, tc.errs, nil, nil, tc.changed)
		switch {
		case tc.want == "" && len(got) > 0:
			t.Errorf("expect: %s, errors %v, %d changed: problems %q, want none", tc.expect, tc.errs, tc.changed, got)
		case tc.want != "" && !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, tc.want) }):
			t.Errorf("expect: %s, errors %v, %d changed: problems %q, want one saying %q", tc.expect, tc.errs, tc.changed, got, tc.want)
		}
	}
}

// TestParseRejects: what the parser must not accept, a comment inside a case's SQL first.
func TestParseRejects(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"=== c\nsql:\nSELECT 1\n# a comment\nexpect: ok\n", "'#' line inside the sql: block"},
		{"=== c\nsql:\nSELECT 1\n  # indented\nexpect: ok\n", "'#' line inside the sql: block"},
		{"=== c\nsql:\nSELECT 1\nexpect: refused\n", "refused needs a SQLSTATE"},
		{"=== c\nsql:\nSELECT 1\nexpect: untouched 55F04\n", "takes no SQLSTATE"},
		{"=== c\nsql:\nSELECT 1\nexpect: fenced cannot parse\n", "takes no SQLSTATE"},
	} {
		path := filepath.Join(t.TempDir(), "case.txt")
		if err := os.WriteFile(path, []byte(tc.text), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := parseFile(path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parse %q: %v, want an error saying %q", tc.text, err, tc.want)
		}
	}
	path := filepath.Join(t.TempDir(), "case.txt")
	text := "# a comment between cases\n=== c\n# a comment before sql:\nsql:\nSELECT 1 # 2\nexpect: refused 55F04 cannot parse a statement\n# after\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cases, err := parseFile(path)
	if err != nil || len(cases) != 1 || cases[0].sql != "SELECT 1 # 2" || cases[0].expectCode != "55F04" || cases[0].expectText != "cannot parse a statement" {
		t.Fatalf("parse %q: %+v, %v", text, cases, err)
	}
}
