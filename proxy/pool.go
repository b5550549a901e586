package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// Transaction pooling (pool.mode: transaction): the server connections. A txPool holds the server connections
// of one (database, user, startup settings) and lends them to clients one transaction at a time (pooled.go).
// A serverConn is the backend's side of the split: the connection, its framing, its BackendKeyData and what the
// proxy prepared on it; the client's logical state (token, lock, pin) stays with the client session.
//
// A pooled server connection holds, at session level, poolPlaceholder as its token and lock settings: never a
// token the proxy put there. Every transaction a client runs on it starts with the client's own values set
// transaction-locally (pooled.go: the token statement), so no value in the session, not even one a function
// left there, reaches another client's transaction; what runs without a token statement (a FunctionCall, a
// VACUUM) runs only after a check that the placeholder is still there (checkFirst), and a fenced write there
// meets a value no fence accepts (55F03) rather than another client's token.

// poolPlaceholder is the session-level value of the token and lock settings on every pooled server connection.
// It is not a valid token (ValidToken), nor a lock the guard accepts, so a write that meets it is refused.
const poolPlaceholder = rewrite.PoolPlaceholder

// errPoolTimeout: no server connection of a full pool became free within pool.max_client_wait.
var errPoolTimeout = errors.New("no server connection became free")

// errPoolPaused: the pool stayed paused (PAUSE, admin.go) for the whole of pool.max_client_wait. It is an
// errPoolTimeout: a client waiting through a pause is refused as one waiting for a full pool is (as pgbouncer's
// query_wait_timeout applies to its paused clients).
var errPoolPaused = fmt.Errorf("%w: the pool is paused (PAUSE)", errPoolTimeout)

// serverConn is one upstream connection of a pool.
type serverConn struct {
	// reading is how the server reads the connection's SQL text now, as it last reported (ParameterStatus of
	// client_encoding, server_encoding and standard_conforming_strings: at its startup, and since, whoever's
	// statement changed them, a function's or dynamic SQL's included, which nothing else sees). A client's
	// transaction starts only once the connection reads as the client's texts are read (replaySettings).
	reading serverReading
	// For the admin console (SHOW SERVERS, SHOW CLIENTS): the login of the client it is lent to (nil: idle) and
	// when it was lent, in Unix nanoseconds.
	lentTo atomic.Pointer[clientLogin]
	lentAt atomic.Int64
	// unreadBy is the session whose lend idles in a transaction block with nothing reading the connection
	// (answerInline), set as it goes idle: a client that waits for the pool looks at such connections
	// (wakeUnread). Stale once the lend moved on; whoever uses it checks under the session's lock.
	unreadBy atomic.Pointer[session]
	// lentBy is the session the connection was last lent to (lend), never cleared: its pl.lent says whether it
	// still is. writeBy is that session while one of its writes to the connection waits for the server to read
	// (writeWaits), under writeMu; writeWaiting says so without the lock, for the sweep (endStuckWrites).
	lentBy       atomic.Pointer[session]
	writeMu      sync.Mutex
	writeBy      *session
	writeWaiting atomic.Bool

	pool *txPool
	conn net.Conn
	r    msgReader
	w    *bufio.Writer
	// intr stops the lend's server side at a message boundary (intrEndLend, closeUnderRelay); raised on no
	// other connection, and only on one that is closed then.
	intr interrupt
	// relaying counts the lend's server sides (relayServer) that may be relaying this connection's messages to
	// a client now: a count, for one that ends may still be on its way out when the next lend's begins.
	relaying atomic.Int32
	// holder holds the bytes of w's next flush for the next read (writeHolder); nil where the socket cannot.
	holder writeHolder
	// The limit of an inline read (pooled.go: peekInline, txPools.inlineLook), under inlineMu: inlineSince is
	// when the session goroutine began to wait for an answer's first bytes (txPools.sinceEpoch; 0: it does not
	// wait), inlineTripped whether the watch set the read deadline that stops the wait.
	inlineMu      sync.Mutex
	inlineSince   time.Duration
	inlineTripped bool
	key           []byte       // BackendKeyData: PID and secret, for cancels
	host          upstreamHost // the server it was dialled to (the router's pick) and the router's epoch then
	// movedTo is the new primary when the connection was closed because a change of primary superseded its
	// host (txPools.dropHost): the client then learns why.
	movedTo atomic.Pointer[string]
	// fencedEnd is why the router stopped trusting the host and the table the lend's fenced transaction wrote,
	// when the proxy has the connection's backend terminated for it (deliverCancel): the server's FATAL is then
	// the proxy's farewell to the client (fencedTxFarewell), as in session mode, not the server's 57P01.
	fencedEnd atomic.Pointer[[2]string]
	born      time.Time
	idleSince time.Time // when it went back to the pool (under txPool.mu)
	// unnamedToken is the token statement the server's unnamed statement holds (tokenNone: not known to hold
	// one). No SQL reaches a connection's unnamed statement, and no client's message does either (a client's
	// unnamed statement goes to unnamedStmtName): only the proxy's Parse of it, and any simple Query, which drops
	// it, replace it. So what the proxy put there is there still, whichever client's code ran since: the token
	// statement is prepared once per connection and kind, and bound per transaction (writeTokenStmt).
	unnamedToken tokenStmtKind
	// clientUnnamed: unnamedStmtName may hold a client's unnamed statement (a Parse of it went since its last
	// Close), unnamedOwner's (nil: not known). It is closed before another client's first message (lend): no
	// other client's code reads its text, which may carry that client's token (inline form).
	clientUnnamed bool
	unnamedOwner  *pooledState
	stmts         map[string]bool // the clients' statements prepared on it, by server name (pooledstmts.go)
	// stmtsFresh are those of stmts that lastClient prepared (or prepared again) since it was lent the
	// connection, and that the server did not skip: only those are bound as they are. Another client's function
	// may have replaced any other (DEALLOCATE, then PREPARE of the name), so it is prepared again before its first
	// use (serverStmt).
	stmtsFresh map[string]bool
	// lastClient is the client it was last lent to: a lend to another makes it forget what it knew of the
	// proxy's own statements and state on it (lend).
	lastClient *pooledState
	// sqlStmts are the SQL-level prepared statements it holds for lastClient, by server name: what its Queries
	// prepared or dropped there since it was lent the connection (pooledsqlprep.go).
	sqlStmts map[string]bool
	// settings are its session-level settings that the pool replays, as last read back or put there; nil: the
	// pool's defaults. settingsFor is the client for which settingsStmtName was last prepared on it (pooledsettings.go).
	settings    map[string]string
	settingsFor *pooledState
	// checkedFor is the client for which the check of its session state (the role, and the token and lock
	// placeholders: pooledsettings.go checkFirst) last ran on it, if no other client was lent it since.
	checkedFor *pooledState
	// prep is the fenced statement templates prepared on it (prepared.go), whichever client's transaction
	// prepared them: a client's session uses them while the connection is lent to it (session.prep, set by lend).
	// Its trust counts every client's messages on the connection, so a name that another client's function
	// replaced is verified before any client EXECUTEs it.
	prep *prepState
	// beforeSend is called (the client's pooledState.mu held) before bytes written to w reach the server: the
	// client it is lent to makes sure something reads the answers (pooled.go: needReader). nil: nobody's.
	beforeSend func()
	// loginSuperuser is is_superuser as its login reported it. roleSeen: its login can become no role the server
	// would not report (logIn, roleSeen: a superuser). A change of its role behind the proxy's back is then seen
	// (superMoved, authMoved), and a plain token statement needs not set the role back (pooled.go:
	// plainPrefix).
	loginSuperuser string
	roleSeen       bool
	// superMoved and authMoved: the server last reported is_superuser other than its login did
	// (loginSuperuser: the pool's other connections may have logged in before the role was made a superuser, or
	// after it was made none), or session_authorization other than the login role (pooledsettings.go:
	// pooledParamStatus). Such a connection serves nobody else (release).
	superMoved, authMoved atomic.Bool
}

// writeHolder is a socket whose writes can wait for its next read (rawsocket_linux.go: rawSocket.holdWrites).
type writeHolder interface{ holdWrites(on bool) }

// spokeUnread reports whether the server sent something on the connection that nobody has read (a FATAL before
// it closed it, a notice), or ended it: bytes in its reader's buffer, or waiting in the socket, or its end.
func (sc *serverConn) spokeUnread() bool { return sc.r.r.Buffered() > 0 || spokeOrClosed(sc.conn) }

// writeWaiter is told when a write to a server connection must wait for the server to read (the socket is
// full), and when that write returned: rawSocket tells it on its slow path only (watchWrites).
type writeWaiter interface{ writeWaits(waiting bool) }

// writeWaits marks (waiting) or unmarks the connection as being written by its lend's session in a write that
// waits for the server to read. A write made while the connection is lent comes from the session it is lent
// to, holding that session's pl.mu (the session goroutine forwarding, or the lend's server side in settle),
// and the lend ends (pl.sc, pl.lent cleared) only under pl.mu; the pool's own writes (a login) are made while
// no session has it, and are not marked. So from the mark to its unmark the lend cannot end, and the
// connection cannot go back to the pool or to another client: endStuckWrites, which closes it only under
// writeMu with the mark set, closes the connection of that session only.
func (sc *serverConn) writeWaits(waiting bool) {
	if !waiting {
		sc.writeMu.Lock()
		sc.writeBy = nil
		sc.writeWaiting.Store(false)
		sc.writeMu.Unlock()
		return
	}
	ss := sc.lentBy.Load()
	if ss == nil || ss.pooled.lent.Load() != sc {
		return // the pool's own write: no client of its to leave
	}
	sc.writeMu.Lock()
	sc.writeBy = ss
	sc.writeWaiting.Store(true)
	sc.writeMu.Unlock()
}

// endStuckWrites closes each lent connection of the pool whose session waits in a write to it while its client
// has left. The session then never moves on by itself: a goroutine that writes to the server holding pl.mu,
// while the server waits for its answers to be read and the lend's server side, which reads them, waits for
// pl.mu, is a deadlock of the proxy's own (a client that pipelined far more than it read: settle, copyStarted
// before 590a72a); nobody reads the client's socket, so its leaving goes unseen, and the connection and its
// pool slot would stay held until the proxy stopped. Closed, the write fails and the session ends as for any
// client that leaves mid-transaction (the server rolls back). Connected directly, such a server would have
// seen its client leave at its next write. A waiting client calls it every waitCheck, the reaper at its ticks.
func (p *txPool) endStuckWrites() {
	for _, sc := range p.liveWhere(func(sc *serverConn) bool { return sc.writeWaiting.Load() }) {
		sc.writeMu.Lock()
		if ss := sc.writeBy; ss != nil && peerClosed(ss.client) {
			// Under writeMu: the write has not returned, so the connection is still that session's
			// (writeWaits). Close waits for the write to let go of the socket, which it does before it
			// unmarks (writeMu).
			sc.conn.Close()
		}
		sc.writeMu.Unlock()
	}
}

// serverOut is what a server connection's writer writes through: beforeSend first.
type serverOut struct {
	sc *serverConn
	w  io.Writer
}

func (o serverOut) Write(p []byte) (int, error) {
	if f := o.sc.beforeSend; f != nil {
		f()
	}
	return o.w.Write(p)
}

// txPools are the pools of a Server, by key.
type txPools struct {
	clients atomic.Int64 // client sessions of every pool (pool.max_clients)

	// beforePutBack, when set (by tests only: testHooks), runs in release between the checks made before the
	// lock and the put-back itself, where a test holds a put-back while a change of primary is published
	// (dropHost). Set by New before anything runs, and only read after.
	beforePutBack func()
	// beforePoolMade, likewise, runs in poolFor before it takes mu to find or make the pool: where a test
	// reloads the pool settings (poolreload.go) while a client's pool is being made.
	beforePoolMade func()

	// PAUSE and RESUME (admin.go), under mu: every pool paused, or those of some databases (nil until one is).
	// resumed is closed by the next RESUME (nil when nothing is paused); anyPaused lets a lend skip mu when
	// nothing is.
	pausedAll bool
	pausedDBs map[string]bool
	resumed   chan struct{}
	anyPaused atomic.Bool

	// The watch of inline waits (pooled.go: peekInline), under watchMu: inlineWaits are the waits under way,
	// watchTimer runs the watch's next look (nil until the first wait), armed while any wait is under way;
	// watchLooks counts its looks (tests). epoch: what inline waits are timed from.
	watchMu     sync.Mutex
	inlineWaits int
	watchTimer  *time.Timer
	watchArmed  bool
	watchLooks  atomic.Int64
	epoch       time.Time

	srv    *Server
	parker *parker // idle clients without goroutines (park_linux.go); nil when there is none
	mu     sync.Mutex
	byKey  map[string]*txPool
	groups map[string]*poolGroup // by database and user (groupKey)
	closed bool
	stop   chan struct{} // closed by close: the reaper stops
	retick chan struct{} // a reload changed the pool settings: the reaper looks now, at its new period (poolreload.go)

	// clientWatcher wakes a session's wait on the server side when its client leaves (watch.go); nil: waits poll.
	clientWatcher *clientWatcher
}

// newTxPools makes a Server's pools and starts their reaper, which closes server connections idle longer than
// pool.server_idle_timeout or older than pool.server_lifetime.
func newTxPools(s *Server, parkAfter time.Duration) *txPools {
	ps := &txPools{srv: s, byKey: map[string]*txPool{}, groups: map[string]*poolGroup{}, stop: make(chan struct{}), retick: make(chan struct{}, 1), epoch: time.Now()}
	if parkAfter > 0 {
		ps.parker = newParker(s, parkAfter)
	}
	ps.clientWatcher = newClientWatcher()
	go func() {
		t := time.NewTicker(ps.reaperPeriod())
		defer t.Stop()
		for {
			select {
			case <-ps.stop:
				return
			case <-ps.retick: // a reload changed the lifetimes: look now, and then as often as they need
				t.Reset(ps.reaperPeriod())
			case <-t.C:
			}
			for _, p := range ps.list() {
				p.reap()
				p.endStuckWrites()
			}
			ps.dropUnused()
		}
	}()
	return ps
}

// reap closes the pool's idle server connections that were alive too long (pool.server_lifetime), those the
// server closed (it said FATAL first: a restart, pg_terminate_backend), and those idle too long
// (pool.server_idle_timeout) beyond the pool.min_idle the pool keeps, as pgbouncer keeps min_pool_size;
// keepIdle opens new ones for those closed.
func (p *txPool) reap() {
	cfg := p.srv.poolSettings()
	keep := p.minIdle()
	now := time.Now()
	var old []*serverConn
	p.mu.Lock()
	spare := len(p.idle) - keep // p.idle[0] is the one idle longest
	kept := p.idle[:0]
	for _, sc := range p.idle {
		if now.Sub(sc.born) > cfg.ServerLifetime || sc.spokeUnread() ||
			spare > 0 && now.Sub(sc.idleSince) > cfg.ServerIdleTimeout {
			old = append(old, sc)
			delete(p.live, sc)
			spare--
			continue
		}
		kept = append(kept, sc)
	}
	clear(p.idle[len(kept):])
	p.idle = kept
	p.mu.Unlock()
	for _, sc := range old {
		sc.conn.Close()
	}
	if len(old) > 0 {
		p.nudge()
	}
}

// txPool is the server connections of one (database, user, startup settings).
type txPool struct {
	srv     *Server
	name    string            // "database/user", in messages and logs
	params  map[string]string // the startup parameters of its server connections
	slots   chan struct{}     // one per server connection lent or being opened (idle ones hold none): the group's
	group   *poolGroup        // the pools of its database and user
	stop    chan struct{}     // closed when the pool is dropped (dropUnused): keepIdle ends
	dropped bool              // dropped by dropUnused (under txPools.mu): it dials nothing more (makeRoom)
	mu      sync.Mutex
	idle    []*serverConn
	live    map[*serverConn]struct{} // every open server connection, idle or lent (dropHost closes a host's)
	timers  sync.Pool                // stopped *time.Timer for clients waiting in takeSlot: none made per wait
	reports []paramStatus            // ParameterStatus values of its first server connection, shown to its clients
	// startups are its clients' startup parameters, one map for all clients that gave the same (sharedParams),
	// by startupKey; clientViews its clients' lists of ParameterStatus values, one for all that see the same
	// (clientParams), by application_name. Both are read only once given out, and both bounded (sharedMax).
	startups    map[string]map[string]string
	clientViews map[string][]paramStatus

	database, user string // its database (the user's name when the client gave none) and user

	// resetToken and resetLock are the token and lock values a RESET gives on its server connections (role and
	// database defaults; nil: none), read when the first one is opened.
	resetToken, resetLock *string
	// resetApp is the application_name a RESET gives on its server connections, which start without a client's
	// (poolKeyParams): the value the first one reported.
	resetApp   string
	tokenStmts tokenStmtCache // the token statement's texts, built once (pooledsettings.go)

	// pool.min_idle (keepIdle, started once the pool keeps some: startKeeper): refill is signalled when the pool
	// may have fewer idle server connections than it keeps; idleLogin is how they log in: the login of the
	// last client whose server connection logged in, as pgbouncer keeps a client's SCRAM keys for its server
	// logins. Kept whatever pool.min_idle is, for a reload may raise it (poolreload.go).
	refill    chan struct{}
	keeper    sync.Once
	keeping   atomic.Bool // the keeper runs (startKeeper): nudge has someone to tell
	idleLogin atomic.Pointer[clientLogin]

	waitTime prometheus.Observer // fenceproxy_pool_wait_seconds of the pool's database and user; nil: no metrics

	// For the admin console (admin.go) and the metrics. members and waiters are under mu.
	members map[*session]member        // client sessions of the pool
	waiters map[*clientLogin]time.Time // clients waiting for a server connection now, since when
	clients atomic.Int64               // client sessions of the pool
	waiting atomic.Int64               // clients waiting for a server connection now
	dialing atomic.Int64               // server connections being opened now
	lends   atomic.Int64               // server connections lent, since start
	opened  atomic.Int64               // server connections opened, since start
	pins    atomic.Int64               // clients pinned, since start
	// lentNanos and waitNanos are the time server connections spent lent and clients spent waiting for one,
	// since start (SHOW STATS total_xact_time, total_wait_time).
	lentNanos, waitNanos atomic.Int64
}

// member is a client session of a pool, as the admin console shows it.
type member struct {
	login *clientLogin
	since time.Time
}

// poolGroup is the pools of one database and user (they differ in other startup parameters). pool.size is the
// group's: its pools share one set of places for server connections lent or being opened (slots), and a pool
// that opens one closes an idle one of the group first when the group's open connections are pool.size already
// (makeRoom), as pgbouncer closes idle connections of other pools at max_db_connections. So a client cannot
// open more server connections than pool.size by logging in with ever new startup parameters (a new pool
// each), which filled the server's max_connections for every other client (an attacker's review, 2026-12-04).
type poolGroup struct {
	slots chan struct{}
	pools []*txPool // under txPools.mu
}

// groupKey is the key of the pool group of a database and user.
func groupKey(database, user string) string { return database + "\x00" + user }

// errPoolDropped: a dial for a pool that dropUnused dropped (its min_idle keeper, which ends then).
var errPoolDropped = errors.New("the pool was dropped")

// openCounts are a group's server connections open or being opened, and its idle one idle longest (nil: none),
// with its pool (txPools.mu held).
func (g *poolGroup) openCounts() (open int64, victim *serverConn, from *txPool) {
	for _, q := range g.pools {
		q.mu.Lock()
		open += int64(len(q.live)) + q.dialing.Load()
		if len(q.idle) > 0 && (victim == nil || q.idle[0].idleSince.Before(victim.idleSince)) {
			victim, from = q.idle[0], q
		}
		q.mu.Unlock()
	}
	return open, victim, from
}

// makeRoom counts p's coming dial (p.dialing), first closing the idle connection of the group idle longest
// when the group has pool.size connections open or being opened already. A dial holds a slot, so at most
// pool.size - 1 others are lent or being opened and the rest are idle: one is there to close (taken from its
// pool's idle ones under that pool's lock; one lent meanwhile is counted again). It all happens under the
// pools' lock: no pool joins or leaves the group meanwhile, two dials cannot both find room for one, and a pool
// that dropUnused dropped (whose connections nothing would count, reap or close) dials nothing.
func (p *txPool) makeRoom() error {
	ps := p.srv.pools
	ps.mu.Lock()
	if p.dropped {
		ps.mu.Unlock()
		return errPoolDropped
	}
	var victim *serverConn
	var from *txPool
	for {
		open, v, q := p.group.openCounts()
		if open < int64(p.srv.poolSettings().Size) || v == nil {
			break
		}
		q.mu.Lock()
		i := slices.Index(q.idle, v)
		if i >= 0 {
			q.idle = slices.Delete(q.idle, i, i+1)
			delete(q.live, v)
		}
		q.mu.Unlock()
		if i >= 0 {
			victim, from = v, q
			break
		}
	}
	p.dialing.Add(1)
	ps.mu.Unlock()
	if victim != nil {
		victim.conn.Close()
		from.nudge()
	}
	return nil
}

// dropUnused forgets the pools that have no client session, no server connection and no dial going on (the
// reaper, after their idle connections were closed): a pool is made at a client's first login, before the
// server accepted it, so logins with ever new startup parameters or unknown databases made pools (and metric
// series) that nothing took away. A client that comes later makes its pool again.
func (ps *txPools) dropUnused() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for key, p := range ps.byKey {
		p.mu.Lock()
		unused := p.clients.Load() == 0 && len(p.live) == 0 && p.dialing.Load() == 0 && len(p.waiters) == 0
		p.mu.Unlock()
		// A pool that keeps pool.min_idle connections for a login that worked stays: its keeper opens them
		// again after the reaper closed them (server_lifetime, a server that ended them).
		if !unused || p.keepsIdle() {
			continue
		}
		delete(ps.byKey, key)
		p.dropped = true
		close(p.stop)
		g := p.group
		g.pools = slices.DeleteFunc(g.pools, func(q *txPool) bool { return q == p })
		if len(g.pools) == 0 {
			delete(ps.groups, groupKey(p.database, p.user))
			ps.srv.metrics.poolGone(p.database, p.user)
		}
	}
}

// poolKeyParam is whether a client's startup parameter k (value v) chooses its pool, and the value that does:
// every one but those the proxy keeps per client (the token and lock settings, in options too,
// application_name).
func poolKeyParam(k, v, tokenSetting, lockSetting string) (string, bool) {
	switch {
	case k == "application_name", strings.EqualFold(k, tokenSetting), strings.EqualFold(k, lockSetting):
		return "", false
	case k == "options":
		if v = withoutOptionSettings(v, tokenSetting, lockSetting); v == "" {
			return "", false
		}
	}
	return v, true
}

// poolParam is a startup parameter that chooses a pool (poolKeyParam).
type poolParam struct{ name, value string }

// poolFor returns the pool of a client's startup parameters, creating it.
//
// The parameters and the key are gathered in buffers on the stack, and the key is looked up without a string
// of its own (a map index by string(bytes) makes none): a client of an existing pool, every client but the
// first, allocates nothing here, where a connection per transaction paid six allocations (a map of the
// parameters, the sorted names, the key's growth).
func (ps *txPools) poolFor(params map[string]string) (*txPool, error) {
	cfg := ps.srv.cfg
	var kpBuf [16]poolParam
	kp := kpBuf[:0]
	for k, v := range params {
		if v, ok := poolKeyParam(k, v, cfg.Token.Setting, cfg.Token.LockSetting); ok {
			kp = append(kp, poolParam{k, v})
		}
	}
	slices.SortFunc(kp, func(a, b poolParam) int { return strings.Compare(a.name, b.name) })
	var keyBuf [256]byte
	key := keyBuf[:0]
	for _, p := range kp {
		key = append(append(key, p.name...), 0)
		key = append(append(key, p.value...), 0)
	}
	if hook := ps.beforePoolMade; hook != nil {
		hook()
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		return nil, errors.New("the proxy is shutting down")
	}
	// Read under mu: a reload stores the settings before settingsChanged lists the pools (under mu), so either
	// this pool is made with the new ones or it is among those listed (a keeper for a raised pool.min_idle).
	poolCfg := ps.srv.poolSettings()
	if p := ps.byKey[string(key)]; p != nil {
		p.clients.Add(1) // under ps.mu: dropUnused does not take a pool a client is joining
		return p, nil
	}
	chosen := make(map[string]string, len(kp))
	for _, p := range kp {
		chosen[p.name] = p.value
	}
	p := &txPool{srv: ps.srv, database: chosen["database"], user: chosen["user"], params: chosen, stop: make(chan struct{}), refill: make(chan struct{}, 1),
		live: map[*serverConn]struct{}{}, members: map[*session]member{}, waiters: map[*clientLogin]time.Time{}}
	if p.database == "" {
		p.database = p.user // as PostgreSQL defaults it
	}
	gk := groupKey(p.database, p.user)
	g := ps.groups[gk]
	if g == nil {
		g = &poolGroup{slots: make(chan struct{}, poolCfg.Size)}
		ps.groups[gk] = g
	}
	g.pools = append(g.pools, p)
	p.group, p.slots = g, g.slots
	p.name = p.database + "/" + p.user
	p.waitTime = ps.srv.metrics.poolWaitTime(p.database, p.user)
	if poolCfg.MinIdle > 0 {
		p.startKeeper()
	}
	ps.byKey[string(key)] = p
	p.clients.Add(1)
	return p, nil
}

// join makes a client session that authenticated a client of the pool its startup parameters choose, and
// returns the pool and what to call when the session ends. A client over pool.max_clients (counted across the
// proxy, after authentication, so that connections which never log in do not take the places of clients that
// do; the admin console is not counted) is refused with 53300, as PostgreSQL refuses one over
// max_connections; it is told, and join reports false.
func (ps *txPools) join(ss *session, login *clientLogin) (*txPool, func(), bool) {
	limit := int64(ps.srv.poolSettings().MaxClients)
	if n := ps.clients.Add(1); limit > 0 && n > limit {
		ps.clients.Add(-1)
		ps.srv.metrics.sessionRefused("max_clients")
		ss.fatal(sqlstateTooManyConnections, "sorry, too many clients already", fmt.Sprintf("fenceproxy serves at most %d pooled client sessions (pool.max_clients).", limit))
		return nil, nil, false
	}
	p, err := ps.poolFor(ss.params) // counted in p.clients
	if err != nil {
		ps.clients.Add(-1)
		ss.fatal(sqlstateCannotConnectNow, err.Error(), "")
		return nil, nil, false
	}
	p.mu.Lock()
	ss.params = p.sharedParams(ss.params) // before the admin console can see the member (under p.mu)
	p.members[ss] = member{login: login, since: time.Now()}
	p.mu.Unlock()
	return p, func() {
		p.mu.Lock()
		delete(p.members, ss)
		p.mu.Unlock()
		p.clients.Add(-1)
		ps.clients.Add(-1)
	}, true
}

// sharedMax bounds the startup parameter maps, and the lists of ParameterStatus values, a pool keeps to share
// among its clients: clients that differ in every one (an application_name per client) each keep their own.
const sharedMax = 64

// sharedParams is params, the startup parameters of a client joining p, or an equal map another client of p
// gave, so that clients alike keep one (a pooled client idle for hours keeps them all that time). No one
// writes a session's startup parameters once it joined its pool (p.mu held).
func (p *txPool) sharedParams(params map[string]string) map[string]string {
	key := startupKey(nil, params)
	if m, ok := p.startups[key]; ok {
		return m
	}
	if len(p.startups) < sharedMax {
		if p.startups == nil {
			p.startups = map[string]map[string]string{}
		}
		p.startups[key] = params
	}
	return params
}

// clientParams is the list of ParameterStatus values a client of p that gave application_name app (if hasApp)
// starts with: the pool's reports, its application_name the client's. One list for all clients that see the
// same; a session changes its own only by a copy (noteParamValue: protoState.sharedParams).
func (p *txPool) clientParams(reports []paramStatus, app string, hasApp bool) []paramStatus {
	if !hasApp {
		return reports // the pool's: set once, never written (serverReports)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if v, ok := p.clientViews[app]; ok {
		return v
	}
	v := make([]paramStatus, 0, len(reports)+1)
	for _, r := range reports {
		if r.name == "application_name" {
			r.value, hasApp = app, false
		}
		v = append(v, r)
	}
	if hasApp {
		v = append(v, paramStatus{"application_name", app})
	}
	v = slices.Clip(v)
	if len(p.clientViews) < sharedMax {
		if p.clientViews == nil {
			p.clientViews = map[string][]paramStatus{}
		}
		p.clientViews[app] = v
	}
	return v
}

// close closes the idle server connections of every pool; lent ones are closed when given back.
func (ps *txPools) close() {
	ps.mu.Lock()
	if !ps.closed {
		close(ps.stop)
	}
	ps.closed = true
	pools := make([]*txPool, 0, len(ps.byKey))
	for _, p := range ps.byKey {
		pools = append(pools, p)
	}
	ps.mu.Unlock()
	for _, p := range pools {
		p.closeIdle() // an idle connection holds no slot
	}
}

// lendWait is what a client's wait for a server connection (takeSlot) watches besides the pool: wake, signalled
// when something may have ended the wait (a CancelRequest, a drain, the session's forced close), and stopped,
// which says whether and why it ended (nil: wait on). stopped is also asked every waitCheck, since a client
// that disconnects signals nothing. Its error is the wait's.
type lendWait struct {
	wake    <-chan struct{}
	stopped func() error
}

// waitCheck is how often a long wait for a server connection asks lendWait.stopped: a client that left while it
// waited is noticed within it (a wait shorter than it never asks). A wait on the server side that cannot be
// woken by its client socket's end (clientWatch.poll: other systems) looks that often too.
const waitCheck = 100 * time.Millisecond

// acquire lends a server connection: an idle one, or a new one (logged in with login, the client's) while the
// pool has room; else it waits for one up to wait (takeSlot), watching lw (nil: nothing).
func (p *txPool) acquire(wait time.Duration, login *clientLogin, lw *lendWait) (*serverConn, error) {
	if err := p.takeSlot(wait, login, lw); err != nil {
		return nil, err
	}
	p.lends.Add(1)
	sc, err := p.connFor(login)
	if err != nil {
		<-p.slots
		return nil, err
	}
	sc.lentAt.Store(time.Now().UnixNano())
	sc.lentTo.Store(login)
	return sc, nil
}

// takeSlot takes one of the pool's pool.size places for a server connection lent or being opened, waiting up
// to wait for one while the pool is full or paused (PAUSE: no new lends until RESUME), unless lw ends the wait
// first (its error is returned; nil lw: nothing does). The wait is observed (the wait-time histogram, SHOW
// CLIENTS, SHOW POOLS' maxwait).
func (p *txPool) takeSlot(wait time.Duration, login *clientLogin, lw *lendWait) error {
	select {
	case p.slots <- struct{}{}:
		if !p.paused() {
			p.observeWait(0)
			return nil
		}
		<-p.slots
	default:
	}
	start := time.Now()
	p.mu.Lock()
	p.waiters[login] = start
	p.mu.Unlock()
	p.waiting.Add(1)
	defer func() {
		p.waiting.Add(-1)
		p.mu.Lock()
		delete(p.waiters, login)
		p.mu.Unlock()
		p.observeWait(time.Since(start))
	}()
	// The timer fires at the wait's end, or every waitCheck before it when there is a client to look at.
	var wake <-chan struct{} // nil: never ready
	next := func() time.Duration {
		left := wait - time.Since(start)
		if lw != nil {
			left = min(left, waitCheck)
		}
		return max(left, 0)
	}
	if lw != nil {
		wake = lw.wake
	}
	t, _ := p.timers.Get().(*time.Timer)
	if t == nil {
		t = time.NewTimer(next())
	} else {
		t.Reset(next()) // stopped, its channel empty (Go 1.23 timers)
	}
	defer func() {
		t.Stop()
		p.timers.Put(t)
	}()
	// woken looks at why the timer fired or lw woke the wait: the wait's error, or nil to wait on (the timer
	// set again after it fired).
	woken := func(fired bool, timeout error) error {
		if lw != nil {
			if err := lw.stopped(); err != nil {
				return err
			}
		}
		if !fired {
			return nil
		}
		if time.Since(start) >= wait {
			return timeout
		}
		if lw != nil {
			p.wakeUnread()
			p.endStuckWrites()
		}
		t.Reset(next())
		return nil
	}
	for {
		// anyPaused first: pausedUntil takes the lock of every pool's PAUSE state, once per wait. A PAUSE that
		// comes after this look is caught by paused() once the slot is taken.
		if p.srv.pools.anyPaused.Load() {
			if resumed := p.srv.pools.pausedUntil(p); resumed != nil {
				var err error
				select {
				case <-resumed:
				case <-t.C:
					err = woken(true, errPoolPaused)
				case <-wake:
					err = woken(false, errPoolPaused)
				}
				if err != nil {
					return err
				}
				continue
			}
		}
		var err error
		select {
		case p.slots <- struct{}{}:
			if !p.paused() {
				return nil
			}
			<-p.slots // paused meanwhile: no lend
		case <-t.C:
			err = woken(true, errPoolTimeout)
		case <-wake:
			err = woken(false, errPoolTimeout)
		}
		if err != nil {
			return err
		}
	}
}

// wakeUnread starts a reader on each lent connection of the pool that idles in a transaction block with nothing
// reading it (serverConn.unreadBy) and that the server has spoken on or ended: the lend then ends as it would
// have with a reader (the server's FATAL relayed, the slot freed), rather than when its client next speaks. A
// crash restart of the server (one backend killed) or idle_in_transaction_session_timeout ends such
// connections while their clients, and the clients waiting for the pool, say nothing. A waiting client calls
// it every waitCheck. It never waits for a session's lock: one that is busy is looked at next time.
func (p *txPool) wakeUnread() {
	for _, sc := range p.liveWhere(func(sc *serverConn) bool { return sc.unreadBy.Load() != nil }) {
		ss := sc.unreadBy.Load()
		if ss == nil || !spokeOrClosed(sc.conn) || !ss.pooled.mu.TryLock() {
			continue
		}
		if pl := ss.pooled; pl.sc == sc && sc.unreadBy.CompareAndSwap(ss, nil) {
			ss.needReader()
		}
		ss.pooled.mu.Unlock()
	}
}

// liveWhere is the pool's open server connections for which match is true, taken under mu, for a look at each
// without it.
func (p *txPool) liveWhere(match func(*serverConn) bool) []*serverConn {
	var found []*serverConn
	p.mu.Lock()
	for sc := range p.live {
		if match(sc) {
			found = append(found, sc)
		}
	}
	p.mu.Unlock()
	return found
}

// observeWait records how long a lend waited for its slot.
func (p *txPool) observeWait(d time.Duration) {
	if p.waitTime != nil {
		p.waitTime.Observe(d.Seconds())
	}
	if d > 0 {
		p.waitNanos.Add(int64(d))
	}
}

// paused reports whether PAUSE holds the pool's new lends. A lend checks it after it took its slot and PAUSE
// looks at the slots after it set it, so that no lend slips past a PAUSE that found the pool quiet.
func (p *txPool) paused() bool {
	return p.srv.pools.anyPaused.Load() && p.srv.pools.pausedUntil(p) != nil
}

// connFor is the server connection for a lend whose slot is taken: an idle one, or a new one.
func (p *txPool) connFor(login *clientLogin) (*serverConn, error) {
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			break
		}
		sc := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		p.nudge() // one idle fewer
		if sc.spokeUnread() || p.superseded(sc) {
			// The server spoke to an idle connection: the FATAL it sends before it closes one (a restart,
			// pg_terminate_backend). Or its host is no longer where the pool's transactions go (a change of
			// primary, a withdrawn primary: superseded). Another connection serves the client instead of this
			// one failing it; with no primary published, the dial waits for the next.
			p.forget(sc)
			continue
		}
		return sc, nil
	}
	sc, err := p.dial(login)
	if err == nil && p.superseded(sc) {
		// Dialled to a host picked just before a change of primary was published or the primary withdrawn
		// (dropHost missed it): the next pick is the new one, or waits for it.
		p.forget(sc)
		sc, err = p.dial(login)
	}
	return sc, err
}

// release takes back a server connection that is idle and clean: no transaction, the placeholders in place.
func (p *txPool) release(sc *serverConn) {
	if sc.superMoved.Load() || sc.authMoved.Load() {
		// A function changed the role at session level: what it left would run the next client's transaction.
		p.srv.log.Warn("pooled server connection left with another role than it logged in as; closing it", "pool", p.name)
		p.discard(sc)
		return
	}
	if p.srv.draining.Load() || time.Since(sc.born) > p.srv.poolSettings().ServerLifetime {
		p.discard(sc)
		return
	}
	if hold := p.srv.pools.beforePutBack; hold != nil {
		hold()
	}
	p.lendEnded(sc)
	sc.unreadBy.Store(nil)
	p.mu.Lock()
	// Judged under the lock dropHost takes, so that the idle ones are always open ones (p.live): a change of
	// primary published before this point has its dropHost either done (sc taken off p.live, closed: not put
	// back) or still to come (it finds sc among the idle ones and takes it out). Before 2026-12-05 the host was
	// judged before the lock, and a dropHost in between left a closed connection idle, counted by SHOW POOLS and
	// the gauges and keeping pool.min_idle from opening one on the new primary
	// (TestPooledPutBackRacingAChangeOfPrimary). The router's lock is taken inside the pool's, never the reverse.
	if _, open := p.live[sc]; !open || p.superseded(sc) {
		p.mu.Unlock()
		p.discard(sc)
		return
	}
	sc.idleSince = time.Now()
	p.idle = append(p.idle, sc)
	p.mu.Unlock()
	<-p.slots
}

// discard closes a server connection whose state is unknown or the client's own (a transaction the client left
// open, pinned session state): closing it is what rolls the transaction back, and nobody else gets it.
func (p *txPool) discard(sc *serverConn) {
	p.forget(sc)
	<-p.slots
	p.nudge() // pool.min_idle: the place is free now (forget's nudge came while it was still taken)
}

// forget closes a server connection and takes it off the pool's list of open ones.
func (p *txPool) forget(sc *serverConn) {
	p.lendEnded(sc)
	p.mu.Lock()
	delete(p.live, sc)
	p.mu.Unlock()
	sc.closeUnderRelay()
	p.nudge()
}

// relayEndGrace bounds how long closeUnderRelay waits for the rest of the message a relay is in.
const relayEndGrace = time.Second

// closeUnderRelay closes sc. A lend's server side that relays its messages to a client (relaying) is never cut
// inside a message: the bytes of it the client got would be followed by nothing (a cut row, and then no
// FATAL, for the client would read the FATAL's bytes as the rest of the row: clientCut). It is interrupted
// (intrEndLend) instead: every read of sc reads on to the end of the message it is in, and the next message
// is refused (msgReader.next: errEndedAtBoundary), so the relay stops at that boundary and closes sc itself
// (relayServer, lendFailed), and so do the proxy's own statements on sc (the probe, absorbCancel): the
// session's farewell follows whole messages (TestPooledEndWritesNothingAfterACutRow; until 2026-12-05 the
// client got, nearly always, whole rows and the end without the FATAL that says why). A rest that does not
// come within relayEndGrace (a hung server) is cut all the same: the client then gets no farewell, only the
// end, as before. The timer of that cut is started only for a relay still there after the interrupt: one that
// ended by then leaves nothing to wait for.
func (sc *serverConn) closeUnderRelay() {
	if sc.relaying.Load() == 0 {
		sc.conn.Close()
		return
	}
	sc.intr.raise(intrEndLend)
	// Raised first, then counted: a relay that ends after this count sees the interrupt and closes sc itself
	// (relayServer), one that ended before it is seen here.
	if sc.relaying.Load() == 0 {
		sc.conn.Close() // the relay ended meanwhile, maybe before it looked at the interrupt
		return
	}
	time.AfterFunc(relayEndGrace, func() { sc.conn.Close() })
}

// lendEnded marks sc lent to nobody, and counts the time it was lent, if it was (lentNanos).
func (p *txPool) lendEnded(sc *serverConn) {
	if sc.lentTo.Swap(nil) != nil {
		p.lentNanos.Add(time.Now().UnixNano() - sc.lentAt.Load())
	}
}

// nudge tells keepIdle to look at the pool (pool.min_idle). Without a keeper (pool.min_idle 0, the default) it
// is one atomic load: it runs at every lend (connFor), and a send to the full refill nobody reads would be a
// channel operation per transaction for nothing. A keeper started later looks when it is started
// (settingsChanged nudges it then).
func (p *txPool) nudge() {
	if !p.keeping.Load() {
		return
	}
	select {
	case p.refill <- struct{}{}:
	default:
	}
}

// keepIdle keeps pool.min_idle idle server connections open in the pool, opening them one at a time in the
// background, within pool.size (it takes a slot as a lend does), never while the pool is paused, and only once
// a client's server connection logged in (idleLogin: a pool's connections log in as its clients do). A failed
// dial is tried again a second later; one refused with 28P01 forgets the login, until a client's next one.
func (p *txPool) keepIdle(stop, dropped <-chan struct{}) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	for {
		select {
		case <-stop:
			return
		case <-dropped:
			return
		case <-p.refill:
		case <-retry.C:
		}
		for p.needsIdle() {
			login := p.idleLogin.Load()
			if login == nil {
				break
			}
			took := false
			select {
			case p.slots <- struct{}{}:
				took = true
			default:
			}
			if !took {
				// Every place is lent or being opened: nothing idle to keep now. The next nudge (a connection
				// given back, closed or taken from the idle ones) looks again. The keeper must not end here, or
				// the pool keeps no idle connection for the rest of its life: a connection discarded while a
				// client waits hands its place to that client, so needsIdle holds with every place taken.
				break
			}
			if p.paused() {
				<-p.slots
				break
			}
			sc, err := p.dial(login)
			if errors.Is(err, errPoolDropped) {
				<-p.slots
				return
			}
			if err != nil {
				<-p.slots
				p.srv.log.Warn("pool.min_idle: could not open a server connection", "pool", p.name, "err", err)
				var refused *upstreamRefused
				if errors.As(err, &refused) && errorField(refused.body, fieldCode) == sqlstateInvalidPassword {
					p.idleLogin.CompareAndSwap(login, nil)
				}
				retry.Reset(time.Second)
				break
			}
			p.release(sc)
			if p.keptForRemovedUser() { // poolreload.go
				break
			}
		}
	}
}

// needsIdle reports whether the pool has fewer idle server connections than pool.min_idle and room for one.
func (p *txPool) needsIdle() bool {
	keep := p.minIdle()
	p.mu.Lock()
	idle := len(p.idle)
	p.mu.Unlock()
	if idle >= keep || p.srv.draining.Load() {
		return false
	}
	// Room in the group, not only in the pool: a pool's min_idle does not close another pool's idle connection
	// (makeRoom), which would open and close connections in turn between pools that both keep some (a dial
	// that finds the group full meanwhile still does).
	ps := p.srv.pools
	ps.mu.Lock()
	open, _, _ := p.group.openCounts()
	ps.mu.Unlock()
	return open < int64(p.srv.poolSettings().Size)
}

// superseded reports whether sc's host stopped being where the pool's transactions go (router.stale: for
// read-write, anything but the published primary in its epoch), so it must serve no other transaction.
func (p *txPool) superseded(sc *serverConn) bool {
	return p.srv.router != nil && p.srv.router.stale(sc.host)
}

// dropHost closes, in every pool, the server connections a change of primary left behind (Server.primaryChanged:
// those dialled before epoch to the old primary or to the new one while it was not yet published). Idle ones
// are taken out of the pool; a lent one's client learns of the move when its lend fails (lendFailed), as a
// session-mode client on that host does.
func (ps *txPools) dropHost(old, now string, epoch uint64) {
	behind := func(sc *serverConn) bool {
		return sc.host.epoch < epoch && (sc.host.addr == old || sc.host.addr == now)
	}
	for _, p := range ps.list() {
		var gone []*serverConn
		p.mu.Lock()
		for sc := range p.live {
			if behind(sc) {
				gone = append(gone, sc)
				delete(p.live, sc)
			}
		}
		p.idle = slices.DeleteFunc(p.idle, behind)
		p.mu.Unlock()
		for _, sc := range gone {
			sc.movedTo.Store(&now)
			sc.closeUnderRelay()
		}
		if len(gone) > 0 {
			p.nudge() // pool.min_idle, on the new primary: not only once a client comes
		}
	}
}

// dial opens a server connection for a client of the pool whose login is login (dialOnce). A server that
// answers 57P03 (starting up, recovering) is tried again within limits.startup_timeout. When the server
// refuses the login with 28P01 (the role's password changed, and the proxy's auth.file or auth.query secret is
// stale) the proxy refreshes its secrets once and tries again if that is worth it (Server.refreshLogin, as
// session mode does: auth.go loginUpstream); the error that stays is the server's.
func (p *txPool) dial(login *clientLogin) (*serverConn, error) {
	if err := p.makeRoom(); err != nil { // counts the dial in p.dialing
		return nil, err
	}
	defer p.dialing.Add(-1)
	start, pause, refreshed := time.Now(), 50*time.Millisecond, false
	for {
		sc, err := p.dialOnce(login)
		if err == nil {
			p.idleLogin.Store(login)
			return sc, nil
		}
		var refused *upstreamRefused
		if !errors.As(err, &refused) {
			return nil, err
		}
		if errorField(refused.body, fieldCode) == sqlstateCannotConnectNow && time.Since(start)+pause < p.srv.cfg.Limits.StartupTimeout && !p.srv.draining.Load() {
			// The server is starting up, or recovering after a crash (a backend killed: a second or so), or
			// shutting down: tried again within the startup timeout, so that a client waiting for the pool is
			// served once the server is back rather than given the server's 57P03 at once.
			time.Sleep(pause)
			pause = min(2*pause, time.Second)
			continue
		}
		if errorField(refused.body, fieldCode) != sqlstateInvalidPassword {
			return nil, err
		}
		if !refreshed && p.srv.refreshLogin(login, p.srv.log) {
			refreshed = true
			p.srv.log.Info("upstream refused the login; secret refreshed, trying again", "pool", p.name, "err", err)
			continue
		}
		p.srv.metrics.authFailure("upstream")
		p.srv.log.Warn("upstream refused the login", "pool", p.name, "err", err)
		return nil, err
	}
}

// dialOnce opens a server connection for a client of the pool whose login is login: to the host the router picks
// (Server.pickUpstream: upstream.address, or among upstream.hosts for upstream.target, waiting within the
// startup timeout during a failover), through the proxy's one dial function (Server.dialHost, which negotiates
// upstream TLS). It logs in as the pool's user the way every client is logged in upstream (auth.go:
// clientLogin.answerUpstream: the client's SCRAM ClientKey, its md5 secret, or auth.upstream_password(s)) and
// sets the placeholders.
func (p *txPool) dialOnce(login *clientLogin) (*serverConn, error) {
	s := p.srv
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Limits.StartupTimeout)
	defer cancel()
	up, err := s.pickUpstream(ctx)
	if err != nil {
		return nil, fmt.Errorf("pool %s: %w", p.name, err)
	}
	conn, err := s.dialHost(ctx, up.addr)
	if err != nil {
		return nil, fmt.Errorf("pool %s: %w", p.name, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	sc := &serverConn{pool: p, conn: conn, host: up, born: time.Now(), stmts: map[string]bool{}, stmtsFresh: map[string]bool{}}
	sc.prep = &prepState{max: s.cfg.Upstream.Prepared(s.cfg.Token.Scope, s.cfg.Pool.Transaction())}
	rw := rawIO(conn, nil) // rawsocket_linux.go
	sc.w = bufio.NewWriterSize(serverOut{sc: sc, w: rw}, writeBufferSize)
	sc.holder, _ = rw.(writeHolder)
	if ww, ok := rw.(interface{ watchWrites(writeWaiter) }); ok {
		ww.watchWrites(sc)
	}
	sc.intr.conn = conn
	sc.r = msgReader{r: bufio.NewReaderSize(rw, readBufferSize), intr: &sc.intr}
	statuses, defaults, err := sc.logIn(login, s.cfg.Token.Setting, s.cfg.Token.LockSetting)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("pool %s on %s: %w", p.name, up.addr, err)
	}
	conn.SetDeadline(time.Time{})
	for _, st := range statuses {
		sc.reading.note(st.name, st.value)
	}
	s.metrics.poolDialed()
	p.opened.Add(1)
	p.mu.Lock()
	p.live[sc] = struct{}{}
	if p.reports == nil {
		p.resetToken, p.resetLock = nullable(defaults[0]), nullable(defaults[1])
		for _, st := range statuses {
			if st.name == rewrite.AppSetting {
				p.resetApp = st.value
			}
		}
		p.reports = statuses
	}
	p.mu.Unlock()
	return sc, nil
}

// logIn sends the pool's StartupMessage (protocol 3.0, the pool's parameters) on a new server connection, answers
// the server's authentication with login, reads the startup's answers up to ReadyForQuery (its BackendKeyData is
// sc.key) and sets the placeholders. It returns the ParameterStatus values (sorted by name) and the server's
// default token and lock values (nil: none), read before the placeholders replace them.
func (sc *serverConn) logIn(login *clientLogin, tok, lock string) ([]paramStatus, [][]byte, error) {
	p := sc.pool
	names := make([]string, 0, len(p.params))
	for k := range p.params {
		names = append(names, k)
	}
	sort.Strings(names)
	body := binary.BigEndian.AppendUint32(nil, 3<<16)
	for _, k := range names {
		body = append(append(append(append(body, k...), 0), p.params[k]...), 0)
	}
	body = append(body, 0)
	sc.w.Write(binary.BigEndian.AppendUint32(nil, uint32(len(body)+4)))
	sc.w.Write(body)
	if err := sc.w.Flush(); err != nil {
		return nil, nil, fmt.Errorf("send the startup: %w", err)
	}
	if err := login.answerUpstream(&sc.r, sc.w, func(byte, []byte) {}); err != nil {
		return nil, nil, fmt.Errorf("log in: %w", err)
	}
	var statuses []paramStatus
	if _, err := sc.readUntilReady(func(typ byte, body []byte) error {
		switch typ {
		case msgParameterStatus:
			k, rest, ok := cutNul(body)
			v, _, ok2 := cutNul(rest)
			if !ok || !ok2 {
				return fmt.Errorf("%w: malformed ParameterStatus", errProtocol)
			}
			statuses = append(statuses, paramStatus{string(k), string(v)})
		case msgBackendKeyData:
			sc.key = bytes.Clone(body)
		}
		return nil
	}); err != nil {
		var se *serverError
		if errors.As(err, &se) && errorField(se.body, fieldSeverity) == "FATAL" {
			// The server refused the session after authentication (a startup parameter it does not know, a
			// database it cannot open): the client gets its words, as directly (poolError).
			return nil, nil, &upstreamRefused{body: se.body}
		}
		return nil, nil, err
	}
	sort.Slice(statuses, func(i, j int) bool { return statuses[i].name < statuses[j].name })
	// The defaults first, then the placeholders: a target list is evaluated in order. Last, the role the login
	// runs as (loginRoleRefusal).
	writeMsg(sc.w, msgQuery, nil, fmt.Sprintf("SELECT pg_catalog.current_setting(%[1]s, true), pg_catalog.current_setting(%[2]s, true), pg_catalog.set_config(%[1]s, %[3]s, false), pg_catalog.set_config(%[2]s, %[3]s, false), "+
		"pg_catalog.current_setting('role'), pg_catalog.current_setting('session_authorization')",
		quoteLiteral(tok), quoteLiteral(lock), quoteLiteral(poolPlaceholder)))
	if err := sc.w.Flush(); err != nil {
		return nil, nil, fmt.Errorf("set up a server connection: %w", err)
	}
	var row [][]byte
	rows, err := sc.readUntilReady(func(typ byte, body []byte) (err error) {
		if typ == msgDataRow {
			row, err = dataRowValues(body)
		}
		return err
	})
	if err == nil && (rows != 1 || len(row) != 6) {
		err = errors.New("unexpected answer")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("set up a server connection: %w", err)
	}
	if refused := loginRoleRefusal(p, string(row[4]), string(row[5])); refused != nil {
		return nil, nil, refused
	}
	for _, ps := range statuses {
		if ps.name == "is_superuser" {
			sc.loginSuperuser = ps.value
		}
	}
	sc.roleSeen = roleSeen(sc.loginSuperuser)
	return statuses, row[:2], nil
}

// loginRoleRefusal is the refusal of a pool whose logins run as another role than the pool's user (role and
// sessionAuth, the session's settings right after the login), nil when they run as that user. Every transaction
// on a pooled connection runs as the login role (the token statement and putBackFirst set the role to none), so
// a role the login chose (options -c role or -c session_authorization, ALTER ROLE or ALTER DATABASE ... SET
// role), which the client may have chosen to run with fewer privileges, would be dropped without a word: the
// client is refused at login instead, whatever made the role, as the server reports it.
func loginRoleRefusal(p *txPool, role, sessionAuth string) *upstreamRefused {
	user := p.params["user"]
	if (role == "none" || role == user) && sessionAuth == user {
		return nil
	}
	runsAs := sessionAuth
	if role != "none" {
		runsAs = role
	}
	msg := fmt.Sprintf("fenceproxy: a login of pool %s runs as role %q, not as %q, and transaction pooling runs every transaction as the login role", p.name, runsAs, user)
	detail := "The role comes from the startup options (-c role, -c session_authorization) or from ALTER ROLE or ALTER DATABASE ... SET role; log in as that role, or use pool.mode: session."
	return &upstreamRefused{body: errorResponse("FATAL", sqlstateFeatureNotSupported, msg, detail, "")[headerLen:]}
}

// roleSeen reports whether every role change of a session whose login reported is_superuser (loginSuperuser)
// shows in what the server reports (ParameterStatus of is_superuser and session_authorization, sent when they
// change): only for a superuser login, since only a superuser can change session_authorization, and a role that
// is not a superuser turns is_superuser off (one that is has the same privileges). A login that is not a
// superuser may be granted a role at any time (an administrator's GRANT, or its own with CREATEROLE), after
// which its change to that role shows nowhere: what the catalog said when the connection opened is no proof.
func roleSeen(loginSuperuser string) bool {
	return loginSuperuser == "on"
}

// serverError is an ErrorResponse of the server's to a statement of the proxy's own, or to a login.
type serverError struct{ body []byte }

func (e *serverError) Error() string {
	return fmt.Sprintf("server: %s (SQLSTATE %s)", errorField(e.body, fieldMessage), errorField(e.body, fieldCode))
}

// readUntilReady reads a server connection's messages up to ReadyForQuery, giving each to seen, and returns how
// many DataRows came; an ErrorResponse is the error, a serverError (after the ReadyForQuery that follows it, if
// any).
func (sc *serverConn) readUntilReady(seen func(typ byte, body []byte) error) (int, error) {
	rows := 0
	var failed error
	for {
		typ, _, err := sc.r.next()
		if err != nil {
			return rows, err
		}
		body, err := sc.r.body()
		if err != nil {
			return rows, err
		}
		switch typ {
		case msgReadyForQuery:
			return rows, failed
		case msgErrorResponse:
			failed = &serverError{body: bytes.Clone(body)}
			if errorField(body, fieldSeverity) != "ERROR" {
				return rows, failed // FATAL: no ReadyForQuery follows
			}
		case msgDataRow:
			rows++
		}
		if err := seen(typ, body); err != nil {
			return rows, err
		}
	}
}

// serverReports returns the ParameterStatus values the pool's clients are shown at startup, opening a server
// connection if none was opened yet.
func (p *txPool) serverReports(wait time.Duration, login *clientLogin) ([]paramStatus, error) {
	p.mu.Lock()
	r := p.reports
	p.mu.Unlock()
	if r != nil {
		return r, nil
	}
	sc, err := p.acquire(wait, login, nil)
	if err != nil {
		return nil, err
	}
	p.release(sc)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reports, nil
}

// nullable is a column value as a string, nil for NULL.
func nullable(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

// quoteLiteral is s, a string of the proxy's own (UTF-8), as an SQL expression of type text (textExpr).
func quoteLiteral(s string) string { return textExpr(s, "'UTF8'") }

// textExpr is s, bytes in the encoding the SQL expression encoding names, as an SQL expression of type text that
// reads the same whatever the session's client_encoding, standard_conforming_strings and backslash_quote: the
// text it makes is ASCII without a backslash. A string that is such ASCII already is a constant with its quotes
// doubled; any other is built from its bytes (convert_from of decode of hex). Quoting byte by byte could not do
// it: in a client-only encoding (SJIS, BIG5, GBK...) a backslash or quote byte may end a character, so a value
// a client chose (its fence.lock) could end the constant early and run the rest as SQL the proxy never read
// (TestPooledTokenValueCannotBreakOutOfItsConstant).
func textExpr(s, encoding string) string {
	if !plainASCII(s) {
		return "pg_catalog.convert_from(pg_catalog.decode('" + hex.EncodeToString([]byte(s)) + "', 'hex'), " + encoding + ")"
	}
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
