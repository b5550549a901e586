package proxy

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/config"
)

// The admin console (pool.mode transaction): a client of pool.admin_users that connects to the virtual database
// "fenceproxy" talks to the proxy itself, as pgbouncer's users expect, over the simple query protocol: SHOW
// POOLS, CLIENTS, SERVERS, STATS, LOCKS and CONFIG, RELOAD, PAUSE [db] and RESUME [db] (docs/pooling.md).
// Everyone else is refused.

// adminDatabase is the admin console's database name.
const adminDatabase = "fenceproxy"

// sqlstateInsufficientPrivilege is PostgreSQL's insufficient_privilege.
const sqlstateInsufficientPrivilege = "42501"

// pausePoll is how often PAUSE looks whether the paused pools' server connections are all back.
const pausePoll = 10 * time.Millisecond

// serveAdmin serves an admin console session (after the client's authentication).
func (s *Server) serveAdmin(ss *session) {
	user := ss.params["user"]
	if !s.adminUser(user) {
		s.metrics.sessionRefused("admin_not_allowed")
		ss.fatal(sqlstateInsufficientPrivilege, fmt.Sprintf("user %q may not use the admin console (pool.admin_users)", user), "")
		return
	}
	out := ss.cw
	writeMsg(out, msgAuthentication, []byte{0, 0, 0, authOK}, "")
	for _, p := range []paramStatus{{"server_version", "15.0 (fenceproxy admin console)"}, {"client_encoding", "UTF8"},
		{"server_encoding", "UTF8"}, {"standard_conforming_strings", "on"}, {"DateStyle", "ISO, MDY"}, {"integer_datetimes", "on"}} {
		writeMsg(out, msgParameterStatus, []byte(p.name+"\x00"+p.value+"\x00"), "")
	}
	s.registerPooledKey(ss) // a cancel finds no server connection: it does nothing
	defer s.unregister(ss)
	writeMsg(out, msgBackendKeyData, ss.clientKey, "")
	writeMsg(out, msgReadyForQuery, []byte{txIdle}, "")
	if out.Flush() != nil {
		return
	}
	ss.client.SetDeadline(time.Time{})
	// Registered as every session is: a drain ends the console between commands (wakeForDrain), and
	// Shutdown's deadline closes it (forceClose). Unregistered, an idle console held Shutdown for ever.
	ss.admin = true
	s.register(ss)
	ss.logger().Info("admin console session started")
	for {
		if ss.clientIntr.reason() == intrDrain {
			ss.fatal(sqlstateAdminShutdown, "terminating connection because fenceproxy is shutting down", "")
			return
		}
		typ, _, err := ss.cr.next()
		if err != nil {
			if ss.clientIntr.caught(err) == intrDrain {
				continue
			}
			return
		}
		body, err := ss.cr.body()
		if err != nil {
			return
		}
		switch typ {
		case msgTerminate:
			return
		case msgQuery:
			text, ok := planText(msgQuery, body)
			if !ok {
				ss.fatal(sqlstateProtocolViolation, "invalid message from client", "Query message that is not one zero-terminated string")
				return
			}
			ss.logger().Info("admin console command", "command", string(text))
			if !s.adminUser(user) {
				// Removed from pool.admin_users by a reload since its login: the console ends (adminUser).
				ss.logger().Warn("admin console command refused: the user was removed from pool.admin_users", "command", string(text))
				ss.fatal(sqlstateInsufficientPrivilege, fmt.Sprintf("user %q may no longer use the admin console (removed from pool.admin_users by a reload)", user), "")
				return
			}
			s.adminCommand(out, string(text))
			writeMsg(out, msgReadyForQuery, []byte{txIdle}, "")
			if out.Flush() != nil {
				return
			}
		default:
			ss.fatal(sqlstateFeatureNotSupported, "the admin console takes the simple query protocol only", "")
			return
		}
	}
}

// adminUser reports whether user may use the admin console: pool.admin_users in force, at its login and again
// at each of its commands. A reload that removes a role (poolreload.go) takes the console from it at once, a
// session opened before included: its next command is refused with 42501 and the console ends. pgbouncer checks
// admin_users at login only; a role removed to take RELOAD, PAUSE and SHOW away from it (a leaked password, an
// operator gone) kept them for as long as it stayed connected (TestReload59AdminUsersFollowReload).
func (s *Server) adminUser(user string) bool {
	return slices.Contains(s.poolSettings().AdminUsers, user)
}

// adminTable is a command's answer: columns (all text) and rows; a nil table answers with the tag alone.
type adminTable struct {
	cols []string
	rows [][]string
}

// adminCommand answers one admin console command: its rows and tag, or an ERROR.
func (s *Server) adminCommand(out msgSink, text string) {
	words := strings.Fields(strings.TrimRight(strings.TrimSpace(text), "; \t\r\n"))
	verb := strings.ToUpper(strings.Join(words, " "))
	arg := "" // the database of PAUSE db and RESUME db
	if len(words) == 2 && (strings.EqualFold(words[0], "PAUSE") || strings.EqualFold(words[0], "RESUME")) {
		verb, arg = strings.ToUpper(words[0]), strings.Trim(words[1], `"`)
		if arg == "" {
			// PAUSE "" names no database: without this it read as PAUSE, every pool.
			verb = strings.ToUpper(strings.Join(words, " ")) // unknown: refused below
		}
	}
	var t *adminTable
	var err error
	tag := verb
	switch verb {
	case "SHOW POOLS":
		t = s.showPools()
	case "SHOW CLIENTS":
		t = s.showClients()
	case "SHOW SERVERS":
		t = s.showServers()
	case "SHOW STATS":
		t = s.showStats()
	case "SHOW LOCKS":
		t, err = s.showLocks(out) // admin_locks.go
	case "SHOW CONFIG":
		t = s.showConfig()
	case "RELOAD":
		var notApplied []string
		if notApplied, err = s.reloadAll(); err == nil && len(notApplied) > 0 {
			// pgbouncer applies pool sizes and timeouts at RELOAD; the proxy does not: say so, not only in its log.
			writeRaw(out, noticeResponse(sqlstateSuccessfulCompletion,
				"fenceproxy admin console: RELOAD applied the table list, auth.file and the pool settings; changes to "+strings.Join(notApplied, ", ")+" need a restart and were not applied", ""))
		}
	case "PAUSE":
		if arg != "" && !s.pools.hasDatabase(arg) {
			// pgbouncer knows its databases and refuses one it has not; pools here are made at first use, so the
			// name may be new or misspelt: PAUSE holds it all the same, and says that nothing was running.
			writeRaw(out, noticeResponse(sqlstateSuccessfulCompletion,
				fmt.Sprintf("fenceproxy admin console: no client has used database %q yet; its pools will be paused when made", arg),
				"Check the name with SHOW POOLS."))
		}
		err = s.pools.pause(arg, time.Now().Add(s.cfg.Limits.ShutdownTimeout))
	case "RESUME":
		err = s.pools.resume(arg)
	default:
		writeRaw(out, errorResponse("ERROR", sqlstateFeatureNotSupported, fmt.Sprintf("fenceproxy admin console: unknown command %q", strings.TrimSpace(text)), "",
			"The commands are SHOW POOLS, SHOW CLIENTS, SHOW SERVERS, SHOW STATS, SHOW LOCKS, SHOW CONFIG, RELOAD, PAUSE [db] and RESUME [db]."))
		return
	}
	if err != nil {
		var ae *adminError
		if errors.As(err, &ae) {
			writeRaw(out, errorResponse("ERROR", ae.code, ae.msg, "", ""))
		} else {
			writeRaw(out, errorResponse("ERROR", sqlstateObjectNotInPrerequisiteState, fmt.Sprintf("fenceproxy admin console: %s failed: %v", verb, err), "", ""))
		}
		return
	}
	var b []byte
	if t != nil {
		tag = "SHOW"
		rd := pgproto3.RowDescription{}
		for _, c := range t.cols {
			rd.Fields = append(rd.Fields, pgproto3.FieldDescription{Name: []byte(c), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1})
		}
		b, _ = rd.Encode(b)
		for _, r := range t.rows {
			dr := pgproto3.DataRow{}
			for _, v := range r {
				dr.Values = append(dr.Values, []byte(v))
			}
			b, _ = dr.Encode(b)
		}
	}
	b, _ = (&pgproto3.CommandComplete{CommandTag: []byte(tag)}).Encode(b)
	writeRaw(out, b)
}

// adminError is a refused admin command, with its SQLSTATE.
type adminError struct{ code, msg string }

func (e *adminError) Error() string { return e.msg }

// sqlstateObjectNotInPrerequisiteState is PostgreSQL's object_not_in_prerequisite_state: a command that cannot
// run in the proxy's state (RESUME of what is not paused, a PAUSE whose server connections stayed busy).
const sqlstateObjectNotInPrerequisiteState = "55000"

// reloadAll does what SIGHUP does (Options.Reload: the configuration's table list, the token ceiling, auth.file),
// or, for a Server given no reload function, reads auth.file again.
func (s *Server) reloadAll() ([]string, error) {
	if s.reload != nil {
		return s.reload()
	}
	return nil, s.ReloadAuth()
}

// poolCounts are a pool's clients and server connections now.
type poolCounts struct {
	clActive, clWaiting       int64
	svActive, svIdle, svLogin int64
	maxWait                   time.Duration // the longest wait of a client waiting now
}

// counts reads the pool's clients and server connections (SHOW POOLS, the fenceproxy_pool_* gauges).
func (p *txPool) counts() poolCounts {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	var n poolCounts
	for _, since := range p.waiters {
		n.maxWait = max(n.maxWait, now.Sub(since))
	}
	n.clWaiting = int64(len(p.waiters))
	n.clActive = max(0, p.clients.Load()-n.clWaiting)
	n.svIdle = int64(len(p.idle))
	n.svActive = int64(len(p.live)) - n.svIdle
	n.svLogin = p.dialing.Load()
	return n
}

func (s *Server) showPools() *adminTable {
	t := &adminTable{cols: []string{"database", "user", "cl_active", "cl_waiting", "sv_active", "sv_idle", "sv_login", "maxwait", "maxwait_us", "pool_mode", "paused"}}
	for _, p := range s.pools.list() {
		n := p.counts()
		paused := "0"
		if p.paused() {
			paused = "1"
		}
		t.rows = append(t.rows, []string{p.database, p.user, itoa(n.clActive), itoa(n.clWaiting), itoa(n.svActive), itoa(n.svIdle), itoa(n.svLogin),
			itoa(int64(n.maxWait / time.Second)), itoa(int64(n.maxWait % time.Second / time.Microsecond)), s.cfg.Pool.Mode, paused})
	}
	return t
}

func (s *Server) showStats() *adminTable {
	// pgbouncer's names and units (microseconds) for the counters it has too.
	t := &adminTable{cols: []string{"database", "user", "total_xact_count", "total_xact_time", "total_wait_time", "total_server_conns", "total_pins"}}
	for _, p := range s.pools.list() {
		t.rows = append(t.rows, []string{p.database, p.user, itoa(p.lends.Load()), itoa(p.lentNanos.Load() / 1000), itoa(p.waitNanos.Load() / 1000),
			itoa(p.opened.Load()), itoa(p.pins.Load())})
	}
	return t
}

// clientRow is what SHOW CLIENTS and SHOW SERVERS need of a client session.
type clientRow struct {
	ss    *session
	pool  *txPool
	m     member
	since time.Time // waiting since (zero: not waiting)
}

// clientsByLogin is every pooled client session, and each one's proxy PID (the BackendKeyData PID it got).
func (s *Server) clientsByLogin() ([]clientRow, map[*clientLogin]uint32) {
	var rows []clientRow
	for _, p := range s.pools.list() {
		p.mu.Lock()
		for ss, m := range p.members {
			rows = append(rows, clientRow{ss: ss, pool: p, m: m, since: p.waiters[m.login]})
		}
		p.mu.Unlock()
	}
	pids := make(map[*clientLogin]uint32, len(rows))
	s.mu.Lock()
	for _, r := range rows {
		pids[r.m.login] = r.ss.pid
	}
	s.mu.Unlock()
	sort.Slice(rows, func(i, j int) bool { return rows[i].m.since.Before(rows[j].m.since) })
	return rows, pids
}

// serverRow is what SHOW SERVERS and SHOW CLIENTS need of a server connection.
type serverRow struct {
	sc        *serverConn
	pool      *txPool
	idle      bool
	idleSince time.Time
}

// servers is every open server connection of the pools.
func (s *Server) servers() []serverRow {
	var rows []serverRow
	for _, p := range s.pools.list() {
		p.mu.Lock()
		idle := make(map[*serverConn]bool, len(p.idle))
		for _, sc := range p.idle {
			idle[sc] = true
		}
		for sc := range p.live {
			rows = append(rows, serverRow{sc: sc, pool: p, idle: idle[sc], idleSince: sc.idleSince})
		}
		p.mu.Unlock()
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].sc.born.Before(rows[j].sc.born) })
	return rows
}

// backendPID is a server connection's PostgreSQL backend PID (from its BackendKeyData).
func (sc *serverConn) backendPID() uint32 {
	if len(sc.key) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(sc.key)
}

// SHOW CLIENTS: pgbouncer's columns. ptr is the PID the client was given (its BackendKeyData; what it would
// cancel with), link the backend PID of the server connection lent to it (pg_stat_activity.pid), if any.
func (s *Server) showClients() *adminTable {
	t := &adminTable{cols: []string{"type", "user", "database", "state", "addr", "port", "local_addr", "local_port", "connect_time", "request_time",
		"wait", "wait_us", "ptr", "link", "tls", "application_name"}}
	clients, _ := s.clientsByLogin()
	lent := map[*clientLogin]*serverConn{}
	for _, r := range s.servers() {
		if l := r.sc.lentTo.Load(); l != nil {
			lent[l] = r.sc
		}
	}
	now := time.Now()
	for _, c := range clients {
		state, request, wait, link := "active", c.m.since, time.Duration(0), ""
		if !c.since.IsZero() {
			state, request, wait = "waiting", c.since, now.Sub(c.since)
		}
		if sc := lent[c.m.login]; sc != nil {
			link = strconv.FormatUint(uint64(sc.backendPID()), 10)
			request = time.Unix(0, sc.lentAt.Load())
		}
		addr, port := hostPort(c.ss.client.RemoteAddr())
		laddr, lport := hostPort(c.ss.client.LocalAddr())
		app := c.ss.params["application_name"]
		if a := c.ss.appName.Load(); a != nil {
			app = *a
		}
		t.rows = append(t.rows, []string{"C", c.pool.user, c.pool.database, state, addr, port, laddr, lport, timestamp(c.m.since), timestamp(request),
			itoa(int64(wait / time.Second)), itoa(int64(wait % time.Second / time.Microsecond)), strconv.FormatUint(uint64(c.ss.pid), 10), link,
			tlsVersion(c.ss.client), app})
	}
	return t
}

// SHOW SERVERS: pgbouncer's columns. ptr and remote_pid are the backend PID, link the ptr (proxy PID) of the
// client it is lent to; addr and port are the server's.
func (s *Server) showServers() *adminTable {
	t := &adminTable{cols: []string{"type", "user", "database", "state", "addr", "port", "local_addr", "local_port", "connect_time", "request_time",
		"ptr", "link", "remote_pid", "tls"}}
	_, pids := s.clientsByLogin()
	for _, r := range s.servers() {
		state, request, link := "idle", r.idleSince, ""
		if !r.idle {
			state = "active"
			request = time.Unix(0, r.sc.lentAt.Load())
			if l := r.sc.lentTo.Load(); l != nil {
				if pid, ok := pids[l]; ok {
					link = strconv.FormatUint(uint64(pid), 10)
				}
			}
		}
		if request.IsZero() || request.Unix() == 0 {
			request = r.sc.born
		}
		addr, port := hostPort(r.sc.conn.RemoteAddr())
		laddr, lport := hostPort(r.sc.conn.LocalAddr())
		pid := strconv.FormatUint(uint64(r.sc.backendPID()), 10)
		t.rows = append(t.rows, []string{"S", r.pool.user, r.pool.database, state, addr, port, laddr, lport, timestamp(r.sc.born), timestamp(request),
			pid, link, pid, tlsVersion(r.sc.conn)})
	}
	return t
}

func hostPort(a net.Addr) (string, string) {
	if a == nil {
		return "", ""
	}
	h, p, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String(), ""
	}
	return h, p
}

// timestamp is a time as psql shows a timestamptz, in UTC.
func timestamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000000+00") }

// tlsVersion is the TLS version of a connection ("TLSv1.3"), or "" for plain TCP.
func tlsVersion(c net.Conn) string {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return ""
	}
	switch tc.ConnectionState().Version {
	case tls.VersionTLS13:
		return "TLSv1.3"
	case tls.VersionTLS12:
		return "TLSv1.2"
	}
	return "TLS"
}

// configKeys are the settings SHOW CONFIG shows: those a pgbouncer user looks for. No secret is among them
// (passwords, password files' contents), by construction: only what is listed is shown.
var configKeys = []struct {
	key   string
	value func(c *config.Config) string
}{
	{"listen", func(c *config.Config) string { return c.Listen }},
	{"upstream.address", func(c *config.Config) string { return c.Upstream.Address }},
	{"upstream.hosts", func(c *config.Config) string { return strings.Join(c.Upstream.Hosts, ",") }},
	{"upstream.target", func(c *config.Config) string { return c.Upstream.Target }},
	{"pool.mode", func(c *config.Config) string { return c.Pool.Mode }},
	{"pool.size", func(c *config.Config) string { return strconv.Itoa(c.Pool.Size) }},
	{"pool.min_idle", func(c *config.Config) string { return strconv.Itoa(c.Pool.MinIdle) }},
	{"pool.max_clients", func(c *config.Config) string { return strconv.Itoa(c.Pool.MaxClients) }},
	{"pool.max_client_wait", func(c *config.Config) string { return c.Pool.MaxClientWait.String() }},
	{"pool.on_session_state", func(c *config.Config) string { return c.Pool.OnSessionState }},
	{"pool.server_lifetime", func(c *config.Config) string { return c.Pool.ServerLifetime.String() }},
	{"pool.server_idle_timeout", func(c *config.Config) string { return c.Pool.ServerIdleTimeout.String() }},
	{"pool.admin_users", func(c *config.Config) string { return strings.Join(c.Pool.AdminUsers, ",") }},
	{"auth.type", func(c *config.Config) string { return c.Auth.Type }},
	{"auth.file", func(c *config.Config) string { return c.Auth.File }},
	{"auth.user", func(c *config.Config) string { return c.Auth.User }},
	{"auth.query", func(c *config.Config) string { return c.Auth.Query }},
	{"limits.max_client_connections", func(c *config.Config) string { return strconv.Itoa(c.Limits.MaxClientConnections) }},
	{"limits.startup_timeout", func(c *config.Config) string { return c.Limits.StartupTimeout.String() }},
	{"limits.shutdown_timeout", func(c *config.Config) string { return c.Limits.ShutdownTimeout.String() }},
	{"token.setting", func(c *config.Config) string { return c.Token.Setting }},
	{"token.lock_setting", func(c *config.Config) string { return c.Token.LockSetting }},
	{"token.scope", func(c *config.Config) string { return c.Token.Scope }},
	{"relay.mode", func(c *config.Config) string { return c.Relay.Mode }},
}

// SHOW CONFIG: pgbouncer's columns (key, value, default, changeable). The values are those in force: the
// proxy's start's, and the pool settings a reload applied since. changeable says which RELOAD applies: the pool
// settings but pool.mode and pool.size (poolreload.go); every other key shown needs a restart.
func (s *Server) showConfig() *adminTable {
	cfg := *s.cfg
	cfg.Pool = *s.poolSettings()
	def := config.Defaults()
	t := &adminTable{cols: []string{"key", "value", "default", "changeable"}}
	for _, k := range configKeys {
		changeable := "no"
		if strings.HasPrefix(k.key, "pool.") && k.key != "pool.mode" && k.key != "pool.size" {
			changeable = "yes"
		}
		t.rows = append(t.rows, []string{k.key, k.value(&cfg), k.value(def), changeable})
	}
	return t
}

func writeRaw(out msgSink, b []byte) { out.Write(b) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// list returns the pools, by name.
func (ps *txPools) list() []*txPool {
	ps.mu.Lock()
	pools := make([]*txPool, 0, len(ps.byKey))
	for _, p := range ps.byKey {
		pools = append(pools, p)
	}
	ps.mu.Unlock()
	sort.Slice(pools, func(i, j int) bool { return pools[i].name < pools[j].name })
	return pools
}

// hasDatabase reports whether a pool of database db exists.
func (ps *txPools) hasDatabase(db string) bool {
	return slices.ContainsFunc(ps.list(), func(p *txPool) bool { return p.database == db })
}

// pausedUntil is the channel the next RESUME closes when PAUSE holds the pool, nil when it does not.
func (ps *txPools) pausedUntil(p *txPool) chan struct{} {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.pausedAll || ps.pausedDBs[p.database] {
		return ps.resumed
	}
	return nil
}

// pause is PAUSE [db], as pgbouncer's: from now on the pools of database db (every pool when db is "") lend no
// server connection (a transaction that starts waits, pool.max_client_wait included, until RESUME); the
// transactions running now finish. It returns once none of those pools has a server connection lent or being
// opened, and closes their idle ones (the database can restart); or, at deadline, with an error naming the
// pools still busy: they stay paused (PAUSE again waits again; RESUME ends the pause). A client pinned to its
// server connection keeps it, so its pool stays busy until it disconnects, as in pgbouncer's session mode. A
// pool of db made after the PAUSE is paused too.
func (ps *txPools) pause(db string, deadline time.Time) error {
	ps.mu.Lock()
	if db == "" {
		ps.pausedAll = true
	} else {
		if ps.pausedDBs == nil {
			ps.pausedDBs = map[string]bool{}
		}
		ps.pausedDBs[db] = true
	}
	if ps.resumed == nil {
		ps.resumed = make(chan struct{})
	}
	ps.anyPaused.Store(true)
	ps.mu.Unlock()
	ps.srv.log.Info("admin console: PAUSE", "database", db)
	t := time.NewTicker(pausePoll)
	defer t.Stop()
	for {
		var busy []string
		var quiet []*txPool
		for _, p := range ps.list() {
			if ps.pausedUntil(p) == nil {
				continue
			}
			if n := len(p.slots); n > 0 {
				busy = append(busy, fmt.Sprintf("%s (%d)", p.name, n))
				continue
			}
			quiet = append(quiet, p)
		}
		if len(busy) == 0 {
			for _, p := range quiet {
				p.closeIdle()
			}
			return nil
		}
		if time.Now().After(deadline) {
			return &adminError{sqlstateObjectNotInPrerequisiteState, fmt.Sprintf(
				"PAUSE: server connections still active after limits.shutdown_timeout in %s; the pools stay paused (PAUSE again to wait, RESUME to end the pause)",
				strings.Join(busy, ", "))}
		}
		select {
		case <-t.C:
		case <-ps.stop:
			return errors.New("the proxy is shutting down")
		}
	}
}

// resume is RESUME [db]: the pause of database db ends (every pause when db is ""), and the clients waiting for
// it go on.
func (ps *txPools) resume(db string) error {
	ps.mu.Lock()
	switch {
	case db == "" && !ps.anyPaused.Load():
		ps.mu.Unlock()
		return &adminError{sqlstateObjectNotInPrerequisiteState, "RESUME: nothing is paused"}
	case db == "":
		ps.pausedAll = false
		clear(ps.pausedDBs)
	case ps.pausedAll:
		ps.mu.Unlock()
		return &adminError{sqlstateObjectNotInPrerequisiteState, fmt.Sprintf("RESUME %s: every pool is paused (PAUSE without a database); RESUME without one ends that", db)}
	case !ps.pausedDBs[db]:
		ps.mu.Unlock()
		return &adminError{sqlstateObjectNotInPrerequisiteState, fmt.Sprintf("RESUME %s: database %q is not paused", db, db)}
	default:
		delete(ps.pausedDBs, db)
	}
	close(ps.resumed) // the waiters look again: those still paused wait on the next one
	ps.resumed = nil
	if ps.pausedAll || len(ps.pausedDBs) > 0 {
		ps.resumed = make(chan struct{})
	} else {
		ps.anyPaused.Store(false)
	}
	ps.mu.Unlock()
	ps.srv.log.Info("admin console: RESUME", "database", db)
	for _, p := range ps.list() {
		p.nudge() // pool.min_idle: open what the pause closed
	}
	return nil
}

// closeIdle closes the pool's idle server connections (PAUSE; a user removed from auth.file: poolreload.go),
// and returns how many it closed.
func (p *txPool) closeIdle() int {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	for _, sc := range idle {
		delete(p.live, sc)
	}
	p.mu.Unlock()
	for _, sc := range idle {
		sc.conn.Close()
	}
	return len(idle)
}
