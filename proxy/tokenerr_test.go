package proxy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// The contract: every error names the table. A 55F03 raised at the SET (or set_config, or the startup packet)
// comes before any write, so it names the setting and every protected table the token is for.
func TestInvalidTokenAtSetNamesTheTables(t *testing.T) {
	d := direct(t)
	a, b := fxName(t, "a"), fxName(t, "b")
	fxCreateTable(t, d, "public."+a)
	fxCreateTable(t, d, "public."+b)
	p := startProxy(t, proxytest.Options{YAML: fxTables("public."+a, b)})
	ctx := ctxT(t)
	tables := fmt.Sprintf("(fence.token, for writes to public.%s, %s)", a, b)
	c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))

	pe := wantPgErr(t, execErr(c.Exec(ctx, "SET fence.token = 'abc'")), "55F03", "invalid fencing token")
	if want := `invalid fencing token: "abc" is not an integer in 1..9223372036854775807 ` + tables; pe.Message != want {
		t.Errorf("SET fence.token = 'abc':\n got %q\nwant %q", pe.Message, want)
	}
	for _, q := range []string{
		"SET fence.token = 0",
		"SET LOCAL fence.token = -1",
		"SET fence.token = 9223372036854775808",
		"SET fence.token = 1, 2",
		"SELECT set_config('fence.token', 'abc', false)",
	} {
		pe := wantPgErr(t, execErr(c.Exec(ctx, q)), "55F03", "invalid fencing token")
		if !strings.HasSuffix(pe.Message, tables) {
			t.Errorf("%s: %q does not end with %q", q, pe.Message, tables)
		}
		// The extended protocol goes the same way.
		pe = wantPgErr(t, execErr(c.Exec(ctx, q, pgx.QueryExecModeExec)), "55F03", "invalid fencing token")
		if !strings.HasSuffix(pe.Message, tables) {
			t.Errorf("%s (extended): %q does not end with %q", q, pe.Message, tables)
		}
	}

	// In the startup packet the connection is refused with the same message.
	cfg, err := pgx.ParseConfig(p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["options"] = "-c fence.token=abc"
	if cc, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		cc.Close(ctx)
		t.Fatal("startup with fence.token=abc accepted")
	} else if pe := wantPgErr(t, err, "55F03", "invalid fencing token"); !strings.HasSuffix(pe.Message, tables) {
		t.Errorf("startup: %q does not end with %q", pe.Message, tables)
	}
}

func execErr(_ any, err error) error { return err }
