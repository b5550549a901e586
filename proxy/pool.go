package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Transaction pooling (pool.mode: transaction): the server connections. A txPool holds the server connections
// of one (database, user, startup settings) and lends them to clients one transaction at a time (pooled.go).
// A serverConn is the backend's side of the split: the connection, its framing, its BackendKeyData and what the
// proxy prepared on it; the client's logical state (token, lock, pin) stays with the client session.
//
// A pooled server connection always holds, at session level, poolPlaceholder as its token and lock settings:
// never a token. Every transaction a client runs on it starts with the client's own values set
// transaction-locally (tokenSQL), which checks that the placeholder is still there. So no client's token outlives
// its transaction on a shared connection, and a fenced write that ever ran without the client's values would meet
// a value no fence accepts (55F03) rather than another client's token.

// poolPlaceholder is the session-level value of the token and lock settings on every pooled server connection.
// It is not a valid token (ValidToken), so a write that meets it is refused.
const poolPlaceholder = "fenceproxy:pooled"

// tokenStmtName is the statement that sets a client's values at the start of its transaction (pooled.go:
// prepareTokenStmt).
const tokenStmtName = "fenceproxy_t"

// errPoolTimeout: no server connection of a full pool became free within pool.max_client_wait.
var errPoolTimeout = errors.New("no server connection became free")

// serverConn is one upstream connection of a pool.
type serverConn struct {
	pool *txPool
	conn net.Conn
	r    msgReader
	w    *bufio.Writer
	intr interrupt
	key  []byte       // BackendKeyData: PID and secret, for cancels
	host upstreamHost // the server it was dialled to (the router's pick) and the router's epoch then
	// movedTo is the new primary when the connection was closed because a change of primary superseded its
	// host (txPools.dropHost): the client then learns why.
	movedTo   atomic.Pointer[string]
	born      time.Time
	idleSince time.Time       // when it went back to the pool (under txPool.mu)
	tokenFor  *pooledState    // the client for whose transactions tokenStmtName was last prepared; nil: none
	stmts     map[string]bool // the clients' statements prepared on it, by server name (pooledstmts.go)
}

// txPools are the pools of a Server, by key.
type txPools struct {
	srv    *Server
	mu     sync.Mutex
	byKey  map[string]*txPool
	closed bool
	stop   chan struct{} // closed by close: the reaper stops
}

// newTxPools makes a Server's pools and starts their reaper, which closes server connections idle longer than
// pool.server_idle_timeout or older than pool.server_lifetime.
func newTxPools(s *Server) *txPools {
	ps := &txPools{srv: s, byKey: map[string]*txPool{}, stop: make(chan struct{})}
	every := min(s.cfg.Pool.ServerIdleTimeout, s.cfg.Pool.ServerLifetime) / 4
	go func() {
		t := time.NewTicker(max(every, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ps.stop:
				return
			case <-t.C:
				for _, p := range ps.list() {
					p.reap()
				}
			}
		}
	}()
	return ps
}

// reap closes the pool's idle server connections that were idle or alive too long.
func (p *txPool) reap() {
	cfg := p.srv.cfg.Pool
	now := time.Now()
	var old []*serverConn
	p.mu.Lock()
	kept := p.idle[:0]
	for _, sc := range p.idle {
		if now.Sub(sc.idleSince) > cfg.ServerIdleTimeout || now.Sub(sc.born) > cfg.ServerLifetime {
			old = append(old, sc)
			delete(p.live, sc)
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
}

// txPool is the server connections of one (database, user, startup settings).
type txPool struct {
	srv     *Server
	name    string            // "database/user", in messages and logs
	params  map[string]string // the startup parameters of its server connections
	slots   chan struct{}     // one per server connection lent or being opened (idle ones hold none)
	mu      sync.Mutex
	idle    []*serverConn
	live    map[*serverConn]struct{} // every open server connection, idle or lent (dropHost closes a host's)
	reports []paramStatus            // ParameterStatus values of its first server connection, shown to its clients
	// resetToken and resetLock are the token and lock values a RESET gives on its server connections (role and
	// database defaults; nil: none), read when the first one is opened.
	resetToken, resetLock *string

	// For the admin console (admin.go).
	clients atomic.Int64 // client sessions of the pool
	waiting atomic.Int64 // clients waiting for a server connection now
	lends   atomic.Int64 // server connections lent, since start
	opened  atomic.Int64 // server connections opened, since start
	pins    atomic.Int64 // clients pinned, since start
}

// poolKeyParams are the startup parameters of a client that choose its pool: every one but those the proxy
// keeps per client (the token and lock settings in options, application_name).
func poolKeyParams(params map[string]string, tokenSetting, lockSetting string) map[string]string {
	out := make(map[string]string, len(params))
	for k, v := range params {
		switch {
		case k == "application_name", strings.EqualFold(k, tokenSetting), strings.EqualFold(k, lockSetting):
			continue
		case k == "options":
			if v = withoutOptionSettings(v, tokenSetting, lockSetting); v == "" {
				continue
			}
		}
		out[k] = v
	}
	return out
}

// poolFor returns the pool of a client's startup parameters, creating it.
func (ps *txPools) poolFor(params map[string]string) (*txPool, error) {
	cfg := ps.srv.cfg
	kp := poolKeyParams(params, cfg.Token.Setting, cfg.Token.LockSetting)
	names := make([]string, 0, len(kp))
	for k := range kp {
		names = append(names, k)
	}
	sort.Strings(names)
	var key strings.Builder
	for _, k := range names {
		key.WriteString(k)
		key.WriteByte(0)
		key.WriteString(kp[k])
		key.WriteByte(0)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		return nil, errors.New("the proxy is shutting down")
	}
	if p := ps.byKey[key.String()]; p != nil {
		return p, nil
	}
	p := &txPool{srv: ps.srv, name: kp["database"] + "/" + kp["user"], params: kp, slots: make(chan struct{}, cfg.Pool.Size), live: map[*serverConn]struct{}{}}
	if p.name == "/" || kp["database"] == "" {
		p.name = kp["user"] + "/" + kp["user"]
	}
	ps.byKey[key.String()] = p
	return p, nil
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
		p.mu.Lock()
		idle := p.idle
		p.idle = nil
		for _, sc := range idle {
			delete(p.live, sc)
		}
		p.mu.Unlock()
		for _, sc := range idle {
			sc.conn.Close() // an idle connection holds no slot
		}
	}
}

// acquire lends a server connection: an idle one, or a new one while the pool has room; else it waits for one
// up to wait.
func (p *txPool) acquire(wait time.Duration) (*serverConn, error) {
	select {
	case p.slots <- struct{}{}:
	default:
		p.waiting.Add(1)
		t := time.NewTimer(wait)
		select {
		case p.slots <- struct{}{}:
			t.Stop()
			p.waiting.Add(-1)
		case <-t.C:
			p.waiting.Add(-1)
			return nil, errPoolTimeout
		}
	}
	p.lends.Add(1)
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
		if sc.r.r.Buffered() > 0 || inputWaiting(sc.conn) || p.superseded(sc) {
			// The server spoke to an idle connection: the FATAL it sends before it closes one (a restart,
			// pg_terminate_backend). Or a change of primary left its host behind. Another connection serves the
			// client instead of this one failing it.
			p.forget(sc)
			continue
		}
		return sc, nil
	}
	sc, err := p.dial()
	if err == nil && p.superseded(sc) {
		// Dialled to a host picked just before a change of primary was published (dropHost missed it): the
		// next pick is the new one.
		p.forget(sc)
		sc, err = p.dial()
	}
	if err != nil {
		<-p.slots
		return nil, err
	}
	return sc, nil
}

// release takes back a server connection that is idle and clean: no transaction, the placeholders in place.
func (p *txPool) release(sc *serverConn) {
	if p.srv.draining.Load() || time.Since(sc.born) > p.srv.cfg.Pool.ServerLifetime || p.superseded(sc) {
		p.discard(sc)
		return
	}
	p.mu.Lock()
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
}

// forget closes a server connection and takes it off the pool's list of open ones.
func (p *txPool) forget(sc *serverConn) {
	p.mu.Lock()
	delete(p.live, sc)
	p.mu.Unlock()
	sc.conn.Close()
}

// superseded reports whether a change of primary published since sc was dialled concerns its host
// (router.superseded: the rule that ends the sessions of session mode), so it must serve no other transaction.
func (p *txPool) superseded(sc *serverConn) bool {
	if p.srv.router == nil {
		return false
	}
	_, ended := p.srv.router.superseded(sc.host)
	return ended
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
			sc.conn.Close()
		}
	}
}

// dial opens a server connection to the host the router picks (Server.pickUpstream: upstream.address, or among
// upstream.hosts for upstream.target, waiting within the startup timeout during a failover) through the proxy's
// one dial function (Server.dialHost, which negotiates upstream TLS), logs in
// (pgconn, as the pool's user with auth.upstream_password(s) or none: trust, password, md5 or SCRAM) and sets
// the placeholders.
func (p *txPool) dial() (*serverConn, error) {
	s := p.srv
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Limits.StartupTimeout)
	defer cancel()
	up, err := s.pickUpstream(ctx)
	if err != nil {
		return nil, fmt.Errorf("pool %s: %w", p.name, err)
	}
	host, port, err := net.SplitHostPort(up.addr)
	if err != nil {
		return nil, err
	}
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("host='%s' port=%s sslmode=disable", host, port))
	if err != nil {
		return nil, fmt.Errorf("pool %s: %w", p.name, err)
	}
	cfg.Fallbacks = nil
	cfg.TLSConfig = nil // dialHost negotiates TLS itself (upstream.tls)
	cfg.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) { return s.dialHost(ctx, up.addr) }
	cfg.LookupFunc = func(context.Context, string) ([]string, error) { return []string{host}, nil }
	cfg.User = p.params["user"]
	cfg.Database = p.params["database"]
	cfg.Password = s.cfg.Auth.UpstreamPasswordFor(cfg.User) // "": trust

	cfg.RuntimeParams = map[string]string{}
	for k, v := range p.params {
		if k != "user" && k != "database" {
			cfg.RuntimeParams[k] = v
		}
	}
	pc, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pool %s: connect: %w", p.name, err)
	}
	tok, lock := s.cfg.Token.Setting, s.cfg.Token.LockSetting
	// The defaults first, then the placeholders: a target list is evaluated in order.
	setup := fmt.Sprintf("SELECT pg_catalog.current_setting(%[1]s, true), pg_catalog.current_setting(%[2]s, true), pg_catalog.set_config(%[1]s, %[3]s, false), pg_catalog.set_config(%[2]s, %[3]s, false)",
		quoteLiteral(tok), quoteLiteral(lock), quoteLiteral(poolPlaceholder))
	res, err := pc.Exec(ctx, setup).ReadAll()
	if err == nil && (len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 4) {
		err = errors.New("unexpected answer")
	}
	if err != nil {
		pc.Close(ctx)
		return nil, fmt.Errorf("pool %s: set up a server connection: %w", p.name, err)
	}
	defaults := res[0].Rows[0]
	if err := pc.SyncConn(ctx); err != nil {
		pc.Close(ctx)
		return nil, fmt.Errorf("pool %s: %w", p.name, err)
	}
	hc, err := pc.Hijack()
	if err != nil {
		return nil, fmt.Errorf("pool %s: %w", p.name, err)
	}
	hc.Conn.SetDeadline(time.Time{})
	sc := &serverConn{pool: p, conn: hc.Conn, host: up, born: time.Now(), stmts: map[string]bool{}}
	sc.key = append(sc.key, byte(hc.PID>>24), byte(hc.PID>>16), byte(hc.PID>>8), byte(hc.PID))
	sc.key = append(sc.key, hc.SecretKey...)
	sc.w = bufio.NewWriterSize(hc.Conn, writeBufferSize)
	sc.intr.conn = hc.Conn
	sc.r = msgReader{r: bufio.NewReaderSize(hc.Conn, readBufferSize), intr: &sc.intr}
	s.metrics.poolDialed()
	p.opened.Add(1)
	p.mu.Lock()
	p.live[sc] = struct{}{}
	if p.reports == nil {
		p.resetToken, p.resetLock = nullable(defaults[0]), nullable(defaults[1])
		names := make([]string, 0, len(hc.ParameterStatuses))
		for k := range hc.ParameterStatuses {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			p.reports = append(p.reports, paramStatus{k, hc.ParameterStatuses[k]})
		}
	}
	p.mu.Unlock()
	return sc, nil
}

// serverReports returns the ParameterStatus values the pool's clients are shown at startup, opening a server
// connection if none was opened yet.
func (p *txPool) serverReports(wait time.Duration) ([]paramStatus, error) {
	p.mu.Lock()
	r := p.reports
	p.mu.Unlock()
	if r != nil {
		return r, nil
	}
	sc, err := p.acquire(wait)
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

// quoteLiteral quotes s as an SQL string constant that reads the same whatever standard_conforming_strings is.
func quoteLiteral(s string) string {
	if !strings.ContainsAny(s, `'\`) {
		return "'" + s + "'"
	}
	return "E'" + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(s) + "'"
}
