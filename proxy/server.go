// Package proxy implements fenceproxy's PostgreSQL wire-protocol relay.
//
// Each client session gets its own upstream connection: a new one, or one kept from a finished session with the
// same startup parameters whose authentication asked for nothing (reuse.go). Two goroutines relay it, one per
// direction (relay.go), until it moves to the event loop (evloop_linux.go); both transports give every message
// to the one session core (core.go) and end the session the one way (end.go); docs/architecture.md maps the
// package. Messages the proxy has no reason to read are framed (type and length) and streamed as bytes; the
// proxy decodes only:
//
//   - client to server: Query and Parse, whose SQL may be rewritten or refused by the Planner (the seam where
//     fencing happens), and the startup packets;
//   - server to client: ErrorResponse (to turn fencing markers into fenceproxy's SQLSTATEs), the authentication
//     request that lists SASL mechanisms, BackendKeyData (to route cancel requests with the proxy's own keys),
//     ParameterStatus (to show a reused connection's values) and ReadyForQuery (to know when a session is idle).
//
// Safe points: a session is idle, and may be closed by a drain, only after the server sent ReadyForQuery with
// status 'I' and every Query, Sync and FunctionCall the client sent has been answered by one.
package proxy

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/rewrite"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// Planner decides what to do with a statement's SQL text, read as the server reads it under the session's
// settings. rewrite.Cache implements it.
type Planner interface {
	Plan(sql []byte, set rewrite.Settings) rewrite.Plan
}

// TokenVerifier refuses tokens that no lock service could have issued (the forged-token defence).
type TokenVerifier interface {
	Check(ctx context.Context, token int64) error
}

// Options is everything a Server needs; nothing is read from globals.
type Options struct {
	Config   *config.Config
	Logger   *slog.Logger
	Planner  Planner       // nil: relay only, no fencing
	Verifier TokenVerifier // nil: tokens are checked for form only
	Metrics  *Metrics      // nil: no metrics
	// Grants is the lock service the failover barrier reads (upstream.hosts; nil: the barrier raises marks to
	// those the proxy saw accepted only).
	Grants GrantSource
	// Locks is what the admin console's SHOW LOCKS lists: the stores of the configuration's locks: section
	// (cmd/fenceproxy opens them once, for the lock metrics too). nil: no lock store is configured.
	Locks *tokens.Listing

	// Reload is what the admin console's RELOAD does: what SIGHUP does (cmd/fenceproxy: the configuration's
	// table list, the token ceiling, auth.file). It returns the sections of the file that changed and need a
	// restart (not applied). nil: RELOAD reads auth.file again (ReloadAuth).
	Reload func() (notApplied []string, err error)

	// DisableEventLoop keeps every session on the goroutine-per-direction path, as relay.mode: goroutines does.
	// By default, on Linux, plain TCP sessions move to an epoll event loop after startup (see evloop_linux.go).
	DisableEventLoop bool

	// ParkIdleAfter: in pool.mode transaction, a client idle between transactions for about this long (one to
	// two periods) is parked, keeping no goroutine or buffers until it speaks again (park_linux.go). 0 is
	// defaultParkAfter; negative never parks.
	ParkIdleAfter time.Duration

	// hooks are set by this package's tests only (export_test.go), before New.
	hooks testHooks
}

// testHooks are calls the proxy makes where a test holds it to run a race inside a window it marks (a change of
// primary between a check and what it guards). New copies them to where they are called, before anything
// runs, so those paths read a plain func field, nil outside tests: no atomic load, and no state shared
// between servers.
type testHooks struct {
	beforePutBack  func() // txPools.beforePutBack
	beforePut      func() // upstreamPool.beforePut
	fencedJudged   func() // Server.fencedJudged: a fenced write judged allowed, before it is sent
	fencedScanned  func() // Server.fencedScanned: fencedHostsRefused has chosen the sessions it acts on
	fencedShut     func() // Server.fencedShut: endFencedTx has shut the session's upstream, before its cancel
	lockAnswered   func() // Server.lockAnswered: a message's lock question (unplanned.go) has its answer
	beforePoolMade func() // txPools.beforePoolMade
}

// defaultParkAfter is the parker's sweep period when Options.ParkIdleAfter is 0: long beside a transaction, so
// that a busy client's goroutine is never given up between two of its transactions.
const defaultParkAfter = time.Second

// Server accepts client connections and relays each to its own upstream session.
type Server struct {
	cfg *config.Config
	// poolCfg is the pool section in force: cfg.Pool, or what a reload applied since (ReloadPool). Read it
	// (poolSettings), never cfg.Pool: the pools follow a reload.
	poolCfg atomic.Pointer[config.Pool]
	log     *slog.Logger
	planner atomic.Pointer[plannerBox]
	// plannerGen numbers the planners SetPlanner installs (plannerBox.gen).
	plannerGen atomic.Uint64
	verifier   TokenVerifier
	metrics    *Metrics
	clientTLS  *tls.Config
	upTLS      *tls.Config
	loops      []*evLoop      // empty: no event loop
	spinners   atomic.Int32   // event loops polling in spinPoll now
	pool       *upstreamPool  // nil: upstream connections are not reused
	auth       *authenticator // nil: authentication is relayed to PostgreSQL (auth.type passthrough)
	router     *router        // nil: one upstream.address, no router
	// fencedJudged, fencedScanned, fencedShut and lockAnswered are test hooks (testHooks), nil outside tests.
	fencedJudged, fencedScanned, fencedShut, lockAnswered func()
	pools                                                 *txPools     // pool.mode transaction (pool.go); nil in session mode
	parses                                                sharedParses // the Parse bodies of pooled clients' named statements, one copy each (pooledstmts.go)
	// effectWords are the words of a text that may change the token, lock or application_name at session level
	// (rewrite.SessionEffects): their names, RESET and DISCARD (ALL), EXECUTE (an SQL prepared statement),
	// set_config and u& (which may spell any of them); for the pool's text classes (textClass.effects).
	effectWords *rewrite.FoldWords
	effectsOf   func([]byte, rewrite.Settings) rewrite.SessionEffects // sessionEffects, a method value made once
	// setLocal is the token and lock settings' part of the plain token statement, made once (pooled.go).
	setLocal setLocalTexts
	reload   func() ([]string, error) // the admin console's RELOAD (Options.Reload)
	bufs     connBuffers              // client connections' buffers, kept between sessions

	// locks is what the admin console's SHOW LOCKS lists (Options.Locks); nil: no lock store.
	locks *tokens.Listing

	active   atomic.Int64 // sessions past accept, including those being refused
	draining atomic.Bool

	mu       sync.Mutex
	sessions map[*session]struct{}
	keys     map[string]*session // live sessions by the whole key their client was given (registerKey), for cancels
	lns      []net.Listener
	wg       sync.WaitGroup

	// handlers hands an accepted connection to a goroutine that served one before and waits for the next
	// (handlerLoop), when one waits; else a new goroutine serves it. handlersStop, closed by Shutdown, ends the
	// waiting ones.
	handlers     chan acceptedConn
	handlersStop chan struct{}
	// idleHandlers counts the handler goroutines waiting for their next connection (at most maxIdleHandlers).
	idleHandlers atomic.Int64
}

// acceptedConn is a client connection for a handler goroutine, and whether it is over limits.max_client_connections.
type acceptedConn struct {
	c    net.Conn
	over bool
	// parked, when set, is a parked transaction-mode session to resume (park_linux.go) instead of c.
	parked *session
}

// plannerBox is a planner and its generation: each SetPlanner (a reload, a catalog refresh that changed what is
// protected) installs a new one. What the proxy keeps of a client's statement after fencing it, to prepare it
// again later on other server connections (pooledstmts.go, pooledsqlprep.go), carries the generation it was
// fenced under, and is fenced again from the client's text when it is not the one in force: a statement
// prepared before a reload runs as the new table list says, never as the old one did.
type plannerBox struct {
	p   Planner
	gen uint64
}

// sessionEffects is what a pooled client's text may do to the token, lock and application_name at session level
// (rewrite.SessionEffects, through the planner), for the pool's text classes (textClass.effects). Without a
// planner nothing is fenced, and nothing needs reading.
func (s *Server) sessionEffects(text []byte, set rewrite.Settings) rewrite.SessionEffects {
	if p, ok := s.currentPlanner().(interface {
		SessionEffects([]byte, rewrite.Settings) rewrite.SessionEffects
	}); ok {
		return p.SessionEffects(text, set)
	}
	return rewrite.SessionEffects{}
}

// New builds a Server from its options, loading TLS material now so that a bad certificate fails at start.
func New(o Options) (*Server, error) {
	if o.Config == nil {
		return nil, errors.New("proxy: no configuration")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:      o.Config,
		log:      o.Logger,
		verifier: o.Verifier,
		metrics:  o.Metrics,
		reload:   o.Reload,
		locks:    o.Locks,
		sessions: map[*session]struct{}{},
		keys:     map[string]*session{},

		handlers:     make(chan acceptedConn),
		handlersStop: make(chan struct{}),
	}
	pool := o.Config.Pool
	s.poolCfg.Store(&pool)
	effectWords := []string{strings.ToLower(o.Config.Token.Setting), rewrite.AppSetting, "reset", "discard", "execute", "set_config", "u&"}
	if lock := o.Config.Token.LockSetting; lock != "" {
		effectWords = append(effectWords, strings.ToLower(lock))
	}
	s.effectWords = rewrite.NewFoldWords(effectWords...)
	s.effectsOf = s.sessionEffects
	s.setLocal = newSetLocalTexts(o.Config.Token.Setting, o.Config.Token.LockSetting)
	r := o.Config.Upstream.Reuse
	s.pool = newUpstreamPool(r.Idle(), r.IdleTimeout, r.MaxLifetime, o.Metrics)
	if s.pool != nil {
		s.pool.beforePut = o.hooks.beforePut
	}
	s.fencedJudged, s.fencedScanned, s.lockAnswered = o.hooks.fencedJudged, o.hooks.fencedScanned, o.hooks.lockAnswered
	s.fencedShut = o.hooks.fencedShut
	s.SetPlanner(o.Planner)
	if o.Config.Pool.Transaction() {
		parkAfter := o.ParkIdleAfter
		if parkAfter == 0 {
			parkAfter = defaultParkAfter
		}
		s.pools = newTxPools(s, parkAfter)
		s.pools.beforePutBack = o.hooks.beforePutBack
		s.pools.beforePoolMade = o.hooks.beforePoolMade
		o.Metrics.watchPools(s.pools) // the per-pool series
	}
	if !o.DisableEventLoop && o.Config.Relay.Mode != config.RelayModeGoroutines {
		n := o.Config.Relay.EventLoops
		if n == 0 {
			// One loop per two CPUs: the loops share the machine with PostgreSQL and the clients, and a loop
			// per CPU spent more CPU per transaction on wake-ups across CPUs than it bought (docs/benchmark.md).
			n = max(1, runtime.GOMAXPROCS(0)/2)
		}
		s.loops = newEvLoops(s, n, o.Config.Relay.SpinFor())
	}
	var err error
	if s.clientTLS, err = serverTLSConfig(o.Config.TLS); err != nil {
		return nil, err
	}
	if s.upTLS, err = upstreamTLSConfig(o.Config.Upstream); err != nil {
		return nil, err
	}
	if s.auth, err = newAuthenticator(o.Config, s.upTLS, o.Logger); err != nil {
		return nil, err
	}
	if s.auth != nil && s.pools != nil {
		s.auth.usersChanged = s.pools.authUsersChanged // poolreload.go
	}
	if o.Config.Upstream.Routed() {
		if s.router, err = newRouter(o.Config, s.upstreamTLSFor, o.Grants, o.Logger, o.Metrics); err != nil {
			return nil, err
		}
		s.router.changed = s.primaryChanged
		s.router.epochMoved = s.pool.dropBefore // connections kept in an earlier epoch, which no session takes
		s.router.refusing = s.fencedHostsRefused
		s.router.holds = newWriteHolds(s.router, s)
		s.router.start()
	}
	return s, nil
}

// primaryChanged acts on a change of primary the router published (router.go): sessions dialled before the
// change end whose host stopped being what they were dialled for: those on the old primary, and those on the
// new one (opened while it was a standby). Connections kept for reuse in an earlier epoch were closed already
// (upstreamPool.dropBefore, at every change of the epoch).
func (s *Server) primaryChanged(old, now string, epoch uint64) {
	if s.pools != nil {
		s.pools.dropHost(old, now, epoch) // transaction pooling: the server connections, idle or lent, on those hosts
	}
	s.mu.Lock()
	var ending []*session
	for ss := range s.sessions {
		if ss.pooled != nil {
			continue // not bound to a host: its lent server connection, if dropped, ends it
		}
		if h := ss.host; h.epoch < epoch && (h.addr == old || h.addr == now) {
			ending = append(ending, ss)
		}
	}
	s.mu.Unlock()
	for _, ss := range ending {
		ss.endForFailover(now)
	}
}

// fencedHostsRefused acts on a change that may make the router refuse fenced writes on a host it trusted
// (router.refusing): every session-mode session whose transaction under way wrote a protected table through the
// proxy (fencedTxOut), on a host writeRefusal refuses now, ends at once (endFencedTx). Judging each message as
// it is read (fencedTxRefused) does not cover what was sent before the change: a COMMIT pipelined behind a
// statement still running there reaches the server before the change and commits after it. A transaction that
// wrote one inside the server (a function, a trigger: no write the proxy planned) is asked for after that
// (unplannedWritersRefused). Sessions not in such a transaction go on (reads, and writes to unprotected tables,
// as during a split brain). The order makes the rule hold for a write or message judged while the change is
// made: the session notes the fenced write (fencedTxOut) before it judges it (fencedWriteRefusal) and judges
// each later message under the router's lock, and this runs after the change left that lock, so one judged
// before the change is seen here, and one judged after is refused there.
// A pooled session is bound to no host: what its lent connection runs is cancelled when that connection's host
// is refused (cancelLent); a unit still waiting for a connection is judged when it gets one (the core judges a
// pooled unit after its lend), so nothing of it was judged before the change.
func (s *Server) fencedHostsRefused() {
	// Each session's fencedTxOut is loaded once, here: the table seen here is the one the session is ended for,
	// even if the field changes before the session is acted on below. That is safe. A transaction that ends in
	// between (its next message found the session idle and cleared the field) could as well end just after a
	// second load, before endFencedTx acts: a second load never spared such a session, and ending it fails
	// closed. A fenced write noted in between came after that clear, so after this load, so after the change
	// this acts on: on a host refused now its judgement, after the note, refuses it. (On a host a still later change
	// refuses, a farewell may name the earlier transaction's table where a second load named the later one's.)
	type fencedTx struct {
		ss    *session
		table string
	}
	s.mu.Lock()
	var ending []fencedTx
	for ss := range s.sessions {
		if table := ss.fencedTxOut.Load(); table != nil && !ss.state.idle() {
			ending = append(ending, fencedTx{ss, *table})
		}
	}
	s.mu.Unlock()
	if s.fencedScanned != nil {
		s.fencedScanned()
	}
	var wg sync.WaitGroup // the cancels (endFencedTx) go at once, and are taken before this returns
	for _, e := range ending {
		ss := e.ss
		if ss.pooled != nil {
			// Bound to no host: what runs on the connection lent now is cancelled if that connection's host is
			// refused (the statement then fails, 57014, and the rest of the transaction meets fencedTxRefused).
			wg.Go(func() {
				ss.cancelLent(func(sc *serverConn) bool { return s.router.writeRefusal(sc.host.addr, sc.host.epoch) != "" })
			})
			continue
		}
		if why := s.router.writeRefusal(ss.host.addr, ss.host.epoch); why != "" {
			wg.Go(func() { ss.endFencedTx(why, e.table) })
		}
	}
	wg.Wait()
	// unplanned.go: transactions that wrote a protected table inside the server. Not waited for: it asks the host,
	// and one that hangs would hold the barrier of the next primary back for up to health_timeout.
	go s.unplannedWritersRefused()
}

// SetPlanner replaces the planner for statements parsed from now on (SIGHUP reload). Sessions keep running.
func (s *Server) SetPlanner(p Planner) { s.planner.Store(&plannerBox{p: p, gen: s.plannerGen.Add(1)}) }

func (s *Server) currentPlanner() Planner { return s.planner.Load().p }

// plannerNow is the planner in force and its generation, read together.
func (s *Server) plannerNow() plannerBox { return *s.planner.Load() }

// Serve accepts connections on ln until ln is closed or Shutdown is called.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.draining.Load() {
		s.mu.Unlock()
		ln.Close()
		return net.ErrClosed
	}
	s.lns = append(s.lns, ln)
	s.mu.Unlock()
	tuneListener(ln)
	var tempDelay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.draining.Load() || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporaryAccept(err) {
				// Out of file descriptors and the like: back off instead of spinning.
				tempDelay = min(max(tempDelay*2, 5*time.Millisecond), time.Second)
				s.log.Warn("accept failed; retrying", "err", err, "delay", tempDelay)
				time.Sleep(tempDelay)
				continue
			}
			return fmt.Errorf("accept: %w", err)
		}
		tempDelay = 0
		// No SetNoDelay or SetKeepAlive here: a TCP listener's connections come with TCP_NODELAY set and keepalive
		// from the listening socket (Listen), and setting them again cost system calls per connection
		// (connect-per-transaction clients, docs/benchmark.md).
		n := s.active.Add(1)
		s.wg.Add(1)
		a := acceptedConn{c: c, over: s.cfg.Limits.MaxClientConnections > 0 && n > int64(s.cfg.Limits.MaxClientConnections)}
		select {
		case s.handlers <- a:
		default:
			go s.handlerLoop(a)
		}
	}
}

// handlerIdle is how long a handler goroutine waits for its next connection before it ends; at most
// maxIdleHandlers wait, the others end at once. A wave of transaction-mode clients that park (park_linux.go)
// left a goroutine per client waiting, each with the stack its session grew (8 KiB and more), for handlerIdle:
// 2,000 clients of bench/idlemem kept 16 MB of stacks five seconds after they parked, and longer, until a
// collection freed them and the parker gave the memory back. The goroutines that wait are what a burst of new
// connections needs (a connection per transaction, pgbench -C, has one connecting per client at a time).
const (
	handlerIdle     = 5 * time.Second
	maxIdleHandlers = 128
)

// handlerLoop serves a, then the connections Serve hands it, until none came for handlerIdle or Shutdown began.
// Why not a goroutine per connection: a session's goroutine grows its stack from the runtime's start size by
// copying it, several times, and a connection per transaction (pgbench -C) paid 8% of the proxy's user time
// for that; a goroutine that served a session has the stack the next one needs.
func (s *Server) handlerLoop(a acceptedConn) {
	var idle *time.Timer
	for {
		var parked bool
		if a.parked != nil {
			parked = s.resumePooled(a.parked)
		} else {
			parked = s.handle(a.c, a.over)
		}
		if !parked { // a parked session is still counted: it is served again when its client speaks
			s.active.Add(-1)
			s.wg.Done()
		}
		if s.idleHandlers.Add(1) > maxIdleHandlers {
			s.idleHandlers.Add(-1)
			return
		}
		if idle == nil {
			idle = time.NewTimer(handlerIdle)
		} else {
			idle.Reset(handlerIdle)
		}
		select {
		case a = <-s.handlers:
			s.idleHandlers.Add(-1)
		case <-idle.C:
			s.idleHandlers.Add(-1)
			return
		case <-s.handlersStop:
			s.idleHandlers.Add(-1)
			idle.Stop()
			return
		}
	}
}

// resumeParked serves a parked session again, on a handler goroutine (the parker's goroutine must go on
// watching the others).
func (s *Server) resumeParked(ss *session) {
	a := acceptedConn{parked: ss}
	if !s.draining.Load() {
		select {
		case s.handlers <- a:
			return
		default:
		}
	}
	go s.handlerLoop(a)
}

// resumePooled serves a session the parker resumed until it ends or parks again (true), as handle does.
func (s *Server) resumePooled(ss *session) (parked bool) {
	defer ss.endUnlessParked(&parked)
	ss.unpark()
	return ss.runPooled()
}

func isTemporaryAccept(err error) bool {
	var te interface{ Temporary() bool }
	return errors.As(err, &te) && te.Temporary()
}

// ActiveSessions is the number of client connections being served or refused.
func (s *Server) ActiveSessions() int64 { return s.active.Load() }

// Shutdown stops accepting, closes sessions as they become idle and, when ctx ends, closes the rest.
func (s *Server) Shutdown(ctx context.Context) error {
	if !s.draining.Swap(true) {
		close(s.handlersStop)
	}
	if s.router != nil {
		s.router.close()
	}
	s.pool.close()
	defer s.auth.close()
	if s.pools != nil {
		s.pools.close()
	}
	s.mu.Lock()
	for _, ln := range s.lns {
		ln.Close()
	}
	for ss := range s.sessions {
		ss.wakeForDrain()
	}
	s.mu.Unlock()
	if s.pools != nil && s.pools.parker != nil {
		s.pools.parker.close() // the parked sessions, resumed, end through their drain
	}
	if s.pools != nil {
		// Once every session has ended (both returns below wait for done): a wait is watched to its end.
		defer s.pools.clientWatcher.close()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	n := len(s.sessions)
	for ss := range s.sessions {
		ss.forceClose()
	}
	s.mu.Unlock()
	<-done
	return fmt.Errorf("shutdown timeout: closed %d busy sessions: %w", n, ctx.Err())
}

func (s *Server) register(ss *session) {
	s.mu.Lock()
	s.sessions[ss] = struct{}{}
	s.mu.Unlock()
	if s.draining.Load() {
		ss.wakeForDrain()
	}
}

func (s *Server) unregister(ss *session) {
	s.mu.Lock()
	delete(s.sessions, ss)
	s.forgetKeyLocked(ss)
	s.mu.Unlock()
	ss.state.endCancels() // a cancel owed and never sent (the session ended first): its clients wait no more
}

// forgetKey stops routing CancelRequests to ss (its client's key no longer finds it): its backend is given up.
func (s *Server) forgetKey(ss *session) {
	s.mu.Lock()
	s.forgetKeyLocked(ss)
	s.mu.Unlock()
}

func (s *Server) forgetKeyLocked(ss *session) {
	if ss.clientKey != nil && s.keys[string(ss.clientKey)] == ss {
		delete(s.keys, string(ss.clientKey))
	}
}

// registerKey gives the client of ss its BackendKeyData and routes CancelRequests with it to ss, in place of the
// key it had (if any): the PID pid (in session mode the backend's, so that pg_backend_pid(), notifications and
// the driver agree), or a random positive one of the proxy's when pid is 0, and a random secret of secretLen
// bytes (at least 4), drawn again while the whole key is another live session's. The registry is keyed by that
// whole key, so two live sessions never share an entry: with upstream.hosts each server has its own PID space,
// and sessions on two hosts may carry one PID. Until 2026-12-05 it was keyed by the PID alone, and the later of
// two such sessions replaced the earlier's entry, whose client's cancels were then dropped
// (TestCancelSessionsOnTwoHostsWithOnePID).
func (s *Server) registerKey(ss *session, pid uint32, secretLen int) {
	key := make([]byte, 4+max(secretLen, 4))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetKeyLocked(ss)
	for {
		rand.Read(key)
		if pid != 0 {
			binary.BigEndian.PutUint32(key, pid)
		} else {
			key[0] &= 0x7f // a positive PID, as PostgreSQL's
		}
		if binary.BigEndian.Uint32(key) != 0 && s.keys[string(key)] == nil {
			break
		}
	}
	ss.pid = binary.BigEndian.Uint32(key)
	ss.clientKey = key
	s.keys[string(key)] = ss
}

// sessionForKey returns the session whose client was given clientKey (PID and secret), its upstream
// BackendKeyData (nil when none) and the host that backend runs on; or a nil session. The lookup is by the whole
// key: what it costs in time tells a prober nothing it can use about another client's secret, the map's hash
// being seeded at random (it cannot choose keys that meet a live one in the table).
func (s *Server) sessionForKey(clientKey []byte) (*session, []byte, string) {
	if len(clientKey) < 8 {
		return nil, nil, ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.keys[string(clientKey)]
	if ss == nil {
		return nil, nil, ""
	}
	if ss.pooled != nil {
		// Its server connection is the one lent to it now (cancelPooled); its lends change cancelKey and host
		// without s.mu, which they would otherwise take twice per transaction.
		return ss, nil, ""
	}
	return ss, ss.cancelKey, ss.host.addr
}
