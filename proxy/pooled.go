package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

// Transaction pooling, the client's side (pool.mode: transaction). The client session keeps the client's logical
// state; a server connection (pool.go) is lent to it for one transaction at a time: from the message that starts
// a transaction while the client holds none (a Query, a FunctionCall, the first extended-protocol message after a
// Sync) to the ReadyForQuery 'I' that answers the last message the client sent. It runs on the goroutine
// transport: the session goroutine reads the client (relayPooled) and, when all the client sent is one unit
// answered by the next ReadyForQuery, reads the answer and writes it to the client itself (answerInline);
// otherwise a goroutine of the lend does (serveLend), started before any bytes reach the server (needReader),
// so that the server's answers are always read. Both run one loop (relayServer). The protocol rules are the
// session core's (onClientMsg, onServerMsg), as in session mode.
//
// The client's token and lock (token.setting, token.lock_setting) are the client's, kept as PostgreSQL keeps
// them because PostgreSQL computes them:
//
//   - Each transaction starts with the client's session values set transaction-locally (set_config(name, v,
//     true); NULL, the server's default, for a value never set or RESET), in the same write as the client's
//     first message, so that no value left in the connection's session reaches it: the token statement (hide).
//     It comes in two forms (tokenPrefix). The plain one (plainPrefix) only sets the values, and the login
//     role where a change of it would go unseen (serverConn.roleSeen); it goes before a transaction the proxy
//     knows whole (one Query, or one extended-protocol batch already read up to its Sync) whose statements
//     cannot leave session state by their words (plainText: SELECT, INSERT, UPDATE, ...; no SET, set_config,
//     BEGIN, ...); and, after the put-back below, before a lone BEGIN: in a Query as SET LOCAL, which takes no
//     snapshot (a SET TRANSACTION may follow), in an extended-protocol batch that only opens a block as the
//     SELECT form, which does. A transaction with a statement PostgreSQL refuses after a snapshot (SET
//     TRANSACTION and the like: a Query's text, or an extended-protocol batch's messages read when it starts,
//     batchHasModes) gets the values as SET LOCAL instead, after the put-back (prefixSetLocal). The checked one
//     (tokenSQLWith, roleCheckSQL) goes before every
//     other transaction, and checks, on the server, that the connection's session values are the placeholder
//     and the role the login role. Another client's function never makes it refuse: a connection that comes
//     to a client gets what such a function left put back first, in a transaction of its own that commits
//     before the client's (putBackFirst), so what the check refuses (55F03, 0A000) is the client's own
//     function's doing, as the contract says. The end of a checked transaction, or of a lone BEGIN's, may be
//     read back (below), which is sound only if its start was as the proxy left it (startChecked). Before the text
//     of a Query they carry the values as constants (nothing prepared, so nothing another client could
//     replace); in an extended-protocol batch, and in front of a Query of one CALL or DO statement, which the
//     text form would make an implicit block (procedureAlone), both go as a Bind and Execute of the server
//     connection's unnamed statement, which no client's code can replace, prepared once per connection
//     (writeTokenStmt; the clients' unnamed statements go to a named one of the proxy's, unnamedStmtName). SET,
//     SET LOCAL, RESET, set_config with any arguments, SAVEPOINT and ROLLBACK TO, a rollback: the server applies
//     them to the values inside the transaction exactly as on a connection of the client's own.
//   - A session-level change survives the transaction as the server connection's session value. When the
//     transaction may have made one (its text calls set_config, its commands were SET, RESET, DISCARD, ...), the
//     proxy reads the values back at its end, with the other session state the pool cannot move (probeSQL), and
//     puts the placeholder back before the connection can go to anyone else. The placeholder tells "unchanged"
//     from "reset to the default" from "set".
//   - Startup options (-c name=v, PGOPTIONS) give the client's first values and what RESET returns to.
//
// Session state that cannot move (a temporary table, LISTEN, a session advisory lock, a WITH HOLD cursor, SQL
// PREPARE, a session-level SET of another setting) pins the client to its server connection until it
// disconnects (pool.on_session_state: pin), or ends its session with 0A000 (refuse).

// pooledState is a client session's transaction-pooling state.
type pooledState struct {
	pool  *txPool
	login *clientLogin // how a server connection opened for the client logs in (auth.go: answerUpstream)
	leave func()       // gives the client's place in its pool back (txPools.join), at the session's end

	// Parking (park_linux.go): turns is odd while relayPooled waits for the client's next message at a message
	// boundary, even while it handles one (two atomic additions per message, which the sweep reads); sweptTurns
	// is what the last sweep saw (the parker's sweep only); parked: the session waits in the parker, with no
	// goroutine.
	turns      atomic.Uint32
	sweptTurns uint32
	parked     atomic.Bool

	mu      sync.Mutex
	settled sync.Cond // broadcast when the lend's server side has answered a ReadyForQuery and decided
	// The client's wait for a server connection (lend), which holds mu: under waitMu, waiting says it waits,
	// and waitCancelled that a CancelRequest came meanwhile (cancelPooled); waitWake (buffered) wakes it
	// (wakeWait). skipToSync: a cancelled wait answered the first message of an extended-protocol batch with
	// 57014; the rest up to its Sync is dropped, as the server skips a failed batch (under mu).
	waitMu        sync.Mutex
	waiting       bool
	waitCancelled bool
	skipToSync    bool
	waitWake      chan struct{}
	waitWatch     lendWait // what lend's wait watches (waitWake, waitStopped): made once, not per lend
	// watches are the watches of waits on the server side under way (watchClient), linked by next: the
	// session goroutine's, and a probe's on a lend's goroutine meanwhile (watchProbe). forceClose wakes them.
	// Under waitMu, which is never held for long: one pointer per session, the parked ones too.
	watches *clientWatch
	// cancelDeferred: a CancelRequest came while a unit of the proxy's own ran before the client's statement
	// (a settings replay, checkFirst's check); it goes once that unit is answered and the client's statement is
	// sent (sendDeferredCancel), so that it cancels the client's statement, not the proxy's unit (written under
	// mu; the lend's server side looks at it without: ownUnitAnswered).
	cancelDeferred atomic.Bool
	// cancelsOut counts the client's cancels on their way to the lent connection's server (deliverCancel), and
	// cancelSent says one went during this lend (both under mu). The server's answers meanwhile go to the
	// client at once, as directly; settle waits for the cancels instead, and a connection a cancel went to serves
	// nobody else before a round trip of the proxy's own took that cancel off it (absorbCancel).
	cancelsOut sync.WaitGroup
	cancelSent bool
	// cancelUnsure: a cancel of this lend's was not seen taken (cancelUpstream reported false), so it may still
	// reach the backend after any round trip of the proxy's own: the connection goes to nobody else (settle).
	// Set by the cancel's goroutine, read once cancelsOut is done.
	cancelUnsure atomic.Bool
	// replayed wakes the session goroutine waiting for the proxy's own units (awaitReplayed): the lend's server
	// side sends on it, without mu, each time one is answered, and when the lend is lost (buffered, one).
	replayed chan struct{}
	sc       *serverConn // lent to the client now; nil between transactions. Whoever clears it disposes of it.
	// lent is sc, for forceClose, which must not wait for mu (setLent keeps them equal).
	lent    atomic.Pointer[serverConn]
	serving sync.WaitGroup // the lends' server sides (serveLend) still running
	reading bool           // a serveLend reads sc (needReader)
	inline  bool           // the session goroutine reads the answer to what it sent (answerInline)
	// inlineAtReady: answerInline stopped at the ReadyForQuery that ended the answer (not a timeout or COPY).
	inlineAtReady bool
	// cache is what a busy client keeps only to spare itself work (pooledCache), nil until its first use and
	// from park on: apart, so that a parked client keeps none of its bytes (ss.caches makes it).
	cache *pooledCache
	// beforeSend is needReader, made once: the lent connection's serverConn.beforeSend.
	beforeSend func()
	open       int    // Query, Sync and FunctionCall messages forwarded on sc and not yet settled
	pin        string // why the client keeps sc, "" if it does not
	lost       error  // the lend ended badly: the session ends with farewell
	fare       []byte // the FATAL that ends the session after lost
	// COPY FROM STDIN (under mu). PostgreSQL ignores Sync and Flush while it reads a COPY's data, so those are
	// not units. Which ones it ignores is a matter of their place in the client's stream: after the statement
	// that started the COPY and before the client's CopyDone or CopyFail that ends it, and only if the COPY
	// started, which the CopyInResponse says (copyStarted). Which statement started it the server says too: it
	// answers the client's messages in order, so a CopyInResponse belongs to the first Execute sent that the
	// server has not completed yet (execsDone), or to the Query being answered. copyRuns are the statements that
	// may start a COPY (by their words, copyEnds) since everything sent was last answered, in the order sent,
	// each with where the client's Syncs and COPY ends came after it (copySyncsSent counts the Syncs); a
	// CopyInResponse takes its own statement's run, and drops the runs of the Executes before it, which the
	// server completed without a COPY: a COPY end sent after one of those was ignored by the server, and is by
	// the count (before 2026-12-05 such a stray end counted as the next COPY's, which made the lend wait, for
	// ever, for an answer to a Sync that COPY swallowed: TestPooledCopyStrayEndAfterTheWordCopy). execsSent
	// counts the client's Executes sent since everything was answered. runByExecute: the last Query or Execute
	// sent was an Execute, whose COPY leaves the server inside the batch, up to a Sync. copyIn: the server
	// reads a COPY's data now, and the client has not ended it (from the CopyInResponse to the client's CopyDone
	// or CopyFail, or a ReadyForQuery: a COPY that failed).
	copyRuns             []copyRun
	copySyncsSent        int
	execsSent            int64
	copyIn, runByExecute bool
	// copyEnds says whether a CopyDone or CopyFail the client sends now (outside a COPY the server is known to
	// read: copyIn) may end a COPY: only after a message that may start one, a Query whose text may (any end
	// after it, up to the Query's answer: it may hold several COPYs) or an Execute of a portal that may run one
	// (the first end after it; the server reads the next message only once the Execute ended, so a later end is
	// outside any COPY). Anywhere else the server ignores the end, and so does the count (a stray end counted
	// shifted the next COPY's Syncs: TestPooledStrayCopyEndInsideABatch). Where the words say it may, the end is
	// the run's, and the server's answer decides (copyRuns).
	copyEnds copyEndsState
	// execsDone counts the client's Executes since everything was answered that the server completed
	// (CommandComplete, EmptyQueryResponse, PortalSuspended relayed; all of them at an ErrorResponse, after
	// which the server skips the rest of the batch): the lend's server side alone writes it, but for the
	// resets where it is the only one running (lend, settle).
	execsDone atomic.Int64
	// copyPortals are the client's portals (by the client's names) that may run a COPY: bound from a text
	// that holds the word, or from a statement whose text the proxy does not know (copyEnds). Portals end with
	// the transaction, and so does this (settle); a Query drops the unnamed one.
	copyPortals map[string]struct{}
	// copyStarts are the CopyInResponses the lend's server side relayed whose bookkeeping is still to be done
	// (applyCopyStarts, under mu), each as the place of the Execute it answers (execsDone+1 when it came): that
	// side never waits for mu (copyStarted), so whoever holds mu next applies them, before it looks at the
	// fields above, pl.open or state.unsynced. copyStartsMu guards it alone and is never held for long.
	copyStartsMu sync.Mutex
	copyStarts   []int64
	anyStarts    atomic.Bool // copyStarts is not empty: a look without the lock
	// copyAmbiguous: a Sync or a Query went to the server while it read a COPY's data (forwardCopyIn, which ends
	// the session at any other message but the data, its end and a Flush), or a Sync went between a COPY's rows
	// before its CopyInResponse came (applyCopyStart). While the COPY runs the server
	// ignores a Sync and fails on a Query (08P01, then FATAL); once the COPY has failed (a bad row) it runs them,
	// each answered by a ReadyForQuery of its own that the lend does not count. Which of the two happened the
	// proxy cannot tell, so a COPY that failed with such a message sent ends the session (settle): counting on
	// either could end the lend with answers still to come, which the connection's next client would get (a
	// review's reading of the settle hang).
	copyAmbiguous bool

	token, lock           *string // the client's session values; nil: the server's default
	resetToken, resetLock *string // what RESET returns to: the startup values, or nil
	// tokenInForce is the token the lent connection's transaction holds, as the proxy gave it at its start,
	// while no message since may have changed it (followTokenInForce); "" when not known.
	tokenInForce string
	// unnamedToken is the token the client's unnamed statement carries (inline form), "" if none; unnamedSrc is
	// the client's Parse body of it (its own text), fenced again when it carries a token and is bound where
	// another token is in force.
	unnamedToken string
	unnamedSrc   []byte
	// unnamedGen is the generation of the planner unnamed was fenced under (plannerBox): bound under another, it
	// is fenced again from unnamedSrc first (placeUnnamed).
	unnamedGen uint64
	// unnamedRead is how the server read the client's Parse of unnamed (stmtReading): placed on another server
	// connection, it goes again only where the server reads it the same (readAgain).
	unnamedRead stmtReading
	// plan is the planner, and its generation, of the client message being forwarded (forwardPooled; pl.mu):
	// what the proxy kept of the client's statements fenced under another generation is fenced again under
	// this one before it is sent (serverStmt, placeUnnamed, mapSQLPrepared).
	plan plannerBox

	settings         map[string]string // the client's other session-level settings (pooledsettings.go)
	customNames      map[string]bool   // custom settings the client's texts may have set (noteCustomSettings)
	customUnfollowed bool              // a text set a custom setting the proxy cannot name
	tainted          bool              // the token statement refused the lent connection's state (serveLend's)
	// ranUnsettled: a message that runs statements (a Query, an Execute, a FunctionCall) went since everything
	// sent was last answered, so a SET or a function may have changed the reading settings the server reports
	// only at its ReadyForQuery (readAgainSettings). Parse, Bind, Describe and Close run nothing.
	ranUnsettled bool
	// chainPending: a text of the unit being answered may chain a transaction (AND CHAIN); chainDue: the unit
	// ended in a block after one, chainTokens goes before the next message (under mu).
	chainPending, chainDue bool
	replaying              atomic.Int64 // settings units sent whose ReadyForQuery is still to come
	replayFailure          *replayError // the server's error for the settings unit being answered (serveLend's)

	probe atomic.Bool // the transaction may leave session state: look at the connection at its end
	// probeEffects: what the transaction's texts may do to the token, lock and application_name at session level
	// (rewrite.SessionEffects, under mu), which says how the probe reads what a RESET gives on a pooled connection,
	// which a set gives too (resetRead, followLock). Cleared by the probe.
	probeEffects rewrite.SessionEffects
	// mayUndo: the transaction may have rolled back some of what it did (a text with ROLLBACK or ABORT, an
	// error), so a setting the probe reads as the connection held it before may be that value again, kept by the
	// rollback, rather than a reset's (resetRead; under mu). Cleared at the transaction's end.
	mayUndo bool
	// startChecked: the lent connection's session state was checked since it last served another client
	// (checkFirst), so the token and lock the probe reads at the transaction's end are what the client left, not
	// what a function of another client's left before (under mu).
	startChecked bool
	// checkSent: the transaction's start is the checked token statement, not answered yet; checkRan: it ran
	// (its CommandComplete came, serveLend), so it passed. A check counts only then (settle): a Query that fails
	// to parse, or an error before a BEGIN batch's token statement, skips it.
	checkSent, checkRan atomic.Bool
	// stmtParsed: the transaction sent a Parse of a server statement, which serverConn.stmts counts as prepared
	// before the server answered; an error in it (25P02 in a failed transaction) may have prepared nothing, so
	// the probe reads the statements there again.
	stmtParsed atomic.Bool
	hide       atomic.Int64 // token statements whose answers are still to be hidden (each up to its CommandComplete)
	// quietSetLocals: how many of the hidden statements, the first ones, are the SET LOCALs of writeSetLocals,
	// whose warning outside a block (25P01) is the proxy's, not the client's: the relay drops it, and counts one
	// down at each hidden CommandComplete; an error ends them.
	quietSetLocals atomic.Int64
	// batchFailed: an error came back on the lent connection, so the server skipped the rest of its batch, maybe
	// a Close and Parse of the proxy's own that were counted done when sent; settle then forgets which of the
	// proxy's statements there are known to hold its text (serverConn.stmtsFresh, unnamedToken).
	batchFailed atomic.Bool
	// relayFirst is how many answers to the client's messages come before the hidden ones: the token statement
	// goes after some of the client's messages when a batch starts with a BEGIN with transaction modes
	// (windowOpen). Notices, ParameterStatus and notifications are not counted; an error ends the batch.
	relayFirst atomic.Int64
	// windowOpen: the batch starts with a BEGIN with transaction modes, which fails after a statement that took a
	// snapshot (25001), and its token statement has not gone yet: it goes at the batch's first Execute, after it
	// when it executes a portal of that BEGIN (beginPortals), else before it (closeWindow). windowAnswers counts
	// the answers to the client's messages sent until then (answersTo, under mu). Meanwhile the answers the
	// lend's server side relays are counted (windowRelayed), and an error among them noted (windowFailed), under
	// windowMu: the client may read some of the window's answers before its Execute (a Flush), so the answers
	// still to relay before the hidden ones are windowAnswers less those.
	beginPortals  []string
	windowAnswers int64
	windowOpen    atomic.Bool
	windowMu      sync.Mutex
	windowRelayed int64
	windowFailed  bool

	// tokenPortalLeft: the token statement ran in the unnamed portal of the lent connection, and no message of
	// the client's since could reach that portal (closeTokenPortalBefore closes it first).
	tokenPortalLeft bool
	// Procedure alone (procedureAlone): syncOwed, the token statement went right before the client's Query,
	// whose Sync goes right after it (under mu); readyHidden, the Query's own ReadyForQuery is still to come and
	// is not relayed (the Sync's is): set before the token statement is written, cleared when the server side
	// takes that ReadyForQuery off, or when the token statement fails, which makes the server skip the Query.
	syncOwed    bool
	readyHidden atomic.Bool
	// clientCut: a message the lend's server side forwarded to the client stopped in its middle (its server
	// connection failed as the message streamed, or the rest of it did not come within closeUnderRelay's
	// grace: msgReader.rest). The client's next bytes would be read as the rest of it, so the session's end
	// writes no farewell after it. A close of the proxy's own never cuts a message otherwise (closeUnderRelay).
	clientCut atomic.Bool
	// cancelledAtEnd: the session's end cancelled what its server connection ran (endPooled). What the server
	// says from then on answers the proxy's cancel, not the client: none of it is relayed, so that the client
	// reads its farewell next, not a 57014 "canceling statement due to user request" and a ReadyForQuery it did
	// not ask for, which tell it the session goes on (TestPooledCopyPipelineFuzz, a Parse sent into a COPY).
	cancelledAtEnd atomic.Bool
	// unnamed is the client's unnamed statement (its fenced Parse message; nil when it has none), and
	// unnamedHere whether the lent server connection's unnamed statement is that one: not at the start of a lend
	// (another client's may be there), nor after the proxy's own Query (probeSession). A Bind or Describe of it
	// in a later transaction, maybe on another server connection, gets it prepared there first (pooledstmts.go).
	unnamed     []byte
	unnamedHere bool
	// lastUnnamedOwed: the connection just lent may hold another client's unnamed statement (closeLastUnnamed).
	lastUnnamedOwed bool
	// unnamedDropped: a DISCARD ALL or DEALLOCATE ALL ran on the lent connection, which dropped the server
	// statement of the client's unnamed one (unnamedStmtName), as it does not the unnamed statement: it is
	// prepared again before its next use (placeUnnamed). Set by the lend's server side.
	unnamedDropped atomic.Bool

	stmts    pooledStmts    // the client's named statements (pooledstmts.go)
	sqlStmts pooledSQLStmts // the client's SQL-level prepared statements (pooledsqlprep.go)

	// unnamedVer counts the changes of the client's unnamed statement (pooledStmts: unnamedFix); unnamedEpoch
	// the times the server's was not the client's doing: a lend, the proxy's own Parse, Close or Query
	// (unnamedReplaced). A verdict judged in one epoch says nothing of the server's statement in another.
	unnamedVer   uint64
	unnamedEpoch uint64

	// prefixChars is how many characters the token statement put before the text of the Query being answered
	// (an error's position is shifted back by it, and by the hidden PREPAREs in the text: pooledsqlprep.go); 0
	// when none, negative when they cannot be counted (positions are then left as they are).
	prefixChars atomic.Int64
}

// pooledCache is what a pooled session keeps only so that its next transactions cost less: each part is made
// again, the same, when it is missing, so dropping it loses nothing but that work. A parked client drops it
// (park): the memo alone holds copies of up to sixteen of the client's texts, kept for hours by an idle client
// (TestPooledParkedClientKeepsLittle). Anything the client's next message needs as it was is state, and does
// not belong here. The session goroutine (the client side) alone uses it; it is dropped only with no lend, so
// with no lend's server side running.
type pooledCache struct {
	// classes remembers what the last texts the client sent are by their words (textclass.go).
	classes classMemo
	// plainPrefix is the last text plainPrefix built, for the values and settings of key (n 0: none yet).
	plainPrefix struct {
		key  plainPrefixKey
		text string
		n    int64
	}
	// tokenBind and tokenExecute are writeTokenStmt's scratch, kept for the next transaction's.
	tokenBind, tokenExecute []byte
}

// caches is the session's pooledCache, made at its first use since the session started or last parked: one
// allocation per unpark of a client that then speaks, none per message.
func (ss *session) caches() *pooledCache {
	pl := ss.pooled
	if pl.cache == nil {
		pl.cache = &pooledCache{classes: classMemo{effectWords: ss.srv.effectWords, effectsOf: ss.srv.effectsOf}}
	}
	return pl.cache
}

// setLent sets the connection lent to the client (mu held).
func (pl *pooledState) setLent(sc *serverConn) {
	pl.sc = sc
	pl.lent.Store(sc)
}

// forceLent is forceClose's part for a pooled session (Shutdown, when the drain's time is up): the statement
// running on the lent connection is cancelled and the connection closed, so that a goroutine reading its answer
// (inline, with no limit once the answer's first bytes came) stops now. Only while the proxy drains: a
// connection given back then is closed, never lent again, so the one read here is no other client's even if the
// lend just ended.
func (pl *pooledState) forceLent(s *Server) {
	if !s.draining.Load() {
		return
	}
	pl.wakeWait() // a client waiting for a server connection stops waiting (waitStopped: forced)
	if sc := pl.lent.Load(); sc != nil {
		go s.cancelUpstream(sc.key, sc.host.addr)
		sc.conn.Close()
	}
}

// pooledTransactions reports whether clients share server connections per transaction.
func (s *Server) pooledTransactions() bool { return s.pools != nil }

// tokenSQLWith sets the token and lock settings to the SQL expressions tokVal and lockVal, transaction-locally,
// after checking that the connection's session values are the placeholder: anything else means a change the
// proxy did not follow, and the statement fails with 55F03 naming the setting before the client's statement runs
// (prefixChecked). A connection that comes to a client that is not pinned has what another client's function
// left there put back first (putBackFirst), so what this check refuses is the client's own function's doing, as
// the contract says; a pinned client's connection is its own.
func tokenSQLWith(tok, lock, tokVal, lockVal string) string {
	return "SELECT pg_catalog.set_config(" + quoteLiteral(tok) + ", CASE WHEN " + placeholdersUnchanged(tok, lock) + " THEN " + tokVal +
		" ELSE " + placeholderRefusal(tok, lock) + "::pg_catalog.text END, true), pg_catalog.set_config(" + quoteLiteral(lock) + ", " + lockVal + ", true)"
}

// staleResetSQL is the statements that put the token and lock back to the placeholder at session level,
// session_authorization to the login role (its RESET, which any role may run) and the role to none
// (tokenTexts.putBack). Only code the proxy does not see leaves anything but the placeholders and the login role
// at session level (a function that calls set_config), and in a transaction of another client that is never
// this client's problem. They always run as a Query of their own, whose implicit transaction commits before
// anything of the client's runs (putBackFirst, checkFirst): put back inside the client's transaction, a rollback
// there would bring the stale values back for the rest of the client's Query or batch. Utility statements, set
// whatever was there: PostgreSQL 15 runs the four at 1.6-1.8 times the rate of one SELECT of set_config calls
// that sets the role only where it moved (pgbench, two clients, four rounds: 73-85k against 45-49k a second),
// and a role or session_authorization set to what it was is not reported again.
func staleResetSQL(tok, lock string) string {
	ph := quoteLiteral(poolPlaceholder)
	return "SET " + settingIdent(tok) + " = " + ph + "; SET " + settingIdent(lock) + " = " + ph + "; RESET SESSION AUTHORIZATION; SET ROLE NONE"
}

// plainSQLWith sets the token and lock settings to the SQL expressions tokVal and lockVal, transaction-locally,
// without looking at the connection's session values: the token statement of a transaction whose statements
// cannot change them at session level but through a function (prefixSet). A value a function left there
// stays in the session, which no transaction sees: each sets its client's own.
func plainSQLWith(tok, lock, tokVal, lockVal string) string {
	return "SELECT pg_catalog.set_config(" + quoteLiteral(tok) + ", " + tokVal + ", true), pg_catalog.set_config(" + quoteLiteral(lock) + ", " + lockVal + ", true)"
}

// placeholdersUnchanged is true when the connection's session values of the token and lock settings are the
// placeholder.
func placeholdersUnchanged(tok, lock string) string {
	unchanged := func(name string) string {
		return "pg_catalog.current_setting(" + quoteLiteral(name) + ", true)" + sqlEq + quoteLiteral(poolPlaceholder)
	}
	return unchanged(tok) + " AND " + unchanged(lock)
}

// placeholderRefusal fails with 55F03 naming the setting that is not the placeholder (an int8 expression that
// never yields). The refusal's text is in it once (the name computed), so that the statement stays short: as a
// Query's prefix it shows in pg_stat_activity and the server's logs before the client's text. The cast of the
// marker fails whenever it runs; the setting's value after it keeps the planner from folding it.
func placeholderRefusal(tok, lock string) string {
	cur := func(name string) string { return "pg_catalog.current_setting(" + quoteLiteral(name) + ", true)" }
	return "pg_catalog.concat(" + quoteLiteral(rewrite.NamedRefusalMarker(sqlstateInvalid, rewrite.RefusalPooledSetting, "")) +
		", ':', CASE WHEN " + cur(tok) + sqlEq + quoteLiteral(poolPlaceholder) + " THEN " + quoteLiteral(lock) + " ELSE " + quoteLiteral(tok) + " END, '|', " + cur(tok) + ")::pg_catalog.int8"
}

// tokenTexts are the token statement's texts for one pool and kind of client (txPool.tokenTexts): the pieces of
// the inline forms around the two values, checked (tokenSQLWith, with the role check for a client that is not
// pinned) and plain (plainSQLWith, setting the login role for a client that is not pinned), and the Parse bodies
// of the prepared forms (the values as parameters), as the unnamed statement.
type tokenTexts struct {
	inlineHead, inlineMid, inlineTail string // inlineHead + token + inlineMid + lock + inlineTail, as SQL expressions
	plainHead, plainMid, plainTail    string // the same for the plain form
	bareHead, bareMid, bareTail       string // the plain form without the role set (roleSeen)
	putBack                           string // staleResetSQL, the same for both kinds of client
	checkedParse, plainParse          []byte
	bareParse                         []byte
}

// tokenStmtKind is which prepared token statement a server connection's unnamed statement holds
// (serverConn.unnamedToken).
type tokenStmtKind uint8

const (
	tokenNone          tokenStmtKind = iota // none, or not known
	tokenChecked                            // tokenSQLWith and the role check: a client that is not pinned
	tokenCheckedPinned                      // tokenSQLWith alone: a pinned client, whose connection is its own
	tokenPlain                              // plainSQLWith, the role set to the login role for the transaction
	tokenBare                               // plainSQLWith alone (a pinned client, or roleSeen)
)

// tokenParse is the Parse body that prepares kind as the unnamed statement.
func (p *txPool) tokenParse(kind tokenStmtKind) []byte {
	switch kind {
	case tokenChecked:
		return p.tokenTexts(false).checkedParse
	case tokenCheckedPinned:
		return p.tokenTexts(true).checkedParse
	case tokenPlain:
		return p.tokenTexts(false).plainParse
	}
	return p.tokenTexts(true).bareParse
}

// newTokenTexts builds the texts for a pool whose connections log in as user, for a pinned client or not.
func newTokenTexts(tok, lock, user string, pinned bool) tokenTexts {
	// The two values' places are found by markers no setting name can hold (names are lower-case a.b).
	cut := func(sql string) (head, mid, tail string) {
		head, rest, _ := strings.Cut(sql, "\x00TOK\x00")
		mid, tail, _ = strings.Cut(rest, "\x00LOCK\x00")
		return head, mid, tail
	}
	extra, plainExtra := "", ""
	if !pinned {
		// The role a client that is not pinned runs as is the login role (SET ROLE pins): checked, or set for the
		// transaction by the plain form, on a connection whose role changes the server would not all report
		// (roleSeen).
		extra = ", " + roleCheckSQL(user)
		plainExtra = ", pg_catalog.set_config('role', 'none', true)"
	}
	checked := func(tokVal, lockVal string) string { return tokenSQLWith(tok, lock, tokVal, lockVal) + extra }
	var t tokenTexts
	t.inlineHead, t.inlineMid, t.inlineTail = cut(checked("\x00TOK\x00", "\x00LOCK\x00") + "; ")
	t.plainHead, t.plainMid, t.plainTail = cut(plainSQLWith(tok, lock, "\x00TOK\x00", "\x00LOCK\x00") + plainExtra + "; ")
	t.bareHead, t.bareMid, t.bareTail = cut(plainSQLWith(tok, lock, "\x00TOK\x00", "\x00LOCK\x00") + "; ")
	t.putBack = staleResetSQL(tok, lock)
	// Parse: the unnamed statement, the text, no parameter types.
	unnamedParse := func(text string) []byte { return append(append([]byte{0}, text...), noParamTypes[:]...) }
	const tokParam, lockParam = "$1::pg_catalog.text", "$2::pg_catalog.text"
	t.checkedParse = unnamedParse(checked(tokParam, lockParam))
	t.plainParse = unnamedParse(plainSQLWith(tok, lock, tokParam, lockParam) + plainExtra)
	t.bareParse = unnamedParse(plainSQLWith(tok, lock, tokParam, lockParam))
	return t
}

// inline is the checked token statement with the client's values as constants, followed by "; ": the prefix of
// a Query.
func (t *tokenTexts) inline(tok, lock *string) string {
	return t.inlineHead + sqlValue(tok) + t.inlineMid + sqlValue(lock) + t.inlineTail
}

// plainInline is the plain token statement with the client's values as constants, followed by "; ": with the
// role set back unless bare.
func (t *tokenTexts) plainInline(tok, lock *string, bare bool) string {
	if bare {
		return t.bareHead + sqlValue(tok) + t.bareMid + sqlValue(lock) + t.bareTail
	}
	return t.plainHead + sqlValue(tok) + t.plainMid + sqlValue(lock) + t.plainTail
}

// plainPrefix is the plain token statement (prefixSet) before a Query's text, and how many statements it
// holds, whose answers are hidden; the client's values change seldom, so it is built once for them
// (pooledState.plainPrefix). It is what the server runs for the least (measured on PostgreSQL 15, in front of a
// one-row SELECT: about 0.9 of the SELECT's rate alone, where the SELECT form gives 0.7-0.8): a SET LOCAL of each
// value (tokenSetLocals), which needs no plan, and the role set back only on a connection whose role changes the
// server would not all report (serverConn.roleSeen: setting the role costs PostgreSQL 15 about 0.1 of a one-row
// SELECT's rate, in either spelling). SET LOCAL is in force: the Query is several statements, so its implicit
// transaction is a block. A value no constant carries under the client's settings gets the SELECT form, whose
// values are expressions. (Before an extended-protocol batch the token statement is prepared: writeTokenStmt.)
func (ss *session) plainPrefix(sc *serverConn, set rewrite.Settings) (string, int64) {
	pl := ss.pooled
	key := pl.prefixKey(pl.pin != "" || sc.roleSeen, set)
	cache := ss.caches()
	if c := &cache.plainPrefix; c.n > 0 && c.key == key {
		return c.text, c.n
	}
	text, n := "", int64(1)
	texts := &ss.srv.setLocal
	if pl.token == nil && pl.lock == nil {
		// Most clients: no token or lock of their own, the text made once (and no value that needs a constant).
		text, n = texts.defaultsRoleNone, 3
		if key.bare {
			text, n = texts.defaults, 2
		}
	} else if stmts, ok := ss.tokenSetLocals(set, key.bare); ok {
		text, n = strings.Join(stmts, ""), int64(len(stmts))
	} else {
		text = sc.pool.tokenTexts(pl.pin != "").plainInline(pl.token, pl.lock, key.bare)
	}
	cache.plainPrefix.key, cache.plainPrefix.text, cache.plainPrefix.n = key, text, n
	return text, n
}

// tokenSetLocals is the plain token statement as utility statements, each ending in a semicolon: a SET LOCAL of
// the client's token, then of its lock (setLocalStmt), then, unless bare, SET LOCAL ROLE NONE (the login role
// for the transaction, where a change of the role would not be reported: serverConn.roleSeen). None of them
// takes a snapshot, so SET TRANSACTION may follow them (writeSetLocals). ok is false when a value is one no
// constant carries under set.
func (ss *session) tokenSetLocals(set rewrite.Settings, bare bool) (stmts []string, ok bool) {
	pl := ss.pooled
	texts := &ss.srv.setLocal
	tok, lock := texts.tokDefault, texts.lockDefault
	if pl.token != nil || pl.lock != nil {
		var ok2 bool
		tok, ok = setLocalIdentStmt(texts.tokIdent, pl.token, set)
		lock, ok2 = setLocalIdentStmt(texts.lockIdent, pl.lock, set)
		if !ok || !ok2 {
			return nil, false
		}
	}
	if bare {
		return []string{tok, lock}, true
	}
	return []string{tok, lock, setLocalRoleNone}, true
}

// setLocalRoleNone sets the role back for the transaction, after the token and lock (tokenSetLocals).
const setLocalRoleNone = "SET LOCAL ROLE NONE; "

// setLocalTexts are the parts of the plain token statement that depend on the configuration alone, made once
// by the Server: the settings' names as SET takes them, and the statement of a client with neither a token nor
// a lock of its own, as tokenSetLocals writes it, without and with setLocalRoleNone. Built per client they
// were a tenth of what a connection per transaction allocated in the proxy.
type setLocalTexts struct {
	tokIdent, lockIdent        string
	tokDefault, lockDefault    string // SET LOCAL of each to its default
	defaults, defaultsRoleNone string
}

func newSetLocalTexts(tok, lock string) setLocalTexts {
	t := setLocalTexts{tokIdent: settingIdent(tok), lockIdent: settingIdent(lock)}
	t.tokDefault, _ = setLocalIdentStmt(t.tokIdent, nil, rewrite.Settings{})
	t.lockDefault, _ = setLocalIdentStmt(t.lockIdent, nil, rewrite.Settings{})
	t.defaults = t.tokDefault + t.lockDefault
	t.defaultsRoleNone = t.defaults + setLocalRoleNone
	return t
}

// plainPrefixKey is what plainPrefix's text depends on.
type plainPrefixKey struct {
	tok, lock       string
	tokSet, lockSet bool
	bare            bool
	set             rewrite.Settings
}

// prefixKey is the key of a cached token text (plainPrefix): the client's values now, and bare and set as
// given.
func (pl *pooledState) prefixKey(bare bool, set rewrite.Settings) plainPrefixKey {
	key := plainPrefixKey{bare: bare, set: set}
	key.tok, key.tokSet = derefValue(pl.token)
	key.lock, key.lockSet = derefValue(pl.lock)
	return key
}

// derefValue is *v and whether v is set.
func derefValue(v *string) (string, bool) {
	if v == nil {
		return "", false
	}
	return *v, true
}

// setLocalSQL is a SET LOCAL of the setting name to v (its default for nil), and a semicolon (setLocalStmt); a
// value no constant can carry is replaced by the pool's placeholder, which any fenced write refuses (55F03).
func setLocalSQL(name string, v *string, set rewrite.Settings) string {
	if sql, ok := setLocalStmt(name, v, set); ok {
		return sql
	}
	p := poolPlaceholder
	sql, _ := setLocalStmt(name, &p, set)
	return sql
}

// setLocalStmt is a SET LOCAL of the setting name to v (its default for nil), and a semicolon. v is written as
// setConstant writes it under the session's settings (set): never a constant the server could read otherwise
// than the proxy. ok is false for a value no such constant can carry.
func setLocalStmt(name string, v *string, set rewrite.Settings) (sql string, ok bool) {
	return setLocalIdentStmt(settingIdent(name), v, set)
}

// setLocalIdentStmt is setLocalStmt of a name already written as SET takes it (settingIdent).
func setLocalIdentStmt(ident string, v *string, set rewrite.Settings) (sql string, ok bool) {
	if v == nil {
		return "SET LOCAL " + ident + " TO DEFAULT; ", true
	}
	c, ok := setConstant(*v, set)
	if !ok {
		return "", false
	}
	return "SET LOCAL " + ident + " = " + c + "; ", true
}

// settingIdent is a setting's name (a.b) as SET takes it: each part a quoted identifier.
func settingIdent(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
	}
	return strings.Join(parts, ".")
}

// sqlValue is v, a value of the client's (read back from the server in the client's encoding, or given at
// startup), as an SQL expression (textExpr), NULL for nil.
func sqlValue(v *string) string {
	if v == nil {
		return "NULL"
	}
	return textExpr(*v, "pg_catalog.current_setting('client_encoding')")
}

// probeSQL (like every statement of the proxy's own on a pooled connection) names its operators with
// pg_catalog: it runs under the client's search_path, which may put a schema with operators of its own first.
//
// probeSQL reads, after a transaction, the token and lock values it left, the session state the pool cannot
// move (user is the role the connection logged in as) and the settings it replays (pooledsettings.go); then it
// puts the placeholder back.
//
// It runs under the client's session-level statement_timeout and lock_timeout, which the transaction may just
// have set (pgx's TestSendBatchHandlesTimeoutBetweenParseAndDescribe sets 100 ms, which the probe's reads of
// pg_settings and pg_locks can outlast on a busy machine): a probe they cancel would end the client's session
// (08006). So its first two statements, cheap ones, turn both off for the probe
// (probeLimitsSQL) before anything else runs; the settings read then sees the proxy's local values, and takes
// the client's from the first statement instead (probeOnce). A probe cancelled anyway is run again.
//
// own is the condition on a row p of pg_prepared_statements that it is one of the prepared fences' statements as
// the proxy prepared it on this connection (prepState.ownCond): those are not the client's SQL PREPARE, while a
// statement a function put under one of the proxy's names is.
func probeSQL(tok, lock, user string, custom []string, own string) string {
	return probeLimitsSQL + replayableSettingsSQL(custom) + "; " +
		"SELECT pg_catalog.current_setting(" + quoteLiteral(tok) + ", true), pg_catalog.current_setting(" + quoteLiteral(lock) + ", true), " +
		"pg_catalog.concat_ws(', ', " + unmovableSettingsSQL() + ", " +
		"CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_listening_channels()) THEN 'LISTEN' END, " +
		"CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_cursors WHERE is_holdable) THEN 'a WITH HOLD cursor' END, " +
		"CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql AND pg_catalog.left(p.name, 12)" + sqlNe + quoteLiteral(sqlStmtPrefix) +
		" AND NOT (" + own + ")) THEN 'SQL PREPARE' END, " +
		"CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_prepared_statements WHERE NOT from_sql AND pg_catalog.left(name, 11)" + sqlNe + "'fenceproxy_') THEN 'a named protocol-level prepared statement' END, " +
		"CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_locks WHERE locktype" + sqlEq + "'advisory' AND pid" + sqlEq + "pg_catalog.pg_backend_pid()) THEN 'a session advisory lock' END, " +
		"CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_class WHERE relnamespace" + sqlEq + "pg_catalog.pg_my_temp_schema()) THEN 'a temporary table' END), " +
		"EXISTS (SELECT FROM pg_catalog.pg_prepared_statements WHERE name" + sqlEq + quoteLiteral(unnamedStmtName) + "), " +
		"(SELECT pg_catalog.string_agg(name, ' ') FROM pg_catalog.pg_prepared_statements WHERE pg_catalog.left(name, 12)" + sqlEq + quoteLiteral(serverStmtPrefix) + "), " +
		loginRoleSQL(user) + "; " +
		"SELECT pg_catalog.set_config(" + quoteLiteral(tok) + ", " + quoteLiteral(poolPlaceholder) + ", false), pg_catalog.set_config(" +
		quoteLiteral(lock) + ", " + quoteLiteral(poolPlaceholder) + ", false)"
}

// startPooled answers the startup of a client the proxy authenticated (auth.go: authenticateClient; its user
// and database choose the pool) in transaction mode and serves the session.
func (s *Server) startPooled(ss *session, login *clientLogin) (parked bool) {
	if v, ok := ss.params["replication"]; ok && !replicationOff(v) {
		// A walsender takes no extended-protocol message and reads a Query as a replication command before
		// SQL: no token statement can go in front of what it runs, so it is not pooled.
		s.metrics.sessionRefused("replication")
		ss.fatalHint(sqlstateFeatureNotSupported, fmt.Sprintf("fenceproxy: a replication connection (replication=%s) cannot be pooled in pool.mode transaction", v), "",
			"Connect replication clients to PostgreSQL directly, or through a proxy with pool.mode: session.")
		return
	}
	// Pools, and pool.size, are per database as named. PostgreSQL cuts a name longer than maxName, so every
	// longer name that starts with a 63-byte database's name is that database: each would have its own pool
	// group and slots, as many server connections of one database as a client cares to spell.
	if db := ss.params["database"]; len(db) > maxName {
		s.metrics.sessionRefused("database_name")
		ss.fatalHint(sqlstateInvalidCatalogName, fmt.Sprintf("database name of %d bytes is too long", len(db)), "",
			fmt.Sprintf("PostgreSQL would connect to the database named by its first %d bytes", maxName))
		return
	}
	if ss.params["database"] == adminDatabase {
		s.serveAdmin(ss) // admin.go
		return
	}
	p, leave, ok := s.pools.join(ss, login) // pool.go: pool.max_clients
	if !ok {
		return false
	}
	handedOver := false // to runPooled, which gives the place back at the session's end
	defer func() {
		if !handedOver {
			leave()
		}
	}()
	reports, err := p.serverReports(s.poolSettings().MaxClientWait, login)
	if err != nil {
		ss.poolFailed(p, err)
		return
	}
	pl := &pooledState{pool: p, login: login, waitWake: make(chan struct{}, 1), replayed: make(chan struct{}, 1)}
	pl.waitWatch = lendWait{wake: pl.waitWake, stopped: ss.waitStopped}
	pl.settled.L = &pl.mu
	pl.beforeSend = ss.needReader
	tok, lock := s.cfg.Token.Setting, s.cfg.Token.LockSetting
	pl.token, pl.lock = startupValue(ss.params, tok), startupValue(ss.params, lock)
	pl.resetToken, pl.resetLock = pl.token, pl.lock
	pl.settings = startupSettings(ss.params)
	ss.pooled = pl
	ss.ownPrep.max = 0 // session.prep, off until the first lend gives it the server connection's

	// The client's socket is read and written with raw system calls from here on (rawsocket_linux.go): since
	// its first byte (negotiate), or, after TLS, from now, the bytes it sent that are buffered already first.
	if ss.clientIO == nil {
		pending, _ := ss.cr.r.Peek(ss.cr.r.Buffered())
		clientIO := rawIO(ss.client, bytes.Clone(pending))
		ss.cr.r.Reset(clientIO) // the same buffer: what it held is in clientIO's pending bytes
		ss.clientOut.out = clientIO
	}
	out := ss.cw
	// AuthenticationOk and, below, ReadyForQuery from constants: a []byte literal given to writeMsg (an
	// interface's Write) is an allocation each.
	writeHeader(out, msgAuthentication, 8)
	writeUint32(out, authOK)
	// The server's parameters, application_name the client's: a list the pool's clients that see the same
	// share (txPool.clientParams), which noting each value again leaves shared.
	app, hasApp := ss.params["application_name"]
	ss.state.serverParams, ss.state.sharedParams = p.clientParams(reports, app, hasApp), true
	for _, r := range ss.state.serverParams {
		ss.noteParamValue(r.name, r.value)
		writeParamStatus(out, r.name, r.value)
	}
	s.registerPooledKey(ss)
	writeMsg(out, msgBackendKeyData, ss.clientKey, "")
	writeHeader(out, msgReadyForQuery, 5)
	out.WriteByte(txIdle)
	if err := out.Flush(); err != nil {
		s.unregister(ss)
		return
	}
	ss.client.SetDeadline(time.Time{})
	ss.state.txStatus.Store(uint32(txIdle))
	ss.state.ready.Store(true)

	s.register(ss)
	s.metrics.sessionStarted()
	ss.logConnected(false)
	handedOver, pl.leave = true, leave
	return ss.runPooled()
}

// runPooled relays a pooled session until it ends, or parks (true: the session waits in the parker with no
// goroutine, and belongs to whoever resumes it; the caller must not touch it).
func (ss *session) runPooled() (parked bool) {
	s, pl := ss.srv, ss.pooled
	defer func() {
		if !parked {
			s.metrics.sessionEnded()
			s.unregister(ss)
			pl.leave()
		}
	}()
	for {
		end := ss.relayPooled()
		if end.why == endParked {
			if ss.park() {
				return true
			}
			continue
		}
		ss.endPooled(end)
		ss.logDisconnected()
		// Nothing uses the client's buffers any more: endPooled closed the client, and no lend's server side
		// (serveLend, which writes to the client) is left once serving is done.
		pl.serving.Wait()
		s.bufs.put(ss.cr.r, ss.cw)
		return false
	}
}

// parkable reports whether the session may park now (relayPooled, at a message boundary): no server connection
// lent, nothing of the client's read and not handled, nothing buffered for it, no transaction or batch open, a
// plain socket (a TLS connection may hold bytes it decrypted that the socket no longer shows), and no drain.
//
// The client's writer is looked at under mu, once no connection is lent: a lend's server side (serveLend) writes
// to it without the session goroutine, up to the settle that gives the connection back under mu, so a look
// before the lock raced with its writes (the race detector: TestParkAttackSpeakingWhileParking).
func (ss *session) parkable() bool {
	pl := ss.pooled
	if ss.srv.pools.parker == nil || ss.srv.draining.Load() || ss.cr.r.Buffered() > 0 {
		return false
	}
	if _, ok := parkableSocket(ss.clientIO); !ok {
		return false
	}
	pl.mu.Lock()
	ss.applyCopyStarts()
	idle := pl.sc == nil && pl.open == 0 && !ss.state.unsynced.Load() && byte(ss.state.txStatus.Load()) == txIdle && !pl.inline &&
		ss.cw.Buffered() == 0
	pl.mu.Unlock()
	return idle
}

// park gives the session to the parker: its buffers are dropped, its goroutine returns (true). False
// when the parker would not take it, or a stronger interrupt than the sweep's came meanwhile: the session is
// served on (its buffers back).
func (ss *session) park() bool {
	s, pl := ss.srv, ss.pooled
	pl.serving.Wait() // no lend's server side left (none is, with no connection lent): nothing writes to the client
	fd, ok := parkableSocket(ss.clientIO)
	// Nothing for the client is dropped with the buffers: looked at again after the wait, which orders this look
	// after every write of the lends' server sides.
	if !ok || ss.cw.Buffered() > 0 || ss.clientIntr.reason() > intrPark {
		ss.clientIntr.dropPark()
		return false
	}
	ss.clientIntr.dropPark()
	// The buffers are dropped, not kept for other sessions (bufs): a parked client's memory is to be given back
	// (parker.sweep), and a kept buffer outlives two collections.
	ss.cr.r, ss.cw, ss.cr.buf = nil, nil, nil
	pl.cache = nil // made again at its first use (caches): nothing the next message needs is in it
	ss.portalsParked()
	if s.pools.parker.park(ss, fd) {
		return true
	}
	ss.unpark()
	return false
}

// unpark gives a session that parked, or was about to, its buffers again.
func (ss *session) unpark() {
	ss.cr.r = ss.srv.bufs.reader(ss.clientIO)
	ss.cw = ss.srv.bufs.writer(&ss.clientOut)
}

// replicationOff reports whether PostgreSQL reads the startup parameter replication's value v as no
// replication (parse_bool's spellings of false: an unambiguous prefix of false, no or off, or 0). Every other
// value is a walsender (true, database) or refused by the server.
func replicationOff(v string) bool {
	v = strings.ToLower(v)
	return v == "0" || v != "" && (strings.HasPrefix("false", v) || strings.HasPrefix("no", v)) || len(v) >= 2 && strings.HasPrefix("off", v)
}

// registerPooledKey gives the client a BackendKeyData of the proxy's own, a random PID and secret that no other
// live session's client holds (registerKey). A CancelRequest with it reaches the server connection lent to the
// client (cancelPooled).
func (s *Server) registerPooledKey(ss *session) {
	s.registerKey(ss, 0, 4)
}

// startupValue is the value a setting gets from a client's startup packet (a parameter of its own, or -c in
// options, which wins as in PostgreSQL), or nil.
func startupValue(params map[string]string, setting string) *string {
	var v *string
	if o, ok := optionSetting(params["options"], setting); ok {
		found := o
		v = &found
	}
	// A parameter of its own wins: PostgreSQL applies the options first, then the other parameters
	// (process_startup_options). There is at most one (checkStartupToken refuses two spellings of the name).
	for k, val := range params {
		if k != "options" && strings.EqualFold(k, setting) {
			found := val // only a match escapes: the address of val would cost every parameter an allocation
			v = &found
		}
	}
	return v
}

// poolFailed answers a client whose pool could not lend it a server connection.
func (ss *session) poolFailed(p *txPool, err error) {
	ss.fatal(poolError(p, err))
}

// poolError is the FATAL for a failed lend: 53300 when the pool stayed full or paused, the server's own error
// when it refused the login, 08006 when no server connection could be opened.
func poolError(p *txPool, err error) (code, msg, detail string) {
	if errors.Is(err, errPoolPaused) {
		p.srv.metrics.poolTimedOut()
		return sqlstateTooManyConnections, fmt.Sprintf("pool %s stayed paused (PAUSE) for pool.max_client_wait (%v)", p.name, p.srv.poolSettings().MaxClientWait), "An operator paused the pool from the admin console; RESUME ends the pause."
	}
	if errors.Is(err, errPoolTimeout) {
		p.srv.metrics.poolTimedOut()
		return sqlstateTooManyConnections, fmt.Sprintf("no server connection of pool %s became free within pool.max_client_wait (%v)", p.name, p.srv.poolSettings().MaxClientWait), fmt.Sprintf("The pool holds at most %d server connections (pool.size); each is lent to a client until its transaction ends, so a client idle in a transaction keeps its own (SHOW CLIENTS).", p.srv.poolSettings().Size)
	}
	var refused *upstreamRefused
	if errors.As(err, &refused) {
		// The server refused the login (28P01 after a refresh of the secrets: pool.go dial), or the pool did
		// (loginRoleRefusal): its own words.
		return errorField(refused.body, fieldCode), errorField(refused.body, fieldMessage), errorField(refused.body, fieldDetail)
	}
	p.srv.metrics.upstreamError()
	return sqlstateConnectionFailure, fmt.Sprintf("fenceproxy could not open a server connection for pool %s", p.name), err.Error()
}

// ignoredBetweenUnits reports whether PostgreSQL takes a client message of type typ that starts nothing
// (unitStart false) while no transaction or batch is open, doing nothing: the COPY messages outside a COPY and
// a Flush. The pool drops those when no server connection is lent; any other ends the session (forwardPooled).
func ignoredBetweenUnits(typ byte) bool {
	switch typ {
	case msgCopyData, msgCopyDone, msgCopyFail, msgFlush:
		return true
	}
	return false
}

// unitStart reports whether a client message of type typ starts something the server answers with
// ReadyForQuery on its own: where a transaction may begin.
func (ss *session) unitStart(typ byte) bool {
	switch typ {
	case msgQuery, msgFunctionCall:
		return true
	case msgParse, msgBind, msgDescribe, msgExecute, msgClose, msgSync:
		return !ss.state.unsynced.Load()
	}
	return false // a Flush starts nothing (forwardPooled)
}

// relayPooled relays the client's messages until the session ends.
func (ss *session) relayPooled() ending {
	cr := &ss.cr
	pl := ss.pooled
	for {
		switch ss.clientIntr.reason() {
		case intrNone:
		case intrDrain:
			pl.mu.Lock()
			ss.applyCopyStarts()
			idle := pl.sc == nil || pl.open == 0 && !ss.state.unsynced.Load() && byte(ss.state.txStatus.Load()) == txIdle
			pl.mu.Unlock()
			if idle && cr.r.Buffered() == 0 && !inputWaiting(ss.client) {
				return ending{why: endDrained}
			}
			ss.clientIntr.lift() // looked at again when the lend ends
		case intrPark: // the parker's sweep saw the client idle here
			if ss.parkable() {
				return ending{why: endParked}
			}
			ss.clientIntr.dropPark()
			continue // a stronger reason raised meanwhile is looked at first
		default: // intrPeerEnded: the lend ended badly (pl.lost)
			return ending{why: endUpstreamGone, atBoundary: true}
		}
		pl.turns.Add(1) // odd: waiting at a message boundary (parker.sweep)
		typ, _, err := cr.next()
		pl.turns.Add(1)
		if err != nil {
			if ss.clientIntr.caught(err) != intrNone {
				continue
			}
			return ss.clientEnding(err)
		}
		if typ == msgTerminate {
			return ending{why: endTerminate, atBoundary: true}
		}
		if !frontendType(typ) { // protocol.go
			// PostgreSQL ends the session at once, whatever it is doing (SocketBackend, before a failed batch's
			// skip), and so does the pool, before any path below reads or drops the message's body.
			return ss.clientEnding(fmt.Errorf("%w: invalid frontend message type %q", errProtocol, typ))
		}
		var body []byte
		switch {
		case typ == msgQuery, typ == msgParse, typ == msgBind, typ == msgDescribe, typ == msgClose,
			typ == msgExecute && ss.portalsStale(), ss.clientNeedsBody(typ, ss.srv.currentPlanner()):
			if body, err = cr.body(); err != nil {
				return ss.clientEnding(err)
			}
		}
		if err := ss.forwardPooled(typ, body); err != nil {
			switch {
			case errors.Is(err, errLendLost):
				return ending{why: endUpstreamGone, atBoundary: true}
			case errors.Is(err, errWaitDrained):
				return ending{why: endDrained, atBoundary: true}
			}
			return ss.clientEnding(err)
		}
		cr.release()
		if pl.inline { // set by forwardPooled, in this goroutine
			ss.answerInline()
		}
	}
}

// refuseInsideBatch ends the session of a client that sent a Query or FunctionCall (typ) inside an
// extended-protocol batch, before its Sync (pl.mu held). PostgreSQL answers it with a ReadyForQuery of its own,
// unless a message of the batch before it failed: then it skips it, unanswered, up to the Sync. Which of the two
// the proxy cannot tell when it must decide whether the lend ends at the next ReadyForQuery; counting on the one
// that did not come held the client's server connection for ever, and a handful of such clients the whole pool.
// No driver sends this (libpq's pipeline mode, pgx, JDBC send a Sync first); the session ends with FATAL 0A000,
// and its server connection, the batch's transaction in it, is closed.
func (ss *session) refuseInsideBatch(typ byte) error {
	pl := ss.pooled
	if sc := pl.sc; sc != nil {
		pl.setLent(nil)
		sc.pool.discard(sc)
	}
	what := "a Query"
	if typ == msgFunctionCall {
		what = "a FunctionCall"
	}
	pl.lost = errors.New("message inside an extended-protocol batch")
	pl.fare = errorResponse("FATAL", sqlstateFeatureNotSupported,
		"fenceproxy: "+what+" inside an extended-protocol batch (before its Sync) is not supported in transaction pooling", "",
		"Send Sync before a simple Query, or use pool.mode: session.")
	return errLendLost
}

// errLendLost: the lent server connection failed, or the pool could not lend one; pl.fare says why.
var errLendLost = errors.New("server connection lost")

// copyEndsState is pooledState.copyEnds.
type copyEndsState uint8

const (
	copyEndsNone copyEndsState = iota // no COPY can be in progress: a COPY end is ignored by the server
	copyEndsOne                       // after an Execute that may start a COPY: the next end may be its
	copyEndsAny                       // after a Query that may start COPYs: every end may be one's
)

// copyRun is a client's Query, or Execute of a portal, that may start a COPY (pooledState.copyRuns).
type copyRun struct {
	exec    int64 // the Execute's place among the client's Executes (execsSent after it); 0 for a Query
	syncs   int   // copySyncsSent when it went
	ends    []int // copySyncsSent at each COPY end the client sent after it that may be a COPY's (copyEnds)
	started int   // its COPYs started so far (a Query's: the n-th takes the n-th end)
	// data is copySyncsSent at the first CopyData sent after an Execute's, before its end; -1 when none.
	// A Sync sent after it, before the end, is one a COPY that fails on a row (before it reads that Sync)
	// answers, and one it ignores otherwise (copyAmbiguous).
	data int
}

// execsFailed is execsDone after an ErrorResponse: the server skips every Execute up to the batch's Sync.
const execsFailed = 1 << 40

// errClientLeftWaiting: the client left (its socket closed, or the session was forced out) while the session
// goroutine waited on the server side: for the answer to an earlier message of the client's (awaitSettled), or
// to a unit of the proxy's own sent before the client's message (awaitReplayed).
// errCancelledAtEnd ends a lend's server side once the session's end cancelled what the server ran
// (pooledState.cancelledAtEnd).
var errCancelledAtEnd = errors.New("the session ended: the server's answers from here are to the proxy's cancel")

var errClientLeftWaiting = errors.New("the client left while the session waited for the server's answer")

// awaitSettled waits on settled while more reports true (pl.mu held, and released while it waits), unless the
// client leaves first (watchClient): then it reports errClientLeftWaiting, and the session ends as for a
// client that leaves mid-transaction (endPooled: what the server runs is cancelled, the connection closed, the
// slot freed).
func (ss *session) awaitSettled(more func() bool, grace time.Duration) error {
	pl := ss.pooled
	if !more() {
		return nil
	}
	// The Broadcast under mu: the wait looks at gone and waits again without letting mu go between the two.
	w := ss.watchClient(func() {
		pl.mu.Lock()
		pl.settled.Broadcast()
		pl.mu.Unlock()
	}, grace)
	defer w.end()
	for more() {
		if w.gone.Load() {
			return errClientLeftWaiting
		}
		pl.settled.Wait()
		ss.applyCopyStarts()
	}
	return nil
}

// forwardPooled forwards one client message (body nil: streamed from the reader), lending the client a server
// connection first when the message may start a transaction.
func (ss *session) forwardPooled(typ byte, body []byte) error {
	pl := ss.pooled
	st := &ss.state
	pl.mu.Lock()
	defer pl.mu.Unlock()
	ss.portalsBatch(typ) // reloadkept.go
	if st.pending.Load() == 0 && !st.unsynced.Load() {
		pl.ranUnsettled = false // everything sent is answered: the reported reading settings are the server's
	}
	if typ == msgQuery || typ == msgExecute || typ == msgFunctionCall {
		pl.ranUnsettled = true
	}
	ss.applyCopyStarts()
	if pl.skipToSync {
		return ss.skipCancelledBatch(typ, body)
	}
	// Before any path below sends it (a COPY's data, a Bind or Describe as it is): the core's rule, where the
	// core does not see the message.
	if err := ss.fencedTxRefused(typ); err != nil {
		return err
	}
	ss.fixAfterFailedBatch()
	if (typ == msgQuery || typ == msgFunctionCall) && st.unsynced.Load() {
		return ss.refuseInsideBatch(typ)
	}
	if pl.copyIn && pl.sc != nil {
		return ss.forwardCopyIn(typ, body)
	}
	if typ == msgFlush && !st.unsynced.Load() && ss.cr.n != 0 {
		// A Flush has no body: PostgreSQL fails one that has (invalid message format). Outside a batch the pool
		// sends a Flush on as it is or drops it (below), neither of which would say so: the session ends.
		return fmt.Errorf("%w: Flush message with a body of %d bytes", errProtocol, ss.cr.n)
	}
	if typ == msgFlush && !st.unsynced.Load() && pl.sc != nil {
		// Outside a batch a Flush runs nothing and starts nothing (unitStart): to the lent connection as it is,
		// not through the core, for which it is a batch's message (the next Query would be one inside a batch:
		// refuseInsideBatch). With no connection lent it is dropped below, as CopyData outside COPY is.
		return ss.forwardAsIs(typ, nil)
	}
	if ss.unitStart(typ) {
		if pl.sc != nil && pl.open > 0 {
			// What the client sent before is answered first (the next transaction's token statement depends on
			// how it ends): send it on, though the client's next messages are already here.
			ss.countRelayed(dirClientToServer, &ss.cr)
			pl.sc.w.Flush()
			ss.needReader()         // the answers come first: something must read them
			ss.sendDeferredCancel() // a cancel that came during checkFirst's wait: that statement is out now
		}
		if err := ss.awaitSettled(func() bool {
			return pl.sc != nil && pl.open > 0 && pl.lost == nil && !pl.copyIn && ss.unitStart(typ)
		}, 0); err != nil {
			return err
		}
		if pl.lost != nil {
			return errLendLost
		}
		if pl.copyIn && pl.sc != nil { // behind a COPY that started meanwhile: the server reads it in the copy
			return ss.forwardCopyIn(typ, body)
		}
	}
	// Asked again: a COPY run by an Execute that started meanwhile makes the message its batch's (copyStarted).
	if ss.unitStart(typ) {
		ss.fixAfterFailedBatch() // the unit waited for may have failed
		if err := ss.heldMoved(); err != nil {
			return err
		}
		if pl.chainDue && pl.sc != nil && byte(st.txStatus.Load()) == txBlock {
			pl.chainDue = false
			if err := ss.chainTokens(); err != nil {
				return err
			}
		}
		pl.chainDue = false
		if pl.sc == nil {
			if err := ss.lend(); err != nil {
				if errors.Is(err, errWaitCancelled) {
					return ss.answerCancelledWait(typ, body)
				}
				return err
			}
			ss.closeLastUnnamed(typ, body)
		}
		if sendTokenStmt && byte(st.txStatus.Load()) == txIdle {
			ss.replaySettings() // pooledsettings.go
			prefix := ss.injectTokens(typ, body)
			// The transaction's token is now the client's: a Query's rewrite may carry it (inlineToken).
			pl.tokenInForce = ""
			if prefix != prefixNone && pl.token != nil {
				if _, ok := rewrite.ValidToken(*pl.token); ok {
					pl.tokenInForce = *pl.token
				}
			}
			if err := ss.checkFirst(typ, body, prefix); err != nil { // pooledsettings.go
				return err
			}
		}
	} else if pl.sc == nil {
		if pl.lost != nil {
			return errLendLost
		}
		if !ignoredBetweenUnits(typ) {
			// PostgreSQL ends the session at any other message here (invalid frontend message type): so does
			// the proxy, before reading a body whose length may be the bytes of what comes next (a second
			// StartupMessage or an SSLRequest read as a message of type 0), which it swallowed unseen.
			return fmt.Errorf("%w: message type %q between transactions", errProtocol, typ)
		}
		if body == nil { // the server ignores them: read and dropped
			_, err := ss.cr.body()
			return err
		}
		return nil
	}
	sc := pl.sc
	tokenAfter := false // the token statement goes right after this message
	if pl.windowOpen.Load() {
		if typ == msgExecute && body == nil {
			var err error
			if body, err = ss.cr.body(); err != nil { // which portal it runs decides where the token statement goes
				return err
			}
		}
		switch answers, ok := ss.answersTo(typ, body); {
		case typ == msgSync:
			pl.windowOpen.Store(false) // nothing was executed: nothing ran
		case typ == msgExecute && ss.executesBegin(body):
			pl.windowAnswers += answers
			tokenAfter = true
		case ok && typ != msgExecute:
			pl.windowAnswers += answers
		default:
			// A statement other than the BEGIN would run before the token statement: it goes now (the BEGIN,
			// if it still comes, then fails 25001, as after any statement).
			ss.closeWindow()
		}
	}
	if pl.tokenPortalLeft {
		ss.closeTokenPortalBefore(typ, body)
	}
	var text []byte // a Query's or Parse's text; nil for other messages, or one that is malformed
	if body != nil && (typ == msgQuery || typ == msgParse) {
		text, _ = planText(typ, body)
	}
	// words is the client's text whose words say what the message may run: a Query's or Parse's own, or, for a
	// Bind, the statement's it binds (parsed maybe in an earlier transaction, and run again here: what it may
	// leave is read back at this transaction's end too, as a bound set_config of the token at session level).
	words := text
	if typ == msgBind && body != nil {
		words, _ = ss.boundClientText(body)
	}
	var wordsClass textClass // words' class; the zero class when words is nil
	if words != nil {
		wordsClass = ss.classOf(words)
	}
	if wordsClass.Chain || wordsClass.ChainsLast {
		// settle: the chained transaction, if it started (the unit ends in a block), gets the client's values;
		// also after a BEGIN earlier in the Query or batch.
		pl.chainPending = true
	}
	leaves := wordsClass.leaves
	if leaves {
		pl.probe.Store(true)
	}
	if e := wordsClass.effects; e != (rewrite.SessionEffects{}) {
		// What the text may do to the token, lock and application_name at session level (textclass.go): how the
		// probe reads a reset value at the transaction's end. It looks also after a DO block, whose SET has no
		// tag of its own. A Query's statements run in order, after the texts before it (Then).
		pl.probe.Store(true)
		if typ != msgQuery {
			// A Parse's or Bind's text runs at an Execute, maybe later, maybe again, maybe not: in no known order,
			// also after a Query sent later (a portal a row limit suspended runs again at the next Execute).
			e = e.Later()
		}
		pl.probeEffects = pl.probeEffects.Then(e)
	}
	if wordsClass.undoes {
		pl.mayUndo = true
	}
	if text != nil {
		ss.noteCustomSettings(text) // pooledsettings.go
	}
	switch typ {
	case msgQuery, msgSync, msgFunctionCall:
		pl.open++
		pl.stmts.unitSent()
	}
	switch typ {
	case msgQuery, msgExecute:
		pl.runByExecute = typ == msgExecute
		if typ == msgQuery {
			// Sent only once everything before it is answered (or into a COPY: forwardCopyIn), so no run before
			// it has a COPY still to start.
			pl.copyRuns = pl.copyRuns[:0]
			pl.copyEnds = copyEndsNone
			if text == nil || wordsClass.copies {
				pl.copyEnds = copyEndsAny
				pl.copyRuns = append(pl.copyRuns, copyRun{syncs: pl.copySyncsSent, data: -1})
			}
			delete(pl.copyPortals, "") // a Query replaces the unnamed portal
			break
		}
		pl.execsSent++
		pl.copyEnds = copyEndsNone
		if len(pl.copyPortals) > 0 {
			if body == nil { // read only when a portal may run a COPY: which one it runs decides
				var err error
				if body, err = ss.cr.body(); err != nil {
					return err
				}
			}
			portal, _, ok := cutNul(body)
			if _, copies := pl.copyPortals[string(portal)]; copies || !ok {
				pl.copyEnds = copyEndsOne
				pl.copyRuns = append(pl.copyRuns, copyRun{exec: pl.execsSent, syncs: pl.copySyncsSent, data: -1})
			}
		}
	case msgBind:
		// A portal bound from a text that may start a COPY, or from one the proxy does not know, may run one.
		if portal, _, ok := cutNul(body); !ok || words == nil || wordsClass.copies {
			if pl.copyPortals == nil {
				pl.copyPortals = make(map[string]struct{})
			}
			pl.copyPortals[string(portal)] = struct{}{}
		} else if len(portal) == 0 {
			// The unnamed portal is replaced. A named one that exists stays as it was (the Bind fails, 42P03).
			delete(pl.copyPortals, "")
		}
	case msgSync:
		pl.copySyncsSent++
	case msgCopyData:
		if n := len(pl.copyRuns); n > 0 && pl.copyEnds == copyEndsOne && pl.copyRuns[n-1].exec == pl.execsSent && pl.copyRuns[n-1].data < 0 {
			pl.copyRuns[n-1].data = pl.copySyncsSent
		}
	case msgCopyDone, msgCopyFail:
		// Sent before its COPY's CopyInResponse came (pipelined), or, where no COPY can be in progress, ignored
		// by the server and by the count (copyEnds). Where one may be, the end is the last run's: whether it ends
		// a COPY the server's answer to that run says (applyCopyStart).
		pl.noteCopyEnd()
		if pl.copyEnds == copyEndsOne {
			pl.copyEnds = copyEndsNone
		}
	}
	if typ == msgQuery {
		pl.dropUnnamed() // a simple Query drops the unnamed statement, here as directly
		pl.queryDroppedUnnamed(sc)
	}
	if typ == msgFunctionCall {
		pl.probe.Store(true) // a fastpath call may take an advisory lock
	}
	pl.plan = ss.srv.plannerNow()
	p := pl.plan.p
	if err := ss.portalsPooled(typ, body); err != nil { // reloadkept.go: a portal runs as fenced at its Bind
		return err
	}
	ss.inlined = false
	ss.followTokenInForce(typ, body, wordsClass)
	defer func() { ss.inlineToken = "" }()
	var err error
	switch {
	case typ == msgQuery && body != nil && mentionsSQLPrepared(body):
		err = ss.querySQLPrepared(body, p) // pooledsqlprep.go
	case body != nil && p == nil && (typ == msgQuery || typ == msgParse):
		// No fencing: the core would not read it; the prefix, if any, still goes first.
		if typ == msgQuery {
			st.pending.Add(1)
			writeQueryMsg(sc.w, ss.takeQueryPrefix(sc.w), body, "")
		} else if len(body) > 0 && body[0] != 0 {
			err = ss.parseNamed(body, nil)
		} else {
			err = ss.parseUnnamed(body, nil)
		}
	case typ == msgParse && body != nil && len(body) > 0 && body[0] != 0:
		err = ss.parseNamed(body, p) // pooledstmts.go
	case body != nil && (typ == msgBind || typ == msgDescribe || typ == msgClose) && ss.renamedOut(typ, body):
	case body != nil && typ == msgParse:
		err = ss.parseUnnamed(body, p) // pooledstmts.go
	case body != nil && typ == msgClose:
		var undo *unnamedUndo
		out := body
		if namesUnnamedStmt(typ, body) {
			u := pl.unnamedChange(false)
			undo = &u
			pl.dropUnnamed()
			out, sc.clientUnnamed = unnamedStmtRef, false
		}
		err = ss.onClientMsg(typ, out, p, sc.w)
		if undo != nil {
			undo.ver = pl.unnamedVer
			pl.stmts.sentUnnamed(msgCloseComplete, *undo)
		} else {
			pl.stmts.sent(msgCloseComplete, false)
		}
	case body != nil && (typ == msgBind || typ == msgDescribe):
		if namesUnnamedStmt(typ, body) {
			ss.placeUnnamed(p, typ == msgBind && body[0] != 0) // a named portal may run under a later token
		}
		st.unsynced.Store(true) // the unnamed statement (unnamedStmtName on the server), a portal: as they are
		if !pl.unnamedOut(typ, body) {
			writeMsg(sc.w, typ, body, "")
		}
	case body != nil && typ == msgExecute: // read to see its portal (windowOpen): the core writes none
		if err = ss.onClientMsg(typ, body, p, sc.w); err == nil {
			writeMsg(sc.w, typ, body, "")
		}
	case body != nil:
		err = ss.onClientMsg(typ, body, p, sc.w)
	default:
		if err = ss.onClientMsg(typ, nil, p, sc.w); err == nil {
			err = ss.cr.forward(sc.w)
		}
	}
	// Whichever path above sent it, after it went (a Query's own fenced statement may still be sent as EXECUTE):
	// a text that may drop prepared statements makes the connection's prepared fences forgotten, swept at the
	// next idle point (with a planner every path above went through the core, which looked: queryOut, parseOut);
	// and every message but a bare BEGIN may run code of the client's on the connection (the core counts only
	// some), so they are not EXECUTEd again until a verification sent after it comes back clean (prepared.go).
	if text != nil && p == nil {
		ss.prep.clientText(text)
	}
	ss.prep.clientRan(typ, body)
	if err != nil {
		return err
	}
	if pl.syncOwed {
		// The token statement went right before the Query (procedureAlone): this Sync ends its batch, after the
		// Query, whose transaction it is in.
		pl.syncOwed = false
		writeMsg(sc.w, msgSync, []byte{}, "")
	}
	if typ == msgBind && wordsClass.dropsStmts {
		// Run, it may drop unnamedStmtName: a Bind or Describe of the unnamed statement after it in the batch
		// gets the statement parsed again first (placeUnnamed), as the server still has it directly.
		pl.unnamedReplaced()
	}
	switch typ {
	case msgParse, msgBind, msgDescribe, msgExecute, msgClose, msgFlush:
		n := -1 // a Describe streamed unread
		if body != nil || typ != msgDescribe {
			n = answersOf(typ, body)
		}
		pl.stmts.sentAnswer(n) // pooledstmts.go: where an error of the batch falls
	}
	if tokenAfter {
		// The BEGIN with transaction modes is in: the token statement goes next, its answers hidden after the
		// BEGIN's.
		ss.closeWindow()
	}
	if !ss.cr.nextBuffered() {
		// All the client sent is one unit, answered up to the next ReadyForQuery, and nothing reads the
		// connection yet: relayPooled reads the answer (answerInline), so the flush starts no serveLend.
		pl.inline = !pl.reading && pl.open == 1 && !st.unsynced.Load() && pl.pin == ""
		ss.countRelayed(dirClientToServer, &ss.cr)
		// answerInline reads next, with a deadline: the bytes go from inside its first read (holdWrites), which
		// then waits for the answer without an empty read first.
		hold := pl.inline && sc.holder != nil
		if hold {
			sc.holder.holdWrites(true)
		}
		err := sc.w.Flush()
		if hold {
			sc.holder.holdWrites(false)
		}
		if err != nil {
			return nil // the lend's server side (or answerInline) sees the connection fail and ends the session
		}
		ss.sendDeferredCancel() // a cancel that came during checkFirst's wait: the client's statement is out now
	}
	return nil
}

// forwardCopyIn forwards a client message (body, if read already) while the lent connection reads a COPY's
// data (pl.mu held, copyIn). A Sync or Flush there is ignored by the server: it neither starts nor ends a
// unit, nor waits for one; any other message but the data fails there, as directly (a Query: 08P01). A
// CopyDone or CopyFail ends the copy; after a COPY run by an Execute the server then goes on with the batch
// (copyStarted marked it unsynced), up to the Sync that ends it, which counts as a batch's Sync does.
//
// Once the server failed the COPY (a bad row) it runs what follows as any message, so nothing goes as it is that
// could run: the COPY's data and end, a Flush and a Sync go as they are (a Sync the server ignores there, or,
// once the COPY failed, answers: copyAmbiguous); a Query goes through the core, fenced as any Query (while the
// COPY runs the server fails on it, 08P01, as directly); any other message (a Parse, Bind, Execute, ..., which
// names statements and portals the pool renames) ends the session before it reaches the server. Sent as they
// were, a Query or a Parse, Bind, Execute and Sync behind a bad row wrote a protected table unfenced, without a
// token and with its token column forged (TestPooledWriteBehindFailedCopyIsFenced).
func (ss *session) forwardCopyIn(typ byte, body []byte) error {
	pl := ss.pooled
	switch typ {
	case msgCopyDone, msgCopyFail:
		pl.copyIn = false
		if n := len(pl.copyRuns); n > 0 && pl.copyRuns[n-1].exec == 0 && pl.copyEnds == copyEndsAny {
			// A Query's COPY: the next COPY of the same Query, if any, takes the next end.
			pl.copyRuns[n-1].ends = append(pl.copyRuns[n-1].ends, pl.copySyncsSent)
		}
		if pl.copyEnds == copyEndsOne {
			pl.copyEnds = copyEndsNone // an Execute runs one COPY: a later end is outside any
		}
	case msgCopyData, msgFlush:
	case msgSync:
		pl.copyAmbiguous = true
	case msgQuery:
		pl.copyAmbiguous = true
		if body == nil {
			var err error
			if body, err = ss.cr.body(); err != nil {
				return err
			}
		}
		body = ss.copyQuery(body)
	default:
		// A Parse, Bind, Execute, ... names statements and portals the pool renames, and its answers could not be
		// told from a running COPY's; no driver sends one there.
		return &sessionRefused{code: sqlstateProtocolViolation,
			msg:  fmt.Sprintf("fenceproxy: message type %q sent during a COPY FROM STDIN's data is not supported in transaction pooling", typ),
			hint: "End a COPY with CopyDone or CopyFail before the next message, or use pool.mode: session."}
	}
	return ss.forwardAsIs(typ, body)
}

// copyQuery is the body of a client's Query sent while the server reads a COPY's data (forwardCopyIn), as the
// server may run it (once the COPY failed on a bad row, it runs a Query as any other): fenced by the core as any
// Query, with no token statement in front (it starts no transaction of the pool's: a fenced write meets the
// connection's placeholder, 55F03), unless it may name SQL-level prepared statements, which cannot be mapped
// there (an unmapped EXECUTE could run the proxy's own statements), or the core does not fence it: then a Query
// of the proxy's refusal (55F04). Before 2026-12-05 it went as the client sent it, and a write to a protected
// table behind a bad row landed unfenced (TestPooledStatementIntoCopyNeverRaw,
// TestPooledWriteBehindFailedCopyIsFenced).
func (ss *session) copyQuery(body []byte) []byte {
	if p := ss.srv.currentPlanner(); p != nil && !mentionsSQLPrepared(body) {
		var fenced bytes.Buffer
		prefix, token, sqlOnly := ss.queryPrefix, ss.queryToken, ss.sqlOnly
		// No prefix or token statement of a transaction's start; no prepared fence's EXECUTE.
		ss.queryPrefix, ss.queryToken, ss.sqlOnly = "", tokenNone, true
		err := ss.queryOut(&fenced, p, body, ss.readingSettings(), true)
		ss.queryPrefix, ss.queryToken, ss.sqlOnly = prefix, token, sqlOnly
		if msg := fenced.Bytes(); err == nil && len(msg) > headerLen && msg[0] == msgQuery {
			return bytes.Clone(msg[headerLen:])
		}
	}
	return append([]byte(ss.refusal(rewrite.Plan{Action: rewrite.Refuse, Code: sqlstateUnfenceable, Message: "unfenceable write: " +
		"a statement sent while the server reads a COPY's data cannot be fenced in transaction pooling; end the COPY with CopyDone or CopyFail first"})), 0)
}

// forwardAsIs forwards the client's message (typ, with body if relayPooled read it, else streamed) to the lent
// connection as it is (pl.mu held), and sends what is written when nothing more of the client's is buffered.
func (ss *session) forwardAsIs(typ byte, body []byte) error {
	pl := ss.pooled
	if body != nil {
		writeMsg(pl.sc.w, typ, body, "")
	} else if err := ss.cr.forward(pl.sc.w); err != nil {
		return err
	}
	ss.sendIfLast()
	return nil
}

// sendIfLast sends what is written to the lent connection when nothing more of the client's is buffered (pl.mu
// held).
func (ss *session) sendIfLast() {
	if !ss.cr.nextBuffered() {
		ss.countRelayed(dirClientToServer, &ss.cr)
		ss.pooled.sc.w.Flush() // a failure: the lend's server side sees the connection fail and ends the session
	}
}

// copyStarted records a CopyInResponse relayed to the client (the lend's server side): the server reads the
// COPY's data now, and ignores the Syncs the client sent after the Query or Execute that started it. It never
// waits for pl.mu: the session goroutine may hold it in a write to the server that waits for the server to
// read, and the server, past the COPY's end the client pipelined, for this side to read its answers (a client
// that pipelined a COPY and statements with much output behind it: TestPooledClientLeavesAPipelinedCopy).
// The bookkeeping is done here when mu is free, else by whoever holds it next (applyCopyStarts): the session
// goroutine before it looks at its next message, settle before it decides at the next ReadyForQuery. Either
// way it lands between two of the client's messages, as when this side waited for mu. A goroutine takes mu
// when it is busy, so that a session goroutine about to wait for settled is woken once it waits.
func (ss *session) copyStarted() {
	pl := ss.pooled
	pl.copyStartsMu.Lock()
	pl.copyStarts = append(pl.copyStarts, pl.execsDone.Load()+1)
	pl.anyStarts.Store(true)
	pl.copyStartsMu.Unlock()
	pl.lockedSoon(func() { ss.applyCopyStarts() })
}

// lockedSoon runs f under mu: now when mu is free, else from a goroutine once it is. For the lend's server
// side, which must never wait for mu (the session goroutine may hold it in a write to the server that waits
// for the server to read, and the server for this side to read its answers), when what f does may come late:
// whoever holds mu meanwhile sees its state as before f.
func (pl *pooledState) lockedSoon(f func()) {
	if pl.mu.TryLock() {
		f()
		pl.mu.Unlock()
		return
	}
	go func() {
		pl.mu.Lock()
		f()
		pl.mu.Unlock()
	}()
}

// applyCopyStarts does the bookkeeping of the CopyInResponses relayed since it last ran (copyStarts), in the
// order they came (pl.mu held), and wakes a message that waits for the unit before it (settled). It reports
// whether there were any.
func (ss *session) applyCopyStarts() bool {
	pl := ss.pooled
	if !pl.anyStarts.Load() {
		return false
	}
	pl.copyStartsMu.Lock()
	starts := pl.copyStarts
	pl.copyStarts = nil
	pl.anyStarts.Store(false)
	pl.copyStartsMu.Unlock()
	if len(starts) == 0 {
		return false
	}
	for _, exec := range starts {
		ss.applyCopyStart(exec)
	}
	pl.settled.Broadcast() // a message behind the COPY that waits for the unit before it looks again
	return true
}

// applyCopyStart is the bookkeeping of one CopyInResponse (pl.mu held), which answers the client's exec-th
// Execute if an Execute runs it: the Syncs sent between its statement and the end of its COPY are ignored by
// the server, and the server reads the COPY's data unless the client ended it already.
func (ss *session) applyCopyStart(exec int64) {
	pl := ss.pooled
	// The runs of the Executes before it: the server completed them before it started this COPY, so none started
	// one, and a COPY end sent after them was not a COPY's (the server ignored it).
	for len(pl.copyRuns) > 0 && pl.copyRuns[0].exec != 0 && pl.copyRuns[0].exec < exec {
		pl.copyRuns = pl.copyRuns[1:]
	}
	// Not the words' run (they did not see it coming): nothing ignored, and the COPY not ended, as far as the
	// pool knows; the count errs high, never low.
	ignored, ended, after, byExecute := 0, false, 0, pl.runByExecute
	if len(pl.copyRuns) > 0 && (pl.copyRuns[0].exec == 0 || pl.copyRuns[0].exec == exec) {
		r := &pl.copyRuns[0]
		from := r.syncs
		if r.started > 0 && r.started <= len(r.ends) {
			from = r.ends[r.started-1]
		}
		until := pl.copySyncsSent // the Syncs up to the COPY's end are ignored, if it runs to its end
		if r.started < len(r.ends) {
			until = r.ends[r.started]
			ended, after = true, pl.copySyncsSent-until
		}
		ignored = until - from
		if r.data >= 0 && until > r.data {
			// A Sync between its rows: answered if the COPY fails on a row before it, as forwardCopyIn's.
			pl.copyAmbiguous = true
		}
		r.started++
		byExecute = r.exec != 0
		if byExecute {
			pl.copyRuns = pl.copyRuns[1:] // an Execute runs one COPY
		}
	}
	if ignored > 0 { // ignored by the server: no ReadyForQuery comes for them
		pl.open -= ignored
		pl.stmts.unitsUnsent(ignored)
		ss.state.answered(int64(ignored))
	}
	pl.copyIn = !ended
	if byExecute && after == 0 {
		// The server is inside the COPY's batch until a Sync the client has still to send: not between units
		// (a message waiting to start one goes as the batch's; a cancel or a drain sees a statement running).
		ss.state.unsynced.Store(true)
	}
}

// noteCopyEnd records a COPY end the client sends outside a COPY the server is known to read (pl.mu held), as
// the end of the last run's COPY where one may be in progress (copyEnds): of a Query's, any end up to its
// answer; of an Execute's, the first end after it.
func (pl *pooledState) noteCopyEnd() {
	n := len(pl.copyRuns)
	if n == 0 {
		return
	}
	r := &pl.copyRuns[n-1]
	switch {
	case pl.copyEnds == copyEndsAny && r.exec == 0, pl.copyEnds == copyEndsOne && r.exec == pl.execsSent:
		r.ends = append(r.ends, pl.copySyncsSent)
	}
}

// resetCopyRuns forgets the runs and their counts (pl.mu held), once no statement sent is left to start a COPY:
// everything is answered, or nothing was sent yet on the connection (a lend). The lend's server side, which
// counts execsDone, is the caller or is not running.
func (pl *pooledState) resetCopyRuns() {
	pl.copyRuns, pl.copyEnds = pl.copyRuns[:0], copyEndsNone
	pl.copySyncsSent, pl.execsSent = 0, 0
	pl.execsDone.Store(0)
}

// lend takes a server connection from the pool for the client (pl.mu held) and starts its server side.
func (ss *session) lend() error {
	pl := ss.pooled
	pl.waitMu.Lock()
	pl.waiting = true
	pl.waitMu.Unlock()
	sc, err := pl.pool.acquire(ss.srv.poolSettings().MaxClientWait, pl.login, &pl.waitWatch)
	pl.waitMu.Lock()
	pl.waiting = false
	if err == nil {
		// What ended the wait may have come as the connection did: it is given back unused (nothing was sent on
		// it, so it is as clean as it came).
		if err = ss.waitStoppedLocked(); err != nil {
			pl.pool.release(sc)
		}
	}
	pl.waitCancelled = false
	select {
	case <-pl.waitWake:
	default:
	}
	pl.waitMu.Unlock()
	switch {
	case err == nil:
	case errors.Is(err, errWaitCancelled), errors.Is(err, errWaitDrained), errors.Is(err, errWaitClientGone):
		return err // nothing was sent: the statement never ran
	default:
		code, msg, detail := poolError(pl.pool, err)
		pl.lost, pl.fare = err, errorResponse("FATAL", code, msg, detail, "")
		return errLendLost
	}
	ss.srv.metrics.poolLent()
	if sc.lastClient != pl {
		// Another client held the connection since it was last lent to this one, and that client's code may
		// have left anything, whatever its unit turned out to run: a token, lock or role at session level
		// (checkedFor: put back first), or the proxy's own statements replaced (DEALLOCATE, then PREPARE of the
		// name, in a function): the settings statement (settingsFor), the server statements of the clients'
		// named ones (stmtsFresh) and the SQL-level ones (sqlStmts, pooledsqlprep.go) are prepared afresh before
		// their next use. (The prepared fences have a verification of their own: prepared.go. The token
		// statement, the unnamed statement, no SQL reaches: serverConn.unnamedToken.)
		sc.checkedFor, sc.settingsFor, sc.lastClient = nil, nil, pl
		clear(sc.stmtsFresh)
		clear(sc.sqlStmts)
	}
	// Another client's unnamed statement goes before anything of this one's runs: its text may carry that
	// client's token (inline form), and a function of this one's could read or run it (closeLastUnnamed). Also
	// on a connection this client held last, where its Parse's Close was skipped (serverConn.unnamedOwner).
	pl.lastUnnamedOwed = sc.clientUnnamed && sc.unnamedOwner != pl
	pl.setLent(sc)
	sc.lentBy.Store(ss) // writeWaits
	pl.unnamedReplaced()
	pl.open = 0
	pl.copyStartsMu.Lock()
	pl.copyStarts = nil // the last lend's server side, which counted them, has ended
	pl.anyStarts.Store(false)
	pl.copyStartsMu.Unlock()
	pl.resetCopyRuns()
	pl.copyAmbiguous = false
	// The fenced writes of the transaction go to this host (checkPlan: router.writeRefusal). Read by this
	// goroutine and the lend's server side only (sessionForKey does not look at a pooled session's), so no
	// lock of the Server's is taken per transaction.
	ss.host = sc.host
	// The connection's prepared fences serve the client's transaction. Written under pl.mu before any byte goes
	// out, read by this goroutine and the lend's server side (which starts after, and ends before the next lend).
	ss.prep = sc.prep
	sc.beforeSend = pl.beforeSend
	pl.reading = false
	return nil
}

// Why a client's wait for a server connection ended without one (lend: waitStopped). Nothing of the client's
// was sent: its statement never ran.
var (
	// errWaitCancelled: the client's CancelRequest came while it waited; its statement is answered 57014
	// (answerCancelledWait) and the session goes on.
	errWaitCancelled = errors.New("cancelled while waiting for a server connection")
	// errWaitDrained: the proxy began to shut down; the session ends with 57P01, as an idle one does.
	errWaitDrained = errors.New("the proxy is shutting down")
	// errWaitClientGone: the client disconnected, or Shutdown's deadline closed the session.
	errWaitClientGone = errors.New("the client disconnected while waiting for a server connection")
)

// waitStopped is lendWait.stopped for the client's wait in lend: waitStoppedLocked, or the client's socket
// closed (it disconnected while it waited: a driver's timeout, a killed process).
func (ss *session) waitStopped() error {
	pl := ss.pooled
	pl.waitMu.Lock()
	err := ss.waitStoppedLocked()
	pl.waitMu.Unlock()
	if err == nil && peerClosed(ss.client) {
		err = errWaitClientGone
	}
	return err
}

// waitStoppedLocked reports what ends the client's wait for a server connection, of what is signalled
// (waitMu held): Shutdown's deadline closed the session, a drain began, the client cancelled; nil when none.
func (ss *session) waitStoppedLocked() error {
	switch {
	case ss.forcedOut.Load():
		return errWaitClientGone
	case ss.srv.draining.Load():
		return errWaitDrained
	case ss.pooled.waitCancelled:
		return errWaitCancelled
	}
	return nil
}

// wakeWait wakes the client's wait for a server connection, if it waits, to look at waitStopped.
func (pl *pooledState) wakeWait() {
	select {
	case pl.waitWake <- struct{}{}:
	default:
	}
}

// answerCancelledWait answers the message of type typ (body nil: still in the reader) whose wait for a server
// connection the client cancelled (pl.mu held), as PostgreSQL answers a statement cancelled before it ran:
// ErrorResponse 57014, then ReadyForQuery for a Query or FunctionCall; the rest of an extended-protocol batch
// is skipped up to its Sync (skipCancelledBatch). A lone Sync gets its ReadyForQuery and a lone Flush nothing,
// as the server, with nothing running, ignores the cancel. The session goes on.
func (ss *session) answerCancelledWait(typ byte, body []byte) error {
	pl := ss.pooled
	if typ == msgFlush || typ == msgSync {
		// Nothing runs, so the server ignores the cancel: the Flush gets nothing, the Sync only its answer.
		return ss.skipCancelledBatch(typ, body)
	}
	if body == nil {
		if _, err := ss.cr.body(); err != nil {
			return err
		}
	}
	ss.cw.Write(errorResponse("ERROR", sqlstateQueryCanceled, "canceling statement due to user request",
		fmt.Sprintf("The statement had not started: it was waiting for a server connection of pool %s.", pl.pool.name), ""))
	if typ == msgQuery || typ == msgFunctionCall {
		writeMsg(ss.cw, msgReadyForQuery, []byte{txIdle}, "")
	} else {
		pl.skipToSync = true // Parse, Bind, Describe, Execute, Close: the rest of the batch, as the server skips it
	}
	return ss.cw.Flush()
}

// skipCancelledBatch drops a message of an extended-protocol batch whose wait was cancelled
// (answerCancelledWait), up to its Sync, which is answered with ReadyForQuery (pl.mu held). A cancelled lone
// Flush or Sync is answered the same way.
func (ss *session) skipCancelledBatch(typ byte, body []byte) error {
	if body == nil {
		if _, err := ss.cr.body(); err != nil {
			return err
		}
	}
	if typ != msgSync {
		return nil
	}
	ss.pooled.skipToSync = false
	writeMsg(ss.cw, msgReadyForQuery, []byte{txIdle}, "")
	return ss.cw.Flush()
}

// tokenPrefix is what injectTokens put in front of a transaction.
type tokenPrefix int

const (
	// prefixNone: nothing (a FunctionCall, a text that must run outside a transaction block): the message runs
	// with the connection's session values, which checkFirst checks before it goes.
	prefixNone tokenPrefix = iota
	// prefixChecked: the token statement that checks the connection's session values (the placeholder, the role)
	// before it sets the client's (tokenSQLWith, roleCheckSQL), after putBackFirst.
	prefixChecked
	// prefixSet: the token statement that sets the client's values (and, where needed, the login role for a
	// client that is not pinned: serverConn.roleSeen) without looking at the session's (plainPrefix,
	// plainSQLWith): for a transaction whose every statement is known to the proxy and plain (plainText,
	// batchOf), and for a lone BEGIN after putBackFirst.
	prefixSet
	// prefixSetLocal: SET LOCAL of the client's values, which takes no snapshot, before a Query that starts with
	// a BEGIN with transaction modes or holds SET TRANSACTION, and before an extended-protocol batch that holds
	// one (writeSetLocals); checkFirst checks the connection first.
	prefixSetLocal
)

// needReader starts the lend's server side (serveLend) unless it runs already or the session goroutine is to
// read the answer itself (answerInline) (pl.mu held). The lent connection calls it before any bytes reach the
// server (serverConn.beforeSend): a server whose answers nobody reads stops reading, and the client's messages
// would wait for ever behind them.
func (ss *session) needReader() {
	pl := ss.pooled
	if pl.reading || pl.inline || pl.sc == nil || pl.lost != nil {
		return
	}
	pl.reading = true
	pl.serving.Add(1)
	go ss.serveLend(pl.sc)
}

// inlineWait is how long the session goroutine waits for the next bytes of an answer it reads itself
// (answerInline), the first or any later, before a serveLend takes over and the session goroutine reads the
// client again: while it waits, a client that goes away is not noticed, and its statement not cancelled.
const inlineWait = 10 * time.Millisecond

// answerInline reads the answer to the unit forwardPooled just sent (pl.inline), in the session goroutine, up
// to its ReadyForQuery, and gives the connection back there as serveLend would: no goroutine per lend and one
// wake-up fewer per transaction. When the answer's next bytes take longer than inlineWait, when the server asks
// for COPY data, or when the lend goes on after the ReadyForQuery (a transaction block, a pin), a serveLend
// takes over the connection and the session goroutine goes back to reading the client, as without it.
func (ss *session) answerInline() {
	pl := ss.pooled
	pl.mu.Lock()
	sc := pl.sc
	pl.mu.Unlock()
	ended := sc == nil || ss.relayServer(sc, true)
	pl.mu.Lock()
	pl.inline = false
	// In a transaction block the server says nothing until the client's next message (notifications wait for
	// the block's end): that message's answer is read inline again, and no serveLend is needed meanwhile
	// (forwardPooled: heldMoved looks at whether a change of primary closed it in between).
	if !ended && !(pl.inlineAtReady && byte(ss.state.txStatus.Load()) != txIdle) {
		ss.needReader()
	} else if !ended && sc != nil {
		sc.unreadBy.Store(ss) // a client waiting for the pool may find it ended meanwhile (txPool.wakeUnread)
	}
	pl.inlineAtReady = false
	pl.mu.Unlock()
}

// peekInline waits for the first bytes of the answer to what the session goroutine sent (answerInline), for
// about inlineWait: past it, the pools' watch (inlineLook) stops the wait with a read deadline. A deadline set
// and cleared around each read cost two timer changes per statement, 4% of the proxy's user time in TPC-B;
// this costs a clock read and a few uncontended locks, and the watch's timer changes only when the first wait
// begins and the last ends.
func (sc *serverConn) peekInline(ps *txPools) error {
	sc.inlineMu.Lock()
	sc.inlineSince = max(time.Since(ps.epoch), 1)
	sc.inlineMu.Unlock()
	ps.inlineBegins()
	_, err := sc.r.r.Peek(1)
	sc.inlineMu.Lock()
	tripped := sc.inlineTripped
	sc.inlineSince, sc.inlineTripped = 0, false
	sc.inlineMu.Unlock()
	ps.inlineEnds()
	if tripped {
		// The watch set the deadline under inlineMu, before it said so: lifting it here comes after.
		sc.conn.SetReadDeadline(time.Time{})
	}
	return err
}

// inlineBegins counts a wait that began (its inlineSince noted), and arms the watch for inlineWait on when it is
// the only one: a wait that begins while the watch is armed began later than the one it is armed for.
//
// Why a timer armed while waits are under way rather than a ticker that runs on for a while after the last: a
// look every inlineWait/2 for a second after each wait woke the runtime 200 times a second whenever a client
// came now and then (a connection per transaction: with SCRAM about one wake-up of the netpoller, and the
// runtime monitor's polling after it, per connection), while a wait is nearly always over long before
// inlineWait, and stopping the timer then wakes nothing.
func (ps *txPools) inlineBegins() {
	ps.watchMu.Lock()
	ps.inlineWaits++
	if !ps.watchArmed {
		ps.watchArmed = true
		if ps.watchTimer == nil {
			ps.watchTimer = time.AfterFunc(inlineWait, ps.inlineLook)
		} else {
			ps.watchTimer.Reset(inlineWait)
		}
	}
	ps.watchMu.Unlock()
}

// inlineEnds counts a wait that ended, and stops the watch after the last.
func (ps *txPools) inlineEnds() {
	ps.watchMu.Lock()
	if ps.inlineWaits--; ps.inlineWaits == 0 && ps.watchArmed {
		ps.watchArmed = false
		ps.watchTimer.Stop()
	}
	ps.watchMu.Unlock()
}

// inlineLook is the watch's look (the timer's function): it stops, with a read deadline, each inline wait that
// began inlineWait ago or more, and arms itself again for the oldest wait left, if any. A look that comes after
// the last wait ended (its timer fired as inlineEnds stopped it) finds nothing to do; one that comes after a
// new first wait re-armed the timer moves it no earlier than that wait needs. It goes on while the proxy drains
// (Shutdown): a statement sent in a transaction block that the drain waits for is then read by a serveLend,
// and the session goroutine reads the client, so that the end of the drain's time (forceClose) ends the
// session and cancels the statement (TestPooledShutdownCutsAStatementSentWhileDraining).
func (ps *txPools) inlineLook() {
	ps.watchLooks.Add(1)
	oldest := ps.tripSlowInline()
	ps.watchMu.Lock()
	defer ps.watchMu.Unlock()
	if ps.inlineWaits == 0 {
		ps.watchArmed = false
		return
	}
	// The waits that started after the tripped ones: the next look when the oldest of them reaches inlineWait
	// (at least a millisecond on, so that a wait the scan missed, noted as it ran, is not looked at in a loop).
	next := inlineWait
	if oldest > 0 {
		next = max(oldest+inlineWait-time.Since(ps.epoch), time.Millisecond)
	}
	ps.watchArmed = true
	ps.watchTimer.Reset(next)
}

// tripSlowInline sets a past read deadline on each connection whose inline wait began inlineWait ago or more,
// and returns when the oldest wait it left began (txPools.epoch's time; 0: none).
func (ps *txPools) tripSlowInline() (oldest time.Duration) {
	var pools []*txPool
	var conns []*serverConn
	ps.mu.Lock()
	for _, p := range ps.byKey {
		pools = append(pools, p)
	}
	ps.mu.Unlock()
	for _, p := range pools {
		p.mu.Lock()
		for sc := range p.live {
			conns = append(conns, sc)
		}
		p.mu.Unlock()
	}
	now := time.Since(ps.epoch)
	for _, sc := range conns {
		sc.inlineMu.Lock()
		if since := sc.inlineSince; since > 0 && !sc.inlineTripped {
			if now-since >= inlineWait {
				sc.conn.SetReadDeadline(time.Unix(1, 0))
				sc.inlineTripped = true
			} else if oldest == 0 || since < oldest {
				oldest = since
			}
		}
		sc.inlineMu.Unlock()
	}
	return oldest
}

// heldMoved looks, before a client's message goes, at a server connection the client holds in a transaction
// block that nothing read since its last answer (answerInline) (pl.mu held): one a change of primary closed ends
// the session as serveLend would have (57P01 naming the new primary: nothing of the message was sent).
//
// It does not look at the socket. In a block the server says nothing of its own accord but what it sends as it
// closes the connection (a FATAL: pg_terminate_backend, idle_in_transaction_session_timeout, a crash of another
// backend); its ParameterStatus and notifications wait for a command's answer. Whatever reads the answer to
// this message, inline or a serveLend started as the bytes go (beforeSend), reads that FATAL first, relays it
// and ends the lend at the close (TestPooledTerminatedWhileIdleInTransaction). A FIONREAD here cost one system
// call per statement of every transaction block, 3% of the proxy's CPU in TPC-B.
func (ss *session) heldMoved() error {
	pl := ss.pooled
	sc := pl.sc
	if sc == nil || pl.reading || pl.inline {
		return nil
	}
	if moved := sc.movedTo.Load(); moved != nil {
		pl.setLent(nil)
		sc.pool.discard(sc)
		pl.lost, pl.fare = errors.New("server connection moved"), movedFarewell(sc.host.addr, *moved, false)
		return errLendLost
	}
	return nil
}

// injectTokens writes what gives the transaction the client's token and lock, before the message of type typ
// that starts it (pl.mu held): a prefix of a Query's text, or a Bind and Execute of the token statement before
// an extended-protocol message. A text that must run outside a transaction block gets nothing
// (rewrite.OwnTransaction); nor does a FunctionCall. It reports what went in front.
func (ss *session) injectTokens(typ byte, body []byte) tokenPrefix {
	pl := ss.pooled
	sc := pl.sc
	set := ss.readingSettings()
	pl.windowOpen.Store(false) // a window a lend that failed left open is not this unit's
	pl.tokenPortalLeft = false // the portals of the transaction before ended with it
	pl.quietSetLocals.Store(0) // nor are a lend's that failed
	ss.queryToken, pl.syncOwed = tokenNone, false
	pl.readyHidden.Store(false)
	switch typ {
	case msgFunctionCall:
		return prefixNone
	case msgQuery:
		text, ok := planText(msgQuery, body)
		if !ok {
			return prefixNone
		}
		class := ss.classOf(text)
		if class.Own || class.NeedsBlock {
			return prefixNone // NeedsBlock: refused or ignored as directly, not run in the prefix's implicit block
		}
		var prefix tokenPrefix
		if plain, loneBegin := class.plain(), class.LoneBegin(); plain || loneBegin {
			// Plain: nothing in the text can leave session state or open a block, and the values are set, not
			// checked. A lone BEGIN (TPC-B's, pgx's, Rails'): what another client's function left is put back
			// first, and the values go the same way, as SET LOCAL, which takes no snapshot, so that a SET
			// TRANSACTION may follow in the block. The connection is then as the proxy left it, or as this
			// client's own statements left it (serverConn.checkedFor), and the block's end may be read back.
			if loneBegin {
				ss.putBackFirst()
			}
			var n int64
			ss.queryPrefix, n = ss.plainPrefix(sc, set)
			pl.hide.Add(n)
			prefix = prefixSet
		} else if class.Begin && class.Modes || class.ModesLater {
			// BEGIN ISOLATION LEVEL ... fails (25001) after a statement that took a snapshot, as the token
			// statement does, and so does SET TRANSACTION or a BEGIN with modes later in the Query (after a SET,
			// which takes none, it runs directly): two SET LOCAL take none. The checks of the token statement go
			// first as a unit of their own (checkFirst).
			cfg := ss.srv.cfg.Token
			ss.queryPrefix = setLocalSQL(cfg.Setting, pl.token, set) + setLocalSQL(cfg.LockSetting, pl.lock, set)
			pl.hide.Add(2)
			prefix = prefixSetLocal
		} else if class.Procedure {
			// A lone CALL or DO, which may COMMIT or ROLLBACK only outside a block: the checked token statement
			// goes in front of the Query by the extended protocol (procedureAlone), not in its text, which
			// would make the Query an implicit block (2D000).
			ss.putBackFirst()
			ss.queryToken = ss.checkedKind()
			prefix = prefixChecked
		} else {
			ss.putBackFirst()
			ss.queryPrefix = sc.pool.tokenTexts(pl.pin != "").inline(pl.token, pl.lock)
			pl.hide.Add(1)
			prefix = prefixChecked
		}
		switch {
		case set.ClientEncoding == "UTF8":
			pl.prefixChars.Store(int64(utf8.RuneCountInString(ss.queryPrefix)))
		case isASCII(ss.queryPrefix):
			pl.prefixChars.Store(int64(len(ss.queryPrefix)))
		default:
			pl.prefixChars.Store(-1)
		}
		return prefix
	}
	// The batch's statement: a Parse's, a Bind's, or the first such behind a Close or Describe (batchLead).
	leadText, leadOK := ss.stmtText(ss.batchLead(typ, body))
	// A Parse of a text that must run outside a block, or a Bind of one parsed before, starts a batch without
	// a token statement (it would make the batch a block: 25001). One of no statement does not: the batch goes
	// on, and may bind and run another statement of the client's.
	if leadOK && ss.classOf(leadText).Own && !noStatement(leadText, set) {
		return prefixNone // checkFirst puts back first
	}
	// A batch of nothing but statements PostgreSQL refuses or ignores outside a block (SET TRANSACTION, SET
	// LOCAL, DECLARE, LOCK, PREPARE TRANSACTION: NeedsBlock) runs nothing that reads the token, and goes without the token
	// statement, as a Query of one does: that SELECT would take the snapshot, after which SET TRANSACTION
	// ISOLATION LEVEL fails 25001 where directly it only warns (the settings fuzzer's finding). A batch with
	// another statement keeps it, which that statement may need.
	if leadOK && ss.classOf(leadText).NeedsBlock && ss.batchOf(typ, body, func(text []byte) bool { return ss.classOf(text).NeedsBlock }) {
		return prefixNone
	}
	beginLed := leadOK && ss.beginsWithModes(leadText)
	if ss.batchHasModes(typ, body, beginLed) {
		// SET TRANSACTION, a SET of transaction_isolation, _read_only or _deferrable, or a BEGIN with modes
		// after other statements fails 25001 behind a statement that took a snapshot, as the checked token
		// statement (a SELECT) does, where directly it runs (a warning outside a block). The values go as SET
		// LOCAL instead, which takes none, after the put-back, as a Query's do (checkFirst waits for it); the
		// role as the plain form sets it. Where no constant carries a value, the checked statement goes, and
		// such a statement fails 25001 as before: never a transaction without the token.
		if stmts, ok := ss.tokenSetLocals(set, pl.pin != "" || sc.roleSeen); ok {
			ss.putBackFirst()
			ss.writeSetLocals(stmts)
			return prefixSetLocal
		}
	}
	if beginLed {
		ss.putBackFirst()
		pl.beginPortals, pl.windowAnswers = pl.beginPortals[:0], 0 // forwardPooled sends it
		pl.windowMu.Lock()
		pl.windowRelayed, pl.windowFailed = 0, false
		pl.windowOpen.Store(true)
		pl.windowMu.Unlock()
		return prefixChecked
	}
	plainBatch := ss.batchOf(typ, body, ss.plainText)
	loneBegin := !plainBatch && ss.batchOf(typ, body, func(text []byte) bool { return ss.classOf(text).LoneBegin() })
	if plainBatch || loneBegin {
		// The unchecked token statement. A batch that only opens a block (pgconn's ExecParams("BEGIN"), JDBC's)
		// gets the put-back first, as a Query's lone BEGIN does. Its token statement is a SELECT, which takes the
		// transaction's snapshot, so a SET TRANSACTION right after that batch fails 25001 (docs/pooling.md, known
		// differences): SET LOCAL before the BEGIN would warn (and be logged by the server at every
		// transaction), and after it needs statements of the proxy's own inside the client's batch.
		if loneBegin {
			ss.putBackFirst()
		}
		kind := tokenPlain
		if pl.pin != "" || sc.roleSeen {
			kind = tokenBare
		}
		ss.writeTokenStmt("", kind)
		return prefixSet
	}
	ss.putBackFirst()
	ss.writeTokenStmt("", ss.checkedKind())
	return prefixChecked
}

// batchHasModes reports whether the extended-protocol batch that the client's message typ (body read) starts
// holds, in that message or the ones buffered whole behind it up to its Sync, a Parse or a Bind of a statement
// that PostgreSQL refuses (25001) once the transaction took a snapshot: SET [LOCAL | SESSION] TRANSACTION or a
// SET of transaction_isolation, _read_only or _deferrable (rewrite.PoolingClass.ModesLater), or a BEGIN with
// transaction modes unless the batch starts with one (beginLed: its token statement goes right after it,
// closeWindow). Only what the proxy knows counts: a statement behind what was read (a batch the client sends in
// parts, reading answers in between), or one a Bind names that the proxy never saw parsed, is not seen, and its
// batch keeps the checked token statement (a loud 25001, as before).
func (ss *session) batchHasModes(typ byte, body []byte, beginLed bool) bool {
	found := false
	ss.walkBatch(typ, body, func(text []byte, ok bool) bool {
		if ok {
			c := ss.classOf(text)
			found = c.ModesLater || !beginLed && c.Begin && c.Modes
		}
		return !found
	})
	return found
}

// writeSetLocals writes each of stmts (tokenSetLocals) to the lent connection as a Parse of the server's unnamed
// statement, a Bind and an Execute of the unnamed portal, counted hidden (pl.mu held): the token statement of a
// batch that holds a statement that must come before any snapshot (batchHasModes). Outside a block the batch's
// implicit transaction lasts to its Sync, so SET LOCAL holds for every statement of it, as the token statement's
// set_config does; PostgreSQL warns of each (25P01), which the relay drops (quietSetLocals), and logs it. The
// unnamed statement no longer holds the token statement (serverConn.unnamedToken), and the unnamed portal is
// closed before a client message could reach it, as after the token statement (closeTokenPortal).
func (ss *session) writeSetLocals(stmts []string) {
	pl := ss.pooled
	sc := pl.sc
	// Counted before anything is written: a full buffer may send it, and the answers come back at once.
	pl.quietSetLocals.Store(int64(len(stmts)))
	pl.hide.Add(int64(len(stmts)))
	for _, stmt := range stmts {
		// Parse: the unnamed statement, the text, no parameter types.
		writeMsg(sc.w, msgParse, append(append([]byte{0}, stmt...), noParamTypes[:]...), "")
		writeMsg(sc.w, msgBind, bindUnnamedBody[:], "")
		writeMsg(sc.w, msgExecute, executeUnnamedBody[:], "")
	}
	sc.unnamedToken = tokenNone
	ss.closeTokenPortal("")
}

// closeLastUnnamed closes the unnamed statement another client left on the connection just lent (lend:
// lastUnnamedOwed) in a unit of its own, answered before anything of this client's (replayAnswer), unless the
// client's first message (typ, body) is a Parse of its unnamed statement, which closes it first anyway
// (writeUnnamedParse) with only the token statement, the proxy's own, in front: should that fail (a cancel,
// a timeout), the server skips the Close, and the client's Parse with everything else of its batch, and the
// connection's next lend owes the Close again (settle: unnamedOwner nil), to this client too (pl.mu held).
func (ss *session) closeLastUnnamed(typ byte, body []byte) {
	pl := ss.pooled
	if !pl.lastUnnamedOwed {
		return
	}
	pl.lastUnnamedOwed = false
	if typ == msgParse && len(body) > 0 && body[0] == 0 {
		return
	}
	sc := pl.sc
	pl.replaying.Add(1) // before anything is written: a full buffer may send it
	writeMsg(sc.w, msgClose, unnamedStmtRef, "")
	writeMsg(sc.w, msgSync, []byte{}, "")
	sc.clientUnnamed = false
}

// checkedKind is the checked token statement for the client (pinned or not).
func (ss *session) checkedKind() tokenStmtKind {
	if ss.pooled.pin != "" {
		return tokenCheckedPinned
	}
	return tokenChecked
}

// batchLead is the message a batch is classified by (injectTokens): its first message, or, when that runs
// nothing (a Close, a Describe of a statement) and its body was read, the first Parse or Bind buffered behind
// it, before anything that runs. pgx sends the Close of its evicted statements in front of its next batch: a
// BEGIN with transaction modes or a DISCARD ALL there failed 25001, the checked token statement in front of
// them (the settings fuzzer's finding).
func (ss *session) batchLead(typ byte, body []byte) (byte, []byte) {
	runsNothing := func(typ byte, body []byte) bool {
		return typ == msgClose || typ == msgDescribe && len(body) > 0 && body[0] == 'S'
	}
	if body == nil || !runsNothing(typ, body) {
		return typ, body
	}
	for t, b := range ss.bufferedMsgs() {
		switch {
		case t == msgParse || t == msgBind:
			return t, b
		case !runsNothing(t, b):
			return typ, body
		}
	}
	return typ, body
}

// closeTokenPortal closes the portal the token statement just ran in (pl.mu held), hidden, so that no message
// of the client's can reach it: an Execute or a Describe of a portal that nothing of the client's bound finds
// none (34000) and fails as directly, instead of running the proxy's finished statement again (SELECT 0), which
// let a block PostgreSQL aborts commit (the wire oracle's finding). The proxy's named portal (a window's) is
// closed at once. The unnamed portal is closed only where a client message could reach it
// (closeTokenPortalBefore): most batches replace it with a Bind of their own first, and a Close per transaction
// cost 4% of the proxy's CPU in select-only -M extended (docs/benchmark.md, eighteenth pass).
func (ss *session) closeTokenPortal(portal string) {
	pl := ss.pooled
	if portal == "" {
		pl.tokenPortalLeft = true
		return
	}
	pl.writeHiddenClose(append(append([]byte{'P'}, portal...), 0))
}

// writeHiddenClose writes a Close of the proxy's own (body) to the lent connection (pl.mu held), its
// CloseComplete hidden (pooledStmts: the answers to Parse and Close, in the order sent).
func (pl *pooledState) writeHiddenClose(body []byte) {
	writeMsg(pl.sc.w, msgClose, body, "")
	pl.stmts.sent(msgCloseComplete, true)
}

// closeTokenPortalBefore closes the unnamed portal the token statement left (tokenPortalLeft) before a client
// message of type typ that could reach it (pl.mu held). It is the unnamed portal's last moment in each case:
//   - a Parse, a Flush, or a Describe or Close of a statement reaches no portal: it stays;
//   - a Bind to the unnamed portal replaces it. Should that Bind fail before it does (26000, 08P01), no Execute
//     ran since the token statement (the first would have closed it), so no BEGIN did: the error aborts the
//     batch's implicit transaction, and the portal with it;
//   - a Sync with none of these ends it the same way;
//   - anything else (an Execute of any portal, which may open a block the portal would outlive; a Describe or
//     Close of a portal; a Bind to a named portal; a message whose body is not read) gets the Close first.
func (ss *session) closeTokenPortalBefore(typ byte, body []byte) {
	pl := ss.pooled
	switch typ {
	case msgParse, msgFlush:
		return
	case msgSync:
		pl.tokenPortalLeft = false
		return
	case msgDescribe, msgClose:
		if len(body) > 0 && body[0] == 'S' {
			return
		}
	case msgBind:
		if portal, _, ok := cutNul(body); ok && len(portal) == 0 {
			pl.tokenPortalLeft = false
			return
		}
	}
	pl.tokenPortalLeft = false
	pl.writeHiddenClose(closeUnnamedPortalBody[:])
}

// closeUnnamedPortalBody closes the unnamed portal.
var closeUnnamedPortalBody = [2]byte{'P', 0}

// noParamTypes ends a Parse body that names no parameter types: the text's terminator, then a count of zero.
var noParamTypes = [3]byte{0, 0, 0}

// bindUnnamedBody binds the unnamed statement to the unnamed portal with no parameters and text results, and
// executeUnnamedBody runs the unnamed portal to its end: arrays, so that no call builds them again.
var (
	bindUnnamedBody    = [8]byte{}
	executeUnnamedBody = [5]byte{}
)

// tokenPortal is the portal of the token statement when it goes after some of a batch's messages: the
// unnamed portal may be the client's by then. It is closed right after the token statement ran in it
// (closeTokenPortal).
const tokenPortal = "fenceproxy_p"

// noStatement reports whether a client's text holds no statement: empty, or only comments and semicolons.
func noStatement(text []byte, set rewrite.Settings) bool {
	l, err := rewrite.Lex(text, set)
	return err == nil && l.Statements == 0
}

// closeWindow sends the token statement of a batch that starts with a BEGIN with transaction modes, after the
// message just forwarded (pl.mu held), unless an answer of the window was an error: the server skips the rest
// of the batch, which the token statement would then be part of, so nothing is to be hidden. The answers still
// to relay before its own are those of the window's messages that the lend's server side has not relayed yet.
// Both are decided under windowMu, which that side takes to count while the window is open: no answer is
// counted twice or not at all.
func (ss *session) closeWindow() {
	pl := ss.pooled
	pl.windowMu.Lock()
	defer pl.windowMu.Unlock()
	if !pl.windowFailed {
		// relayFirst before the token statement counts itself hidden (writeTokenStmt): a server side that
		// reads an earlier answer of the window in between must not find something to hide and nothing to
		// relay first, and drop the client's answer (a review's reading).
		pl.relayFirst.Store(pl.windowAnswers - pl.windowRelayed)
		ss.writeTokenStmt(tokenPortal, ss.checkedKind())
	}
	pl.windowOpen.Store(false) // last: the server side that sees it closed sees the two values above
}

// countWindowAnswer counts an answer the lend's server side relays while the window of a BEGIN with transaction
// modes is open (closeWindow), and reports whether it was open.
func (pl *pooledState) countWindowAnswer(typ byte) bool {
	pl.windowMu.Lock()
	defer pl.windowMu.Unlock()
	if !pl.windowOpen.Load() {
		return false // closed meanwhile: relayFirst holds what is left
	}
	switch typ {
	case msgNoticeResponse, msgParameterStatus, msgNotificationResponse:
	case msgErrorResponse:
		pl.windowFailed = true // the server skips the rest of the batch
	default:
		pl.windowRelayed++
	}
	return true
}

// writeTokenStmt writes the Bind (to portal) and Execute of the token statement kind with the client's values,
// prepared first as the unnamed statement where that does not hold it (serverConn.unnamedToken), to the lent
// connection (pl.mu held), and counts it hidden (its ParseComplete, if any, comes before its CommandComplete).
// Prepared once per connection, not per client: no client's code can replace the unnamed statement, as a
// function can a named one (DEALLOCATE, then PREPARE of its name); so Parse and plan of the token statement, about
// three quarters of its cost to the server, are paid once (docs/benchmark.md, twentieth pass).
func (ss *session) writeTokenStmt(portal string, kind tokenStmtKind) {
	ss.tokenStmtMsgs(ss.pooled.sc.w, portal, kind)
	ss.closeTokenPortal(portal)
	ss.pooled.hide.Add(1)
}

// tokenStmtMsgs writes to w the messages of writeTokenStmt: a Parse of the token statement kind where the lent
// connection's unnamed statement does not hold it, its Bind to portal with the client's values, and its Execute
// (pl.mu held). The caller counts its answers hidden.
func (ss *session) tokenStmtMsgs(w msgSink, portal string, kind tokenStmtKind) {
	pl := ss.pooled
	sc := pl.sc
	if sc.unnamedToken != kind {
		writeMsg(w, msgParse, sc.pool.tokenParse(kind), "")
		sc.unnamedToken = kind
	}
	// Bind: the portal, the unnamed statement, no parameter formats (text), two parameters, no result formats.
	cache := ss.caches()
	b := append(append(cache.tokenBind[:0], portal...), 0, 0, 0, 0, 0, 2)
	for _, v := range []*string{pl.token, pl.lock} {
		if v == nil {
			b = binary.BigEndian.AppendUint32(b, 0xffffffff)
			continue
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(*v)))
		b = append(b, *v...)
	}
	b = append(b, 0, 0)
	cache.tokenBind = b
	writeMsg(w, msgBind, b, "")
	cache.tokenExecute = append(append(cache.tokenExecute[:0], portal...), 0, 0, 0, 0, 0)
	writeMsg(w, msgExecute, cache.tokenExecute, "")
}

// procedureAlone writes to w, right before the client's Query message goes there, the token statement kind of a
// Query that is one CALL or DO statement (rewrite.PoolingClass.Procedure), as a Bind and Execute of the lent
// connection's unnamed statement with no Sync, and owes the Sync that goes right after the Query (syncOwed)
// (pl.mu held; takeQueryPrefix). In the Query's text it would make the Query an implicit transaction block, in
// which PostgreSQL runs a procedure atomically: a COMMIT or ROLLBACK in it failed 2D000 where directly it runs.
// A Query that comes after an Execute with no Sync runs in that batch's implicit transaction, which is no block
// (TestPostgresQueryAfterUnsyncedExecute): the procedure sees the client's values, transaction-locally, until its
// first COMMIT or ROLLBACK, which commits the token statement with it; its later transactions see the
// connection's session values, the placeholder (docs/pooling.md, known differences), as after a COMMIT in an
// extended-protocol batch. The Query is answered with a ReadyForQuery of its own, then the Sync with another: the
// first is not relayed (readyHidden), the second is the Query's for the client. Should the token statement fail
// (the check refuses, a cancel), the server skips the Query up to the Sync, whose ReadyForQuery is then the only
// one (relayServer clears readyHidden). Written here rather than when the transaction starts (injectTokens), so
// that nothing of the proxy's own goes between it and the Query (the prepared fences' Queries go before the
// client's: one in between would commit the token statement's transaction).
func (ss *session) procedureAlone(w msgSink, kind tokenStmtKind) {
	pl := ss.pooled
	// Counted before anything is written: a full buffer may send it, and the answers come back at once.
	pl.readyHidden.Store(true)
	pl.hide.Add(1)
	pl.syncOwed = true
	ss.tokenStmtMsgs(w, "", kind)
	// The Query right behind drops the unnamed statement, as any simple Query does (forwardPooled noted that
	// before this was written): the next token statement is prepared again, not bound where none is (26000).
	pl.sc.unnamedToken = tokenNone
}

// putBackFirst puts back what unseen code left on a connection that comes to a client that is not pinned (the
// token and lock to the placeholder, the role to the login role), in a transaction of its own written before
// the client's, whose answer is hidden and not waited for (pl.mu held): a checked start then finds the connection
// as the proxy left it, and a rollback in the client's Query or batch cannot bring another client's values back.
// Once per client per connection (serverConn.checkedFor); what the check finds later is the client's own doing,
// refused (tokenSQLWith, roleCheckSQL). Its failure ends the session (replayAnswer); the client's unit, already
// written, runs after it as after a failed settings unit: on a connection it did not put back, the check
// refuses it.
func (ss *session) putBackFirst() {
	pl := ss.pooled
	sc := pl.sc
	if pl.pin != "" || sc.checkedFor == pl {
		return
	}
	pl.replaying.Add(1)
	writeMsg(sc.w, msgQuery, nil, sc.pool.tokenTexts(false).putBack)
	pl.queryDroppedUnnamed(sc)
	sc.checkedFor = pl
}

// chainTokens gives the transaction that a COMMIT, END, ROLLBACK or ABORT AND CHAIN started (settle: chainDue)
// the client's values, before the client's next message (pl.mu held). The chained transaction starts with the
// connection's session values, as on a connection of the client's own: the placeholder, unless the transaction
// before set the token or lock at session level, which is then the client's value (the probe reads it at the
// end) and stays. So each is set, transaction-locally, only where the placeholder is in force: where the guess
// that a chain happened is wrong (a block that goes on), the client's own values are in force, never the
// placeholder, and nothing changes.
func (ss *session) chainTokens() error {
	pl := ss.pooled
	cfg := ss.srv.cfg.Token
	if !pl.probe.Load() {
		// No text of the transaction before may have set the token or lock at session level: the placeholder
		// is in force, and the plain token statement gives the values (SET LOCAL, which takes no snapshot, where
		// constants carry them: a SET TRANSACTION may follow).
		values, _ := ss.plainPrefix(pl.sc, ss.readingSettings())
		return ss.hiddenUnit(values)
	}
	ph := quoteLiteral(poolPlaceholder)
	// inForce sets the setting to v where the placeholder is in force; and, when the transaction's texts say it
	// was reset (resetOnly), to the client's reset value where the pooled connection's reset value is: a RESET
	// in the chained-from transaction gives the chained one the client's reset value, as directly.
	inForce := func(name string, v *string, resetOnly bool, clientReset, poolReset *string) string {
		current := "pg_catalog.current_setting(" + quoteLiteral(name) + ", true)"
		sql := "CASE WHEN " + current + sqlEq + ph + " THEN pg_catalog.set_config(" + quoteLiteral(name) + ", " + sqlValue(v) + ", true)"
		if resetOnly && clientReset != nil {
			pr := ""
			if poolReset != nil {
				pr = *poolReset
			}
			sql += " WHEN " + current + sqlEq + quoteLiteral(pr) + " THEN pg_catalog.set_config(" + quoteLiteral(name) + ", " + sqlValue(clientReset) + ", true)"
		}
		return sql + " END"
	}
	e := pl.probeEffects
	return ss.hiddenUnit("SELECT " + inForce(cfg.Setting, pl.token, e.Token.ResetOnly(), pl.resetToken, pl.pool.resetToken) + ", " +
		inForce(cfg.LockSetting, pl.lock, e.Lock.ResetOnly(), pl.resetLock, pl.pool.resetLock))
}

// hiddenUnit sends sql as a unit of the proxy's own on the lent connection, its answers hidden (replayAnswer),
// and waits for them (pl.mu held): nothing of the client's next message runs before it, and its failure ends
// the session (lendFailed) before that message goes.
func (ss *session) hiddenUnit(sql string) error {
	pl := ss.pooled
	pl.replaying.Add(1)
	writeMsg(pl.sc.w, msgQuery, nil, sql)
	return ss.awaitHidden()
}

// awaitHidden sends what the proxy wrote of its own on the lent connection and waits for the answers to all its
// hidden units (pl.mu held). Its Queries dropped the unnamed statement.
func (ss *session) awaitHidden() error {
	pl := ss.pooled
	pl.queryDroppedUnnamed(pl.sc)
	// The flush starts the lend's server side (beforeSend), which sees a failed connection and ends the session.
	if err := pl.sc.w.Flush(); err != nil {
		return nil
	}
	if err := ss.awaitReplayed(); err != nil {
		return err
	}
	if pl.lost != nil {
		return errLendLost
	}
	return nil
}

// awaitReplayed waits until the proxy's own units sent are answered (replaying), or the lend is lost (pl.mu
// held, and released while it waits), unless the client leaves first (watchClient): then it reports
// errClientLeftWaiting, and the session ends as for a client that leaves mid-transaction (a unit blocked behind
// a lock held the connection and its slot as long as the lock: TestPooledClientVanishingWhileItsSettingsReplay).
// Not on settled: the lend's server side must never wait for mu while the session goroutine may hold it in a
// write to the server (lendFailed), and a Broadcast without mu could come between this goroutine's look and its
// Wait; replayed keeps the wake-up until it is taken.
func (ss *session) awaitReplayed() error {
	pl := ss.pooled
	if pl.replaying.Load() <= 0 || pl.lost != nil {
		return nil
	}
	w := ss.watchClient(ss.wakeReplayed, 0)
	defer w.end()
	for pl.replaying.Load() > 0 && pl.lost == nil {
		if w.gone.Load() {
			return errClientLeftWaiting
		}
		pl.mu.Unlock()
		<-pl.replayed
		pl.mu.Lock()
	}
	return nil
}

// ownUnitAnswered is the lend's server side's part when a unit of the proxy's own was answered (replaying or
// state.internal just counted down): it wakes awaitReplayed, and sends a cancel deferred for it
// (sendDeferredCancel). It never waits for pl.mu: the session goroutine may hold it in a write to the server
// that waits for the server to read, and the server for this side to read its answers (a client pipelining a
// batch behind the put-back, unread: TestPooledClientLeavesAnUnreadPipeline). Only a deferred cancel needs mu;
// when it is busy, a goroutine sends it once it is free.
func (ss *session) ownUnitAnswered() {
	pl := ss.pooled
	ss.wakeReplayed()
	if !pl.cancelDeferred.Load() {
		return // cancelPooled looks at ownAhead again after it defers one
	}
	pl.lockedSoon(ss.sendDeferredCancel)
}

// boundClientText is the client's own text of the statement a Bind binds (pl.mu held), where the proxy keeps it:
// the fenced text may also hold the proxy's own set_config (fence.synchronous_commit), which leaves no session
// state. Else, as stmtText, the fenced text.
func (ss *session) boundClientText(body []byte) ([]byte, bool) {
	pl := ss.pooled
	if namesUnnamedStmt(msgBind, body) {
		if pl.unnamedSrc != nil {
			return planText(msgParse, pl.unnamedSrc)
		}
	} else if _, rest, ok := cutNul(body); ok {
		if name, _, ok := cutNul(rest); ok {
			if cs, known := pl.stmts.byName[string(name)]; known && cs.text != nil {
				return cs.text, true
			}
		}
	}
	return ss.stmtText(msgBind, body)
}

// queryDroppedUnnamed records a simple Query written to the lent connection sc (pl.mu held): it dropped the
// server's unnamed statement, the token statement there (serverConn.unnamedToken), and the client's unnamed
// statement is placed again before its next Bind or Describe (unnamedReplaced: the server's unnamedStmtName
// holds it still, but directly a Query drops it, and a client's may follow in the same lend).
func (pl *pooledState) queryDroppedUnnamed(sc *serverConn) {
	pl.unnamedReplaced()
	sc.unnamedToken = tokenNone
}

// unnamedReplaced records that the server connection's unnamed statement is no longer the client's, by no
// message of the client's: another's statement at a lend, or the proxy's own (pl.mu held).
func (pl *pooledState) unnamedReplaced() {
	pl.unnamedHere = false
	pl.unnamedEpoch++
}

// dropUnnamed forgets the client's unnamed statement, as the server does at a simple Query or a Close of it.
func (pl *pooledState) dropUnnamed() {
	pl.unnamed, pl.unnamedHere = nil, true
	pl.unnamedToken, pl.unnamedSrc = "", nil
	pl.unnamedVer++
}

// unnamedChange is the undo entry of a client's Parse (parse) or Close of its unnamed statement about to change
// it (pl.mu held); its ver is filled in once it changed.
func (pl *pooledState) unnamedChange(parse bool) unnamedUndo {
	return unnamedUndo{
		before: unnamedState{unnamed: pl.unnamed, src: pl.unnamedSrc, token: pl.unnamedToken, here: pl.unnamedHere},
		parse:  parse,
		epoch:  pl.unnamedEpoch,
	}
}

// fixAfterFailedBatch takes what the server left after a batch that failed (pooledStmts.failed; pl.mu held).
// The client's unnamed statement becomes the verdict's, unless the client changed it since; the lent
// connection holds it (here) only while the epoch it was judged in goes on. The server statements whose Parse
// did not run are no longer counted prepared on the lent connection; on one the lend gave back, the probe at
// its end has read them again (stmtParsed). A named statement whose Close or Parse did not run is what it was
// before them, the last sent undone first (a Close then a Parse of the name: the Parse's statement goes, the
// Close's comes back), unless the client changed the name since: a Close is undone only where the name holds
// nothing, a Parse only where the name still holds its statement.
func (ss *session) fixAfterFailedBatch() {
	pl := ss.pooled
	unplaced, reopened := pl.stmts.takeSkipped()
	for _, u := range unplaced {
		if u.sc == pl.sc {
			delete(u.sc.stmts, u.server)
			delete(u.sc.stmtsFresh, u.server)
		}
	}
	for _, c := range reopened {
		cur, held := pl.stmts.byName[c.name]
		switch {
		case c.parsed != "":
			if !held || cur.server != c.parsed {
				continue
			}
			if c.stmt.server == "" {
				delete(pl.stmts.byName, c.name)
			} else {
				pl.stmts.byName[c.name] = c.stmt
			}
			pl.stmts.unprepare(c.name) // it held no statement PostgreSQL would bind (parseNamed)
		case !held && c.stmt.server != "": // a name it had: byName is made
			pl.stmts.byName[c.name] = c.stmt
			if c.prepared {
				pl.stmts.reprepare(c.name)
			}
		}
	}
	f := pl.stmts.takeUnnamedFix()
	if f == nil || f.ver != pl.unnamedVer {
		return
	}
	pl.unnamed, pl.unnamedSrc, pl.unnamedToken = f.state.unnamed, f.state.src, f.state.token
	pl.unnamedHere = f.state.here && f.epoch == pl.unnamedEpoch
	pl.unnamedVer++
}

// followTokenInForce keeps pl.tokenInForce for a client message about to be forwarded (pl.mu held), and says
// whether its fenced writes carry it (ss.inlineToken, rewrite/inline.go). The token in force stays known through
// what cannot change it by its own words: plain Queries (plainText), a lone BEGIN, the extended protocol's Parse,
// Describe, Execute, Close, Sync and Flush, and a Bind of a plain statement or a lone BEGIN. Anything else (a SET,
// set_config, SAVEPOINT or ROLLBACK TO, a Bind of another statement, a FunctionCall) makes it unknown until the
// next transaction's start. A function that changes it behind the proxy is caught by the inline fence itself
// (55F03). A plain Query, and a Parse of the unnamed statement with a plain text (run right away, and fenced again
// if it is bound where another token is in force: placeUnnamed), carry it; a named statement, which may run
// under any later token, never does. Prepared fences, when turned on, are sent instead. words is forwardPooled's:
// the class of the text whose words decide (the zero class when none is known).
func (ss *session) followTokenInForce(typ byte, body []byte, words textClass) {
	pl := ss.pooled
	if pl.tokenInForce == "" {
		return
	}
	plain, lone := words.plain(), words.LoneBegin() // plainText; both false for the zero class
	carry := false
	switch typ {
	case msgQuery:
		switch {
		case plain:
			carry = true
		case !lone:
			pl.tokenInForce = ""
		}
	case msgParse:
		carry = plain && len(body) > 0 && body[0] == 0
	case msgBind:
		if !plain && !lone {
			pl.tokenInForce = ""
		}
	case msgDescribe, msgExecute, msgClose, msgSync, msgFlush:
	default:
		pl.tokenInForce = ""
	}
	if carry && ss.prep.max == 0 {
		ss.inlineToken = pl.tokenInForce
	}
}

// plainText reports whether a client's text, the whole of what its transaction runs, may have the plain token
// statement (prefixSet): every statement plain by its words (rewrite.PlainStatements) and none of the words
// for which the end of the transaction looks at the connection (mayLeaveSessionState). The proxy never reads
// such a transaction's session state back, so it needs no check of what the connection held before.
func (ss *session) plainText(text []byte) bool { return ss.classOf(text).plain() }

// beginsWithModes reports whether a client's text starts with BEGIN or START TRANSACTION with transaction modes
// (rewrite.BeginsWithTransactionModes).
func (ss *session) beginsWithModes(text []byte) bool {
	c := ss.classOf(text)
	return c.Begin && c.Modes
}

// answersTo is how many answers the server gives a client message of the extended protocol that succeeds
// (errors end the batch): ParseComplete, BindComplete, CloseComplete, ParameterDescription and RowDescription
// or NoData, one CommandComplete for an Execute of a BEGIN. beginPortals follows the portals bound to a BEGIN
// with transaction modes. ok is false for a message it cannot count.
func (ss *session) answersTo(typ byte, body []byte) (n int64, ok bool) {
	pl := ss.pooled
	switch typ {
	case msgParse, msgClose:
		return 1, true
	case msgBind:
		// A Bind (re)defines its portal: it is a BEGIN's only while the last Bind of it bound one (the unnamed
		// portal is bound again without a Close; a named one after its Close).
		portal, _, _ := cutNul(body)
		pl.beginPortals = slices.DeleteFunc(pl.beginPortals, func(p string) bool { return p == string(portal) })
		if text, ok := ss.stmtText(msgBind, body); ok && ss.beginsWithModes(text) {
			pl.beginPortals = append(pl.beginPortals, string(portal))
		}
		return 1, true
	case msgDescribe:
		if len(body) > 0 && body[0] == 'S' {
			return 2, true
		}
		return 1, true
	case msgFlush:
		return 0, true
	case msgExecute:
		return 1, true
	}
	return 0, false
}

// executesBegin reports whether an Execute (body nil: not read) runs a portal the batch bound to a BEGIN with
// transaction modes.
func (ss *session) executesBegin(body []byte) bool {
	if body == nil {
		return false
	}
	portal, _, ok := cutNul(body)
	return ok && slices.Contains(ss.pooled.beginPortals, string(portal))
}

// stmtText is the client's text that a Parse (typ msgParse) prepares, or that a Bind (msgBind) binds: its
// named statement or its unnamed one as the client last parsed it (the fenced text, as the server has it).
// ok is false for a statement the proxy does not know.
func (ss *session) stmtText(typ byte, body []byte) (text []byte, ok bool) {
	pl := ss.pooled
	switch typ {
	case msgParse:
		return planText(msgParse, body)
	case msgBind:
		_, rest, ok := cutNul(body)
		if !ok {
			return nil, false
		}
		name, _, ok := cutNul(rest)
		if !ok {
			return nil, false
		}
		if len(name) == 0 {
			if len(pl.unnamed) <= headerLen {
				return nil, false
			}
			return planText(msgParse, pl.unnamed[headerLen:]) // a whole message: header, then body
		}
		cs, known := pl.stmts.byName[string(name)]
		if !known {
			return nil, false
		}
		return planText(msgParse, cs.parse.body)
	}
	return nil, false
}

// batchOf reports whether every text of the extended-protocol batch that the client's message typ (body read)
// starts is one textOK accepts: up to its Sync, all of it already in the client reader's buffer (so it is known
// before the token statement goes), it holds only Parse, Bind, Describe, Execute, Close and Flush, and every
// text it parses or binds passes. A batch that goes on past what was read, or names a statement the proxy does
// not know, is not (the checked token statement goes). Plain batches (plainText) get the plain token statement;
// one that only opens a block (rewrite.LoneBegin) the same after the put-back.
func (ss *session) batchOf(typ byte, body []byte, textOK func([]byte) bool) bool {
	return ss.walkBatch(typ, body, func(text []byte, ok bool) bool { return ok && textOK(text) })
}

// walkBatch gives each the texts the extended-protocol batch that the client's message typ (body read) starts
// would prepare or bind, in order, over that message and the ones buffered whole behind it up to its Sync: a
// Parse's text, and a Bind's statement as the batch leaves it (one the batch parsed was given at its Parse;
// else the client's, stmtText). ok is false for a statement the proxy does not know, a malformed message, and
// any message but Parse, Bind, Describe, Execute, Close and Flush (the last four prepare and bind nothing:
// not given). It reports whether it reached the Sync with each never answering false: a batch that goes on
// past what was read is not known whole. The one walk both questions about a batch ask (batchOf: every text;
// batchHasModes: any), so that both read a Bind of a name parsed again in the batch as its new text.
func (ss *session) walkBatch(typ byte, body []byte, each func(text []byte, ok bool) bool) bool {
	if body == nil {
		return false // the messages behind it cannot be read before its body
	}
	var unnamed []byte // the unnamed statement's text as the batch leaves it; nil: as the client left it
	var parsed []string
	step := func(typ byte, body []byte) bool {
		switch typ {
		case msgParse:
			name, _, _ := cutNul(body)
			text, ok := planText(msgParse, body)
			if ok {
				if len(name) == 0 {
					unnamed = text
				} else {
					parsed = append(parsed, string(name))
				}
			}
			return each(text, ok)
		case msgBind:
			_, rest, ok := cutNul(body)
			if !ok {
				return each(nil, false)
			}
			name, _, ok := cutNul(rest)
			switch {
			case !ok:
				return each(nil, false)
			case len(name) == 0 && unnamed != nil, len(name) > 0 && slices.Contains(parsed, string(name)):
				return true // parsed in this batch: given at its Parse
			}
			return each(ss.stmtText(msgBind, body))
		case msgDescribe, msgExecute, msgClose, msgFlush:
			return true
		}
		return each(nil, false)
	}
	if !step(typ, body) {
		return false
	}
	for t, b := range ss.bufferedMsgs() {
		if t == msgSync {
			return true
		}
		if !step(t, b) {
			return false
		}
	}
	return false
}

// bufferedMsgs yields the client's messages buffered whole behind the one being handled (its body read), type
// and body, framed by parseHeader; it ends at the first one not buffered whole, or malformed. The bodies are
// the reader's, valid until it reads on.
func (ss *session) bufferedMsgs() iter.Seq2[byte, []byte] {
	return func(yield func(byte, []byte) bool) {
		buf, _ := ss.cr.r.Peek(ss.cr.r.Buffered())
		for len(buf) >= headerLen {
			t, n, err := parseHeader(buf, 0)
			if err != nil || len(buf) < headerLen+n {
				return
			}
			if !yield(t, buf[headerLen:headerLen+n]) {
				return
			}
			buf = buf[headerLen+n:]
		}
	}
}

// shiftPosition moves the position field of an ErrorResponse into the client's text: the server read prefix
// characters of the proxy's (the token statement) in front of it, and in it the hidden PREPAREs of spans
// (characters of the text after the prefix, in order). A position inside the token statement is left as it is;
// one inside a hidden PREPARE is dropped: it would point at some unrelated character of the client's text, or
// past its end; one in the client's text moves back by the characters of the proxy's before it.
func shiftPosition(body []byte, prefix int, spans []charSpan) []byte {
	var out []byte
	for rest := body; len(rest) > 0 && rest[0] != 0; {
		f := rest[0]
		v, after, ok := cutNul(rest[1:])
		if !ok {
			return body
		}
		if f == fieldPosition {
			p, err := strconv.Atoi(string(v))
			if err != nil || p <= prefix {
				return body
			}
			p -= prefix
			shift := 0
			for _, s := range spans {
				if p <= s.at {
					break
				}
				if p <= s.at+s.n { // positions count from 1
					return append(append([]byte(nil), body[:len(body)-len(rest)]...), after...)
				}
				shift += s.n
			}
			out = append(append(append(out, body[:len(body)-len(rest)]...), f), strconv.Itoa(p-shift)...)
			return append(append(out, 0), after...)
		}
		rest = after
	}
	return body
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// writeQueryMsg writes a Query whose text is prefix followed by raw (a Query body, zero byte included) or, when
// raw is nil, by s.
func writeQueryMsg(w msgSink, prefix string, raw []byte, s string) {
	if prefix == "" {
		writeMsg(w, msgQuery, raw, s)
		return
	}
	if raw == nil {
		writeMsg(w, msgQuery, nil, prefix+s)
		return
	}
	writeHeader(w, msgQuery, 4+len(prefix)+len(raw))
	w.WriteString(prefix)
	w.Write(raw)
}

// mayLeaveSessionState reports whether a client's text may leave session state that command tags do not show:
// set_config (the token, or any setting at session level), advisory locks, temporary tables made by SELECT
// INTO or CREATE TABLE AS. Matching is by case-insensitive substring, so a word in a comment or a string
// costs only a look at the connection; a function that does it on the client's behalf is not seen (the token
// statement of the next transaction catches a token or lock changed that way).
//
// pg_settings counts as set_config: an UPDATE of it calls set_config at session level (its rule). A Unicode
// escape (U&"...", U&'...') can spell an identifier without its letters showing: a text that holds one counts as
// holding every word.
func mayLeaveSessionState(text []byte) bool { return sessionStateWords.In(text) }

// sessionStateWords are mayLeaveSessionState's words.
var sessionStateWords = rewrite.NewFoldWords("set_config", "pg_settings", "advisory", "temp", "u&")

// tagMayLeaveSessionState reports whether a command tag says the statement may have left session state.
func tagMayLeaveSessionState(tag []byte) bool {
	return tagStartsWith(tag, "SET", "RESET", "DISCARD", "LISTEN", "PREPARE", "DECLARE", "CREATE", "LOAD", "DEALLOCATE")
}

// tagStartsWith reports whether a command tag starts with one of prefixes.
func tagStartsWith(tag []byte, prefixes ...string) bool {
	for _, p := range prefixes {
		if len(tag) >= len(p) && string(tag[:len(p)]) == p { // no copy of p, as bytes.HasPrefix would make
			return true
		}
	}
	return false
}

// serveLend relays the lent server connection's messages to the client until the lend ends: given back at the
// end of a transaction, lost, or stopped by the session's end.
func (ss *session) serveLend(sc *serverConn) {
	defer ss.pooled.serving.Done()
	ss.relayServer(sc, false)
}

// relayServer relays the lent server connection's messages to the client until the lend ends, and reports
// true; inline (answerInline), it also stops, reporting false, where a serveLend is to take over: whenever the
// answer's next bytes do not come within inlineWait (its first ones, or any after them: a statement behind a
// lock, after the rows of one before it), after a CopyInResponse or CopyBothResponse (the server waits for the
// client), after a ReadyForQuery that does not end the lend.
func (ss *session) relayServer(sc *serverConn, inline bool) bool {
	pl := ss.pooled
	r := &sc.r
	sc.relaying.Add(1)
	defer func() {
		sc.relaying.Add(-1)
		if sc.intr.reason() == intrEndLend {
			sc.conn.Close() // closeUnderRelay left it to this side, at a boundary (or this side ended first)
		}
	}()
	for {
		if ss.cw.Buffered() > 0 && !r.nextBuffered() {
			// The answers relayed last were followed by ones the client does not see (the token statement's
			// after a BEGIN with modes, a settings unit's): they go out before this waits for more, as after any
			// relayed answer (a batch that ends in a Flush gets no ReadyForQuery that would send them).
			ss.countRelayed(dirServerToClient, r)
			if err := ss.cw.Flush(); err != nil {
				ss.lendFailed(sc, err)
				return true
			}
		}
		if inline && r.r.Buffered() == 0 {
			// Not only before the first bytes: a wait without a deadline here is one the client's leaving never
			// ends, for the session goroutine reads the client no more (a Query whose second statement waited for
			// a lock held the pool's slot as long as the lock: TestPooledClientVanishingWhileItsAnswerIsReadInline).
			// At a message boundary, what was relayed sent: the serveLend goes on from here.
			if err := sc.peekInline(ss.srv.pools); err != nil && isTimeout(err) {
				return false
			}
		}
		typ, _, err := r.next()
		if err == nil && pl.cancelledAtEnd.Load() {
			err = errCancelledAtEnd
		}
		if err != nil {
			ss.lendFailed(sc, err)
			return true
		}
		if pl.replaying.Load() > 0 {
			if err := ss.replayAnswer(sc, typ); err != nil { // pooledsettings.go
				ss.lendFailed(sc, err)
				return true
			}
			continue
		}
		if ss.state.internal.Load() > 0 && typ != msgParameterStatus && typ != msgNotificationResponse {
			// The answers to the prepared fences' own commands (prepared.go: sendQueued), which went after the
			// settings unit and before the client's Query: none reaches the client, and their ReadyForQuery
			// settles nothing.
			if err := ss.preparedAnswer(sc, typ); err != nil {
				ss.lendFailed(sc, err)
				return true
			}
			continue
		}
		hiding := pl.hide.Load() > 0 && pl.relayFirst.Load() == 0
		if typ == msgReadyForQuery && !hiding && pl.readyHidden.CompareAndSwap(true, false) {
			// A lone CALL's or DO's Query answered (procedureAlone): the proxy's Sync behind it answers next, and
			// that ReadyForQuery, the last of the unit, goes to the client; this one settles nothing.
			if _, err = r.body(); err != nil {
				ss.lendFailed(sc, err)
				return true
			}
			r.release()
			continue
		}
		if typ == msgNoticeResponse && !hiding && pl.stmts.ownParseRuns() {
			// The proxy's Parse of the client's statement again, hidden, sent it: the client had it at its own
			// Parse (pooledstmts.go).
			if _, err = r.body(); err != nil {
				ss.lendFailed(sc, err)
				return true
			}
			r.release()
			continue
		}
		var body []byte
		// A notice's body is read for its position, moved as an error's is (below).
		if hiding || typ == msgCommandComplete || typ == msgParseComplete || typ == msgCloseComplete || typ == msgNoticeResponse || ss.serverNeedsBody(typ) {
			if body, err = r.body(); err != nil {
				ss.lendFailed(sc, err)
				return true
			}
		}
		if hiding {
			switch typ {
			case msgCommandComplete:
				pl.sqlStmts.hiddenAnswered(pl.hide.Load()) // pooledsqlprep.go
				pl.hide.Add(-1)
				if pl.quietSetLocals.Load() > 0 {
					pl.quietSetLocals.Add(-1)
				}
				if pl.checkSent.Swap(false) {
					pl.checkRan.Store(true)
				}
				continue
			case msgErrorResponse:
				pl.hide.Store(0) // relayed: the client's statement did not run, nor the rest of the token statements
				pl.quietSetLocals.Store(0)
				pl.readyHidden.Store(false)   // a lone CALL's Query skipped: the Sync's ReadyForQuery is the only one
				ss.noteTokenStmtRefusal(body) // pooledsettings.go
			case msgNoticeResponse:
				if pl.quietSetLocals.Load() > 0 && errorField(body, fieldCode) == sqlstateNoActiveSQLTransaction {
					// "SET LOCAL can only be used in transaction blocks": of the proxy's SET LOCAL, outside a
					// block (writeSetLocals); the client's own statements have not run yet.
					r.release()
					continue
				}
				if pl.sqlStmts.ownPrepareRuns(pl.hide.Load()) {
					// The proxy's hidden PREPARE of the client's statement again sent it: the client had it at
					// its own PREPARE (pooledsqlprep.go).
					r.release()
					continue
				}
			case msgParameterStatus, msgNotificationResponse:
			default:
				continue // ParseComplete, BindComplete, RowDescription, DataRow of the token statement
			}
		} else {
			switch typ {
			case msgCommandComplete:
				if tagMayLeaveSessionState(body) {
					pl.probe.Store(true)
				}
				if tag := string(body); tag == "DISCARD ALL\x00" || tag == "DEALLOCATE ALL\x00" {
					pl.stmts.droppedAll() // they deallocate the client's statements, as on a connection of its own
					pl.unnamedDropped.Store(true)
				}
				if n := pl.sqlStmts.completed(body); n > 0 { // pooledsqlprep.go
					pl.hide.Add(int64(n)) // hidden PREPAREs before the client's next statement
				}
				pl.stmts.relayedAnswer()
				pl.execsDone.Add(1) // an Execute's end (a Query's statements count too, and no Execute is sent then)
			case msgParseComplete, msgCloseComplete:
				if pl.stmts.answered(typ) {
					continue // the proxy's own (pooledstmts.go)
				}
				pl.stmts.relayedAnswer()
			case msgBindComplete, msgParameterDescription, msgRowDescription, msgNoData:
				pl.stmts.relayedAnswer()
			case msgEmptyQueryResponse, msgPortalSuspended:
				pl.stmts.relayedAnswer()
				pl.execsDone.Add(1) // an Execute's end
			case msgReadyForQuery:
				pl.stmts.ready()
				pl.sqlStmts.ready()
				pl.prefixChars.Store(0)
			}
			if pl.windowOpen.Load() && pl.countWindowAnswer(typ) {
				// relayed before the token statement went: closeWindow takes it off
			} else if pl.relayFirst.Load() > 0 {
				switch typ {
				case msgNoticeResponse, msgParameterStatus, msgNotificationResponse:
				case msgErrorResponse:
					pl.relayFirst.Store(0) // the server skips the rest of the batch, the token statement too
					pl.hide.Store(0)
				default:
					pl.relayFirst.Add(-1) // one of the client's: the token statement's answers come after them
				}
			}
		}
		if typ == msgParameterStatus {
			ss.pooledParamStatus(sc, body) // pooledsettings.go: only what changes the client's view
			r.release()
			continue
		}
		if typ == msgErrorResponse {
			if ended := sc.fencedEnd.Load(); ended != nil && errorField(body, fieldSeverity) == "FATAL" {
				body = fencedTxFarewell(ended[0], ended[1], ss.state.pending.Load() > 0).farewell()[5:] // past type and length
			}
			var dropped bool
			body, dropped = pl.errorNamesOut(body, hiding) // pooledstmts.go; before failed() forgets the Query's new names
			pl.batchFailed.Store(true)
			pl.execsDone.Store(execsFailed) // the server skips the batch's other Executes: none starts a COPY
			pl.stmts.failed(hiding)         // the server skips the rest of the batch
			pl.stmts.reopen(pl.sqlStmts.failed())
			if pl.stmtParsed.Load() {
				pl.probe.Store(true)
			}
			if n := pl.prefixChars.Load(); n >= 0 {
				body = pl.sqlStmts.shiftPosition(body, int(n)) // pooledsqlprep.go
			} else {
				ss.positionsUncounted() // positions.go
			}
			if dropped {
				pl.unnamedDropped.Store(true) // parsed again before the next Bind or Describe of it (placeUnnamed)
			}
		}
		if typ == msgNoticeResponse {
			// A warning's position counts characters of the client's text too (a TIMESTAMP precision reduced,
			// 22023, points at the type).
			if n := pl.prefixChars.Load(); n >= 0 {
				body = pl.sqlStmts.shiftPosition(body, int(n)) // pooledsqlprep.go
			} else {
				ss.positionsUncounted() // positions.go
			}
		}
		var ev serverEvent
		if body != nil {
			ev, err = ss.onServerMsg(typ, body, ss.cw)
			r.release()
		} else if ev, err = ss.onServerMsg(typ, nil, ss.cw); err == nil {
			err = r.forward(ss.cw)
		}
		if err != nil {
			ss.lendFailed(sc, err)
			return true
		}
		waitsForClient := typ == msgCopyInResponse || typ == msgCopyBothResponse
		if typ == msgCopyInResponse {
			ss.copyStarted()
		}
		if typ == msgReadyForQuery || waitsForClient || !r.nextBuffered() {
			ss.countRelayed(dirServerToClient, r)
			if err := ss.cw.Flush(); err != nil {
				ss.lendFailed(sc, err)
				return true
			}
		}
		if ev&evDrainNow != 0 {
			ss.clientIntr.raise(intrDrain)
		}
		if typ == msgReadyForQuery && ss.settle(sc) {
			return true
		}
		if inline && (typ == msgReadyForQuery || waitsForClient) {
			pl.mu.Lock()
			pl.inlineAtReady = typ == msgReadyForQuery
			pl.mu.Unlock()
			return false
		}
	}
}

// preparedAnswer takes one message that answers a command of the prepared fences' own (state.internal > 0) off
// sc and applies it to sc's templates (onPreparedAnswer). A FATAL goes to the client, as the server's reason,
// and ends the lend as a lost connection does, for this client only.
func (ss *session) preparedAnswer(sc *serverConn, typ byte) error {
	body, err := sc.r.body()
	if err != nil {
		return err
	}
	defer sc.r.release()
	if _, err := ss.onPreparedAnswer(sc.prep, typ, body, ss.cw); err != nil {
		return err
	}
	if typ == msgReadyForQuery && ss.state.internal.Load() == 0 {
		ss.ownUnitAnswered() // a cancel that came while the proxy's commands ran: the client's statement runs now
	}
	if ss.state.serverFatal { // onPreparedAnswer relayed the server's FATAL: no farewell of the proxy's after it
		ss.cw.Flush()
		return fmt.Errorf("the server ended the connection during the proxy's own statement: %s", errorField(body, fieldMessage))
	}
	return nil
}

// lendFailed ends a lend whose server connection (or the client, written to) failed. Only the lend's server side
// (relayServer) calls it.
func (ss *session) lendFailed(sc *serverConn, err error) {
	if sc.r.rest > 0 {
		// A message forwarded to the client stopped in its middle: nothing may follow it (endPooled).
		ss.pooled.clientCut.Store(true)
	}
	// Closed first, without the lock: the writer of the client's messages may hold pl.mu in a write to the server
	// that waits for the server to read, while the server waits for its answers to be read, which this side no
	// longer does (a client that pipelined far more than it read, then left: the lock was never freed, and the
	// connection and its pool slot stayed held). Closing it gives that write its error. sc is still this lend's
	// or already closed: nothing but this side gives it back open (settle), and the session's end closes it
	// before it waits for this side.
	sc.conn.Close()
	pl := ss.pooled
	pl.mu.Lock()
	defer pl.mu.Unlock()
	defer pl.settled.Broadcast()
	defer ss.wakeReplayed() // awaitReplayed looks at pl.lost
	if pl.sc != sc {
		return // the session's end took it
	}
	pl.setLent(nil)
	sc.pool.discard(sc)
	if pl.lost == nil {
		pl.lost = err
		if !ss.clientOut.failed.Load() && !ss.state.serverFatal {
			ss.serverConnLost(sc, err)
		}
	}
	ss.clientIntr.raise(intrPeerEnded)
}

// serverConnLost is the loss of the client's server connection, with the client there to be told (pl.mu held):
// it counts in fenceproxy_upstream_errors_total, and the client's farewell is lostFarewell's. A lend's loss
// (lendFailed) and the probe's after the transaction (settle) both come here, so that one counts as the other
// does; until 2026-12-05 the probe's was not counted (TestPooledProbeCutByADeadHost).
func (ss *session) serverConnLost(sc *serverConn, err error) {
	ss.srv.metrics.upstreamError()
	ss.pooled.fare = ss.lostFarewell(sc, err)
}

// wakeReplayed wakes awaitReplayed, if it waits, to look again.
func (ss *session) wakeReplayed() {
	select {
	case ss.pooled.replayed <- struct{}{}:
	default:
	}
}

// lostFarewell is the FATAL of a pooled client whose lent server connection was lost without a FATAL of the
// server's (pl.mu held), by the rule a session's loss of its upstream connection follows (upstreamLostFarewell,
// docs/ha.md), so that a client is told the same in either mode: 57P01 naming the new primary when a change of
// primary closed it (movedFarewell); the settings replay's own failure, and a probe the server answered with
// what the proxy cannot read (probeUnread, probeCancelled: not lost, closed by the proxy); 08007 when a
// statement's answer was lost (it may have committed, a COMMIT or a statement of an implicit transaction; the
// proxy never replays it); with upstream.hosts, 57P01 naming the lost host (its next session goes to the
// current primary); else 08006 naming it. The lend's failure (lendFailed) and the probe's (settle) both come
// here. Before 2026-12-05 only a change of primary was told apart: a primary that died under a statement gave
// 08006, which a client may take for a statement that did not run (TestPooledPrimaryKilledUnderAStatement).
func (ss *session) lostFarewell(sc *serverConn, err error) []byte {
	answerLost := ss.pooled.open > 0 && byte(ss.state.txStatus.Load()) != txFailed
	if ended := ss.fencedTxEnded.Load(); ended != nil {
		// Ended by the write hold (writehold.go: Server.endHeldBack); a write that waited behind it did not commit.
		// Owed as fencedTxRefused tells it (an answer the client waits for), not by the lend's unsettled count.
		return fencedTxFarewell(ended[0], ended[1], ss.state.pending.Load() > 0 && !ss.endedUncommitted.Load()).farewell()
	}
	if moved := sc.movedTo.Load(); moved != nil {
		return movedFarewell(sc.host.addr, *moved, answerLost)
	}
	var replay *replayError
	var unread *probeUnread
	var cancelled *probeCancelled
	switch {
	case errors.As(err, &replay):
		return settingsFailure(replay)
	case errors.As(err, &unread), errors.As(err, &cancelled):
		// The server answered the probe after the transaction (answered too): the connection is closed
		// because its session state cannot be read, not lost.
		return errorResponse("FATAL", sqlstateConnectionFailure, "fenceproxy could not read the server connection's session state", err.Error(), "")
	case answerLost:
		return errorResponse("FATAL", sqlstateTransactionResolutionUnknown,
			"fenceproxy lost the connection to the upstream server while a statement was running: whether its transaction committed is unknown",
			fmt.Sprintf("upstream %s: %v", sc.host.addr, err), "Check whether the transaction's changes are there before doing it again.")
	case ss.srv.router != nil:
		return errorResponse("FATAL", sqlstateAdminShutdown,
			fmt.Sprintf("terminating connection because fenceproxy lost the upstream host %s", sc.host.addr), err.Error(),
			"Connect again: fenceproxy sends new sessions to the current primary.")
	}
	return errorResponse("FATAL", sqlstateConnectionFailure, fmt.Sprintf("fenceproxy lost the server connection to %s", sc.host.addr), err.Error(), "")
}

// movedFarewell is the FATAL of a pooled client whose lent server connection was closed because a change of
// primary left its host (from) behind: as in session mode (upstreamLostFarewell), 08007 when a statement's
// answer was lost (it may have committed; the proxy never replays it), else 57P01 naming the new primary.
func movedFarewell(from, now string, answerLost bool) []byte {
	if answerLost {
		return errorResponse("FATAL", sqlstateTransactionResolutionUnknown,
			"fenceproxy lost the connection to the upstream server while a statement was running: whether its transaction committed is unknown",
			fmt.Sprintf("the primary moved from %s to %s", from, now), "Check whether the transaction's changes are there before doing it again.")
	}
	if now == "" {
		now = "not known yet"
	}
	return errorResponse("FATAL", sqlstateAdminShutdown, fmt.Sprintf("terminating connection because the primary moved from %s to %s", from, now), "",
		"Connect again: fenceproxy sends new sessions to the new primary.")
}

// settle is the lend's decision at a ReadyForQuery: when everything the client sent is answered and no
// transaction is open, look at the connection if the transaction may have left session state, then give it
// back, unless the client is pinned to it. It reports whether the lend ended.
func (ss *session) settle(sc *serverConn) bool {
	pl := ss.pooled
	st := &ss.state
	pl.mu.Lock()
	defer pl.mu.Unlock()
	defer pl.settled.Broadcast()
	// The cancels on their way go first: what this decides (the lend's end, the client's next unit) must not
	// meet one that PostgreSQL has not taken yet.
	pl.cancelsOut.Wait()
	if pl.sc != sc {
		return true
	}
	if ss.applyCopyStarts() && ss.srv.draining.Load() && st.idle() {
		// The Syncs the COPY made the server ignore were still counted when the ReadyForQuery was relayed
		// (readyOut), which then found the session busy: a drain looks now.
		ss.clientIntr.raise(intrDrain)
	}
	pl.copyIn = false // at a ReadyForQuery the server reads no COPY's data: a COPY that failed ended it
	failed := pl.batchFailed.Swap(false)
	if failed {
		pl.mayUndo = true // the error aborted the transaction, or a savepoint's part of it
		// Before the next unit decides what to prepare again (it waits for this).
		clear(sc.stmtsFresh)
		sc.unnamedToken = tokenNone // its Parse may have been skipped (after a window's BEGIN that failed)
		sc.clientUnnamed = true     // and the Close of unnamedStmtName before a Parse of it: whose statement is
		sc.unnamedOwner = nil       // there is not known (closeLastUnnamed)
	}
	if pl.copyAmbiguous {
		pl.copyAmbiguous = false
		if failed {
			// The unit failed after messages went into its COPY (copyAmbiguous): how many ReadyForQuery are
			// still to come is not known. The connection goes, and the session with it.
			pl.setLent(nil)
			sc.pool.discard(sc)
			pl.lost = errors.New("messages sent into a COPY FROM STDIN that failed")
			pl.fare = errorResponse("FATAL", sqlstateProtocolViolation,
				"fenceproxy: messages sent during a COPY FROM STDIN that failed cannot be followed in transaction pooling", "",
				"End a COPY with CopyDone or CopyFail before the next message, or use pool.mode: session.")
			ss.clientIntr.raise(intrPeerEnded)
			return true
		}
	}
	if pl.checkRan.Swap(false) {
		sc.checkedFor, pl.startChecked = pl, true // checkFirst
	}
	if pl.open > 0 {
		pl.open--
	}
	allAnswered := pl.open == 0 && !st.unsynced.Load() // every unit the client sent
	if allAnswered {
		// No statement the client sent is left to start a COPY, so no Sync or COPY end it sent so far is any
		// COPY's: the runs are forgotten. Kept, a COPY end sent outside any COPY (which the server ignores)
		// left the Syncs of answered units counted, and the next COPY's CopyInResponse took them as ignored by
		// the server: the lend miscounted the answers still to come, relayed the proxy's hidden ones and
		// waited for one that never came (a review's finding: TestPooledWireOracleCases, stray copydone).
		pl.resetCopyRuns()
		if byte(st.txStatus.Load()) == txIdle {
			clear(pl.copyPortals) // the transaction ended, and its portals with it
		}
		// Whatever a deferred cancel waited for has answered: it must not reach the client's next statement,
		// which the client sent after (ownUnitAnswered's goroutine may come after this; a review's finding).
		pl.cancelDeferred.Store(false)
	}
	if pl.chainPending && allAnswered {
		pl.chainPending = false
		// In a block that is not failed: a chain that an error skipped started nothing, and a statement of the
		// proxy's in the failed block would fail (25P02) and end the session.
		pl.chainDue = byte(st.txStatus.Load()) == txBlock
	}
	if !allAnswered || byte(st.txStatus.Load()) != txIdle {
		return false
	}
	pl.stmtParsed.Store(false)
	defer func() { pl.mayUndo = false }() // the transaction has ended; after the probe, which reads it
	if pl.probe.Swap(false) {
		stop := ss.watchProbe(sc)
		err := ss.probeSession(sc)
		left := stop()
		if left && err == nil {
			// The client left as the probe ended: the watch may have cancelled on, or set a deadline on, a
			// connection that must then go to nobody else.
			err = errClientLeftWaiting
		}
		if err != nil {
			pl.setLent(nil)
			sc.pool.discard(sc)
			pl.lost = err
			switch {
			case pl.fare != nil:
			case left:
				// The client left, and the watch cut the probe: the connection was not lost under a client
				// (not counted), and the farewell goes to nobody.
				pl.fare = ss.lostFarewell(sc, err)
			default:
				// One rule for every lost server connection, as at a lend's failure: a change of primary that
				// closed it, a host that died (before 2026-12-05 the probe had its own 08006 that named no
				// host, and was not counted: TestPooledProbeCutByADeadHost). The transaction's answer went out
				// before the probe (pl.open is 0), so no answer was lost with it.
				ss.serverConnLost(sc, err)
			}
			ss.clientIntr.raise(intrPeerEnded)
			return true
		}
		if pl.lost != nil { // refused session state
			pl.setLent(nil)
			sc.pool.discard(sc)
			ss.clientIntr.raise(intrPeerEnded)
			return true
		}
	}
	if pl.pin != "" {
		return false
	}
	pl.cancelDeferred.Store(false) // its statement is over
	// A cancel not seen taken may reach the backend after absorbCancel, and stop another client's statement
	// there: the connection is closed instead (TestPooledCancelGivenUpOnNeverReachesAnotherClient).
	unsure := pl.cancelUnsure.Swap(false)
	if pl.cancelSent && !unsure {
		// Watched as the probe is: an absorb held (a lock on pg_proc, a stopped backend) held the connection and
		// its slot as long, its client gone (TestPooledClientVanishingWhileItsCancelIsAbsorbed).
		stop := ss.watchProbe(sc)
		err := ss.absorbCancel(sc)
		if stop() && err == nil {
			err = errClientLeftWaiting // the watch may have cancelled on, or set a deadline on, the connection
		}
		if err != nil {
			// The client's transaction is over and answered: only the connection is in doubt (a role that may
			// not run pg_sleep, a server gone, a client that left while it was held). It goes to nobody else;
			// the client's next unit gets another (TestPooledCancelWhoseAbsorbFailsKeepsTheClient: the
			// session used to end with 08006).
			ss.logger().Warn("closing a server connection: a cancel sent to it could not be cleared off it", "err", err)
			unsure = true
		}
	}
	pl.cancelSent = false
	pl.setLent(nil)
	if pl.tainted || unsure { // tainted: pooledsettings.go, noteTokenStmtRefusal
		pl.tainted = false
		sc.pool.discard(sc)
	} else {
		sc.pool.release(sc)
	}
	if ss.srv.draining.Load() {
		ss.clientIntr.raise(intrDrain)
	}
	return true
}

// watchProbe watches the client (watchClient) while the probe, or absorbCancel, runs on sc: a probe that waited
// behind a lock, its client gone, held the connection and its slot as long as the lock
// (TestPooledClientVanishingWhileItsProbeWaits; the absorb until 2026-12-05:
// TestPooledClientVanishingWhileItsCancelIsAbsorbed). Once the client is gone the probe's statement is cancelled
// and its reads end (a read deadline), so the probe fails and the connection is discarded. The returned stop
// ends the watch and reports whether it acted: then the connection goes to nobody else, whatever the probe
// found. Whoever runs the probe: the session goroutine (answerInline read the answer that ends the
// transaction), which reads the client no more; or a lend's own goroutine (serveLend, which an inline read
// hands over to at any slow gap, so which one runs it is a matter of timing), where the session goroutine
// reads the client and sees it leave, but its end waits for pl.mu, which the probe holds (settle): the watch
// was once for the first alone, and the test failed one run in five on a loaded machine.
func (ss *session) watchProbe(sc *serverConn) (stop func() bool) {
	var mu sync.Mutex
	done, acted := false, false
	w := ss.watchClient(func() {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		acted = true
		ss.srv.cancelUpstream(sc.key, sc.host.addr)
		sc.conn.SetReadDeadline(time.Now())
	}, leaveGrace)
	return func() bool {
		mu.Lock()
		done = true
		mu.Unlock()
		w.end()
		return acted
	}
}

// probeLimits are the client's limits the probe turns off for itself (probeSQL).
var probeLimits = [...]string{"statement_timeout", "lock_timeout"}

// probeLimitsSQL: a row of each probeLimits' session value and its reset value (set_config local with NULL
// resets it and answers the value it got, in the same units as the session value), in that order: the
// subquery is read first; then the limits off for the rest of the probe.
var probeLimitsSQL = "SELECT s.a, s.b, pg_catalog.set_config(" + quoteLiteral(probeLimits[0]) + ", NULL, true), pg_catalog.set_config(" + quoteLiteral(probeLimits[1]) + ", NULL, true) " +
	"FROM (SELECT pg_catalog.current_setting(" + quoteLiteral(probeLimits[0]) + ") AS a, pg_catalog.current_setting(" + quoteLiteral(probeLimits[1]) + ") AS b OFFSET 0) AS s; " +
	"SELECT pg_catalog.set_config(" + quoteLiteral(probeLimits[0]) + ", '0', true), pg_catalog.set_config(" + quoteLiteral(probeLimits[1]) + ", '0', true); "

// probeAttempts is how many times a probe that was cancelled runs before the client's session ends.
const probeAttempts = 3

// probeSession runs probeSQL on sc (pl.mu held) and applies what it found: the client's new token and lock
// values, a pin (or, with pool.on_session_state refuse, the session's end), whether the token statement is still
// prepared. A probe cancelled (57014: the client's statement_timeout while it read the settings, or the client's
// CancelRequest that arrived after its statement ended) changed nothing, its implicit transaction rolled back:
// it runs again.
func (ss *session) probeSession(sc *serverConn) error {
	defer func() {
		ss.pooled.probeEffects = rewrite.SessionEffects{}
	}()
	for attempt := 1; ; attempt++ {
		err := ss.probeOnce(sc)
		var cancelled *probeCancelled
		if !errors.As(err, &cancelled) || attempt == probeAttempts {
			return err
		}
	}
}

// probeCancelled: a probe failed with query_canceled.
type probeCancelled struct{ msg string }

func (e *probeCancelled) Error() string { return "probe cancelled: " + e.msg }

// probeUnread: the server answered the probe, but not with what the proxy can read the session state from (an
// error, a row of another shape). The connection is there and is closed by the proxy, not lost (lostFarewell);
// every other failure of the probe is the connection's.
type probeUnread struct{ msg string }

func (e *probeUnread) Error() string { return "probe: " + e.msg }

// probeOnce runs probeSQL once (probeSession).
func (ss *session) probeOnce(sc *serverConn) error {
	pl := ss.pooled
	cfg := ss.srv.cfg
	writeMsg(sc.w, msgQuery, nil, probeSQL(cfg.Token.Setting, cfg.Token.LockSetting, sc.pool.params["user"], ss.customToRead(sc), sc.prep.ownCond()))
	pl.queryDroppedUnnamed(sc)
	if err := sc.w.Flush(); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	var row, limits [][]byte
	var failure, failureCode string
	settings := map[string]string{}
	// probeSQL's statements: the limits (one row), the limits off, the settings (a row each), the state (one
	// row), the placeholder.
	const limitsStmt, settingsStmt, stateStmt = 0, 2, 3
	for rows, stmt := 0, 0; ; {
		typ, _, err := sc.r.next()
		if err != nil && failure != "" {
			return fmt.Errorf("probe: %w, after the server said: %s", err, failure) // its FATAL, the reason
		}
		if err != nil {
			return fmt.Errorf("probe: %w", err)
		}
		body, err := sc.r.body()
		if err != nil {
			return fmt.Errorf("probe: %w", err)
		}
		switch typ {
		case msgDataRow:
			switch {
			case stmt == limitsStmt && rows == 0:
				if limits, err = dataRowValues(body); err != nil {
					return &probeUnread{err.Error()}
				}
			case stmt == stateStmt && rows == 0:
				if row, err = dataRowValues(body); err != nil {
					return &probeUnread{err.Error()}
				}
			case stmt == settingsStmt:
				nv, err := dataRowValues(body)
				if err != nil || len(nv) != 2 || nv[0] == nil || nv[1] == nil {
					return &probeUnread{fmt.Sprintf("a setting's row: %v", err)}
				}
				settings[string(nv[0])] = string(nv[1])
			}
			rows++
		case msgCommandComplete:
			stmt++
			rows = 0
		case msgErrorResponse, msgParameterStatus, msgNotificationResponse:
			if err := ss.ownUnitMessage(sc, typ, body, &failure, &failureCode); err != nil {
				return fmt.Errorf("probe: %w", err)
			}
		case msgReadyForQuery:
			if failureCode == sqlstateQueryCanceled {
				return &probeCancelled{failure}
			}
			if failure != "" {
				return &probeUnread{"failed: " + failure}
			}
			if len(row) != 6 || len(limits) != 2*len(probeLimits) {
				return &probeUnread{fmt.Sprintf("%d and %d values", len(row), len(limits))}
			}
			// The settings read saw the probe's own limits: the client's are those of the first statement,
			// kept when they differ from what a reset gives (as the read keeps only session-level values).
			for i, name := range probeLimits {
				if v, reset := limits[i], limits[len(probeLimits)+i]; v != nil && string(v) != string(reset) {
					settings[name] = string(v)
				} else {
					delete(settings, name)
				}
			}
			if pl.startChecked {
				// The value a reset gives on the pool's connections is a reset only when the transaction's texts
				// leave the token reset (resetRead), a set when they leave it set (setRead); where they cannot
				// tell, it is no token, which refuses every fenced write where either token might write
				// (followedToken). The connection held the placeholder before.
				e := pl.probeEffects.Token
				pl.token = followedToken(row[0], pl.token, pl.resetToken, sc.pool.resetToken, resetRead(e, pl.mayUndo, false), setRead(e, pl.mayUndo))
				// An empty lock has no reading that refuses more in every case (a kept lock refuses what its
				// fence refuses, no lock what require_lock refuses): it is read only where the texts say which
				// it is, and where they cannot, the session ends (lockUnknown).
				ss.followLock(sc, row[1])
			} else if string(row[0]) != poolPlaceholder || string(row[1]) != poolPlaceholder {
				// Not checked at the start, and not the placeholder: a function may have left it, the client's or
				// one of a client before. The client's plain texts set neither, so its values stay; the connection
				// does not serve another transaction.
				pl.tainted = true
				ss.logger().Warn("pooled server connection holds a token or lock no client's text set; closing it", "pool", sc.pool.name)
			}
			ss.settingsRead(sc, settings) // pooledsettings.go
			if string(row[3]) != "t" && sc.clientUnnamed {
				// Dropped (DISCARD ALL, DEALLOCATE ALL, in a function too): the client's unnamed statement is
				// prepared again before its next use (placeUnnamed).
				sc.clientUnnamed = false
				pl.unnamedReplaced()
			}
			clear(sc.stmts)      // a DISCARD or DEALLOCATE may have dropped some
			clear(sc.stmtsFresh) // and what a name holds now is not known: prepared again before its next use
			for _, name := range strings.Fields(string(row[4])) {
				sc.stmts[name] = true
			}
			reasons := string(row[2])
			if string(row[5]) != "t" {
				if pl.startChecked {
					reasons = strings.TrimPrefix(reasons+", "+roleReason, ", ")
				} else {
					// Not checked at the start: the role may be one a function of another client's left, which
					// the client's plain token statement set back for its own transaction only. Pinned there,
					// its later transactions would run as that role; the connection serves nobody else.
					pl.tainted = true
					ss.logger().Warn("pooled server connection holds a role no client's text set; closing it", "pool", sc.pool.name)
				}
			}
			// A tainted connection is closed when the transaction ends: what it holds is not surely the client's,
			// and pinned there the client's transactions would take it for their own.
			if reasons := ss.settingsPinReason(reasons); reasons != "" && pl.pin == "" && !pl.tainted {
				ss.srv.metrics.poolPinned(pinReason(reasons))
				sc.pool.pins.Add(1)
				if ss.srv.poolSettings().OnSessionState == config.PoolRefuse {
					pl.lost = errors.New("session state refused")
					pl.fare = errorResponse("FATAL", sqlstateFeatureNotSupported, fmt.Sprintf("pool.on_session_state is refuse, and the transaction left %s, which a pooled server connection cannot keep for the client", reasons), "", "Use pool.mode session for this client, or pool.on_session_state: pin.")
				} else {
					pl.pin = reasons
					ss.logger().Info("client pinned to its server connection", "reason", reasons)
				}
			}
			return nil
		}
	}
}

// followLock takes the client's new session lock from its server session value after the transaction (got;
// nil: NULL), as followed does, where an empty value is what the transaction's texts say: set, when they may
// set the lock and cannot reset it; reset, when they may reset it and cannot set it. A review of 2026-12-04
// showed that no guess is safe: taking it for a reset kept a lock the client had dropped (a require_lock table
// then took writes directly refused), taking it for a set lost a lock the client had (row fencing alone). Where
// the texts cannot tell (both, or neither: code the proxy does not see), the session ends with FATAL 55F03,
// unless both readings give the same lock.
func (ss *session) followLock(sc *serverConn, got []byte) {
	pl := ss.pooled
	// What a reset gives on the pool's connection (the empty string, or a role's or database's default set
	// outside the proxy), where the client's reset value is another: a set to it leaves the same.
	atReset := got != nil && string(got) == valueOr(sc.pool.resetLock) && !sameReset(pl.resetLock, sc.pool.resetLock)
	e := pl.probeEffects
	if atReset && !e.Lock.SetOnly() && !e.Lock.ResetOnly() {
		what := "the empty string (on a pooled server connection both leave it empty)"
		if sc.pool.resetLock != nil {
			what = fmt.Sprintf("%q, the value a reset gives on a pooled server connection (a role's or database's default)", *sc.pool.resetLock)
		}
		pl.lost = errors.New("fencing lock not known")
		pl.fare = errorResponse("FATAL", sqlstateInvalid, fmt.Sprintf(
			"fenceproxy cannot tell whether the transaction reset %s or set it to %s, so the session's lock is not known", ss.srv.cfg.Token.LockSetting, what),
			"", "Reconnect. In transaction pooling, reset the lock and set it in separate transactions, with SET or set_config in the statement's text.")
		ss.logger().Warn("pooled session ended: its fencing lock is not known after its transaction", "pool", sc.pool.name)
		return
	}
	pl.lock = followed(got, pl.lock, pl.resetLock, sc.pool.resetLock, !e.Lock.SetOnly())
}

// followed is the client's new session value of a setting whose server session value after the transaction is
// got (nil: NULL): the placeholder means unchanged, anything else was set, but for what a RESET gives on a pooled
// connection: its default (poolDefault, a role's or database's), or without one the empty string (a custom
// setting's own default). A set to that value gives the same: readIsReset says which to take it as (the
// caller's). Until 2026-12-05 a value equal to a pool default was always a reset, and a client with a startup
// token that set the token to the default's value got its startup token back (a review's finding). For the
// token: followedToken; for the lock: followLock.
func followed(got []byte, cur, reset, poolDefault *string, readIsReset bool) *string {
	switch {
	case got != nil && string(got) == poolPlaceholder:
		return cur
	case got == nil && poolDefault == nil,
		got != nil && string(got) == valueOr(poolDefault) && readIsReset:
		return reset
	}
	v := string(got)
	return &v
}

// followedToken is followed for the token: the value a reset gives on the pool's connections is the client's
// reset value where the transaction's texts leave the token reset (asReset), the value read where they leave it
// set (asSet), and otherwise no token, unless both readings give the same token. Taking it for either could
// give a token the client does not have: for a set to the empty string its startup token, which would write
// where directly nothing does; for a set to a role's default its startup token, older than the one it chose.
// No token refuses every fenced write where either might write.
func followedToken(got []byte, cur, reset, poolDefault *string, asReset, asSet bool) *string {
	if !asReset && !asSet && got != nil && string(got) == valueOr(poolDefault) && !sameReset(reset, poolDefault) {
		none := ""
		return &none
	}
	return followed(got, cur, reset, poolDefault, asReset)
}

// valueOr is the value a reset gives on a pooled connection whose default is poolDefault: the empty string
// without one.
func valueOr(poolDefault *string) string {
	if poolDefault == nil {
		return ""
	}
	return *poolDefault
}

// sameReset: a client whose reset value is reset (nil: none of its own, the connection's applies) resets to
// what a reset gives on a pooled connection whose default is poolDefault.
func sameReset(reset, poolDefault *string) bool {
	return reset == nil || *reset == valueOr(poolDefault)
}

// pinReason is the metric label of a pin: its first reason's kind.
func pinReason(reasons string) string {
	for _, r := range []string{"ROLE", "SET", "LISTEN", "WITH HOLD", "SQL PREPARE", "protocol-level", "advisory", "temporary"} {
		if strings.Contains(reasons, r) {
			return strings.ToLower(strings.ReplaceAll(r, " ", "_"))
		}
	}
	return "other"
}

// dataRowValues decodes a DataRow body (nil for NULL).
func dataRowValues(body []byte) ([][]byte, error) {
	if len(body) < 2 {
		return nil, errors.New("short DataRow")
	}
	n := int(binary.BigEndian.Uint16(body))
	body = body[2:]
	out := make([][]byte, 0, n)
	for i := 0; i < n; i++ {
		if len(body) < 4 {
			return nil, errors.New("short DataRow")
		}
		l := int32(binary.BigEndian.Uint32(body))
		body = body[4:]
		if l < 0 {
			out = append(out, nil)
			continue
		}
		if int(l) > len(body) {
			return nil, errors.New("short DataRow")
		}
		// A copy that is never nil: an empty value ('') is not NULL. append([]byte(nil), empty...) is nil, and a
		// client's token or setting set to '' read back as a RESET (the startup token came back, and the write
		// went with it) or as a broken row (08006).
		out = append(out, append(make([]byte, 0, l), body[:l]...))
		body = body[l:]
	}
	return out, nil
}

// endPooled ends a pooled session: a server connection the client still holds (mid-transaction, pinned, or
// with an answer on its way) is closed, which rolls back whatever the client left open, after a cancel of what
// it may still run; nobody else ever gets it.
func (ss *session) endPooled(e ending) {
	pl := ss.pooled
	pl.mu.Lock()
	ss.applyCopyStarts()
	if e.why == endTerminate {
		if pl.sc != nil && pl.open > 0 {
			// What the client sent right before its Terminate (in the same read) is still in the writer: it goes,
			// and is answered, as on a connection of its own.
			ss.countRelayed(dirClientToServer, &ss.cr)
			pl.sc.w.Flush()
			ss.needReader()
		}
		// A client that says goodbye right after its last answer may be quicker than the lend's decision to give
		// the connection back: let it decide. Not after the client closed its socket: an answer that never
		// comes (a Sync the pool counts wrong) held the connection for good; the connection is closed below.
		ss.awaitSettled(func() bool { return pl.sc != nil && pl.open > 0 && pl.lost == nil }, leaveGrace)
	}
	sc, open := pl.sc, pl.open
	pl.setLent(nil)
	pl.settled.Broadcast()
	fare := pl.fare
	pl.mu.Unlock()
	forced := ss.forced()
	ss.outcome = ss.outcomeOf(e, forced)
	// The lend's server side writes to the client until it stops (below): its writes to a client that reads
	// nothing are bounded as the farewell's are, so that the session ends all the same, and its pool slot comes
	// back, whoever holds the server connection now (TestPooledEndWithAClientThatReadsNothing; with the
	// connection still lent, TestPooledProtocolEndWithAClientThatReadsNothing: until 2026-12-05 the deadline
	// came only after the wait for that side, and the session and its slot stayed, one end in two, for as
	// long as the client did not read).
	ss.client.SetWriteDeadline(time.Now().Add(farewellTimeout))
	if sc != nil {
		// Also while a unit of the proxy's own runs (a settings replay, a put-back): one blocked behind a lock
		// would otherwise stay, its backend waiting, after the connection closed.
		if open > 0 || ss.state.answersInFlight() || pl.replaying.Load() > 0 {
			pl.cancelledAtEnd.Store(true)
			ss.srv.cancelUpstream(sc.key, sc.host.addr)
		}
		sc.closeUnderRelay() // a relay stops at a message boundary: the farewell below follows whole messages
		pl.serving.Wait()
		sc.pool.discard(sc)
	}
	// No lend's server side writes to the client past here, even one whose connection the session goroutine
	// took from the lend already (refuseInsideBatch): such a side relays the message it is in to its end and
	// stops there (closeUnderRelay), so that the farewell below follows whole messages. Waited for only where
	// pl.sc was still set, it wrote the client's bufio.Writer at the same time as the farewell below: bytes
	// sent twice or cut (TestPooledEndWritesAfterTheLendsServerSide).
	pl.serving.Wait()
	switch e.why {
	case endProtocol:
		ss.srv.metrics.protocolError()
		ss.logger().Info("client protocol violation; closing", "err", e.err)
		fare = errorResponse("FATAL", sqlstateProtocolViolation, "invalid message from client", e.err.Error(), "")
	case endDrained:
		fare = errorResponse("FATAL", sqlstateAdminShutdown, "terminating connection because fenceproxy is shutting down", "", "")
	case endRefused:
		ss.logger().Warn("session refused; closing", "err", e.err)
		fare = refusedFarewell(e.err)
	case endTerminate, endClientGone:
		fare = nil
	}
	// After a message cut in the middle (clientCut) the client would read the farewell's bytes as the rest of
	// that message: it gets none, only the connection's end.
	if !forced && fare != nil && !pl.clientCut.Load() {
		ss.client.SetWriteDeadline(time.Now().Add(farewellTimeout))
		ss.cw.Write(fare)
		ss.cw.Flush()
		(&goroutineIO{ss: ss}).lingerClient(time.Now().Add(lingerTimeout))
	}
	ss.client.Close()
}

// cancelPooled delivers a client's CancelRequest to the server connection lent to it (deliverCancel: the lend
// does not end before the cancel arrived and was taken off the connection); nothing when the client is idle.
//
// A client waiting for a server connection holds mu for its wait (lend): its wait ends, cancelled
// (errWaitCancelled), and its statement never runs. Without that, the cancel waited for the wait, and then
// reached a statement already over.
func (ss *session) cancelPooled() { ss.cancelLent(nil) }

// cancelLent cancels what the lent server connection runs for the client, as cancelPooled says: for the
// client's CancelRequest (refuses nil), or for the router, which stopped trusting a host with fenced writes
// (Server.fencedHostsRefused): then only if refuses, asked under the session's lock, says the connection lent
// now is on such a host. The lend cannot end while that lock is held, so the connection cancelled is the
// client's own, never one given back and lent to another client meanwhile. A client waiting for a connection
// has nothing running: only its own cancel ends the wait.
func (ss *session) cancelLent(refuses func(*serverConn) bool) {
	pl := ss.pooled
	pause := time.Millisecond
	for !pl.mu.TryLock() {
		pl.waitMu.Lock()
		waiting := pl.waiting
		if waiting && refuses == nil {
			pl.waitCancelled = true
		}
		pl.waitMu.Unlock()
		if waiting {
			if refuses == nil {
				pl.wakeWait()
			}
			return
		}
		// mu is held for a message being forwarded (a long one: a COPY's), or by a lend about to wait: look
		// again, less often the longer it is held, so that cancels piling up cost no CPU.
		time.Sleep(pause)
		pause = min(2*pause, cancelPollMax)
	}
	if refuses != nil && (pl.sc == nil || !refuses(pl.sc)) {
		pl.mu.Unlock()
		return
	}
	ss.applyCopyStarts()
	if pl.sc != nil && ss.ownAhead() {
		// A unit of the proxy's own runs first: cancelled, it would end the session (replayAnswer: 08006), or
		// fail (a sweep of the prepared fences' statements: their next probe would take them for the client's
		// SQL PREPARE), and the client's statement would still run. The cancel waits for it.
		pl.cancelDeferred.Store(true)
		// The lend's server side may have taken the last one off between the look and the store, and looked at
		// cancelDeferred before it (ownUnitAnswered, without mu): looked at again, after the store.
		ss.sendDeferredCancel()
		pl.mu.Unlock()
		return
	}
	var delivered <-chan struct{}
	if pl.sc != nil && (pl.open > 0 || ss.state.unsynced.Load()) {
		delivered = ss.deliverCancel(refuses != nil)
	}
	pl.mu.Unlock()
	if delivered != nil {
		<-delivered // the client's cancel connection is answered once PostgreSQL has taken the cancel, as directly
	}
}

// deliverCancel sends the client's cancel to the lent connection's server from a goroutine of its own (pl.mu
// held) and returns a channel closed once PostgreSQL has taken it, which takes as long as the server needs to
// start a process for it: under load a median of 60 ms, past a second in its tail. Nothing that relays the
// server's answers waits for it, as directly nothing holds a statement's answer until its cancel arrived: until
// 2026-12-05 the cancel held mu while it went, which the inline read of the answer needs to hand over to a
// serveLend, and a deferred cancel was sent by the relaying goroutine itself, and pgx, which gives up on a
// connection a second after its context ended, closed it (TestPooledAnswerNeverWaitsForItsCancel;
// pgx's TestCancelRequestContextWatcherHandler/Stress through the pool on a loaded machine). settle waits for
// it instead (cancelsOut), and the connection serves nobody else before absorbCancel took it off.
// With terminate (the router's change, cancelLent), the backend is then terminated too (terminateStopped): a
// statement flushed just before, unread when the cancel came, would run after it. The channel does not wait for
// that (the router's change does not wait for a host that may hang), settle does (cancelsOut): the connection
// serves nobody else before.
func (ss *session) deliverCancel(terminate bool) <-chan struct{} {
	pl := ss.pooled
	pl.cancelSent = true
	pl.cancelsOut.Add(1)
	if terminate {
		pl.cancelsOut.Add(1)
	}
	done := make(chan struct{})
	sc := pl.sc
	key, addr, port := sc.key, sc.host.addr, localPort(sc.conn)
	if terminate {
		table := unplannedTables
		if t := ss.fencedTxOut.Load(); t != nil {
			table = *t
		}
		why := ss.srv.router.writeRefusal(addr, sc.host.epoch)
		if why == "" {
			why = "the router stopped trusting the host " + addr // trusted again since cancelLent looked
		}
		sc.fencedEnd.Store(&[2]string{why, table})
	}
	go func() {
		defer close(done)
		defer pl.cancelsOut.Done()
		if !ss.srv.cancelUpstream(key, addr) {
			pl.cancelUnsure.Store(true)
		}
		if terminate {
			go func() {
				defer pl.cancelsOut.Done()
				if !ss.srv.terminateStopped(addr, binary.BigEndian.Uint32(key), port) {
					sc.fencedEnd.Store(nil) // a FATAL the connection gets later is not the proxy's doing
				}
			}()
		}
	}()
	return done
}

// ownUnitMessage takes, for a statement of the proxy's own on sc (the probe, absorbCancel), a message any of
// them may get besides its rows: an ErrorResponse (its message and code into failure and code), a
// ParameterStatus (followed), a NotificationResponse (the client's: another session's NOTIFY to a channel the
// client LISTENs on may arrive meanwhile, and is relayed at once; pgx's TestListenNotify waited for one forever,
// TestConnOnNotification missed it).
func (ss *session) ownUnitMessage(sc *serverConn, typ byte, body []byte, failure, code *string) error {
	switch typ {
	case msgErrorResponse:
		*failure, *code = errorField(body, fieldMessage), errorField(body, fieldCode)
	case msgParameterStatus:
		ss.pooledParamStatus(sc, body)
	case msgNotificationResponse:
		writeMsg(ss.cw, typ, body, "")
		if err := ss.cw.Flush(); err != nil {
			return fmt.Errorf("relaying a notification: %w", err)
		}
	}
	return nil
}

// cancelAbsorbSQL is the round trip that takes a cancel off a server connection (absorbCancel): pg_sleep looks
// at the backend's pending interrupts before it returns.
const cancelAbsorbSQL = "SELECT pg_catalog.pg_sleep(0)"

// absorbCancel runs cancelAbsorbSQL on sc, which a cancel of the client's went to during its lend, before the
// connection goes back to the pool (settle, pl.mu held, the cancels delivered). PostgreSQL closes the cancel's
// connection once it has signalled the backend, but the backend may take the signal later, when it next runs: a
// cancel that arrived after the client's statement ended stopped the statement the connection ran next, another
// client's (TestPooledAnswerNeverWaitsForItsCancel: b's statement got 57014). The backend has taken the signal
// before it answers anything sent after that close, and this statement stops at a cancel still pending: either
// way nothing of it is left after the answer. A 57014 here is that cancel; after any other failure the
// connection is closed (settle).
func (ss *session) absorbCancel(sc *serverConn) error {
	writeMsg(sc.w, msgQuery, nil, cancelAbsorbSQL)
	ss.pooled.queryDroppedUnnamed(sc)
	if err := sc.w.Flush(); err != nil {
		return fmt.Errorf("clearing a cancel: %w", err)
	}
	var failure, failureCode string
	for {
		typ, _, err := sc.r.next()
		if err != nil {
			return fmt.Errorf("clearing a cancel: %w", err)
		}
		body, err := sc.r.body()
		if err != nil {
			return fmt.Errorf("clearing a cancel: %w", err)
		}
		switch typ {
		case msgErrorResponse, msgParameterStatus, msgNotificationResponse:
			if err := ss.ownUnitMessage(sc, typ, body, &failure, &failureCode); err != nil {
				return fmt.Errorf("clearing a cancel: %w", err)
			}
		case msgReadyForQuery:
			if failure != "" && failureCode != sqlstateQueryCanceled {
				return fmt.Errorf("clearing a cancel: %s", failure)
			}
			return nil
		}
	}
}

// cancelPollMax is the longest pause of cancelPooled between two looks at a session that holds its lock.
const cancelPollMax = 50 * time.Millisecond

// sendDeferredCancel sends the cancel deferred by cancelPooled once the proxy's own units are answered and the
// client's statement is on its way (pl.mu held).
func (ss *session) sendDeferredCancel() {
	pl := ss.pooled
	if !pl.cancelDeferred.Load() || ss.ownAhead() || pl.sc == nil || pl.open == 0 && !ss.state.unsynced.Load() {
		return
	}
	pl.cancelDeferred.Store(false)
	ss.deliverCancel(false)
}

// ownAhead reports whether units of the proxy's own, sent before the client's statement, are not answered
// yet: the settings unit and the put-back (replaying), the prepared fences' commands (state.internal). A cancel
// waits for them (cancelPooled).
func (ss *session) ownAhead() bool {
	return ss.pooled.replaying.Load() > 0 || ss.state.internal.Load() > 0
}
