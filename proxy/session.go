package proxy

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// session is one client connection and its upstream connection. Its protocol state and rules are the core's
// (core.go); how its bytes move is a transport's: two goroutines (relay.go), or an event loop (evloop_linux.go)
// after startup. It ends in one place (end.go).
type session struct {
	srv *Server
	// log names the client, its user and its database; nil until a line needs it after the StartupMessage was
	// read (named: logger builds it). The per-connection lines (connlog.go) do without it: a With formats its
	// attributes, a tenth of what a connection per transaction costs the proxy in user time with the lines.
	// Its sides may write their first line at once: hence the atomic.
	log    atomic.Pointer[slog.Logger]
	remote string

	// The connections and the goroutine transport's framing over them. cr and cw are the client's, sr and sw
	// the upstream's. In the goroutine transport the session goroutine reads cr and writes sw, the
	// server-to-client goroutine reads sr and writes cw; each interrupt stops the reads of its connection.
	client, upstream net.Conn // client: after TLS, if any
	cr, sr           msgReader
	cw, sw           *bufio.Writer
	clientOut        failWriter // the client connection as cw writes it, remembering a failed write
	// clientIO, in transaction mode, is the client's plain socket read and written with raw system calls
	// (rawIO) from its first byte: the startup reader reads through it, and attachClient writes through it; nil
	// otherwise, and once TLS replaced the socket (negotiate).
	clientIO                 io.ReadWriter
	clientIntr, upstreamIntr interrupt

	clientTLS bool
	named     bool              // the StartupMessage was read: the log lines name the user and database (logger)
	params    map[string]string // the StartupMessage's parameters
	appName   atomic.Pointer[string]
	startup   string       // the StartupMessage's protocol version and parameters (startupKey), for reuse
	born      time.Time    // when the upstream connection was opened
	host      upstreamHost // the server the upstream connection goes to (upstream.go)
	// movedTo is set when the router ends the session because its host stopped being what it was dialled for:
	// the primary it moved to ("" when none yet). Its end then says so (end.go).
	movedTo atomic.Pointer[string]

	state protoState // the core's (core.go)
	// prep is the templates prepared on the upstream connection (prepared.go): the session's own (ownPrep) in
	// session mode; in transaction mode the lent server connection's (serverConn.prep), set by lend, or, before
	// the first lend, ownPrep turned off.
	prep    *prepState
	ownPrep prepState
	// inlineToken: the Query or Parse being fenced runs where the token in force is this (a ValidToken), which
	// its rewrite carries as a constant (pooled followTokenInForce, rewrite/inline.go); "" for the usual form.
	// The session goroutine's own.
	inlineToken string
	// sqlOnly: the Query being fenced goes as SQL, with no command of the prepared fences' in front (pooled
	// querySQLPrepared); the session goroutine's own.
	sqlOnly bool
	// inlined: the last Query or Parse fenced was sent in the inline form (its text carries inlineToken);
	// rewroteParse: the last Parse fenced was rewritten.
	inlined, rewroteParse bool
	// keptFenced names a protected table that a fenced statement the server keeps for the session may write (a
	// Parse, which a later Bind runs, or a Query's PREPARE, which a later EXECUTE runs), "" while there is none.
	// The router's refusal (fence.go: checkPlan) is judged when a text is planned; such a statement runs later,
	// so its runs are judged again (keptFencedRefusal). Set only, never cleared: a Parse that replaced one may
	// have been skipped. Written and read by the side that reads the client.
	keptFenced string
	// fencedTxOut names a protected table the transaction under way may have written through the proxy (a fenced
	// Query or Parse planned, an Execute or EXECUTE that may run a kept fenced statement), nil when it wrote none
	// that the proxy saw. Cleared when a message comes with the session idle (everything answered, no block
	// open): that transaction ended. While it is set nothing more of the client's reaches a host the router
	// refuses fenced writes on (fencedTxRefused). Written only by the side that reads the client, and set before
	// the fenced write is judged (fencedWriteRefusal); atomic for the router's side (Server.fencedHostsRefused), which ends the session
	// when its host is refused fenced writes while such a transaction is under way. fencedTxEnded is why it
	// ended it (upstreamLostFarewell).
	fencedTxOut   atomic.Pointer[string]
	fencedTxEnded atomic.Pointer[[2]string] // why, and the table
	// endedUncommitted: the write hold (writehold.go) ended the session knowing that nothing it sent can commit
	// (its backend waited behind the hold; or, pooled, nothing was in flight when its connection was closed): the
	// farewell is 55F04 even with an answer owed.
	endedUncommitted atomic.Bool
	// keptStmts are the statements a session-mode client prepared by Parse, by name, with the planner generation
	// that fenced them; ownSQLPrep the generation in force at its first SQL PREPARE the proxy does not follow (both
	// pool modes). For the rules of reloadkept.go; written and read by the side that reads the client.
	keptStmts   map[string]*keptStmt
	keptChanged map[string]bool // kept statements the planner in force makes otherwise
	keptGen     uint64          // the generation every kept statement was judged against (0: none yet)
	ownSQLPrep  ownPrepared
	planGen     uint64 // the generation of the planner the transport gives the core now (reloadkept.go)
	// unkeptGen: the oldest generation of a statement the server may hold under a name not in keptStmts (an SQL
	// PREPARE, a Close the server may have skipped); 0: none. portalGen: the oldest generation a portal that may
	// be open was bound under (0: none); keptRetired the statements replaced or closed since, retiredLost when
	// more were than it keeps. All for reloadkept.go, on the side that reads the client.
	unkeptGen   uint64
	portalGen   uint64
	keptRetired []*keptStmt
	retiredLost bool

	// pooledPortals: the generations a transaction-pool client's portals were bound under (reloadkept.go).
	pooledPortals pooledPortals
	// positions maps the positions of errors and notices of the answers in flight into the client's text
	// (positions.go); nil when they need no map. Written by the client side, read and cleared by the server side.
	positions atomic.Pointer[sentRewrite]
	// unplanned is what the rule on writes the proxy did not plan keeps between the client's messages
	// (unplanned.go); the side that reads the client's own.
	unplanned unplannedWrites

	// Transaction pooling (pooled.go): the client's pooling state, nil in session mode; and the text that goes
	// before the client's next Query (the transaction's token statement).
	pooled      *pooledState
	queryPrefix string
	// queryToken: the token statement goes right before the client's next Query as a Bind and Execute, not in
	// its text (pooled.go: procedureAlone); tokenNone for none.
	queryToken tokenStmtKind
	// admin: the session is the admin console's (admin.go), which a drain ends at its next message boundary.
	admin bool

	pid       uint32 // upstream backend PID, set under srv.mu
	cancelKey []byte // upstream BackendKeyData (PID and secret), for cancelling on client loss
	clientKey []byte // the BackendKeyData the client got: the PID and the proxy's own secret
	// cancelGate: each cancel sent to the backend holds it shared; keep takes it for good (cancelBackend).
	cancelGate sync.RWMutex
	// cancelUnsure: a cancel sent to the backend was not seen taken (cancelUpstream), so it may reach the backend
	// after keep's reset: the backend is then not kept (keep).
	cancelUnsure atomic.Bool

	// Event loop (evloop_linux.go). noLoop: the loop could not take this session; it stays on goroutines.
	noLoop    bool
	closed    bool        // forceClose ran; under evMu
	forcedOut atomic.Bool // closed, for a look that takes no lock (lend, once per transaction)
	evMu      sync.Mutex
	ev        *evSession // the session is in the event loop; under evMu
	closeOnce sync.Once
	// kept: its upstream connection was kept for reuse (for the per-connection log lines, below). Here, in
	// what sync.Once leaves of a word, as the bools above are together: spread, their padding made a session
	// 1,184 bytes, an allocation of 1,280; packed it is 1,152 (TestPooledParkedClientKeepsLittle logs it).
	kept bool

	out []byte // scratch for messages the proxy builds during startup

	// For the per-connection log lines (connlog.go). relayed[dir] is written only by the side that reads that
	// direction (a relay goroutine, or the event loop), and read when the session has ended.
	started time.Time
	relayed [2]uint64 // bytes relayed, by direction (dirClientToServer, dirServerToClient)
	outcome string    // how the session ended
}

// logger is the session's logger: once the StartupMessage was read, ss.log, built at its first line; before
// that the server's with the client's address. Built only when a line is written: most connections write none
// but the per-connection lines.
func (ss *session) logger() *slog.Logger {
	if l := ss.log.Load(); l != nil {
		return l
	}
	l := ss.srv.log.With(ss.who()...)
	if ss.named && !ss.log.CompareAndSwap(nil, l) {
		return ss.log.Load()
	}
	return l
}

// who are the attributes that name the session in its log lines: the client's address, its user and its
// database (named: the StartupMessage was read).
func (ss *session) who() []any {
	if !ss.named {
		return []any{slog.String("client", ss.remote)}
	}
	return []any{slog.String("client", ss.remote), slog.String("user", ss.params["user"]), slog.String("database", ss.params["database"])}
}

// attachClient sets the client side up for relaying, reading through r (which may hold bytes already read).
func (ss *session) attachClient(r *bufio.Reader) {
	ss.clientOut = failWriter{Conn: ss.client, out: ss.clientIO}
	ss.cw = ss.srv.bufs.writer(&ss.clientOut)
	ss.clientIntr.conn = ss.client
	ss.cr = msgReader{r: r, intr: &ss.clientIntr, max: ss.srv.cfg.Limits.MaxMessageSize}
}

// attachUpstream sets the upstream side up for relaying over conn.
func (ss *session) attachUpstream(conn net.Conn) {
	ss.upstream = conn
	ss.sw = bufio.NewWriterSize(conn, writeBufferSize)
	ss.upstreamIntr.conn = conn
	ss.sr = msgReader{r: bufio.NewReaderSize(conn, readBufferSize), intr: &ss.upstreamIntr}
}

// serveSession relays a started session to its end, registered for cancel requests and drains; reused says
// it runs on a kept upstream connection.
func (s *Server) serveSession(ss *session, reused bool) {
	s.register(ss)
	defer s.unregister(ss)
	if s.router != nil {
		// A change of primary published while this session started did not see it registered.
		if now, ended := s.router.superseded(ss.host); ended {
			ss.endForFailover(now)
		}
	}
	s.metrics.sessionStarted()
	defer s.metrics.sessionEnded()
	ss.logConnected(reused)
	ss.relay()
	ss.logDisconnected()
}

// wakeForDrain makes the session look at itself now, in case it is already idle and a drain may close it.
func (ss *session) wakeForDrain() {
	if ss.pooled != nil || ss.admin {
		ss.clientIntr.raise(intrDrain) // decided by relayPooled between transactions
		if ss.pooled != nil {
			ss.pooled.wakeWait() // a client waiting for a server connection is refused (waitStopped: drained)
		}
		return
	}
	if !ss.state.ready.Load() || ss.upstream == nil {
		return // it will look at its first ReadyForQuery
	}
	ss.evMu.Lock()
	es := ss.ev
	ss.evMu.Unlock()
	if es != nil {
		es.loop.post(evCmd{es: es, drain: true})
		return
	}
	ss.upstreamIntr.raise(intrDrain)
}

// forceClose closes both connections; the transport then ends the session.
func (ss *session) forceClose() {
	ss.evMu.Lock()
	ss.closed = true
	ss.forcedOut.Store(true)
	if ss.ev != nil {
		ss.ev.shutdownSockets()
	}
	ss.evMu.Unlock()
	if ss.pooled != nil {
		ss.pooled.wakeWatches() // its socket, closed below, wakes no watch
	}
	ss.closeOnce.Do(func() {
		ss.client.Close()
		if ss.upstream != nil {
			ss.upstream.Close()
		}
		if ss.pooled != nil {
			ss.pooled.forceLent(ss.srv)
		}
	})
}

// forced reports whether forceClose ran.
func (ss *session) forced() bool {
	ss.evMu.Lock()
	defer ss.evMu.Unlock()
	return ss.closed
}

// failWriter remembers that a write to the connection failed, so that the server-to-client side can tell a
// client that went away from an upstream that did.
type failWriter struct {
	net.Conn
	out    io.Writer // what writes to the connection (rawIO) instead of Conn's Write; nil: Conn's
	failed atomic.Bool
}

func (w *failWriter) Write(p []byte) (int, error) {
	out := io.Writer(w.Conn)
	if w.out != nil {
		out = w.out
	}
	n, err := out.Write(p)
	if err != nil {
		w.failed.Store(true)
	}
	return n, err
}
