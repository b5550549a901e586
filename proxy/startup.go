package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// Startup: everything between accept and relaying. The client negotiates TLS (SSLRequest, GSSENCRequest, direct
// TLS) or sends a CancelRequest; its StartupMessage is checked (limits, drain, a token among its parameters);
// the client is authenticated by the proxy when auth.type says so (auth.go); the session then resumes a kept
// upstream connection (reuse.go) or dials a new one and sends the StartupMessage on, after which authentication
// is relayed by the transport like any other message (passthrough) or answered by the proxy (auth.go), until the
// first ReadyForQuery (core.go: readyOut).

// endUnlessParked is the deferred end of a goroutine that served ss (handle, resumePooled): a panic is logged
// and closes the session (a bug must not take the other sessions down with it), and the client connection is
// closed unless the session parked, when it belongs to the parker.
func (ss *session) endUnlessParked(parked *bool) {
	if r := recover(); r != nil {
		ss.logger().Error("session panic", "panic", r)
		ss.forceClose()
		*parked = false
	}
	if !*parked {
		ss.client.Close()
	}
}

// handle runs one accepted connection to the end.
// It reports whether the session parked (a transaction-mode client idle between transactions, park_linux.go):
// then it is not over, and belongs to the parker.
func (s *Server) handle(raw net.Conn, over bool) (parked bool) {
	ss := &session{srv: s, client: raw, remote: raw.RemoteAddr().String()}
	ss.ownPrep.max = s.cfg.Upstream.Prepared(s.cfg.Token.Scope, s.cfg.Pool.Transaction())
	ss.prep = &ss.ownPrep // one allocation with the session
	defer ss.endUnlessParked(&parked)

	raw.SetDeadline(time.Now().Add(s.cfg.Limits.StartupTimeout))
	startup, r, err := ss.negotiate(raw)
	if err != nil {
		ss.startupFailed(err)
		return
	}
	if startup == nil {
		return // a CancelRequest, handled
	}
	ss.attachClient(r)

	if over {
		s.metrics.sessionRefused("too_many_clients")
		ss.fatal(sqlstateTooManyConnections, "sorry, too many clients already", fmt.Sprintf("fenceproxy serves at most %d client connections (limits.max_client_connections).", s.cfg.Limits.MaxClientConnections))
		return
	}
	if s.draining.Load() {
		s.metrics.sessionRefused("shutting_down")
		ss.fatal(sqlstateCannotConnectNow, "the proxy is shutting down", "")
		return
	}
	if ss.params, err = parseStartupParams(startup[4:]); err != nil {
		ss.startupFailed(err)
		return
	}
	if s.pools != nil && !ss.negotiateVersion(binary.BigEndian.Uint32(startup)) {
		return
	}
	app := ss.params["application_name"]
	ss.appName.Store(&app)
	ss.named = true // the session's lines name its user and database from here on (logger)
	if msg, ok := ss.checkStartupSearchPath(); !ok {
		s.metrics.refusal(sqlstateUnfenceable, "")
		ss.logger().Warn("refused startup search_path", "code", sqlstateUnfenceable, "reason", msg, "application_name", app)
		ss.fatalHint(sqlstateUnfenceable, msg, "", "")
		return
	}
	if code, msg, hint, ok := ss.checkStartupToken(); !ok {
		s.metrics.refusal(code, "")
		msg = s.withTokenContext(msg)
		ss.logger().Warn("refused startup token", "code", code, "reason", msg, "application_name", app)
		ss.fatalHint(code, msg, "", hint)
		return
	}

	// With auth by the proxy, the client proves itself here, before any upstream work; with passthrough
	// (login nil) PostgreSQL authenticates it through the relay.
	login, err := s.authenticateClient(ss)
	if err != nil {
		return
	}
	if s.pools != nil {
		return s.startPooled(ss, login) // pooled.go: the client is authenticated (pool.mode transaction needs auth by the proxy)
	}
	// The host: upstream.address, or the one the router picks among upstream.hosts (waiting, within the
	// startup deadline, for a primary during a failover).
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(s.cfg.Limits.StartupTimeout))
	ss.host, err = s.pickUpstream(ctx)
	cancel()
	if err != nil {
		s.metrics.upstreamError()
		ss.logger().Warn("no upstream host", "err", err)
		ss.fatal(sqlstateConnectionFailure, "fenceproxy could not connect to the upstream server", err.Error())
		return
	}
	if s.pool != nil {
		ss.startup = startupKey(startup[:4], ss.params)
	}
	for kc := s.pool.get(ss.startup, ss.host); kc != nil; kc = s.pool.get(ss.startup, ss.host) {
		resumed, err := ss.resume(kc)
		if !resumed {
			continue // that one was dead: try another, or a new connection
		}
		if err != nil {
			s.unregister(ss) // the client went away
			kc.conn.Close()
			return
		}
		s.serveSession(ss, true)
		return
	}

	if login != nil {
		if !ss.loginUpstream(login, startup) {
			return
		}
	} else if !ss.openUpstream(startup) {
		return
	}
	s.serveSession(ss, false)
	return false
}

// negotiateVersion answers, in transaction mode, a StartupMessage of a newer 3.x protocol than 3.0 or with
// protocol options (_pq_.*) with NegotiateProtocolVersion, as PostgreSQL does before authentication: 3.0 and
// none of the options. The pool speaks 3.0 to its server connections, whichever version its clients asked for,
// so it tells the client; the options are taken out of the startup parameters (they would choose a pool and
// reach the server's login). In session mode the StartupMessage goes to PostgreSQL as it is, which answers.
// It reports false when the client could not be told.
func (ss *session) negotiateVersion(version uint32) bool {
	var options []string
	for k := range ss.params {
		if strings.HasPrefix(k, "_pq_.") {
			options = append(options, k)
		}
	}
	if version&0xffff == 0 && len(options) == 0 {
		return true
	}
	slices.Sort(options)
	body := binary.BigEndian.AppendUint32(nil, 0) // the newest minor version fenceproxy speaks: 3.0
	body = binary.BigEndian.AppendUint32(body, uint32(len(options)))
	for _, o := range options {
		body = append(append(body, o...), 0)
		delete(ss.params, o)
	}
	writeMsg(ss.cw, msgNegotiateProtocolVersion, body, "")
	return ss.cw.Flush() == nil
}

// negotiate runs the startup phase up to the StartupMessage: SSLRequest, GSSENCRequest, direct TLS and
// CancelRequest. It returns the StartupMessage body (protocol version first) and the reader to go on with, or a
// nil body when the connection was a CancelRequest.
//
// In transaction mode the client's socket is read and written with raw system calls (rawIO) from here on, as
// relayPooled reads it: the startup's reads and writes do not enter the scheduler's system-call path, whose
// first call after the process went idle wakes the runtime's monitor thread (sysmon), a context switch and a
// sleep of its own, each time a connection-per-transaction client's next packet arrives.
func (ss *session) negotiate(raw net.Conn) ([]byte, *bufio.Reader, error) {
	var in io.Reader = raw
	if ss.srv.pools != nil {
		ss.clientIO = rawIO(raw, nil)
		in = ss.clientIO
	}
	r := ss.srv.bufs.reader(in)
	const attempts = 4 // negotiation requests a client may send before its StartupMessage
	// refuse answers N to an SSLRequest or GSSENCRequest; readNext: the next request is read after it.
	refuse := func(readNext bool) error {
		w := io.Writer(ss.client)
		if ss.clientIO != nil {
			w = ss.clientIO
		}
		// The client's next bytes depend on the answer (TLS or not), and bytes it sent before reading it are
		// refused (r.Buffered, below), so the answer goes out from inside the read of the next request
		// (askClient): no empty read first.
		if h, ok := w.(writeHolder); ok && readNext && r.Buffered() == 0 {
			h.holdWrites(true)
			defer h.holdWrites(false)
		}
		_, err := w.Write([]byte{negotiateRefuse})
		return err
	}
	tlsCfg := ss.srv.clientTLS
	for attempt := 0; attempt < attempts; attempt++ {
		if !ss.clientTLS && tlsCfg != nil && attempt == 0 {
			// PostgreSQL 17's sslnegotiation=direct starts TLS at once: the first byte is a TLS handshake
			// record, not a length word.
			if b, err := r.Peek(1); err == nil && b[0] == 0x16 {
				tc := tls.Server(&bufferedConn{Conn: raw, r: r}, tlsCfg)
				if err := tc.Handshake(); err != nil {
					return nil, nil, fmt.Errorf("direct TLS handshake: %w", err)
				}
				if tc.ConnectionState().NegotiatedProtocol != "postgresql" {
					return nil, nil, fmt.Errorf("%w: direct TLS without ALPN \"postgresql\"", errProtocol)
				}
				ss.client, ss.clientTLS, ss.clientIO = tc, true, nil
				r = bufio.NewReaderSize(tc, readBufferSize)
				continue
			}
		}
		body, err := readStartupPacket(r)
		if err != nil {
			return nil, nil, err
		}
		code := binary.BigEndian.Uint32(body)
		switch code {
		case codeSSLRequest:
			if len(body) != 4 || ss.clientTLS {
				return nil, nil, fmt.Errorf("%w: unexpected SSLRequest", errProtocol)
			}
			if r.Buffered() > 0 {
				// Bytes sent before the handshake could be injected by a man in the middle (CVE-2021-23214).
				return nil, nil, fmt.Errorf("%w: data received after SSLRequest", errProtocol)
			}
			if tlsCfg == nil {
				if err := refuse(attempt+1 < attempts); err != nil {
					return nil, nil, err
				}
				continue
			}
			if _, err := ss.client.Write([]byte{negotiateAccept}); err != nil {
				return nil, nil, err
			}
			tc := tls.Server(ss.client, tlsCfg)
			if err := tc.Handshake(); err != nil {
				return nil, nil, fmt.Errorf("TLS handshake: %w", err)
			}
			ss.client, ss.clientTLS, ss.clientIO = tc, true, nil
			r = bufio.NewReaderSize(tc, readBufferSize)
		case codeGSSENCRequest:
			if len(body) != 4 || r.Buffered() > 0 {
				return nil, nil, fmt.Errorf("%w: unexpected GSSENCRequest", errProtocol)
			}
			if err := refuse(attempt+1 < attempts); err != nil {
				return nil, nil, err
			}
		case codeCancelRequest:
			ss.srv.forwardCancel(body)
			return nil, nil, nil
		default:
			if major := code >> 16; major != 3 {
				return nil, nil, &startupError{code: sqlstateFeatureNotSupported, msg: fmt.Sprintf("unsupported frontend protocol %d.%d: fenceproxy supports 3.x", major, code&0xffff)}
			}
			return body, r, nil
		}
	}
	return nil, nil, fmt.Errorf("%w: too many negotiation requests", errProtocol)
}

// bufferedConn lets a TLS handshake read bytes already peeked into a bufio.Reader.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

type startupError struct{ code, msg string }

func (e *startupError) Error() string { return e.msg }

// startupFailed answers a client that failed before its session began.
func (ss *session) startupFailed(err error) {
	log := ss.logger()
	var se *startupError
	switch {
	case errors.As(err, &se):
		ss.fatal(se.code, se.msg, "")
	case errors.Is(err, errProtocol):
		ss.srv.metrics.protocolError()
		log.Info("startup protocol violation", "err", err)
		ss.fatal(sqlstateProtocolViolation, "invalid startup packet", err.Error())
	case isTimeout(err):
		log.Info("startup timed out")
		ss.fatal(sqlstateConnectionFailure, "startup timed out", "")
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		// A client that connects and goes away (a port check, a libpq retry after 'N') is not worth a line.
	default:
		log.Info("startup failed", "err", err)
	}
}

// fatal sends a FATAL ErrorResponse to the client, best effort, before the session is relayed.
func (ss *session) fatal(code, msg, detail string) { ss.fatalHint(code, msg, detail, "") }

// fatalHint is fatal with a HINT.
func (ss *session) fatalHint(code, msg, detail, hint string) {
	ss.client.SetWriteDeadline(time.Now().Add(farewellTimeout))
	b := errorResponse("FATAL", code, msg, detail, hint)
	if ss.cw != nil {
		ss.cw.Write(b)
		ss.cw.Flush()
		return
	}
	ss.client.Write(b)
}

// checkStartupSearchPath refuses a startup packet whose search_path (a parameter of its own, or -c in options,
// in any spelling PostgreSQL reads) may name a schema of the in-database guard: unqualified DDL would then
// resolve into it and could replace the guard's code. SET and set_config of it are refused by the rewrite
// (rewrite/guardpath.go); this is the same rule for the one setter it does not see.
func (ss *session) checkStartupSearchPath() (msg string, ok bool) {
	var values []string
	for k, v := range ss.params {
		if sameSetting(k, "search_path") {
			values = append(values, v)
		}
	}
	for _, o := range optionSettings(splitOptions(ss.params["options"])) {
		if sameSetting(o.name, "search_path") {
			values = append(values, o.value)
		}
	}
	for _, v := range values {
		if rewrite.GuardOnSearchPath(v) {
			return fmt.Sprintf("unfenceable write: the startup search_path %q may put fenceproxy, a schema of the fenceproxy guard, on the search_path, "+
				"where unqualified DDL could change the guard; fenceproxy refuses it", v), false
		}
	}
	return "", true
}

// checkStartupToken validates a token given in the startup packet, as a parameter of its own or as -c in
// options, so that an invalid or forged token is refused before the session starts.
func (ss *session) checkStartupToken() (code, msg, hint string, ok bool) {
	setting := ss.srv.cfg.Token.Setting
	// The same setting twice, in two spellings of its name (fence.token and FENCE.TOKEN): PostgreSQL takes the
	// one later in the packet, an order the parameters lose here. Refused rather than guessed.
	for _, name := range []string{setting, ss.srv.cfg.Token.LockSetting} {
		var spellings []string
		for k := range ss.params {
			if name != "" && strings.EqualFold(k, name) {
				spellings = append(spellings, k)
			}
		}
		if len(spellings) > 1 {
			slices.Sort(spellings)
			return sqlstateInvalid, fmt.Sprintf("invalid fencing token: the startup packet gives %s more than once (%s)", name, strings.Join(spellings, ", ")), "", false
		}
	}
	var values []string
	for k, v := range ss.params {
		if strings.EqualFold(k, setting) {
			values = append(values, v)
		}
	}
	if v, found := optionSetting(ss.params["options"], setting); found {
		values = append(values, v)
	}
	if len(values) > 0 && ss.srv.transactionScope() {
		return sqlstateInvalid, fmt.Sprintf("invalid fencing token: a token in the startup packet is session-level, and %s would stay on a pooled server connection for its next client", setting), ss.srv.scopeHint(), false
	}
	for _, v := range values {
		if code, msg, ok := ss.srv.checkToken(v); !ok {
			return code, msg, "", false
		}
	}
	return "", "", "", true
}
