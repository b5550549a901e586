package proxy_test

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// A reload that raises pool.min_idle from 0 while a client's pool is being made. From review59 (attack on
// reload59): poolFor read the pool settings before it took the pools' lock, so a reload whose settingsChanged
// listed the pools in between (the new pool not among them, no keeper started) left the pool made with the old
// min_idle of 0 (no keeper started either): it never kept pool.min_idle connections until the next reload. The
// test reloads at that point (a test hook); the pool must keep its two idle server connections.
func TestReloadMinIdleWhileAPoolIsMade(t *testing.T) {
	d := direct(t)
	name := fxName(t, "rm")
	fxCreateTable(t, d, "public."+name)
	var started atomic.Pointer[proxytest.Proxy] // set once the proxy runs, read by the hook (its clients come after)
	var once sync.Once
	p := startProxy(t, proxytest.Options{
		YAML: fxTables("public."+name) + "pool:\n  mode: transaction\n  size: 3\n  admin_users: [admin]\nauth:\n  type: trust\n",
		Tune: func(o *proxy.Options) {
			proxy.BeforePoolMade(o, func() {
				once.Do(func() {
					pp := started.Load()
					next := pp.Config.Pool
					next.MinIdle = 2
					apply, err := pp.Server.ReloadPool(next)
					if err != nil {
						t.Errorf("ReloadPool raising min_idle: %v", err)
						return
					}
					apply()
				})
			})
		},
	})
	started.Store(p)
	f := &fenced{p: p, d: d, name: name, label: "public." + name}
	c := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	if _, err := c.Exec(ctxT(t), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	adm := adminConn(t, f)
	idle := func() int {
		for _, r := range adminRows(t, adm, "SHOW POOLS") {
			if r["user"] != "admin" && r["database"] != "fenceproxy" {
				n, _ := strconv.Atoi(r["sv_idle"].(string))
				return n
			}
		}
		return -1
	}
	eventually(t, 20*time.Second, "the pool made during the reload to keep pool.min_idle (2) idle server connections", func() bool {
		return idle() >= 2
	})
}
