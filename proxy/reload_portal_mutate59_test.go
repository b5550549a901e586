package proxy_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// Two ways a transaction-pool client runs a portal bound before a reload that protected its table, which
// TestReload58PortalBoundBeforeTheReload does not take, each of which portalsPooled must refuse as it refuses a
// named portal executed in a later batch. From mutate59 (2026-12-06), each a mutant that survived every reload58
// and pooled reload test:
//   - the unnamed portal: it too lives until the block ends or the next Bind of it (a Query drops it), so an
//     Execute of "" after the reload runs the statement as the old list fenced it (mutant: Binds of the unnamed
//     portal not recorded);
//   - a Bind of the portal's name that failed in an earlier batch ended by a Sync (not a Query), the block then
//     rolled back to a savepoint by the extended protocol: the portal of before is kept, and the Execute comes in a
//     later batch (mutant: Syncs not counted as the ends of batches, so the failed Bind is taken for the one in
//     the Execute's batch).
//
// Either way the write reached the row unfenced with the session's stale token 5 (rows 1:1:9).
func TestReload59PortalRunAfterTheReloadWithoutAQuery(t *testing.T) {
	d := direct(t)
	name := fxName(t, "rq")
	fxCreateTable(t, d, "public."+name)
	fxExec(t, d, fmt.Sprintf("INSERT INTO public.%s (id, balance, fence_token) VALUES (1, 0, 9)", name))
	upd := fmt.Sprintf("UPDATE public.%s SET balance = balance + 1 WHERE id = $1", name)
	pooled := "pool:\n  mode: transaction\n  size: 2\nauth:\n  type: trust\n"
	for _, c := range []struct {
		name   string
		portal string
		// between: the batches sent after the reload, before the Execute, and the error code each answers
		between func(fe *pgproto3.Frontend)
		codes   []string
	}{
		{"unnamed portal", "", nil, nil}, // no statement between: any would drop the unnamed portal
		{"a failed Bind of its name in an earlier batch", "p", func(fe *pgproto3.Frontend) {
			fe.Send(&pgproto3.Bind{DestinationPortal: "p", PreparedStatement: "none", Parameters: [][]byte{[]byte("1")}})
			fe.Send(&pgproto3.Sync{})
			fe.Send(&pgproto3.Parse{Query: "ROLLBACK TO SAVEPOINT sp"})
			fe.Send(&pgproto3.Bind{})
			fe.Send(&pgproto3.Execute{})
			fe.Send(&pgproto3.Sync{})
		}, []string{"26000", ""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fxExec(t, d, fmt.Sprintf("UPDATE public.%s SET balance = 0, fence_token = 9 WHERE id = 1", name))
			f := &fenced{p: startProxy(t, proxytest.Options{YAML: fxTables("public."+name+"_other") + pooled}),
				d: d, name: name, label: "public." + name}
			fe := reload58Hijacked(t, f)
			fe.Send(&pgproto3.Query{String: "BEGIN"})
			fe.Send(&pgproto3.Parse{Name: "s", Query: upd})
			fe.Send(&pgproto3.Bind{DestinationPortal: c.portal, PreparedStatement: "s", Parameters: [][]byte{[]byte("1")}})
			fe.Send(&pgproto3.Sync{})
			readies := 2
			if c.portal != "" {
				fe.Send(&pgproto3.Query{String: "SAVEPOINT sp"}) // after the Bind: ROLLBACK TO it keeps the portal
				readies++
			}
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			for range readies {
				if _, code, _ := reload58UntilReady(t, fe); code != "" {
					t.Fatalf("before the reload: error %s", code)
				}
			}
			reloadTables(t, f, "public."+name+"_other", "public."+name)
			if c.between != nil {
				c.between(fe)
				if err := fe.Flush(); err != nil {
					t.Fatal(err)
				}
				for _, want := range c.codes {
					if _, code, _ := reload58UntilReady(t, fe); code != want {
						t.Fatalf("after the reload, before the Execute: error %q, want %q", code, want)
					}
				}
			}
			fe.Send(&pgproto3.Execute{Portal: c.portal})
			fe.Send(&pgproto3.Sync{})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			tags, code, ended := reload58UntilReady(t, fe)
			if !ended {
				fe.Send(&pgproto3.Query{String: "COMMIT"})
				if err := fe.Flush(); err != nil {
					t.Fatal(err)
				}
				reload58UntilReady(t, fe)
			}
			if got := f.snapshot(t); code == "" || got != "1:0:9" {
				t.Fatalf("the portal bound before the reload, executed after it: tags %v, error %q; rows after COMMIT %s, want 55F01 or 55F04 and 1:0:9", tags, code, got)
			}
		})
	}
}
