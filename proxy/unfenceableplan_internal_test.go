package proxy

import (
	"testing"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// The refusal of a fenced write the router does not let through (checkPlan, keptFencedQuery) is the contract's
// 55F04: a message that starts with "unfenceable write", names the table and says why, byte for byte as the
// three places that built it before unfenceablePlan did.
func TestUnfenceablePlan(t *testing.T) {
	why := "two hosts claim to be primary (a:1 and b:2); writes to protected tables are refused until one is demoted"
	got := unfenceablePlan("public.accounts", why)
	want := rewrite.Plan{Action: rewrite.Refuse, Code: sqlstateUnfenceable, Table: "public.accounts",
		Message: "unfenceable write to public.accounts: " + why}
	if got.Action != want.Action || got.Code != want.Code || got.Table != want.Table || got.Message != want.Message {
		t.Errorf("unfenceablePlan = %+v, want %+v", got, want)
	}
}
