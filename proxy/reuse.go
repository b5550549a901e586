package proxy

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Upstream connection reuse (upstream.reuse), pgbouncer's session pooling made safe for a proxy that relays
// authentication instead of doing it.
//
// A PostgreSQL backend that has served a while is much cheaper than a new one: a new backend process faults in
// every shared-buffer page it touches and fills its catalog caches from scratch, which on a small machine costs
// a third of the throughput of a read-only benchmark. So when a session ends cleanly (the client sent Terminate
// while idle: no transaction block, nothing pending), the proxy keeps its upstream connection, resets it with
// DISCARD ALL, and gives it to the next client whose StartupMessage is byte for byte the same.
//
// Only connections whose authentication asked for nothing are kept: the server answered the StartupMessage with
// AuthenticationOk straight away (trust, or ident/cert decided on the proxy's own identity). PostgreSQL would
// let the next client with the same startup in the same way, so answering it from a kept connection skips no
// check. A session that had to prove a password never gives its connection to anyone.
//
// The client of a reused connection sees what a new connection shows: AuthenticationOk, the server's current
// ParameterStatus values (after the reset), BackendKeyData and ReadyForQuery. The PID in BackendKeyData is the
// backend's own, so pg_backend_pid() and notifications agree with it; the secret key is the proxy's, drawn for
// each session and checked by the proxy on CancelRequest, so an earlier client of the same backend cannot cancel
// a later client's query.

// keptConn is an upstream connection kept for reuse.
type keptConn struct {
	conn      net.Conn
	startup   string        // the startupKey of the StartupMessage it was opened with
	host      upstreamHost  // the server it goes to, and the router's epoch when it was dialled
	params    []paramStatus // ParameterStatus values the server last reported
	cancelKey []byte        // the backend's BackendKeyData body (PID, secret)
	born      time.Time
	since     time.Time // kept since
}

type paramStatus struct{ name, value string }

// setParam records a ParameterStatus value.
func setParam(ps []paramStatus, name, value string) []paramStatus {
	for i := range ps {
		if ps[i].name == name {
			ps[i].value = value
			return ps
		}
	}
	return append(ps, paramStatus{name, value})
}

// upstreamPool holds kept connections, oldest first.
type upstreamPool struct {
	max         int
	idleTimeout time.Duration
	lifetime    time.Duration
	metrics     *Metrics

	// beforePut, when set (by tests only: testHooks), runs in put before the pool's lock is taken, where a test
	// holds a connection about to be kept while a change of primary is published. Set by New before anything
	// runs, and only read after.
	beforePut func()

	mu     sync.Mutex
	idle   []*keptConn
	closed bool
	// epoch is the router's epoch as dropBefore was last told (0 without upstream.hosts). No kept connection of
	// an earlier one can ever be taken (get matches the epoch exactly), so none is held: dropBefore closes
	// those kept, and put, judging under mu, keeps none.
	epoch uint64
}

func newUpstreamPool(max int, idleTimeout, lifetime time.Duration, m *Metrics) *upstreamPool {
	if max <= 0 {
		return nil
	}
	return &upstreamPool{max: max, idleTimeout: idleTimeout, lifetime: lifetime, metrics: m}
}

// startupKey identifies what a StartupMessage asks for: the protocol version and the parameters, in a fixed
// order (drivers such as pgx send them in map order, which changes from one connection to the next).
func startupKey(version []byte, params map[string]string) string {
	names := slices.Sorted(maps.Keys(params))
	b := append([]byte(nil), version...)
	for _, n := range names {
		b = append(append(append(append(b, n...), 0), params[n]...), 0)
	}
	return string(b)
}

// get takes the newest kept connection opened with startup (a startupKey) that is still usable, or returns nil.
// It must go to host and have been dialled in its epoch: after a change of primary no connection of an earlier
// one is used, even to the same server.
func (p *upstreamPool) get(startup string, host upstreamHost) *keptConn {
	if p == nil {
		return nil
	}
	for {
		var kc *keptConn
		p.mu.Lock()
		for i := len(p.idle) - 1; i >= 0; i-- {
			if p.idle[i].startup == startup && p.idle[i].host == host {
				kc = p.idle[i]
				p.idle = slices.Delete(p.idle, i, i+1)
				break
			}
		}
		p.metrics.upstreamIdle(len(p.idle))
		p.mu.Unlock()
		if kc == nil {
			return nil
		}
		now := time.Now()
		if now.Sub(kc.since) < p.idleTimeout && now.Sub(kc.born) < p.lifetime && quiet(kc.conn) {
			return kc
		}
		// Expired, or the server closed it or said something (a FATAL before closing) while it was idle.
		kc.conn.Close()
	}
}

// put keeps kc, evicting the oldest kept connection when full, and reports whether it kept it. It closes kc
// when the pool is closed or kc was dialled in an epoch before the router's latest change of primary.
func (p *upstreamPool) put(kc *keptConn) bool {
	kc.since = time.Now()
	if hold := p.beforePut; hold != nil {
		hold()
	}
	var evicted *keptConn
	p.mu.Lock()
	// The epoch is judged under the lock dropBefore takes: a change of primary either has had its dropBefore
	// (p.epoch is past kc's: not kept) or has it still to come (it finds kc kept and closes it). Before
	// 2026-12-05 nothing was judged, and a session that ended just as a new primary was published kept its
	// connection after dropHost had closed the old primary's: never taken, yet counted by
	// fenceproxy_upstream_idle and holding a slot of max_idle until idle_timeout
	// (TestKeptConnectionRacingAChangeOfPrimary).
	if p.closed || kc.host.epoch < p.epoch {
		p.mu.Unlock()
		kc.conn.Close()
		return false
	}
	if len(p.idle) >= p.max {
		evicted = p.idle[0]
		p.idle = slices.Delete(p.idle, 0, 1)
	}
	p.idle = append(p.idle, kc)
	p.metrics.upstreamIdle(len(p.idle))
	p.mu.Unlock()
	if evicted != nil {
		evicted.conn.Close()
	}
	time.AfterFunc(p.idleTimeout, p.expire)
	return true
}

// expire closes the connections kept longer than the idle timeout.
func (p *upstreamPool) expire() {
	now := time.Now()
	p.closeWhere(func(kc *keptConn) bool { return now.Sub(kc.since) >= p.idleTimeout })
}

// dropBefore is told of every change of the router's epoch (a primary published or withdrawn): it closes the
// connections kept in an earlier epoch, on the old primary or any other host, which no session can take any
// more, and keeps none from now on (put).
func (p *upstreamPool) dropBefore(epoch uint64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.epoch = max(p.epoch, epoch) // under p.mu, as put judges against it
	p.mu.Unlock()
	// A put between the two sees the new epoch and keeps nothing older; one before is dropped here.
	p.closeWhere(func(kc *keptConn) bool { return kc.host.epoch < epoch })
}

// closeWhere takes the kept connections for which drop is true out of the pool, and closes them outside the
// lock.
func (p *upstreamPool) closeWhere(drop func(*keptConn) bool) {
	var old []*keptConn
	p.mu.Lock()
	kept := p.idle[:0]
	for _, kc := range p.idle {
		if drop(kc) {
			old = append(old, kc)
		} else {
			kept = append(kept, kc)
		}
	}
	clear(p.idle[len(kept):])
	p.idle = kept
	p.metrics.upstreamIdle(len(p.idle))
	p.mu.Unlock()
	for _, kc := range old {
		kc.conn.Close()
	}
}

// close closes every kept connection and keeps no more.
func (p *upstreamPool) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	old := p.idle
	p.idle, p.closed = nil, true
	p.metrics.upstreamIdle(0)
	p.mu.Unlock()
	for _, kc := range old {
		kc.conn.Close()
	}
}

// socketOf is the socket under c for raw calls (a *tls.Conn's connection underneath); nil when c has none.
func socketOf(c net.Conn) syscall.RawConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// quiet reports whether an idle connection is open and has nothing to read, without blocking.
func quiet(c net.Conn) bool {
	rc := socketOf(c)
	if rc == nil {
		return false
	}
	ok := false
	var b [1]byte
	rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = err == syscall.EAGAIN
		return true // never wait
	})
	return ok
}

// mayKeep reports whether the session's upstream connection may be kept when the session ends now, at the
// client's Terminate. Called once both directions stopped.
func (ss *session) mayKeep() bool {
	s, st := ss.srv, &ss.state
	// idle() first: it loads ready, after which reusable (set before ready) may be read.
	return s.pool != nil && st.idle() && st.reusable && !s.draining.Load() && !st.serverFatal &&
		time.Since(ss.born) < s.pool.lifetime
}

// keptAppName is the application_name a kept connection shows in pg_stat_activity while it waits: operators
// (and tools that look for their own sessions by name) can tell it from a client's session.
const keptAppName = "fenceproxy: kept for reuse"

// keep resets the upstream connection of an ended session and keeps it, or closes it if the reset fails.
// Everything the server sent has been read and forwarded: the connection is at a message boundary.
//
// DISCARD ALL ends everything a session can leave behind (settings, prepared statements, portals, temporary
// tables, LISTEN, advisory locks, sequences' state, cached plans). It must be a Query of its own: PostgreSQL
// refuses it inside the implicit transaction of a multi-statement Query.
func (ss *session) keep(conn net.Conn) {
	// No cancel of this session's may reach the backend once another session runs on it: its client's key
	// stops finding the session, and the cancels already on their way are delivered first (cancelBackend),
	// before the reset, which a late one fails (the connection is then closed, not kept).
	ss.srv.forgetKey(ss)
	if !ss.cancelGate.TryLock() {
		ss.logger().Debug("keeping the upstream connection waits for a cancel on its way to it")
		ss.cancelGate.Lock()
	}
	if ss.cancelUnsure.Load() {
		// That cancel may still reach the backend after the reset, and stop the next session's statement
		// (TestSessionCancelGivenUpOnNeverReachesTheNextSession).
		ss.logger().Debug("upstream connection not kept: a cancel sent to it was not seen taken")
		conn.Close()
		return
	}
	// The session's own application_name, not the kept connection's, goes into its "connection ended" line.
	app := ss.appName.Load()
	defer ss.appName.Store(app)
	if err := ss.upstreamQueries(conn, "DISCARD ALL", "SET application_name = '"+keptAppName+"'"); err != nil {
		ss.logger().Debug("upstream connection not kept", "err", err)
		conn.Close()
		return
	}
	ss.kept = ss.srv.pool.put(&keptConn{conn: conn, startup: ss.startup, host: ss.host, params: ss.state.serverParams, cancelKey: ss.cancelKey, born: ss.born})
}

// upstreamQueries runs the proxy's own statements, each as a Query, on an idle upstream connection, noting the
// ParameterStatus values they change. It fails unless each succeeds and the session ends idle with nothing
// more to read.
func (ss *session) upstreamQueries(conn net.Conn, queries ...string) error {
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	var q []byte
	for _, sql := range queries {
		q = appendMessage(q, msgQuery, []byte(sql), []byte{0})
	}
	if _, err := conn.Write(q); err != nil {
		return fmt.Errorf("send %q: %w", queries, err)
	}
	r := msgReader{r: bufio.NewReaderSize(conn, 512), max: 1 << 20}
	for ready := 0; ready < len(queries); {
		typ, _, err := r.next()
		if err != nil {
			return fmt.Errorf("read the answer to %q: %w", queries, err)
		}
		body, err := r.body()
		if err != nil {
			return fmt.Errorf("read the answer to %q: %w", queries, err)
		}
		switch typ {
		case msgCommandComplete, msgNoticeResponse, msgNotificationResponse: // a notification sent before UNLISTEN
		case msgParameterStatus:
			if !ss.noteParam(body) {
				return fmt.Errorf("answer to %q: malformed ParameterStatus", queries)
			}
		case msgReadyForQuery:
			if len(body) != 1 || body[0] != txIdle {
				return fmt.Errorf("answer to %q: ReadyForQuery %q", queries, body)
			}
			ready++
		default:
			return fmt.Errorf("answer to %q: unexpected message %q", queries, typ)
		}
	}
	if r.r.Buffered() > 0 {
		return fmt.Errorf("answer to %q: more data after ReadyForQuery", queries)
	}
	conn.SetDeadline(time.Time{})
	return nil
}

// resume starts the session on a kept connection, answering the client's startup as the server did.
// It reports false, having told the client nothing, when the kept connection turns out to be unusable.
func (ss *session) resume(kc *keptConn) (bool, error) {
	// Back to this session's own application_name (the startup's, which is the one RESET restores).
	ss.state.serverParams = kc.params
	for _, p := range kc.params {
		ss.state.reading.note(p.name, p.value)
	}
	if err := ss.upstreamQueries(kc.conn, "RESET application_name"); err != nil {
		ss.logger().Debug("kept upstream connection unusable", "err", err)
		kc.conn.Close()
		ss.state.serverParams = nil
		return false, nil
	}
	ss.srv.metrics.upstreamReused() // before the client can see the session start
	ss.attachUpstream(kc.conn)
	ss.born = kc.born
	ss.state.reusable = true
	ss.cancelKey = kc.cancelKey
	ss.srv.registerKey(ss, binary.BigEndian.Uint32(kc.cancelKey), len(kc.cancelKey)-4) // a new secret

	b := appendMessage(ss.out[:0], msgAuthentication, []byte{0, 0, 0, authOK})
	for _, p := range ss.state.serverParams {
		b = appendMessage(b, msgParameterStatus, []byte(p.name), []byte{0}, []byte(p.value), []byte{0})
	}
	b = appendMessage(b, msgBackendKeyData, ss.clientKey)
	b = appendMessage(b, msgReadyForQuery, []byte{txIdle})
	ss.out = b
	if _, err := ss.cw.Write(b); err != nil {
		return true, err
	}
	if err := ss.cw.Flush(); err != nil {
		return true, err
	}
	ss.client.SetDeadline(time.Time{})
	ss.state.txStatus.Store(uint32(txIdle))
	ss.state.ready.Store(true)
	return true, nil
}
