package proxy_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/config"
)

// Pool settings reloaded (Server.ReloadPool, as RELOAD and SIGHUP do) again and again while clients run
// transactions and an admin console reads SHOW POOLS and SHOW CONFIG: every transaction runs, and nothing races
// (run it with -race). A pool.size or pool.mode change is refused, naming the setting, and applies nothing.
func TestReload59PoolSettingsReloadedUnderTraffic(t *testing.T) {
	f := newPooledFenced(t, 3, "  admin_users: [admin]\n")
	start := f.p.Server
	base := f.p.Config.Pool
	variants := []func(p *config.Pool){
		func(p *config.Pool) { p.MinIdle = 2 },
		func(p *config.Pool) { p.ServerLifetime = time.Millisecond },
		func(p *config.Pool) { p.ServerIdleTimeout = 20 * time.Millisecond },
		func(p *config.Pool) { p.MaxClientWait = 20 * time.Second; p.MaxClients = 50 },
		func(p *config.Pool) { p.AdminUsers = []string{"admin", "ops"} },
	}

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 4 {
		c := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
		wg.Go(func() {
			for range 200 {
				if _, err := c.Exec(ctxT(t), "SELECT 1"); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	adm := adminConn(t, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			next := base
			variants[i%len(variants)](&next)
			apply, err := start.ReloadPool(next)
			if err != nil {
				errs <- err
				return
			}
			apply()
		}
	}()
	for range 50 {
		adminRows(t, adm, "SHOW POOLS")
		adminRows(t, adm, "SHOW CONFIG")
	}
	wg.Wait()
	<-done
	close(errs)
	for err := range errs {
		t.Fatalf("under reloads of the pool settings: %v", err)
	}

	for _, c := range []struct {
		key    string
		change func(p *config.Pool)
	}{
		{"pool.size", func(p *config.Pool) { p.Size = 4 }},
		{"pool.mode", func(p *config.Pool) { p.Mode = config.PoolModeSession }},
	} {
		next := base
		c.change(&next)
		if apply, err := start.ReloadPool(next); err == nil || apply != nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("ReloadPool changing %s: %v, want an error naming it and nothing to apply", c.key, err)
		}
	}
	if r := rowWhere(adminRows(t, adm, "SHOW CONFIG"), "key", "pool.size"); r == nil || r["value"] != "3" {
		t.Errorf("SHOW CONFIG pool.size after the refused changes: %v", r)
	}
}
