package proxy_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/catalog"
	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// A reload with a catalog section: the catalog snapshot (partitions, children, views and cascades of the
// protected tables) was derived for the table list of its read. serve's reload applies the new list
// (PlannerSet.SetConfig) and only then reads the catalog again (catalog.Watcher.Refresh), and a refresh that
// read the list before a reload may publish after it (PlannerSet.SetSnapshot). Whatever the order, the planner
// must protect what the list in force protects: a partition of a table the reload adds is fenced at once (not
// after a refresh that may fail and keep the old snapshot for good), a setting the reload changes on a table
// reaches its partitions, and a partition of a table the reload removes is no longer refused.

// reload58Partitioned creates public.<name> partitioned by id, with the partition public.<name>_p1 for ids 0..99
// holding row 1 with token 9, and the plain table public.<name>_other.
func reload58Partitioned(t *testing.T, d *pgx.Conn, name string) {
	t.Helper()
	fxExec(t, d, fmt.Sprintf("CREATE TABLE public.%s (id int NOT NULL, balance int NOT NULL DEFAULT 0, fence_token bigint) PARTITION BY RANGE (id)", name))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := d.Exec(ctx, "DROP TABLE IF EXISTS public."+name+" CASCADE"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	fxExec(t, d, fmt.Sprintf("CREATE TABLE public.%[1]s_p1 PARTITION OF public.%[1]s FOR VALUES FROM (0) TO (100)", name))
	fxExec(t, d, fmt.Sprintf("INSERT INTO public.%s (id, balance, fence_token) VALUES (1, 0, 9)", name))
	fxCreateTable(t, d, "public."+name+"_other")
}

// reload58Config is a configuration protecting tables (YAML entries under tables:) for mode.
func reload58Config(t *testing.T, mode, tables string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("reload.yaml", []byte(fmt.Sprintf("upstream:\n  address: %s\ntables:\n%spool:\n  mode: %s\n  size: 2\nauth:\n  type: trust\n", pg.Addr(), tables, mode)))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func reload58Table(name, extra string) string {
	return fmt.Sprintf("  - name: public.%s\n    token_column: fence_token\n%s", name, extra)
}

func TestReload58CatalogFollowsTheTableList(t *testing.T) {
	d := direct(t)
	name := fxName(t, "rc")
	reload58Partitioned(t, d, name)
	facts, err := catalog.Read(ctxT(t), d, catalog.DefaultGuardProbe())
	if err != nil {
		t.Fatal(err)
	}
	other := reload58Table(name+"_other", "")
	both := other + reload58Table(name, "")
	withLock := other + reload58Table(name, "    require_lock: true\n")
	write := fmt.Sprintf("UPDATE public.%s_p1 SET balance = balance + 1 WHERE id = 1", name)

	for _, mode := range []string{"session", "transaction"} {
		// Each case starts from a proxy protecting from (with a catalog snapshot derived for it), applies the
		// reload to to as apply says, and runs the write with the session's token 5 (and no lock).
		for _, c := range []struct {
			name, from, to string
			rowToken       int // the token the row holds: 9, newer than the client's 5, or 1
			apply          func(ps *proxy.PlannerSet, fromSnap *catalog.Snapshot, to *config.Config) error
			want           string // SQLSTATE, "" for none
		}{
			{"reload adds the parent, before the refresh", other, both, 9,
				func(ps *proxy.PlannerSet, _ *catalog.Snapshot, to *config.Config) error { return ps.SetConfig(to) }, "55F01"},
			{"a refresh read before the reload publishes after it", other, both, 9,
				func(ps *proxy.PlannerSet, fromSnap *catalog.Snapshot, to *config.Config) error {
					if err := ps.SetConfig(to); err != nil {
						return err
					}
					return ps.SetSnapshot(fromSnap)
				}, "55F01"},
			{"reload makes the parent require a lock, before the refresh", both, withLock, 1,
				func(ps *proxy.PlannerSet, _ *catalog.Snapshot, to *config.Config) error { return ps.SetConfig(to) }, "55F02"},
			{"reload removes the parent, before the refresh", both, other, 9,
				func(ps *proxy.PlannerSet, _ *catalog.Snapshot, to *config.Config) error { return ps.SetConfig(to) }, ""},
		} {
			t.Run(mode+"/"+c.name, func(t *testing.T) {
				fxExec(t, d, fmt.Sprintf("UPDATE public.%s SET balance = 0, fence_token = %d WHERE id = 1", name, c.rowToken))
				from, to := reload58Config(t, mode, c.from), reload58Config(t, mode, c.to)
				fromSnap := catalog.Derive(facts, proxy.ConfiguredTables(from))
				p := startProxy(t, proxytest.Options{YAML: fmt.Sprintf("tables:\n%spool:\n  mode: %s\n  size: 2\nauth:\n  type: trust\n", c.from, mode)})
				ps := proxy.NewPlannerSet(p.Server, p.Config, nil, nil)
				if err := ps.SetSnapshot(fromSnap); err != nil {
					t.Fatal(err)
				}
				if err := c.apply(ps, fromSnap, to); err != nil {
					t.Fatal(err)
				}
				cl := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
				fxExec(t, cl, "SET fence.token = 5")
				_, err := cl.Exec(ctxT(t), write)
				if c.want == "" {
					if err != nil {
						t.Fatalf("a write to a partition of a table the reload no longer protects: %v", err)
					}
					return
				}
				if err == nil {
					t.Fatalf("the write to the partition went through unfenced (want %s); rows: %s", c.want, fxSnapshot(t, d, "public."+name))
				}
				wantPgErr(t, err, c.want, "")
			})
		}
	}
}
