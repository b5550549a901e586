package schema_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/schema"
)

// One configuration, several databases each holding some of its tables: install guards the tables present,
// names the ones that are not, and names every relation whose guard a narrower configuration drops.
func TestInstallGuardsTheTablesPresent(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, "CREATE TABLE accounts (id int PRIMARY KEY, fence_token bigint); CREATE TABLE ledger (id int PRIMARY KEY, fence_token bigint)")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	p, err := schema.InstallPlan(ctx, su, guardConfig(table("public.accounts", "fence_token"), table("public.ledger", "fence_token"), table("public.invoices", "fence_token")))
	if err != nil {
		t.Fatal(err)
	}
	if p.Database == "" || !slices.Equal(p.Missing, []string{"public.invoices"}) || len(p.Guarded) != 2 || len(p.Unguarded) != 0 {
		t.Fatalf("plan: %+v", p)
	}
	// The tables present are guarded for real.
	wantCode(t, "accounts without a token", execErr(su, "INSERT INTO accounts VALUES (1, NULL)"), "55F02", "missing fencing token")
	wantCode(t, "ledger without a token", execErr(su, "INSERT INTO ledger VALUES (1, NULL)"), "55F02", "missing fencing token")

	// A narrower configuration: ledger's guard goes, and the plan says so.
	p, err = schema.InstallPlan(ctx, su, guardConfig(table("public.accounts", "fence_token")))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Unguarded, []string{`"public"."ledger"`}) || len(p.Missing) != 0 || len(p.Guarded) != 1 {
		t.Fatalf("narrower plan: %+v", p)
	}
	exec(t, su, "INSERT INTO ledger VALUES (1, NULL)")
	// Run again: nothing more to un-guard.
	if p, err = schema.InstallPlan(ctx, su, guardConfig(table("public.accounts", "fence_token"))); err != nil || len(p.Unguarded) != 0 {
		t.Fatalf("re-run: %+v %v", p, err)
	}
}
