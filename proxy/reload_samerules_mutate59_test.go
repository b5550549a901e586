package proxy_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/catalog"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// A catalog refresh that protects and refuses what the snapshot in force does keeps the planner and its
// generation (PlannerSet.SetSnapshot, reload58), also after a reload whose snapshot was derived again for the
// new list (SetConfig keeps that snapshot, which the next refresh is compared with). A new generation would
// be no harm to a write, but a portal bound under the old one runs no more (portalsPooled, portalsCurrent: FATAL
// 55F04): every catalog.refresh period would end the sessions with a portal open across it. From mutate59
// (2026-12-06): with SetSnapshot's SameRules check dropped, or SetConfig not keeping the snapshot it derived,
// every reload58 test passed.
func TestCatalogRefreshChangingNoRuleKeepsOpenPortals(t *testing.T) {
	d := direct(t)
	name := fxName(t, "rk")
	reload58Partitioned(t, d, name)
	facts, err := catalog.Read(ctxT(t), d, catalog.DefaultGuardProbe())
	if err != nil {
		t.Fatal(err)
	}
	other := reload58Table(name+"_other", "")
	both := other + reload58Table(name, "")
	upd := fmt.Sprintf("UPDATE public.%s SET balance = balance + 1 WHERE id = $1", name)
	for _, mode := range []string{"session", "transaction"} {
		for _, reload := range []bool{false, true} {
			sub := mode + "/refresh"
			if reload {
				sub = mode + "/reload, then a refresh read before it"
			}
			t.Run(sub, func(t *testing.T) {
				fxExec(t, d, fmt.Sprintf("UPDATE public.%s SET balance = 0, fence_token = 1 WHERE id = 1", name))
				from, to := reload58Config(t, mode, other), reload58Config(t, mode, both)
				start := both
				if reload {
					start = other
				}
				p := startProxy(t, proxytest.Options{YAML: fmt.Sprintf("tables:\n%spool:\n  mode: %s\n  size: 2\nauth:\n  type: trust\n", start, mode)})
				startCfg := to
				if reload {
					startCfg = from
				}
				ps := proxy.NewPlannerSet(p.Server, startCfg, nil, nil)
				read := catalog.Derive(facts, proxy.ConfiguredTables(startCfg)) // a refresh's snapshot, for the list it read
				if err := ps.SetSnapshot(read); err != nil {
					t.Fatal(err)
				}
				if reload {
					if err := ps.SetConfig(to); err != nil {
						t.Fatal(err)
					}
				}
				fe := reload58Hijacked(t, &fenced{p: p, d: d, name: name, label: "public." + name})
				fe.Send(&pgproto3.Query{String: "BEGIN"})
				fe.Send(&pgproto3.Parse{Name: "s", Query: upd})
				fe.Send(&pgproto3.Bind{DestinationPortal: "p", PreparedStatement: "s", Parameters: [][]byte{[]byte("1")}})
				fe.Send(&pgproto3.Sync{})
				if err := fe.Flush(); err != nil {
					t.Fatal(err)
				}
				for range 2 {
					if _, code, _ := reload58UntilReady(t, fe); code != "" {
						t.Fatalf("before the refresh: error %s", code)
					}
				}
				// The refresh publishes what it read (before the reload, when there was one): the rules it
				// makes for the list in force are those in force.
				if err := ps.SetSnapshot(read); err != nil {
					t.Fatal(err)
				}
				fe.Send(&pgproto3.Execute{Portal: "p"})
				fe.Send(&pgproto3.Sync{})
				fe.Send(&pgproto3.Query{String: "COMMIT"})
				if err := fe.Flush(); err != nil {
					t.Fatal(err)
				}
				tags, code, ended := reload58UntilReady(t, fe)
				if code != "" || ended || len(tags) != 1 {
					t.Fatalf("a portal bound before a catalog refresh that changed no rule, executed after it: tags %v, error %q, session ended %v; want UPDATE 1", tags, code, ended)
				}
				if _, code, _ := reload58UntilReady(t, fe); code != "" {
					t.Fatalf("COMMIT: error %s", code)
				}
				if got := fxSnapshot(t, d, "public."+name); got != "1:1:5" {
					t.Errorf("rows after COMMIT %s, want 1:1:5 (the write fenced with the session's token)", got)
				}
			})
		}
	}
}
