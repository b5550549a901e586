package proxy_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// The proxy reads a startup options string as PostgreSQL does, PostgreSQL the judge: each string is given to
// the server directly, and the token it holds then is what the proxy's reading found. The forms a getopt reads
// (grouped flags, a flag's argument in the next word, "--") were read otherwise by the proxy: the token it
// checked or pooled with was not the one in force.
func TestOptionSettingAsPostgresReadsIt(t *testing.T) {
	pgtest.Require(t, pg)
	for _, options := range []string{
		"-c fence.token=42",
		"-cfence.token=7 -c statement_timeout=5s",
		"--fence.token=9",
		"-c FENCE.TOKEN=3",
		"-c fence.token=1 -c fence.token=2",
		"-c fence.token=5 -ec fence.token=7",
		"-c fence.token=5 -e-fence.token=7",
		"-c fence.token=5 -ecfence.token=8",
		"-S 1024 -c fence.token=3",
		"-c fence.token=4 -B -c",
		"-e -c fence.token=6",
		"-c fence.token=2 -- -c fence.token=1",
		// Escapes as pg_split_opts reads them (review53proto): a token of "5 -c role=x", not a role.
		`-c fence.token=5\ -c\ role=x`,
		`-c fence.token=5\\ -c fence.token=6`,
		`-c fence.token=8\`,
		`-c fence.token=\9`,
		"-c fence.token=1\t-c fence.token=2",
		"-c fence.token=1 -c\nfence.token=2",
	} {
		dsn := pg.DSN(pgtest.SuperUser, "", pgtest.TestDB) + "&options=" + strings.ReplaceAll(url.QueryEscape(options), "+", "%20")
		c, err := pgx.Connect(ctxT(t), dsn)
		var server string
		if err != nil {
			server = "(refused)"
		} else {
			var v *string
			if err := c.QueryRow(ctxT(t), "SELECT current_setting('fence.token', true)").Scan(&v); err != nil {
				t.Fatal(err)
			}
			c.Close(ctxT(t))
			if v != nil {
				server = *v
			}
		}
		got, found := proxy.OptionSetting(options, "fence.token")
		if server == "(refused)" {
			t.Logf("options %q: the server refuses them (%v)", options, err)
			continue // so does the session: nothing to compare
		}
		if !found {
			got = ""
		}
		if got != server {
			t.Errorf("options %q: the server holds fence.token %q, the proxy read %q (found %v)", options, server, got, found)
		}
	}
}
