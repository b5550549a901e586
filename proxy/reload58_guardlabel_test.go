package proxy_test

import (
	"fmt"
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// A fencing error raised in the database (the guard of fenceproxy install; here a DO block that raises what it
// raises) is counted under the table it names when that table is protected: the running table list decides,
// a reload included. Before, the list of the proxy's start did: a table a reload added was counted as "other".
func TestReload58GuardRefusalCountedUnderTheReloadedList(t *testing.T) {
	d := direct(t)
	name := fxName(t, "rg")
	fxCreateTable(t, d, "public."+name)
	f := &fenced{p: startProxy(t, proxytest.Options{YAML: fxTables("public." + name + "_other")}), d: d, name: name, label: "public." + name}
	reloadTables(t, f, "public."+name+"_other", "public."+name)
	c := f.conn(t, "5")
	_, err := c.Exec(ctxT(t), fmt.Sprintf(`DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '55F01', TABLE = 'public.%s',
		MESSAGE = 'stale fencing token: a newer lock holder has already written to public.%s'; END $$`, name, name))
	wantPgErr(t, err, "55F01", "stale fencing token")
	if n := fxCounter(t, f.p.Registry, "fenceproxy_refusals_total", map[string]string{"code": "55F01", "table": f.label}); n != 1 {
		t.Fatalf("fenceproxy_refusals_total{code=55F01,table=%q} = %v after a guard refusal of a table the reload protects, want 1 (other: %v)",
			f.label, n, fxCounter(t, f.p.Registry, "fenceproxy_refusals_total", map[string]string{"code": "55F01", "table": "other"}))
	}
}
