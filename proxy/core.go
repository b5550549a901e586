package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// The session core: every protocol rule the proxy applies to a relayed session, in one place, for both
// transports. A transport frames messages (wire.go: parseHeader) and calls
//
//   - onClientMsg for each message from the client and onServerMsg for each message from the server, in order;
//   - with the whole body when clientNeedsBody / serverNeedsBody say the core reads that message type: the core
//     then appends what goes to the other side in its place to out (the message itself, rewritten, or refused);
//   - with a nil body otherwise: the core only keeps its state, and the transport forwards the message's bytes
//     unchanged (streaming them, however long) after the call.
//
// Which rule lives where: fencing of Query and Parse (fence.go: queryOut, parseOut, checkPlan), refusal of a
// FunctionCall of set_config (scope.go: functionCallOut), error translation (fence.go: errorOut), the SASL
// mechanism filter, BackendKeyData, ParameterStatus and ReadyForQuery (below), what the server's reported
// settings mean for reading SQL (reading.go), and how a session ends (end.go).

// protoState is a session's protocol state, kept by the core from the messages both ways.
//
// Concurrency: with the event loop one goroutine runs the whole core. With the goroutine transport the client
// side (the session goroutine) writes pending (up), unsynced and internal (up, before it sends the proxy's own
// command: prepared.go sendQueued); the server side writes pending (down), internal (down, at the answer's
// ReadyForQuery: onPreparedAnswer), ready, txStatus and every plain field. Each side reads the other's fields only through the atomics; the plain fields
// are read by the client side only after ready is published (reusable) or after the server side ended
// (serverParams, serverFatal, at the session's end).
type protoState struct {
	ready    atomic.Bool   // the first ReadyForQuery was seen: startup and authentication are over
	pending  atomic.Int64  // Query, Sync and FunctionCall messages not yet answered by ReadyForQuery
	unsynced atomic.Bool   // extended-protocol messages forwarded since the last Sync
	txStatus atomic.Uint32 // the last ReadyForQuery's status byte (txIdle, txBlock, txFailed); txUnknown before
	internal atomic.Int64  // Query messages of the proxy's own (prepared.go) not yet answered by ReadyForQuery
	// owed: a client's cancel came while those ran before its statement (cancelAfterOwn); the last of their
	// answers takes it and sends it (onPreparedAnswer: takeOwedCancel). cancelEnded: the session has ended
	// (unregister), a cancel is no longer deferred or sent. Both under cancelMu. Session mode: a pooled
	// session defers its own (cancelPooled).
	cancelMu    sync.Mutex
	owed        *owedCancel
	cancelEnded bool

	authAsked   bool // the server asked for something during startup: never reuse the connection
	reusable    bool // the connection may be kept for another session; set before ready is published
	serverFatal bool // the server sent a FATAL or PANIC error: the client knows why the session ends
	// sharedParams: serverParams is a list other sessions hold too (a pooled client's, txPool.clientParams),
	// which noteParamValue copies before it changes a value.
	sharedParams bool
	serverParams []paramStatus // ParameterStatus values as the server reported them (reuse.go)
	reading      serverReading // client_encoding, server_encoding, standard_conforming_strings (reading.go)
}

// answered counts n of the client's Query, Sync and FunctionCall messages as answered (or, inside a COPY's data,
// ignored by the server): pending never goes below zero.
func (st *protoState) answered(n int64) {
	if st.pending.Add(-n) < 0 {
		st.pending.Store(0)
	}
}

// inTx reports whether the last ReadyForQuery said the session is inside a transaction block.
func (st *protoState) inTx() bool {
	s := byte(st.txStatus.Load())
	return s == txBlock || s == txFailed
}

// idle reports whether the session is at a safe point to be closed by a drain or to have its upstream kept:
// startup is over, everything the client sent is answered, and no transaction block is open.
func (st *protoState) idle() bool {
	return st.ready.Load() && st.pending.Load() <= 0 && st.internal.Load() <= 0 && !st.unsynced.Load() &&
		byte(st.txStatus.Load()) == txIdle
}

// running reports whether the upstream may be running something for the client (for the cancel at a client's
// loss).
func (st *protoState) running() bool {
	return st.ready.Load() && (st.pending.Load() > 0 || st.unsynced.Load())
}

// answersInFlight reports whether the server may still owe answers to what was sent to it (the client's
// statements or the proxy's own): closing the connection now would cut them (end.go).
func (st *protoState) answersInFlight() bool {
	return st.running() || st.internal.Load() > 0
}

// errTerminated is onClientMsg's answer to a Terminate: the client ends the session. The Terminate is not
// forwarded; the session's end decides between sending it upstream and keeping the connection.
var errTerminated = errors.New("client sent Terminate")

// clientNeedsBody reports whether onClientMsg reads the body of a client message of type typ, with p the
// session's planner (nil: no fencing).
func (ss *session) clientNeedsBody(typ byte, p Planner) bool {
	switch typ {
	case msgQuery, msgParse:
		return p != nil
	case msgClose:
		return p != nil && ss.prep.max > 0 // a Close of a statement may drop one of the proxy's (prepared.go)
	case msgFunctionCall:
		return ss.srv.fastpathGuarded()
	case msgBind:
		return ss.keptNeedsBind() // reloadkept.go
	}
	return false
}

// onClientMsg applies the protocol rules to one message from the client (see the top of this file). p is the
// planner to use for Query and Parse.
func (ss *session) onClientMsg(typ byte, body []byte, p Planner, out msgSink) error {
	st := &ss.state
	if err := ss.fencedTxRefused(typ); err != nil { // fence.go
		return err
	}
	if err := ss.unplannedWriteRefused(typ, body); err != nil { // unplanned.go
		return err
	}
	if ss.portalGen != 0 && st.idle() {
		ss.portalsGone() // reloadkept.go: no portal outlives a transaction
	}
	switch typ {
	case msgQuery:
		if body == nil {
			// Not fenced (no planner now, after a reload): another unit all the same (positions.go).
			ss.positionsOther(st.quiet())
			st.pending.Add(1)
			return nil
		}
		set := ss.readingSettings() // before this message counts as pending
		idle, quiet := st.idle(), st.quiet()
		// Counted before anything is written: the proxy's own commands may reach the server (a full buffer
		// flushes) and be answered before this returns, and the session must not look idle then (a drain).
		st.pending.Add(1)
		if idle && !ss.sqlOnly {
			ss.prep.sendQueued(out, st, body) // prepared.go: the proxy's own commands go out only when idle
		}
		err := ss.queryOut(out, p, body, set, quiet)
		ss.prep.clientRan(typ, body) // after: the Query's own statement may still be sent as EXECUTE
		return err
	case msgParse:
		if body == nil {
			ss.positionsOther(st.quiet())
			st.unsynced.Store(true)
			return nil
		}
		set := ss.readingSettings()
		quiet := st.quiet()
		st.unsynced.Store(true)
		ss.prep.clientRan(typ, body)
		return ss.parseOut(out, p, body, set, quiet)
	case msgSync:
		if !st.unsynced.Load() {
			ss.positionsOther(st.quiet()) // positions.go
		}
		st.pending.Add(1)
		st.unsynced.Store(false)
	case msgFunctionCall:
		ss.positionsOther(st.quiet())
		st.pending.Add(1)
		ss.prep.clientRan(typ, body)
		if body != nil {
			return ss.functionCallOut(out, body)
		}
	case msgClose:
		if !st.unsynced.Load() {
			ss.positionsOther(st.quiet())
		}
		st.unsynced.Store(true)
		if body != nil {
			ss.prep.clientClose(body)
			ss.forgetStmt(body)
			writeMsg(out, msgClose, body, "")
		}
	case msgBind, msgExecute, msgDescribe:
		if !st.unsynced.Load() {
			ss.positionsOther(st.quiet())
		}
		st.unsynced.Store(true)
		if typ == msgExecute {
			// The proxy does not follow a portal to its statement: an Execute may run the fenced one kept, and
			// is judged (and the transaction noted) as such.
			if err := ss.keptFencedRefused(); err != nil {
				return err
			}
			if err := ss.portalsCurrent(); err != nil { // reloadkept.go
				return err
			}
		}
		if typ == msgBind {
			gen := ss.srv.plannerNow().gen                    // read before the judgement: a reload meanwhile makes it older, not newer
			if err := ss.keptStmtsCurrent(body); err != nil { // reloadkept.go
				return err
			}
			ss.bound(gen)
			if body != nil { // read for keptStmtsCurrent (clientNeedsBody): the transport sends nothing of it
				writeMsg(out, msgBind, body, "")
			}
		}
		if typ != msgDescribe {
			ss.prep.clientRan(typ, body)
		}
	case msgFlush:
		st.unsynced.Store(true)
	case msgTerminate:
		return errTerminated
	default:
		// The COPY messages pass as they are (their rules are the server's), and so does a PasswordMessage: a
		// passthrough login relays its exchange through here, and after the login the server ends the session
		// at one (08P01).
		if typ != msgPassword && !frontendType(typ) { // protocol.go
			return fmt.Errorf("%w: unknown message type %q", errProtocol, typ)
		}
	}
	return nil
}

// planText returns the SQL text of a Query or Parse body, as the planner reads it; false when the body is
// malformed (onClientMsg then reports the protocol error).
func planText(typ byte, body []byte) ([]byte, bool) {
	switch typ {
	case msgQuery:
		// One string, ended by the body's only zero byte: PostgreSQL refuses a Query with anything after the
		// string's end (invalid message format), and the planner's shape keys use zero bytes as delimiters.
		if len(body) == 0 || bytes.IndexByte(body, 0) != len(body)-1 {
			return nil, false
		}
		return body[:len(body)-1], true
	case msgParse:
		_, rest, ok := cutNul(body)
		if !ok {
			return nil, false
		}
		query, _, ok := cutNul(rest)
		return query, ok
	}
	return nil, false
}

// serverEvent is what onServerMsg tells the transport beyond the bytes to send.
type serverEvent uint8

const (
	// evStartupOver: this was the first ReadyForQuery; startup and authentication are over.
	evStartupOver serverEvent = 1 << iota
	// evDrainNow: the proxy is draining and the session just became idle: end it (after sending out).
	evDrainNow
)

// serverNeedsBody reports whether onServerMsg reads the body of a server message of type typ: the types it
// reads, and every message while the server answers a command of the proxy's own (prepared.go), which is not
// relayed.
func (ss *session) serverNeedsBody(typ byte) bool {
	if ss.state.internal.Load() > 0 {
		return true
	}
	switch typ {
	case msgErrorResponse, msgAuthentication, msgBackendKeyData, msgParameterStatus, msgReadyForQuery:
		return true
	case msgNoticeResponse:
		return ss.positions.Load() != nil // its position may count in a rewritten text (positions.go)
	}
	return false
}

// onServerMsg applies the protocol rules to one message from the server (see the top of this file).
func (ss *session) onServerMsg(typ byte, body []byte, out msgSink) (serverEvent, error) {
	if body == nil {
		if typ == msgNegotiateProtocolVersion {
			ss.state.authAsked = true // a reused connection could not show it again
		}
		return 0, nil
	}
	if ss.state.internal.Load() > 0 && typ != msgNotificationResponse && typ != msgParameterStatus {
		return ss.onPreparedAnswer(ss.prep, typ, body, out)
	}
	switch typ {
	case msgErrorResponse:
		return 0, ss.errorOut(out, ss.clientPositions(body))
	case msgNoticeResponse:
		writeMsg(out, typ, ss.clientPositions(body), "")
		return 0, nil
	case msgAuthentication:
		return 0, ss.authOut(out, body)
	case msgBackendKeyData:
		return 0, ss.backendKeyOut(out, body)
	case msgParameterStatus:
		return 0, ss.paramStatusOut(out, body)
	case msgReadyForQuery:
		return ss.readyOut(out, body)
	}
	writeMsg(out, typ, body, "")
	return 0, nil
}

// readyOut forwards ReadyForQuery and keeps the session's idle state.
func (ss *session) readyOut(out msgSink, body []byte) (serverEvent, error) {
	st := &ss.state
	if len(body) != 1 {
		return 0, fmt.Errorf("upstream sent ReadyForQuery of %d bytes", len(body))
	}
	var ev serverEvent
	if !st.ready.Load() {
		// Before ready is published: mayKeep, on the client side, reads reusable only after ready.
		st.reusable = ss.srv.pool != nil && !st.authAsked
		st.txStatus.Store(uint32(body[0]))
		st.ready.Store(true)
		ev |= evStartupOver
	} else {
		// txStatus before pending: a client side that sees nothing pending must see this status too (idle()),
		// or it could take an open transaction block for an idle session.
		st.txStatus.Store(uint32(body[0]))
		ss.positionsAnswered() // positions.go
		st.answered(1)
	}
	writeMsg(out, msgReadyForQuery, body, "")
	if ss.srv.draining.Load() && st.idle() {
		ev |= evDrainNow
	}
	return ev, nil
}

// backendKeyOut records the upstream backend's PID and key. The client gets the PID unchanged, so that
// pg_backend_pid(), notifications and the driver agree, and a secret of the proxy's own as long as the
// backend's (registerKey; see reuse.go): its CancelRequest is routed by that whole key.
func (ss *session) backendKeyOut(out msgSink, body []byte) error {
	if len(body) < 8 {
		return fmt.Errorf("upstream sent a BackendKeyData of %d bytes", len(body))
	}
	ss.cancelKey = append([]byte(nil), body...)
	ss.srv.registerKey(ss, binary.BigEndian.Uint32(body), len(body)-4)
	writeMsg(out, msgBackendKeyData, ss.clientKey, "")
	return nil
}

// paramStatusOut forwards a ParameterStatus, noting its value.
func (ss *session) paramStatusOut(out msgSink, body []byte) error {
	ss.noteParam(body)
	writeMsg(out, msgParameterStatus, body, "")
	return nil
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
	ss.noteParamValue(string(k), string(v))
	return true
}

// noteParamValue is noteParam of a ParameterStatus already read into its name and value.
func (ss *session) noteParamValue(name, value string) {
	if name == "application_name" {
		app := value // a copy of its own: the address of value itself would move it to the heap for every name
		ss.appName.Store(&app)
	}
	if ss.srv.router != nil {
		ss.srv.router.observe(ss.host.addr, name, value)
	}
	if ss.state.sharedParams {
		if i := slices.IndexFunc(ss.state.serverParams, func(p paramStatus) bool { return p.name == name }); i >= 0 && ss.state.serverParams[i].value == value {
			ss.state.reading.note(name, value)
			return
		}
		ss.state.serverParams = slices.Grow(slices.Clone(ss.state.serverParams), 1)
		ss.state.sharedParams = false
	}
	ss.state.serverParams = setParam(ss.state.serverParams, name, value)
	ss.state.reading.note(name, value)
}

// authOut forwards authentication requests. When the client reached the proxy over TLS, the proxy removes
// SCRAM-SHA-256-PLUS from the offered mechanisms: channel binding ties the exchange to the TLS connection the
// server sees, which is the proxy's, not the client's, so it could never succeed through a TLS-terminating proxy.
func (ss *session) authOut(out msgSink, body []byte) error {
	if len(body) < 4 || binary.BigEndian.Uint32(body) != authOK {
		ss.state.authAsked = true
	}
	if ss.clientTLS && len(body) >= 4 && binary.BigEndian.Uint32(body) == authSASL {
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
	writeMsg(out, msgAuthentication, body, "")
	return nil
}

// readingSettings are the settings under which the server will read the next client message.
func (ss *session) readingSettings() rewrite.Settings {
	return ss.state.reading.settings(ss.state.pending.Load() > 0 || ss.state.unsynced.Load())
}
