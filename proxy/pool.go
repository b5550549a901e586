package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
	// settings are its session-level settings that the pool replays, as last read back or put there; nil: the
	// pool's defaults. settingsFor is the client for which settingsStmtName was last prepared on it (pooledsettings.go).
	settings    map[string]string
	settingsFor *pooledState
	// roleCheckedFor is the client for which the role check (pooledsettings.go: roleCheckSQL) last ran on it.
	roleCheckedFor *pooledState
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
	tokenStmts            tokenStmtCache // the Parse of tokenStmtName, built once (pooledsettings.go)

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

// acquire lends a server connection: an idle one, or a new one (logged in with login, the client's) while the
// pool has room; else it waits for one up to wait.
func (p *txPool) acquire(wait time.Duration, login *clientLogin) (*serverConn, error) {
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
	sc, err := p.dial(login)
	if err == nil && p.superseded(sc) {
		// Dialled to a host picked just before a change of primary was published (dropHost missed it): the
		// next pick is the new one.
		p.forget(sc)
		sc, err = p.dial(login)
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

// dial opens a server connection for a client of the pool whose login is login: to the host the router picks
// (Server.pickUpstream: upstream.address, or among upstream.hosts for upstream.target, waiting within the
// startup timeout during a failover), through the proxy's one dial function (Server.dialHost, which negotiates
// upstream TLS). It logs in as the pool's user the way every client is logged in upstream (auth.go:
// clientLogin.answerUpstream: the client's SCRAM ClientKey, its md5 secret, or auth.upstream_password(s)) and
// sets the placeholders.
func (p *txPool) dial(login *clientLogin) (*serverConn, error) {
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
	sc := &serverConn{pool: p, conn: conn, host: up, born: time.Now(), stmts: map[string]bool{}}
	sc.w = bufio.NewWriterSize(conn, writeBufferSize)
	sc.intr.conn = conn
	sc.r = msgReader{r: bufio.NewReaderSize(conn, readBufferSize), intr: &sc.intr}
	statuses, defaults, err := sc.logIn(login, s.cfg.Token.Setting, s.cfg.Token.LockSetting)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("pool %s on %s: %w", p.name, up.addr, err)
	}
	conn.SetDeadline(time.Time{})
	s.metrics.poolDialed()
	p.opened.Add(1)
	p.mu.Lock()
	p.live[sc] = struct{}{}
	if p.reports == nil {
		p.resetToken, p.resetLock = nullable(defaults[0]), nullable(defaults[1])
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
		return nil, nil, err
	}
	sort.Slice(statuses, func(i, j int) bool { return statuses[i].name < statuses[j].name })
	// The defaults first, then the placeholders: a target list is evaluated in order.
	writeMsg(sc.w, msgQuery, nil, fmt.Sprintf("SELECT pg_catalog.current_setting(%[1]s, true), pg_catalog.current_setting(%[2]s, true), pg_catalog.set_config(%[1]s, %[3]s, false), pg_catalog.set_config(%[2]s, %[3]s, false)",
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
	if err == nil && (rows != 1 || len(row) != 4) {
		err = errors.New("unexpected answer")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("set up a server connection: %w", err)
	}
	return statuses, row, nil
}

// readUntilReady reads a server connection's messages up to ReadyForQuery, giving each to seen, and returns how
// many DataRows came; an ErrorResponse is the error (after the ReadyForQuery that follows it, if any).
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
			failed = fmt.Errorf("server: %s (SQLSTATE %s)", errorField(body, fieldMessage), errorField(body, fieldCode))
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
	sc, err := p.acquire(wait, login)
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
