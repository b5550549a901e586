package proxy

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// How a session ends, for both transports: the transport says why (an ending) and gives access to its
// connections (sessionIO); end does the rest, once: the outcome for the log line, the metrics, cancelling a
// query the vanished client left running, the farewell messages, Terminate to the upstream or keeping the
// upstream connection for reuse (reuse.go), and closing.

// endReason is why a transport stopped relaying a session.
type endReason uint8

const (
	endNone         endReason = iota // not ended (a side stopped because the other one ended)
	endTerminate                     // the client sent Terminate
	endProtocol                      // the client broke the protocol
	endClientGone                    // the client's connection closed or failed
	endUpstreamGone                  // the upstream connection closed or failed
	endDrained                       // a drain closed the idle session
	endRelayFailed                   // the transport itself failed (an epoll error)
	endHandover                      // goroutine transport only: the session moves to the event loop
	endRefused                       // the proxy refused a client's message by ending the session (sessionRefused)
	endParked                        // transaction mode: not an end; the idle session parks (park_linux.go)
)

// ending is how a transport stopped relaying a session.
type ending struct {
	why endReason
	err error
	// atBoundary: the upstream side stopped between two messages (a farewell may be sent to the client without
	// cutting into a message; the connection may be kept).
	atBoundary bool
}

// sessionIO is what end needs of the transport that relayed the session. The writes are best effort, bounded
// by farewellTimeout, and first send what the transport still holds for that side.
type sessionIO interface {
	forced() bool // forceClose ran: the sockets are shut, write nothing
	sendUpstream(b []byte)
	sendClient(b []byte)
	// lingerClient shuts the client connection's sending side and reads and discards what the client still
	// sends until it closes or deadline passes (see lingerTimeout).
	lingerClient(deadline time.Time)
	// drainUpstream reads and discards what the upstream still sends until it closes (true) or deadline
	// passes or reading fails (false).
	drainUpstream(deadline time.Time) bool
	// finishClientMessage sends the client the rest of the server's message the relay stopped inside of, if
	// any, reading it from the upstream until deadline; false when it could not: the client's stream is then
	// inside a message, and nothing more may go on it.
	finishClientMessage(deadline time.Time) bool
	keepable() bool                  // nothing unread from or unsent to the upstream
	takeUpstream() (net.Conn, error) // the upstream connection, out of the transport, for reuse
	close()                          // close what the transport still holds
}

// farewellTimeout bounds each write a session makes on its way out.
const farewellTimeout = time.Second

// lingerTimeout bounds how long a session the proxy ends (with a farewell FATAL) waits for the client to close
// its side. Closing a socket that still has unread input makes the kernel send a reset, and a reset throws
// away what is still queued to the client: the end of its last answer and the FATAL saying why. A client that
// pipelined its next statement while reading a long answer is exactly that case. So the proxy shuts its
// sending side (the client reads everything, then end of file), discards what the client sends meanwhile, and
// closes when the client has closed.
const lingerTimeout = 2 * time.Second

// terminateDrainTimeout bounds how long a session that ends with the client's Terminate waits, after passing the
// Terminate on, for the server to answer what the client sent before it and close. A direct connection runs
// all of it (PostgreSQL reads the Terminate only after the statements before it); the proxy must not close its
// end sooner: closing a socket with the server's answers unread makes the kernel reset the connection, and
// the server, failing to send its next answer, ends the backend without running the statements it has not
// reached. Beyond this bound the session ends as for a client gone (its running statement is cancelled).
const terminateDrainTimeout = 30 * time.Second

// terminateMsg is the Terminate message.
var terminateMsg = []byte{msgTerminate, 0, 0, 0, 4}

// end ends a session that a transport stopped relaying.
func (ss *session) end(e ending, tio sessionIO) {
	st := &ss.state
	forced := tio.forced()
	ss.outcome = ss.outcomeOf(e, forced)
	var farewell []byte
	drain := false // wait for the server to answer and close after the Terminate
	switch e.why {
	case endProtocol:
		ss.srv.metrics.protocolError()
		ss.logger().Info("client protocol violation; closing", "err", e.err)
		if !st.serverFatal {
			farewell = errorResponse("FATAL", sqlstateProtocolViolation, "invalid message from client", e.err.Error(), "")
		}
	case endUpstreamGone:
		if !forced && e.atBoundary && !st.serverFatal && !errors.Is(e.err, net.ErrClosed) {
			ss.srv.metrics.upstreamError()
			farewell = ss.upstreamLostFarewell(e.err)
		}
	case endDrained:
		farewell = errorResponse("FATAL", sqlstateAdminShutdown, "terminating connection because fenceproxy is shutting down", "", "")
	case endRefused:
		ss.logger().Warn("session refused; closing", "err", e.err)
		ss.cancelIfRunning()
		if !st.serverFatal {
			farewell = refusedFarewell(e.err)
		}
	case endRelayFailed:
		ss.logger().Warn("relay failed; closing the session", "err", e.err)
		ss.cancelIfRunning()
		if !st.serverFatal {
			farewell = errorResponse("FATAL", sqlstateConnectionFailure, "fenceproxy could not relay the session", e.err.Error(), "")
		}
	case endClientGone:
		// A query the client left running would go on holding locks and a backend until it tried to send
		// its result, so cancel it.
		ss.cancelIfRunning()
	case endTerminate:
		if !forced && e.atBoundary && ss.mayKeep() && tio.keepable() {
			up, err := tio.takeUpstream()
			tio.close()
			if err != nil {
				ss.logger().Debug("upstream connection not kept", "err", err)
				return
			}
			ss.keep(up)
			return
		}
		// Everything the client sent before its Terminate must run, as on a direct connection: pass the
		// Terminate on after it, and close only when the server has answered all of it and closed.
		drain = st.answersInFlight()
	}
	if !forced {
		// What the client gets last ends at a message boundary: a session that ends while a long message streams
		// to the client (a Terminate, a protocol violation, behind it) sends the rest of that message first, as
		// the drain below discards what the server sends, and a farewell inside a message would be read as its
		// bytes. Sending only the part the relay held left the client with a message cut short.
		whole := e.why == endClientGone || tio.finishClientMessage(time.Now().Add(terminateDrainTimeout))
		if e.why != endUpstreamGone {
			tio.sendUpstream(terminateMsg)
			// Cut short (the bound, a failure, or forceClose, which reads as end of file in the loop): the
			// statement still running goes on holding a backend and its locks, so cancel it.
			if drain && (!tio.drainUpstream(time.Now().Add(terminateDrainTimeout)) || tio.forced()) {
				ss.cancelIfRunning()
			}
		}
		if e.why != endClientGone && whole {
			tio.sendClient(farewell) // also what the transport still holds for the client
			if farewell != nil {
				tio.lingerClient(time.Now().Add(lingerTimeout))
			}
		}
	}
	tio.close()
}

// upstreamLostFarewell is the FATAL a client gets when its upstream connection was lost or cut (a change of
// primary). A statement whose answer was lost may have committed (a COMMIT, or a statement in an implicit
// transaction) or not: the proxy never replays it, and says the outcome is unknown (08007) unless the
// transaction was already failed. Otherwise a session cut because its host stopped being the primary ends with
// 57P01 naming the new primary, as PostgreSQL ends sessions at a shutdown.
func (ss *session) upstreamLostFarewell(err error) []byte {
	st := &ss.state
	moved := ss.movedTo.Load()
	ss.logger().Warn("upstream connection lost", "host", ss.host.addr, "err", err, "primary_moved", moved != nil)
	if ended := ss.fencedTxEnded.Load(); ended != nil {
		return fencedTxFarewell(ended[0], ended[1], st.pending.Load() > 0 && !ss.endedUncommitted.Load()).farewell()
	}
	if st.pending.Load() > 0 && byte(st.txStatus.Load()) != txFailed {
		return errorResponse("FATAL", sqlstateTransactionResolutionUnknown,
			"fenceproxy lost the connection to the upstream server while a statement was running: whether its transaction committed is unknown",
			fmt.Sprintf("upstream %s: %v", ss.host.addr, err), "Check whether the transaction's changes are there before doing it again.")
	}
	if moved != nil {
		now := *moved
		if now == "" {
			now = "not known yet"
		}
		return errorResponse("FATAL", sqlstateAdminShutdown,
			fmt.Sprintf("terminating connection because the primary moved from %s to %s", ss.host.addr, now), "", "Connect again: fenceproxy sends new sessions to the new primary.")
	}
	if ss.srv.router != nil {
		// One of upstream.hosts was lost between statements: as for a server shut down, the client may connect
		// again, and the router sends it where upstream.target says.
		return errorResponse("FATAL", sqlstateAdminShutdown,
			fmt.Sprintf("terminating connection because fenceproxy lost the upstream host %s", ss.host.addr), err.Error(), "Connect again: fenceproxy sends new sessions to the current primary.")
	}
	return errorResponse("FATAL", sqlstateConnectionFailure, "fenceproxy lost the connection to the upstream server", err.Error(), "")
}

// endForFailover ends the session from the upstream side because its host stopped being what it was dialled
// for; now is the new primary ("" when none yet). Nothing more of the session reaches that host: its
// connection is shut, and the session ends as for a lost upstream (upstreamLostFarewell).
func (ss *session) endForFailover(now string) {
	ss.movedTo.Store(&now)
	ss.shutUpstream()
}

// endFencedTx ends the session from the upstream side because its transaction wrote table (fencedTxOut) and
// the router refuses fenced writes on its host now (why); the client's farewell says so (upstreamLostFarewell:
// fencedTxFarewell). What the server may still be running for the session is cancelled first: closing the
// connection alone does not stop a backend that waits (for a lock, say) from running, once it may, a COMMIT
// already in its socket, and committing there; cancelled, the statement fails and the transaction with it.
// A COMMIT already running may still commit: the client is told 08007 then, not that it committed.
// The connection is shut first, the cancel sent after: nothing of the session reaches the server after the
// shut, so what the cancel is for is there before it. PostgreSQL drops a cancel that finds the backend idle,
// so a cancel sent first would miss a write the session flushed between it and the shut (a fenced write judged
// just before the router's change), which would then wait for its lock there and commit once it may. A
// write sent just before the shut that the backend has not read yet when the cancel arrives escapes the cancel
// (PostgreSQL ignores one that finds the backend waiting for a command), so the backend is also terminated
// over the router's own connection (terminateStopped, endterminate.go; not waited for: the host may hang).
// running is read before the shut, which starts the session's end; a session in one was counted pending
// before its write was judged (core.go).
func (ss *session) endFencedTx(why, table string) {
	ss.fencedTxEnded.Store(&[2]string{why, table})
	running := ss.state.running()
	port := localPort(ss.upstream)
	ss.shutUpstream()
	if ss.srv.fencedShut != nil {
		ss.srv.fencedShut()
	}
	if running && ss.cancelKey != nil {
		ss.cancelBackend()
		// Under cancelGate, as a cancel: a backend the session gave up to another (keep) is not terminated.
		if pid, ok := ss.backendPID(); ok && ss.srv.router != nil && ss.cancelGate.TryRLock() {
			go func() {
				defer ss.cancelGate.RUnlock()
				ss.srv.terminateStopped(ss.host.addr, pid, port)
			}()
		}
	}
}

// shutUpstream shuts the session's upstream connection: nothing more of the session reaches the server, and the
// server side of the transport ends the session when it reads the end.
func (ss *session) shutUpstream() {
	ss.evMu.Lock()
	defer ss.evMu.Unlock()
	if ss.ev != nil {
		ss.ev.shutdownUpstream()
		return
	}
	if ss.upstream != nil {
		shutdownConn(ss.upstream)
	}
}

// refusedFarewell is the FATAL of a session ended with err (a sessionRefused).
func refusedFarewell(err error) []byte {
	var r *sessionRefused
	if errors.As(err, &r) {
		return r.farewell()
	}
	return errorResponse("FATAL", sqlstateConnectionFailure, "fenceproxy ended the session", err.Error(), "")
}

// cancelIfRunning cancels what the upstream may still be running for the client.
func (ss *session) cancelIfRunning() {
	if ss.state.running() && ss.cancelKey != nil {
		ss.cancelBackend()
	}
}

// outcomeOf says how a session ended, for the "connection ended" line.
func (ss *session) outcomeOf(e ending, forced bool) string {
	switch {
	case forced:
		return outcomeShutdown
	case e.why == endTerminate:
		return outcomeTerminated
	case e.why == endProtocol:
		return outcomeProtocol
	case e.why == endRefused:
		return outcomeRefused
	case e.why == endDrained:
		return outcomeShutdown
	case e.why == endUpstreamGone:
		return outcomeServerClosed
	case e.why == endRelayFailed:
		return outcomeRelayFailed
	case ss.srv.draining.Load():
		return outcomeShutdown
	default:
		return outcomeClientGone
	}
}

// shutdownConn shuts both directions of c's socket without closing it: its readers see end of file, and the
// transport ends the session the usual way.
func shutdownConn(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		c.Close()
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		c.Close()
		return
	}
	rc.Control(func(fd uintptr) { syscall.Shutdown(int(fd), syscall.SHUT_RDWR) })
}
