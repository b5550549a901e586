package proxy

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"
)

// upstreamHost is the server an upstream connection was dialled to, and the router's epoch then (0 without a
// router): a session on a host that stops being what it was dialled for is ended (router.go).
type upstreamHost struct {
	addr  string
	epoch uint64
}

// dialUpstream connects a new session to PostgreSQL: to upstream.address, or to the host the router picks
// among upstream.hosts for upstream.target (waiting, as long as ctx allows, while none fits: during a
// failover, until the new primary is published).
func (s *Server) dialUpstream(ctx context.Context) (net.Conn, upstreamHost, error) {
	h, err := s.pickUpstream(ctx)
	if err != nil {
		return nil, h, err
	}
	c, err := s.dialHost(ctx, h.addr)
	return c, h, err
}

// pickUpstream is the host a new session goes to.
func (s *Server) pickUpstream(ctx context.Context) (upstreamHost, error) {
	if s.router == nil {
		return upstreamHost{addr: s.cfg.Upstream.Address}, nil
	}
	addr, epoch, err := s.router.pick(ctx)
	return upstreamHost{addr, epoch}, err
}

// dialHost connects to the server at addr, negotiating TLS first when upstream.tls.mode asks for it.
func (s *Server) dialHost(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: s.cfg.Upstream.ConnectTimeout, KeepAlive: 30 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial upstream %s: %w", addr, err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	upTLS := s.upstreamTLSFor(addr)
	if upTLS == nil {
		return c, nil
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	var req [8]byte
	binary.BigEndian.PutUint32(req[0:], 8)
	binary.BigEndian.PutUint32(req[4:], codeSSLRequest)
	if _, err := c.Write(req[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("upstream SSLRequest: %w", err)
	}
	var answer [1]byte
	if _, err := io.ReadFull(c, answer[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("upstream SSLRequest answer: %w", err)
	}
	if answer[0] != negotiateAccept {
		c.Close()
		return nil, fmt.Errorf("upstream %s does not accept TLS (answered %q) but upstream.tls.mode is %s", addr, answer[0], s.cfg.Upstream.TLS.Mode)
	}
	tc := tls.Client(c, upTLS)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("upstream TLS handshake (mode %s): %w", s.cfg.Upstream.TLS.Mode, err)
	}
	c.SetDeadline(time.Time{})
	return tc, nil
}

// forwardCancel handles a client's CancelRequest (body: code, PID, secret key). The client's key is the one the
// proxy gave it (see reuse.go); the proxy checks it and sends PostgreSQL the backend's real key, so a cancel can
// only stop the query of the session whose key it carries. Requests that match no session are dropped without
// contacting the upstream, so a flood of bogus cancels costs nothing there.
func (s *Server) forwardCancel(body []byte) {
	if len(body) < 12 || len(body) > 4+4+256 {
		s.metrics.protocolError()
		return
	}
	ss, key, _ := s.sessionForKey(body[4:])
	switch {
	case ss != nil && ss.pooled != nil:
		ss.cancelPooled() // to the server connection lent to it now, if any
	case key == nil:
		s.log.Debug("dropped CancelRequest that matches no session")
	default:
		if ss != nil {
			if delivered := ss.cancelAfterOwn(); delivered != nil {
				// The client's cancel connection stays open until PostgreSQL has taken the cancel, as when
				// it is forwarded at once: a client that waits for its cancel to return before its next
				// statement (libpq, pgx) never has that statement hit by it. PostgreSQL signals the backend
				// twice for one cancel (the process, then its group), and the second, late under load,
				// cancelled whatever ran then.
				wait := time.NewTimer(cancelWaitLimit)
				defer wait.Stop()
				select {
				case <-delivered:
				case <-wait.C:
				}
				return
			}
		}
		ss.cancelBackend()
	}
}

// cancelBackend sends PostgreSQL a cancel for the session-mode session's backend, unless the session has given
// that backend up for another session to use (keep): a cancel of an ended session, looked up before it ended
// or still on its way (dialing the server takes a while under load), would stop the next session's statement.
// Each cancel holds cancelGate shared while it is sent; keep takes it for good, after the cancels on their way
// are delivered, before the connection's reset.
func (ss *session) cancelBackend() {
	if !ss.cancelGate.TryRLock() {
		ss.logger().Debug("dropped a CancelRequest: the session gave its backend up")
		return
	}
	defer ss.cancelGate.RUnlock()
	if !ss.srv.cancelUpstream(ss.cancelKey, ss.host.addr) {
		ss.cancelUnsure.Store(true)
	}
}

// cancelWaitLimit bounds how long a client's cancel connection waits for a cancel deferred behind the proxy's
// own commands (cancelAfterOwn): they may wait for a lock that long. The cancel itself stays owed.
const cancelWaitLimit = 30 * time.Second

// cancelWaitMax bounds the client cancel connections that wait for one owed cancel (cancelAfterOwn). Each holds
// a goroutine and a place under limits.max_client_connections, and more cancels add nothing to the one sent
// (it stops the statement): beyond it they are answered at once, as a flood of them would otherwise hold
// every place for as long as the proxy's commands wait.
const cancelWaitMax = 4

// owedCancel is a client's cancel deferred behind the proxy's own commands (cancelAfterOwn). done is closed
// once PostgreSQL has taken it, or when the session ends with it unsent; waiters counts the client cancel
// connections waiting for that.
type owedCancel struct {
	done    chan struct{}
	waiters int
}

// cancelAfterOwn defers a client's cancel while commands of the proxy's own (prepared.go: sendQueued) run
// before the client's statement, in the same write: cancelled, one of them would fail (a sweep would leave
// the proxy's statements on the connection) and the client's statement would run on. The last of their
// answers sends it (onPreparedAnswer). It returns nil when the cancel is to go now; otherwise a channel the
// client's cancel connection waits for (closed already when it need not wait). A pooled session has its own
// rule (cancelPooled).
func (ss *session) cancelAfterOwn() (delivered <-chan struct{}) {
	st := &ss.state
	if st.internal.Load() <= 0 {
		return nil
	}
	st.cancelMu.Lock()
	defer st.cancelMu.Unlock()
	if st.cancelEnded {
		// It looked the session up as it ended: nothing will answer the proxy's commands, and the backend
		// may already serve another session (reuse.go). Nothing to cancel.
		return closedChan()
	}
	// The last answer lowers internal before it takes owed (takeOwedCancel, under cancelMu): either it
	// takes this cancel, or this sees internal at 0 and the cancel goes now.
	if st.internal.Load() <= 0 {
		return nil
	}
	if st.owed == nil {
		st.owed = &owedCancel{done: make(chan struct{})}
	}
	if st.owed.waiters >= cancelWaitMax {
		return closedChan()
	}
	st.owed.waiters++
	return st.owed.done
}

// takeOwedCancel takes the cancel owed (cancelAfterOwn), nil when none: the caller sends it and closes done.
// Cancels that come after it wait for a cancel of their own.
func (st *protoState) takeOwedCancel() *owedCancel {
	st.cancelMu.Lock()
	o := st.owed
	st.owed = nil
	st.cancelMu.Unlock()
	return o
}

// endCancels is the session's end for its cancels: one owed is never sent (its client cancel connections are
// answered), and none is deferred from now on. One already taken is answered when PostgreSQL has taken it.
func (st *protoState) endCancels() {
	st.cancelMu.Lock()
	o := st.owed
	st.owed, st.cancelEnded = nil, true
	st.cancelMu.Unlock()
	if o != nil {
		close(o.done)
	}
}

// closedChan is a channel closed already: a cancel connection that waits for nothing.
func closedChan() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// cancelUpstream cancels the running query of the backend with BackendKeyData key on host.
// cancelUpstream sends a CancelRequest for key to host and reports whether PostgreSQL took it: it closes the
// cancel's connection once it has signalled the backend. A cancel not known taken (the dial, the write or the
// wait for that close failed, each within 5 s) may still reach the backend later, under load or on a slow
// network, and stop whatever it runs then.
func (s *Server) cancelUpstream(key []byte, host string) bool {
	body := binary.BigEndian.AppendUint32(nil, codeCancelRequest)
	body = append(body, key...)
	return s.sendCancel(body, host)
}

func (s *Server) sendCancel(body []byte, host string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := s.dialHost(ctx, host)
	if err != nil {
		s.log.Warn("could not deliver a cancel request", "err", err)
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	pkt := binary.BigEndian.AppendUint32(nil, uint32(len(body)+4))
	pkt = append(pkt, body...)
	if _, err := c.Write(pkt); err != nil {
		s.log.Warn("could not deliver a cancel request", "err", err)
		return false
	}
	// PostgreSQL answers a cancel by closing the connection; waiting for that makes the cancel delivered
	// before the caller goes on.
	var b [1]byte
	if _, err := c.Read(b[:]); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		s.log.Warn("a cancel request was sent but not seen taken", "host", host, "err", err)
		return false
	}
	return true
}
