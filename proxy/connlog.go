package proxy

import (
	"context"
	"log/slog"
	"time"

	"github.com/fenceproxy/fenceproxy/config"
)

// The per-connection log lines (log.connections): one when a session starts relaying, one when it ends. They
// carry what an operator asks about a connection (who, from where, to which database, how long, how much, how
// it ended) and nothing a client sent as a secret: the startup parameters named here and counts, never message
// contents (passwords travel in PasswordMessage and SASL messages, which are only relayed).

// How a session ended, for the "connection ended" line.
const (
	outcomeTerminated   = "client terminated"     // the client sent Terminate
	outcomeClientGone   = "client disconnected"   // the client's connection closed without Terminate
	outcomeServerClosed = "server closed"         // PostgreSQL ended the session (after its own FATAL, or silently)
	outcomeProtocol     = "protocol error"        // the client broke the wire protocol (08P01)
	outcomeShutdown     = "proxy shutting down"   // closed by a drain (57P01) or at its timeout
	outcomeStartup      = "closed during startup" // ended before the first ReadyForQuery (authentication, ...)
	outcomeRelayFailed  = "relay failed"          // the event loop could not relay it (an epoll error)
	outcomeRefused      = "refused"               // the proxy ended it to refuse a message (sessionRefused)
)

// connLogLevel is the level of the per-connection lines, and false when they are off.
func (s *Server) connLogLevel() (slog.Level, bool) {
	switch s.cfg.Log.Connections {
	case config.LogConnectionsOff:
		return 0, false
	case config.LogConnectionsDebug:
		return slog.LevelDebug, true
	default:
		return slog.LevelInfo, true
	}
}

// logConnected writes the "connection started" line when a session begins relaying (on a new upstream
// connection, or on a kept one when reused).
func (ss *session) logConnected(reused bool) {
	ss.started = time.Now()
	level, on := ss.srv.connLogLevel()
	if !on {
		return
	}
	ss.logConnLine(level, "connection started",
		slog.String("application_name", ss.params["application_name"]), slog.Bool("reused_upstream", reused))
}

// logDisconnected writes the "connection ended" line; relay has returned, so both directions are done.
func (ss *session) logDisconnected() {
	level, on := ss.srv.connLogLevel()
	if !on {
		return
	}
	outcome := ss.outcome
	if !ss.state.ready.Load() && outcome != outcomeShutdown && outcome != outcomeProtocol {
		outcome = outcomeStartup
	}
	// What the readers counted after their last report is part of the session too (a final Terminate).
	in := ss.relayed[dirClientToServer] + ss.cr.bytes
	out := ss.relayed[dirServerToClient] + ss.sr.bytes
	ss.logConnLine(level, "connection ended",
		slog.String("application_name", *ss.appName.Load()),
		slog.String("duration", time.Since(ss.started).Round(time.Microsecond).String()),
		slog.Uint64("bytes_in", in), slog.Uint64("bytes_out", out),
		slog.String("outcome", outcome), slog.Bool("upstream_kept", ss.kept), slog.Uint64("backend_pid", uint64(ss.pid)))
}

// logConnLine writes one of the per-connection lines: typed attributes (no boxing of each value, as key-value
// pairs would), and a record without its call site (runtime.Callers per line, for a source the handlers
// fenceproxy configures never print), and who the session is added to the record rather than through the
// session's logger (who). A connection per transaction writes two lines per transaction.
func (ss *session) logConnLine(level slog.Level, msg string, attrs ...slog.Attr) {
	ctx := context.Background()
	h := ss.srv.log.Handler()
	if !h.Enabled(ctx, level) {
		return
	}
	r := slog.NewRecord(time.Now(), level, msg, 0)
	// The attributes of who, as logger's With would put them (first), typed: who's []any boxes each Attr,
	// four allocations per line.
	if ss.named {
		r.AddAttrs(slog.String("client", ss.remote), slog.String("user", ss.params["user"]), slog.String("database", ss.params["database"]))
	} else {
		r.AddAttrs(slog.String("client", ss.remote))
	}
	r.AddAttrs(attrs...)
	h.Handle(ctx, r)
}

// countRelayed adds what a reader read since its last report to the session's totals and the metrics.
func (ss *session) countRelayed(dir int, r *msgReader) {
	ss.relayed[dir] += r.bytes
	ss.srv.metrics.forwarded(dir, r)
}
