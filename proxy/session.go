package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// session is one client connection and its upstream connection.
//
// Ownership: the session goroutine runs clientToServer and is the only writer to the upstream (sw); the
// serverToClient goroutine is the only writer to the client (cw) while it runs. Whoever needs to write to the
// other side's writer first makes the owner exit.
type session struct {
	srv      *Server
	log      *slog.Logger
	client   net.Conn // after TLS, if any
	upstream net.Conn
	cr, sr   msgReader
	cw, sw   *bufio.Writer

	clientTLS bool
	remote    string
	params    map[string]string
	appName   atomic.Pointer[string]

	pid       uint32 // upstream backend PID, set under srv.mu
	cancelKey []byte // upstream BackendKeyData (PID and secret), for cancelling on client loss
	clientKey []byte // the BackendKeyData the client got: the PID and the proxy's own secret

	// Upstream reuse (reuse.go). The fields are the session goroutine's, or the event loop's while it relays.
	startup      string        // the StartupMessage's protocol version and parameters (startupKey)
	born         time.Time     // when the upstream connection was opened
	authAsked    bool          // the server asked for something during startup: never reuse
	reusable     bool          // the connection may be kept for another session when this one ends
	serverParams []paramStatus // ParameterStatus values as the server reported them
	reading      serverReading // client_encoding, server_encoding, standard_conforming_strings (reading.go)
	keeping      atomic.Bool   // clientToServer stopped to keep the upstream; serverToClient must stop too
	parked       atomic.Bool   // serverToClient stopped at a message boundary because of keeping

	ready    atomic.Bool  // the first ReadyForQuery was seen: startup and authentication are over
	pending  atomic.Int64 // Query, Sync and FunctionCall messages not yet answered by ReadyForQuery
	unsynced atomic.Bool  // extended-protocol messages forwarded since the last Sync
	txIdle   atomic.Bool  // the last ReadyForQuery said 'I' (not in a transaction block)
	wake     atomic.Bool  // a drain asked the server-to-client loop to look at the session

	clientOut    failWriter  // the client connection as cw writes it, remembering a failed write
	upstreamGone atomic.Bool // serverToClient ended because the upstream failed or closed
	stopping     atomic.Bool // clientToServer ended and is closing the upstream itself
	clientFatal  atomic.Bool // serverToClient already told the client why the session ends
	closeOnce    sync.Once

	// Event-loop handover (evloop_linux.go). wantLoop is the server-to-client goroutine's; handover tells
	// clientToServer to stop and give the session to the loop.
	wantLoop bool
	noLoop   bool
	handover atomic.Bool
	evMu     sync.Mutex
	closed   bool       // forceClose ran; under evMu
	ev       *evSession // the session is in the event loop; under evMu

	out  []byte // scratch for messages the proxy builds, client to server
	sout []byte // scratch for messages the proxy builds, server to client

	// For the per-connection log lines (connlog.go). relayed[dir] is written only by the side that reads that
	// direction (a relay goroutine, or the event loop), and read when the session has ended.
	started time.Time
	relayed [2]uint64 // bytes relayed, by direction (dirClientToServer, dirServerToClient)
	outcome string    // how the session ended
	kept    bool      // its upstream connection was kept for reuse
}

// handle runs one accepted connection to the end.
func (s *Server) handle(raw net.Conn, over bool) {
	ss := &session{srv: s, client: raw, remote: raw.RemoteAddr().String()}
	ss.log = s.log.With("client", ss.remote)
	defer func() {
		if r := recover(); r != nil {
			// A bug must not take the other sessions down with it.
			ss.log.Error("session panic", "panic", r)
			ss.forceClose()
		}
	}()
	defer func() { ss.client.Close() }()

	raw.SetDeadline(time.Now().Add(s.cfg.Limits.StartupTimeout))
	startup, r, err := ss.negotiate(raw)
	if err != nil {
		ss.startupFailed(err)
		return
	}
	if startup == nil {
		return // a CancelRequest, handled
	}
	ss.clientOut = failWriter{Conn: ss.client}
	ss.cw = bufio.NewWriterSize(&ss.clientOut, writeBufferSize)
	ss.cr = msgReader{r: r, conn: ss.client, max: s.cfg.Limits.MaxMessageSize}

	if over {
		s.metrics.sessionRefused("too_many_clients")
		ss.fatal("53300", "sorry, too many clients already", fmt.Sprintf("fenceproxy serves at most %d client connections (limits.max_client_connections).", s.cfg.Limits.MaxClientConnections))
		return
	}
	if s.draining.Load() {
		s.metrics.sessionRefused("shutting_down")
		ss.fatal("57P03", "the proxy is shutting down", "")
		return
	}
	if ss.params, err = parseStartupParams(startup[4:]); err != nil {
		ss.startupFailed(err)
		return
	}
	app := ss.params["application_name"]
	ss.appName.Store(&app)
	ss.log = ss.log.With("user", ss.params["user"], "database", ss.params["database"])
	if code, msg, hint, ok := ss.checkStartupToken(); !ok {
		s.metrics.refusal(code, "")
		msg = s.withTokenContext(msg)
		ss.log.Warn("refused startup token", "code", code, "reason", msg, "application_name", app)
		ss.fatalHint(code, msg, "", hint)
		return
	}

	if s.pool != nil {
		ss.startup = startupKey(startup[:4], ss.params)
	}
	for kc := s.pool.get(ss.startup); kc != nil; kc = s.pool.get(ss.startup) {
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

	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(s.cfg.Limits.StartupTimeout))
	up, err := s.dialUpstream(ctx)
	cancel()
	if err != nil {
		s.metrics.upstreamError()
		ss.log.Warn("upstream connection failed", "err", err)
		ss.fatal("08006", "fenceproxy could not connect to the upstream server", err.Error())
		return
	}
	ss.upstream = up
	ss.born = time.Now()
	up.SetDeadline(time.Now().Add(s.cfg.Limits.StartupTimeout))
	ss.sw = bufio.NewWriterSize(up, writeBufferSize)
	ss.sr = msgReader{r: bufio.NewReaderSize(up, readBufferSize), conn: up}
	// The StartupMessage goes upstream exactly as the client sent it: every parameter, options included, and
	// the protocol version, so that NegotiateProtocolVersion comes from PostgreSQL itself.
	ss.out = binary.BigEndian.AppendUint32(ss.out[:0], uint32(len(startup)+4))
	ss.out = append(ss.out, startup...)
	if _, err := ss.sw.Write(ss.out); err != nil || ss.sw.Flush() != nil {
		s.metrics.upstreamError()
		ss.fatal("08006", "fenceproxy lost the upstream server during startup", "")
		up.Close()
		return
	}
	s.serveSession(ss, false)
}

// serveSession relays a started session to its end, registered for cancel requests and drains; reused says
// it runs on a kept upstream connection.
func (s *Server) serveSession(ss *session, reused bool) {
	s.register(ss)
	defer s.unregister(ss)
	s.metrics.sessionStarted()
	defer s.metrics.sessionEnded()
	ss.logConnected(reused)
	ss.relay()
	ss.logDisconnected()
}

// negotiate runs the startup phase up to the StartupMessage: SSLRequest, GSSENCRequest, direct TLS and
// CancelRequest. It returns the StartupMessage body (protocol version first) and the reader to go on with, or a
// nil body when the connection was a CancelRequest.
func (ss *session) negotiate(raw net.Conn) ([]byte, *bufio.Reader, error) {
	r := bufio.NewReaderSize(raw, readBufferSize)
	tlsCfg := ss.srv.clientTLS
	for attempt := 0; attempt < 4; attempt++ {
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
				ss.client, ss.clientTLS = tc, true
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
				if _, err := ss.client.Write([]byte{'N'}); err != nil {
					return nil, nil, err
				}
				continue
			}
			if _, err := ss.client.Write([]byte{'S'}); err != nil {
				return nil, nil, err
			}
			tc := tls.Server(ss.client, tlsCfg)
			if err := tc.Handshake(); err != nil {
				return nil, nil, fmt.Errorf("TLS handshake: %w", err)
			}
			ss.client, ss.clientTLS = tc, true
			r = bufio.NewReaderSize(tc, readBufferSize)
		case codeGSSENCRequest:
			if len(body) != 4 || r.Buffered() > 0 {
				return nil, nil, fmt.Errorf("%w: unexpected GSSENCRequest", errProtocol)
			}
			if _, err := ss.client.Write([]byte{'N'}); err != nil {
				return nil, nil, err
			}
		case codeCancelRequest:
			ss.srv.forwardCancel(body)
			return nil, nil, nil
		default:
			if major := code >> 16; major != 3 {
				return nil, nil, &startupError{code: "0A000", msg: fmt.Sprintf("unsupported frontend protocol %d.%d: fenceproxy supports 3.x", major, code&0xffff)}
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
	var se *startupError
	switch {
	case errors.As(err, &se):
		ss.fatal(se.code, se.msg, "")
	case errors.Is(err, errProtocol):
		ss.srv.metrics.protocolError()
		ss.log.Info("startup protocol violation", "err", err)
		ss.fatal("08P01", "invalid startup packet", err.Error())
	case isTimeout(err):
		ss.log.Info("startup timed out")
		ss.fatal("08006", "startup timed out", "")
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		// A client that connects and goes away (a port check, a libpq retry after 'N') is not worth a line.
	default:
		ss.log.Info("startup failed", "err", err)
	}
}

// fatal sends a FATAL ErrorResponse to the client, best effort, during startup or after the relay ended.
func (ss *session) fatal(code, msg, detail string) { ss.fatalHint(code, msg, detail, "") }

// fatalHint is fatal with a HINT.
func (ss *session) fatalHint(code, msg, detail, hint string) {
	ss.client.SetWriteDeadline(time.Now().Add(time.Second))
	b := errorResponse("FATAL", code, msg, detail, hint)
	if ss.cw != nil {
		ss.cw.Write(b)
		ss.cw.Flush()
		return
	}
	ss.client.Write(b)
}

// checkStartupToken validates a token given in the startup packet, as a parameter of its own or as -c in
// options, so that an invalid or forged token is refused before the session starts.
func (ss *session) checkStartupToken() (code, msg, hint string, ok bool) {
	setting := ss.srv.cfg.Token.Setting
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
		return rewrite.CodeInvalid, fmt.Sprintf("invalid fencing token: a token in the startup packet is session-level, and %s would stay on a pooled server connection for its next client", setting), ss.srv.scopeHint(), false
	}
	for _, v := range values {
		if code, msg, ok := ss.srv.checkToken(v); !ok {
			return code, msg, "", false
		}
	}
	return "", "", "", true
}

// errHandover ends clientToServer when the session moves to the event loop.
var errHandover = errors.New("session handed over to the event loop")

// errKeep ends clientToServer at a Terminate when the upstream connection is to be kept for reuse.
var errKeep = errors.New("client ended the session; keeping the upstream connection")

// relay runs both directions until the session ends and cleans up.
func (ss *session) relay() {
	if ss.ready.Load() && !ss.noLoop && ss.loopEligible() {
		// A session resumed on a kept connection is past startup already.
		if ss.runInLoop() {
			return
		}
		ss.noLoop = true
	}
	s2cDone := make(chan struct{})
	go func() {
		defer close(s2cDone)
		ss.serverToClient()
	}()
	err := ss.clientToServer()
	if errors.Is(err, errHandover) {
		<-s2cDone
		ss.handover.Store(false)
		ss.client.SetReadDeadline(time.Time{})
		if ss.runInLoop() {
			return
		}
		ss.noLoop = true
		ss.relay() // the loop could not take the sockets: go on here; nothing buffered was lost
		return
	}
	if err == errKeep {
		// serverToClient is between messages (the session is idle); stop it there.
		ss.stopping.Store(true)
		ss.keeping.Store(true)
		ss.upstream.SetReadDeadline(time.Now())
		<-s2cDone
		ss.outcome = ss.relayOutcome(err)
		ss.client.Close()
		if ss.parked.Load() && ss.sr.r.Buffered() == 0 {
			ss.upstream.SetReadDeadline(time.Time{})
			ss.keep(ss.upstream)
		} else {
			ss.upstream.Close()
		}
		return
	}
	var protoErr error
	switch {
	case err == nil: // Terminate was forwarded
	case errors.Is(err, errProtocol):
		protoErr = err
		ss.srv.metrics.protocolError()
		ss.log.Info("client protocol violation; closing", "err", err)
	case ss.upstreamGone.Load():
	default:
		// The client vanished. A query it left running would go on holding locks and a backend until it
		// tried to send its result, so cancel it.
		if ss.ready.Load() && (ss.pending.Load() > 0 || ss.unsynced.Load()) && ss.cancelKey != nil {
			ss.srv.cancelUpstream(ss.cancelKey)
		}
	}
	ss.stopping.Store(true)
	if !ss.upstreamGone.Load() && err != nil {
		ss.upstream.SetWriteDeadline(time.Now().Add(time.Second))
		ss.sw.Write([]byte{'X', 0, 0, 0, 4})
		ss.sw.Flush()
	}
	ss.upstream.Close()
	<-s2cDone
	ss.outcome = ss.relayOutcome(err)
	if protoErr != nil && !ss.clientFatal.Load() {
		ss.fatal("08P01", "invalid message from client", protoErr.Error())
	}
	ss.client.Close()
}

// clientToServer forwards client messages until Terminate (nil), an error, or the client's close.
func (ss *session) clientToServer() error {
	cr := &ss.cr
	for {
		if ss.handover.Load() {
			if err := ss.sw.Flush(); err != nil {
				return err
			}
			return errHandover
		}
		typ, _, err := cr.next()
		if err != nil {
			if ss.handover.Load() && isTimeout(err) {
				if err := ss.sw.Flush(); err != nil {
					return err
				}
				return errHandover
			}
			return err
		}
		switch typ {
		case 'Q':
			set := ss.readingSettings()
			ss.pending.Add(1)
			err = ss.handleQuery(set)
		case 'P':
			set := ss.readingSettings()
			ss.unsynced.Store(true)
			err = ss.handleParse(set)
		case 'S':
			ss.pending.Add(1)
			ss.unsynced.Store(false)
			err = cr.forward(ss.sw)
		case 'F':
			ss.pending.Add(1)
			err = ss.handleFunctionCall()
		case 'B', 'E', 'D', 'C', 'H':
			ss.unsynced.Store(true)
			err = cr.forward(ss.sw)
		case 'd', 'c', 'f', 'p':
			err = cr.forward(ss.sw)
		case 'X':
			if ss.mayKeep() {
				cr.discardHeader()
				return errKeep
			}
			// The server closes after Terminate; that close is not an upstream failure.
			ss.stopping.Store(true)
			if err = cr.forward(ss.sw); err == nil {
				err = ss.sw.Flush()
			}
			if err == nil {
				return nil
			}
		default:
			return fmt.Errorf("%w: unknown message type %q", errProtocol, typ)
		}
		if err != nil {
			return err
		}
		if !cr.nextBuffered() {
			ss.countRelayed(dirClientToServer, cr)
			if err := ss.sw.Flush(); err != nil {
				return err
			}
		}
	}
}

// serverToClient forwards server messages until the upstream closes or fails, or the session is drained.
func (ss *session) serverToClient() {
	sr := &ss.sr
	atBoundary := true
	var err error
	defer func() {
		if err == nil || ss.stopping.Load() {
			return
		}
		if ss.clientOut.failed.Load() {
			// The client went away while we wrote to it: the session ends from the client side, and
			// clientToServer cancels what the upstream is still running.
			ss.client.Close()
			return
		}
		ss.upstreamGone.Store(true)
		if !ss.clientFatal.Load() && atBoundary && !errors.Is(err, net.ErrClosed) {
			ss.srv.metrics.upstreamError()
			ss.log.Warn("upstream connection lost", "err", err)
			ss.clientFatal.Store(true)
			ss.client.SetWriteDeadline(time.Now().Add(time.Second))
			ss.cw.Write(errorResponse("FATAL", "08006", "fenceproxy lost the connection to the upstream server", err.Error(), ""))
			ss.cw.Flush()
		}
		// The upstream is gone (after its own FATAL, or without a word): so is the client's session, as when
		// connected directly.
		ss.client.Close()
	}()
	for {
		var typ byte
		typ, _, err = sr.next()
		if err != nil {
			if isTimeout(err) && ss.keeping.Load() {
				ss.parked.Store(true)
				err = nil
				return
			}
			if isTimeout(err) && ss.wake.Swap(false) {
				ss.upstream.SetReadDeadline(time.Time{})
				if ss.idle() {
					ss.drainClose()
					err = nil
					return
				}
				continue
			}
			if ss.srv.draining.Load() && errors.Is(err, net.ErrClosed) {
				err = nil // forceClose
			}
			return
		}
		atBoundary = false
		switch typ {
		case 'E':
			err = ss.handleError()
		case 'R':
			err = ss.handleAuth()
		case 'K':
			err = ss.handleBackendKey()
		case 'v':
			// NegotiateProtocolVersion: a reused connection could not show it again.
			ss.authAsked = true
			err = sr.forward(ss.cw)
		case 'S':
			err = ss.handleParameterStatus()
		case 'Z':
			var done bool
			done, err = ss.handleReady()
			if done {
				return
			}
		default:
			err = sr.forward(ss.cw)
		}
		if err != nil {
			return
		}
		atBoundary = true
		if !sr.nextBuffered() {
			ss.countRelayed(dirServerToClient, sr)
			if err = ss.cw.Flush(); err != nil {
				return
			}
			if ss.wantLoop {
				// Startup is over and everything is flushed: stop clientToServer and let relay hand over. This
				// is a message boundary, as keeping the connection needs if the client's Terminate came first.
				ss.wantLoop = false
				ss.parked.Store(true)
				ss.handover.Store(true)
				ss.client.SetReadDeadline(time.Now())
				return
			}
		}
	}
}

// idle reports whether the session is at a safe point to be closed by a drain.
func (ss *session) idle() bool {
	return ss.ready.Load() && ss.pending.Load() <= 0 && !ss.unsynced.Load() && ss.txIdle.Load()
}

// drainClose ends an idle session during shutdown, telling the client why as PostgreSQL does.
func (ss *session) drainClose() {
	ss.clientFatal.Store(true)
	ss.client.SetWriteDeadline(time.Now().Add(time.Second))
	ss.cw.Write(errorResponse("FATAL", "57P01", "terminating connection because fenceproxy is shutting down", "", ""))
	ss.cw.Flush()
	ss.client.Close()
}

// wakeForDrain makes the server-to-client loop look at the session now, in case it is already idle.
func (ss *session) wakeForDrain() {
	if !ss.ready.Load() || ss.upstream == nil {
		return // it will look at its first ReadyForQuery
	}
	ss.evMu.Lock()
	es := ss.ev
	ss.evMu.Unlock()
	if es != nil {
		es.loop.post(evCmd{es: es, drain: true})
		return
	}
	ss.wake.Store(true)
	ss.upstream.SetReadDeadline(time.Now())
}

// forceClose closes both connections; both loops then end.
func (ss *session) forceClose() {
	ss.evMu.Lock()
	ss.closed = true
	if ss.ev != nil {
		ss.ev.shutdownSockets()
	}
	ss.evMu.Unlock()
	ss.closeOnce.Do(func() {
		ss.client.Close()
		if ss.upstream != nil {
			ss.upstream.Close()
		}
	})
}

// handleReady forwards ReadyForQuery and keeps the session's idle state. It reports done when a drain closed
// the session.
func (ss *session) handleReady() (bool, error) {
	sr := &ss.sr
	if sr.n != 1 {
		return false, fmt.Errorf("upstream sent ReadyForQuery of %d bytes", sr.n)
	}
	hdr := sr.header()
	var msg [6]byte
	copy(msg[:], hdr)
	sr.discardHeader()
	status, err := sr.r.ReadByte()
	if err != nil {
		return false, err
	}
	msg[5] = status
	if !ss.ready.Load() {
		// Startup and authentication are over: lift the startup deadlines.
		ss.client.SetDeadline(time.Time{})
		ss.upstream.SetDeadline(time.Time{})
		// Before ready is published: mayKeep, on the other goroutine, reads reusable only after ready.
		ss.reusable = ss.srv.pool != nil && !ss.authAsked
		ss.ready.Store(true)
		ss.wantLoop = ss.loopEligible()
	} else if ss.pending.Add(-1) < 0 {
		ss.pending.Store(0)
	}
	ss.txIdle.Store(status == 'I')
	if _, err := ss.cw.Write(msg[:]); err != nil {
		return false, err
	}
	if ss.srv.draining.Load() && ss.idle() {
		ss.cw.Flush()
		ss.drainClose()
		return true, nil
	}
	return false, nil
}

// handleBackendKey records the upstream backend's PID and key. The client gets the PID unchanged, so that
// pg_backend_pid(), notifications and the driver agree and a CancelRequest can be routed by PID, and a secret
// of the proxy's own (see reuse.go).
func (ss *session) handleBackendKey() error {
	body, err := ss.sr.body()
	if err != nil {
		return err
	}
	if len(body) < 8 {
		return fmt.Errorf("upstream sent a BackendKeyData of %d bytes", len(body))
	}
	ss.cancelKey = append([]byte(nil), body...)
	ss.newClientKey()
	ss.srv.registerPID(ss, binary.BigEndian.Uint32(body))
	ss.sout = appendMessage(ss.sout[:0], 'K', ss.clientKey)
	_, err = ss.cw.Write(ss.sout)
	return err
}

// handleParameterStatus forwards ParameterStatus and keeps application_name for the logs.
func (ss *session) handleParameterStatus() error {
	body, err := ss.sr.body()
	if err != nil {
		return err
	}
	return ss.paramStatusOut(ss.cw, body)
}

// paramStatusOut writes the ParameterStatus whose body is given to w, noting its value.
func (ss *session) paramStatusOut(w io.Writer, body []byte) error {
	ss.noteParam(body)
	ss.sout = appendMessage(ss.sout[:0], 'S', body)
	_, err := w.Write(ss.sout)
	return err
}

// noteParam records a ParameterStatus value (and application_name for the logs); false if body is malformed.
func (ss *session) noteParam(body []byte) bool {
	k, rest, ok := cutNul(body)
	if !ok {
		return false
	}
	v, _, ok := cutNul(rest)
	if !ok {
		return false
	}
	if string(k) == "application_name" {
		app := string(v)
		ss.appName.Store(&app)
	}
	ss.serverParams = setParam(ss.serverParams, string(k), string(v))
	ss.reading.note(string(k), string(v))
	return true
}

// handleAuth forwards authentication requests. When the client reached the proxy over TLS, the proxy removes
// SCRAM-SHA-256-PLUS from the offered mechanisms: channel binding ties the exchange to the TLS connection the
// server sees, which is the proxy's, not the client's, so it could never succeed through a TLS-terminating proxy.
func (ss *session) handleAuth() error {
	body, err := ss.sr.body()
	if err != nil {
		return err
	}
	if len(body) < 4 || binary.BigEndian.Uint32(body) != 0 { // anything but AuthenticationOk
		ss.authAsked = true
	}
	if ss.clientTLS && len(body) >= 4 && binary.BigEndian.Uint32(body) == 10 { // AuthenticationSASL
		var kept []byte
		kept = append(kept, body[:4]...)
		rest := body[4:]
		for len(rest) > 0 && rest[0] != 0 {
			mech, after, ok := cutNul(rest)
			if !ok {
				break
			}
			if string(mech) != "SCRAM-SHA-256-PLUS" {
				kept = append(append(kept, mech...), 0)
			}
			rest = after
		}
		kept = append(kept, 0)
		body = kept
	}
	ss.sout = appendMessage(ss.sout[:0], 'R', body)
	_, err = ss.cw.Write(ss.sout)
	return err
}

// failWriter remembers that a write to the connection failed, so that the server-to-client loop can tell a
// client that went away from an upstream that did.
type failWriter struct {
	net.Conn
	failed atomic.Bool
}

func (w *failWriter) Write(p []byte) (int, error) {
	n, err := w.Conn.Write(p)
	if err != nil {
		w.failed.Store(true)
	}
	return n, err
}
