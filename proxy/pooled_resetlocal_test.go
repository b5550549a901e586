package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A reset of a setting whose reset value on the pool's server connections is not the client's (a startup
// application_name, which the pool's connections do not start with; a startup token from options) gives the
// client's startup value after the transaction, also where a SET LOCAL of it in the same transaction, before or
// after the reset, leaves the reset at session level (PostgreSQL restores the value SET LOCAL masked with source
// session): the probe then reads what a RESET gives on the pool's connection, which a set to it gives too, and
// the pool takes it for a reset where the transaction's texts can only reset the setting
// (rewrite.SessionEffects). Until 2026-12-05 the client with a startup application_name read the empty string
// after RESET ALL; SET LOCAL application_name = ..., where directly it reads its startup value (the settings
// fuzzer's finding, seed 9 with 400 sequences). A client that set the value to what a reset gives on the pool's
// connection (the empty string) keeps it after a transaction that rolled the reset back, as directly. The judge
// is a direct connection started with the same runtime parameters; between the transaction and the read another
// client uses the pool's one server connection with settings of its own.
func TestPooledResetThenSetLocalStartupValues(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	startups := []struct {
		name   string
		params map[string]string
	}{
		{"startup application_name", map[string]string{"application_name": "subj"}},
		{"no startup application_name", map[string]string{}},
		{"startup token", map[string]string{"options": "-c fence.token=5"}},
		{"startup application_name and token", map[string]string{"application_name": "subj", "options": "-c fence.token=5"}},
	}
	cases := []struct {
		name  string
		qs    []string // Queries, each a unit of its own
		batch []woMsg  // then this extended-protocol batch, if any
		// closed: the pool fails closed on the token, which then reads as none where directly it reads its
		// startup value: a rollback to a savepoint may have undone a set after the reset, and the pool cannot
		// tell which of the two its empty value is (docs/pooling.md).
		closed bool
	}{
		{"RESET ALL then SET LOCAL", []string{"RESET ALL; SET LOCAL application_name = 'x'"}, nil, false},
		{"SET LOCAL then RESET ALL", []string{"SET LOCAL application_name='x'; RESET ALL"}, nil, false},
		{"block", []string{"BEGIN; RESET ALL; SET LOCAL application_name = 'x'; COMMIT"}, nil, false},
		{"block of Queries", []string{"BEGIN", "RESET ALL", "SET LOCAL application_name = 'x'", "COMMIT"}, nil, false},
		{"block rolled back", []string{"BEGIN; RESET ALL; SET LOCAL application_name = 'x'; ROLLBACK"}, nil, false},
		{"block of Queries rolled back", []string{"BEGIN", "RESET ALL", "SET LOCAL application_name = 'x'", "ROLLBACK"}, nil, false},
		{"RESET application_name", []string{"RESET application_name; SET LOCAL application_name = 'x'"}, nil, false},
		{"RESET application_name in a block", []string{"BEGIN", "RESET application_name", "SET LOCAL application_name = 'x'", "COMMIT"}, nil, false},
		{"TO DEFAULT and set_config local", []string{"SET application_name TO DEFAULT; SELECT set_config('application_name', 'x', true)"}, nil, false},
		{"DISCARD ALL", []string{"DISCARD ALL", "SET LOCAL application_name = 'x'"}, nil, false},
		{"set first, then the reset", []string{"SET application_name = 'y'", "RESET ALL; SET LOCAL application_name = 'x'"}, nil, false},
		{"set empty first, then the reset", []string{"SET application_name = ''", "RESET ALL; SET LOCAL application_name = 'x'"}, nil, false},
		{"set empty first, the reset rolled back", []string{"SET application_name = ''", "BEGIN; RESET ALL; SET LOCAL application_name = 'x'; ROLLBACK"}, nil, false},
		{"set empty first, the reset failed", []string{"SET application_name = ''", "RESET ALL; SET LOCAL application_name = 'x'; SELECT 1/0"}, nil, false},
		{"set then reset in one Query", []string{"SET application_name = 'y'; RESET ALL; SET LOCAL application_name = 'x'"}, nil, false},
		{"set then reset in a block", []string{"BEGIN", "SET application_name = 'y'", "RESET application_name", "SET LOCAL application_name = 'x'", "COMMIT"}, nil, false},
		{"reset then set empty", []string{"RESET ALL; SET LOCAL application_name = 'x'; SET application_name = ''"}, nil, false},
		{"set empty first, the reset rolled back to a savepoint", []string{"SET application_name = ''", "BEGIN", "SAVEPOINT a", "RESET ALL", "SET LOCAL application_name = 'x'", "ROLLBACK TO a", "COMMIT"}, nil, false},
		{"the reset before a savepoint rolled back", []string{"BEGIN", "RESET ALL", "SET LOCAL application_name = 'x'", "SAVEPOINT a", "SELECT 1/0", "ROLLBACK TO a", "COMMIT"}, nil, false},
		{"extended batch", nil, []woMsg{woP("", "RESET ALL"), woB("", ""), woE("", 0), woP("", "SET LOCAL application_name = 'x'"), woB("", ""), woE("", 0), woS}, false},
		{"extended batch, set empty after", nil, []woMsg{woP("", "RESET ALL"), woB("", ""), woE("", 0), woP("", "SET application_name = ''"), woB("", ""), woE("", 0), woP("", "SET LOCAL application_name = 'x'"), woB("", ""), woE("", 0), woS}, false},
		{"token: RESET ALL then SET LOCAL", []string{"RESET ALL; SET LOCAL fence.token = 7"}, nil, false},
		{"token: SET LOCAL then RESET ALL", []string{"SET LOCAL fence.token = 7; RESET ALL"}, nil, false},
		{"token: block", []string{"BEGIN; RESET ALL; SET LOCAL fence.token = 7; COMMIT"}, nil, false},
		{"token: block rolled back", []string{"BEGIN; RESET ALL; SET LOCAL fence.token = 7; ROLLBACK"}, nil, false},
		{"token: RESET fence.token", []string{"RESET fence.token; SET LOCAL fence.token = 7"}, nil, false},
		{"token: DISCARD ALL", []string{"DISCARD ALL", "SET LOCAL fence.token = 7"}, nil, false},
		{"token: set first, then the reset", []string{"SET fence.token = 8", "BEGIN", "RESET fence.token", "SET LOCAL fence.token = 7", "COMMIT"}, nil, false},
		{"token: set then reset in a block", []string{"BEGIN", "SET fence.token = 8", "RESET fence.token", "SET LOCAL fence.token = 7", "COMMIT"}, nil, false},
		{"token: set then reset, rolled back to a savepoint", []string{"BEGIN", "SET fence.token = 8", "SAVEPOINT a", "RESET fence.token", "SET LOCAL fence.token = 7", "ROLLBACK TO a", "COMMIT"}, nil, false},
		{"token: reset, then a set rolled back to a savepoint", []string{"BEGIN", "RESET fence.token", "SAVEPOINT a", "SET fence.token = 8", "ROLLBACK TO a", "SET LOCAL fence.token = 7", "COMMIT"}, nil, true},
		{"token: extended batch", nil, []woMsg{woP("", "RESET ALL"), woB("", ""), woE("", 0), woP("", "SET LOCAL fence.token = 7"), woB("", ""), woE("", 0), woS}, false},
	}
	const read = "SELECT current_setting('application_name'), coalesce(current_setting('fence.token', true), '')"
	connect := func(dsn string, params map[string]string) *sfConn { return sfConnectWith(t, dsn, params) }
	// run runs qs, then the read in a transaction of its own, and again after another client's transaction on
	// the pool's server connection (pooled): the answers and what the reads saw.
	run := func(dsn string, params map[string]string, qs []string, batch []woMsg, pooled bool) []string {
		c := connect(dsn, params)
		defer c.close()
		var got []string
		for _, q := range qs {
			ans, _ := c.send([]woMsg{woQ(q)})
			got = append(got, strings.Join(ans, " "))
		}
		if batch != nil {
			ans, _ := c.send(batch)
			got = append(got, strings.Join(ans, " "))
		}
		for i := 0; i < 2; i++ {
			if ans, st := c.send([]woMsg{woQ(read)}); st != 'I' || len(c.rows) != 1 {
				t.Fatalf("%s: %v", read, ans)
			}
			got = append(got, fmt.Sprintf("application_name=%s token=%s", c.rows[0][0], c.rows[0][1]))
			if pooled {
				other := connect(f.dsn(), map[string]string{"application_name": "other"})
				other.send([]woMsg{woQ("SET application_name = 'other2'; SET fence.token = 1000")})
				other.close()
			}
		}
		return got
	}
	for _, s := range startups {
		for _, c := range cases {
			t.Run(s.name+"/"+c.name, func(t *testing.T) {
				d := run(pg.SuperDSN(), s.params, c.qs, c.batch, false)
				p := run(f.dsn(), s.params, c.qs, c.batch, true)
				if c.closed {
					for i := range d {
						d[i] = strings.Replace(d[i], "token=5", "token=", 1)
					}
				}
				if strings.Join(d, "\n") != strings.Join(p, "\n") {
					t.Errorf("%q %v\n directly: %q\n pooled:   %q", c.qs, c.batch, d, p)
				}
			})
		}
	}
}

// sfConnectWith connects to dsn with params added to its startup parameters (an application_name, options).
func sfConnectWith(t *testing.T, dsn string, params map[string]string) *sfConn {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range params {
		cfg.RuntimeParams[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	pc, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &sfConn{pc: pc, told: map[string]string{}}
}
