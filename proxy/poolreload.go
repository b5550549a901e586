package proxy

import (
	"fmt"
	"time"

	"github.com/fenceproxy/fenceproxy/config"
)

// The pool section under a reload (RELOAD, SIGHUP: cmd/fenceproxy). A running proxy follows every pool setting
// it reads when it acts, from the next time it acts: pool.admin_users (at a console's login and at each of its
// commands), pool.max_client_wait (the next wait), pool.max_clients (the next client; those connected stay),
// pool.on_session_state (the next state a client leaves; a client pinned stays pinned), pool.server_lifetime and
// pool.server_idle_timeout (the next put-back and the reaper's next look, which comes as often as the new
// values need), pool.min_idle (every pool's keeper, started for pools made while it was 0). Two it cannot
// follow: pool.mode (a session-mode proxy has no pools, and a pooled client's session is not a relay's) and,
// in transaction mode, pool.size (each database and user's pools were made with their places). A reload that
// changes either is refused whole, with an error that names the setting. Until 2026-12-06 the whole section
// kept the start's values until a restart, and a role removed from pool.admin_users kept the admin console
// (TestReload59AdminUsersFollowReload, TestReload59PoolSettingsFollowReload,
// TestReload59PoolChangesItCannotFollowAreRefused).

// poolSettings is the pool section in force.
func (s *Server) poolSettings() *config.Pool { return s.poolCfg.Load() }

// ReloadPool checks a reloaded configuration's pool section against the one in force, for a reload that
// applies all it reads or nothing: apply makes it the one in force. A change the running proxy cannot follow
// is an error naming the setting, and nothing is to apply.
func (s *Server) ReloadPool(next config.Pool) (apply func(), err error) {
	cur := s.poolSettings()
	if next.Mode != cur.Mode {
		return nil, fmt.Errorf("pool.mode: changed from %s to %s, which needs a restart (the running sessions are served in %s mode)", cur.Mode, next.Mode, cur.Mode)
	}
	if cur.Transaction() && next.Size != cur.Size {
		return nil, fmt.Errorf("pool.size: changed from %d to %d, which needs a restart (the running pools were made with %d places each)", cur.Size, next.Size, cur.Size)
	}
	return func() {
		s.poolCfg.Store(&next)
		if s.pools != nil {
			s.pools.settingsChanged(&next)
		}
	}, nil
}

// settingsChanged makes the pools act on the pool settings a reload applied: the reaper looks as often as the
// new lifetimes need (at once, and then at its new period), and every pool keeps the new pool.min_idle.
func (ps *txPools) settingsChanged(next *config.Pool) {
	select {
	case ps.retick <- struct{}{}:
	default:
	}
	for _, p := range ps.list() {
		if next.MinIdle > 0 {
			p.startKeeper()
		}
		p.nudge()
	}
}

// reaperPeriod is how often the reaper looks at the pools: a quarter of the shorter of pool.server_idle_timeout
// and pool.server_lifetime in force, and at least every 10ms.
func (ps *txPools) reaperPeriod() time.Duration {
	cfg := ps.srv.poolSettings()
	return max(min(cfg.ServerIdleTimeout, cfg.ServerLifetime)/4, 10*time.Millisecond)
}

// authUsersChanged acts on auth.file's users read again (a reload, or a login that found the file changed): a
// pool whose user the file no longer has (and no auth.query may find) keeps no pool.min_idle connections (its
// keeper opens none: minIdle), and its idle ones close now: logged in with the ClientKey of a client of the user
// that was, they would otherwise serve that user's logins until they aged out, and the keeper would open
// them again for ever. Its clients already connected go on, as after any change of auth.file (as pgbouncer's
// do), on server connections opened for them. Until 2026-12-06 the keeper went on opening them until a
// restart (TestReload59MinIdleStopsForARemovedUser).
func (ps *txPools) authUsersChanged() {
	for _, p := range ps.list() {
		if !ps.srv.auth.removed(p.user) {
			continue
		}
		p.idleLogin.Store(nil)
		closed := p.closeIdle()
		ps.srv.log.Info("auth.file no longer has the pool's user: it keeps no pool.min_idle connections, and its idle ones closed", "pool", p.name, "closed", closed)
	}
}

// keptForRemovedUser closes the pool's idle server connections if auth.file no longer has its user, for the
// pool.min_idle keeper, after it put one it opened into the pool: one opened while a reload removed the user
// went back after authUsersChanged looked (which applied the users first, so this sees them), and would
// stay. It reports whether it closed them.
func (p *txPool) keptForRemovedUser() bool {
	if !p.srv.auth.removed(p.user) {
		return false
	}
	p.closeIdle()
	return true
}

// minIdle is the pool.min_idle the pool keeps: none for a user auth.file no longer has.
func (p *txPool) minIdle() int {
	if p.srv.auth.removed(p.user) {
		return 0
	}
	return p.srv.poolSettings().MinIdle
}

// keepsIdle reports whether the pool keeps pool.min_idle connections for a login that worked: dropUnused then
// keeps it, for its keeper opens them again after the reaper closed them.
func (p *txPool) keepsIdle() bool { return p.minIdle() > 0 && p.idleLogin.Load() != nil }

// startKeeper starts the pool's pool.min_idle keeper (keepIdle), once.
func (p *txPool) startKeeper() {
	p.keeper.Do(func() {
		p.keeping.Store(true) // before it runs: no nudge from now on is lost (nudge)
		go p.keepIdle(p.srv.pools.stop, p.stop)
	})
}
