package proxy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// soCase is a sequence of units (each sent and answered up to its ReadyForQuery) after which a direct
// connection judges the client's token, lock and application_name.
type soCase struct {
	name  string
	units [][]woMsg
	// closed: where the pool fails closed, what a direct read gives and the pool's instead: no token, the empty
	// application_name, where directly the startup values are back (docs/pooling.md: a set that may run later
	// than a reset after it). Nil: the same.
	closed *strings.Replacer
	// closedFor: the startup closed applies to (its name in the startups); "": every startup.
	closedFor string
}

// soQ makes units of Queries, one each.
func soQ(qs ...string) [][]woMsg {
	var us [][]woMsg
	for _, q := range qs {
		us = append(us, []woMsg{woQ(q)})
	}
	return us
}

// soStartups are startups whose reset values on the pool's server connections are not the client's: a startup
// token and lock (options) and a startup application_name.
var soStartups = map[string]map[string]string{
	"startup token, lock and application_name": {"options": "-c fence.token=5 -c fence.lock=L1", "application_name": "subj"},
}

// startupOracle runs each case as user directly and through f's pool of user (one server connection), for each
// startup, and compares the answers and what a later read sees: twice, the second after another client of the
// pool with values of its own used its server connection.
func startupOracle(t *testing.T, f *fenced, user string, startups map[string]map[string]string, cases []soCase) {
	t.Helper()
	const read = "SELECT current_setting('application_name'), coalesce(current_setting('fence.token', true), ''), coalesce(current_setting('fence.lock', true), '')"
	connect := sfConnectWith
	run := func(t *testing.T, dsn string, params map[string]string, units [][]woMsg, pooled bool) []string {
		c := connect(t, dsn, params)
		defer c.close()
		var got []string
		for _, u := range units {
			ans, _ := c.send(u)
			got = append(got, strings.Join(ans, " "))
		}
		for i := 0; i < 2; i++ {
			if ans, st := c.send([]woMsg{woQ(read)}); st != 'I' || len(c.rows) != 1 {
				t.Fatalf("%s: %v", read, ans)
			}
			got = append(got, fmt.Sprintf("application_name=%s token=%s lock=%s", c.rows[0][0], c.rows[0][1], c.rows[0][2]))
			if pooled {
				other := connect(t, f.p.DSN(user, "", pgtest.TestDB), map[string]string{"application_name": "other"})
				other.send([]woMsg{woQ("SET application_name = 'other2'; SET fence.token = 1000; SET fence.lock = 'other'")})
				other.close()
			}
		}
		return got
	}
	for sn, s := range startups {
		for _, c := range cases {
			t.Run(sn+"/"+c.name, func(t *testing.T) {
				d := run(t, pg.DSN(user, "", pgtest.TestDB), s, c.units, false)
				p := run(t, f.p.DSN(user, "", pgtest.TestDB), s, c.units, true)
				if c.closed != nil && (c.closedFor == "" || c.closedFor == sn) {
					for i := range d {
						d[i] = c.closed.Replace(d[i])
					}
				}
				if strings.Join(d, "\n") != strings.Join(p, "\n") {
					t.Errorf("%v\n directly: %q\n pooled:   %q", c.units, d, p)
				}
			})
		}
	}
}

// A cast that may change a constant (varchar(n) and char(n) cut, char drops trailing spaces, name cuts at 63
// bytes) spells a setting the text does not show: set_config('fence.token.x'::varchar(11), ”, false) clears
// the token. Until 2026-12-05 the analysis read through every cast, saw a setting of no interest, and the pool
// took the empty token read back after a RESET in the same transaction for the reset: the startup token wrote
// where directly the client has none (a review's finding). Only casts that keep the value (text, varchar
// without a length, bool) are read through now (rewrite.constArg); any other argument may be anything.
func TestPooledCastSpelledSetting(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	cases := []soCase{
		{"token", soQ("RESET fence.token; SELECT set_config('fence.token.x'::varchar(11), lower(''), false)"), nil, ""},
		{"token, literal empty", soQ("RESET fence.token; SELECT set_config('fence.token.x'::varchar(11), '', false)"), nil, ""},
		{"token by char", soQ("RESET fence.token; SELECT set_config('fence.token  '::char(12), lower(''), false)"), nil, ""},
		{"token in a block", soQ("BEGIN", "RESET fence.token", "SELECT set_config('fence.token.x'::varchar(11), lower(''), false)", "COMMIT"), nil, ""},
		{"token set", soQ("SELECT set_config('fence.token.x'::varchar(11), '77', false)"), nil, ""},
		{"token value cut", soQ("SELECT set_config('fence.token', '12345'::varchar(2), false)"), nil, ""},
		{"application_name", soQ("RESET application_name; SET LOCAL application_name = 'x'; SELECT set_config('application_name.x'::varchar(16), '', false)"), nil, ""},
		{"casts that keep the value", soQ("RESET fence.token; SELECT set_config('fence.token'::text, lower(''), 'f'::bool)"), nil, ""},
	}
	startupOracle(t, f, pgtest.SuperUser, soStartups, cases)
}
