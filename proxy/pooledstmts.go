package proxy

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// Protocol-level named statements under transaction pooling (pgx's statement cache, JDBC, psycopg 3 and
// node-postgres use them). A client's statement lives on whatever server connection its transaction gets, so the
// client's names are the client's (pooledStmts.byName) and the server's names are the proxy's:
//
//   - A Parse of name N is fenced as always (the core), then sent as the statement fenceproxy_s<hash of the
//     fenced text and parameter types>: clients that prepare the same text share the server statement, and a
//     server statement of a name always holds the same fenced text. The client's ParseComplete comes from it.
//   - A Bind or a Describe of N uses the server name, first preparing it, hidden, on the server connection when
//     that connection has not (serverConn.stmts).
//   - A Close of N forgets N; on the server it closes a name no statement has (the client still gets its
//     CloseComplete), since other clients may use the statement.
//   - The answers of the proxy's own Parse and Close are not relayed: the server answers Parse and Close in the
//     order it received them, so a queue per kind says which answer is the proxy's; an error makes the server skip
//     the rest of the batch, and the queued entries of that batch are dropped. A client's Close or Parse of N
//     among them never ran: N holds again what it held before them (failed, fixAfterFailedBatch).
//   - A notice the server sends while it runs the proxy's own Parse is not relayed (ownParseRuns).
//   - The server's errors about a server statement (a Bind's wrong number of parameters, 42P05 to a Parse of a
//     name in use, 26000) name the client's statement as the client's message they answer did (namedMsg): the
//     server statement is every name's of its text, this client's and others', and says nothing of the client's
//     code.
//
// The unnamed statement is the client's too, as on a connection of its own: pgx's describe_exec mode sends Parse
// and Describe, then after Sync Bind and Execute, and the two may run on different server connections, or on
// one where another client's unnamed statement came in between. The proxy keeps the client's last unnamed Parse
// (pooledState.unnamed) and sends it again, its answer hidden, before a Bind or Describe of the unnamed statement
// on a server connection that does not hold it; a client that has none gets it closed there first, so the server
// says 26000 as it would (never another client's statement). On the server it is the proxy's named statement
// unnamedStmtName, since the server's unnamed statement holds the token statement (pooled.go: writeTokenStmt).

// serverStmtPrefix starts the name of every server statement that carries a client's named statement.
const serverStmtPrefix = "fenceproxy_s"

// closedStmtName is a statement name nobody prepares: a client's Close of its statement closes it on the server.
const closedStmtName = "fenceproxy_none"

// unnamedStmtName is the server statement that carries a client's unnamed statement: the server's unnamed
// statement holds the token statement (serverConn.unnamedToken). A client's Parse of its unnamed statement
// closes it first (writeUnnamedParse), so it holds one Parse's statement at a time, as the unnamed one does;
// its Bind, Describe and Close of it name this one (unnamedOut).
const unnamedStmtName = "fenceproxy_u"

// unnamedStmtRef is the body of a Close or a Describe of unnamedStmtName: 'S', the name.
var unnamedStmtRef = []byte("S" + unnamedStmtName + "\x00")

// unnamedQuoted is unnamedStmtName as the server's messages name it.
var unnamedQuoted = []byte(`"` + unnamedStmtName + `"`)

// unnamedNameOut gives a server's error (body) about unnamedStmtName the words it has for the unnamed
// statement: 26000's message of its own, and the unnamed statement's name, "", in an 08P01's (a Bind's count of
// parameters). Other errors, and the other fields, are returned as they are: a client's own text may quote the
// name (an error of its SELECT '"fenceproxy_u"'::int). dropped reports a 26000 about it: the statement is not
// there (a function's DEALLOCATE ALL).
func unnamedNameOut(body []byte) (out []byte, dropped bool) {
	if !bytes.Contains(body, unnamedQuoted) {
		return body, false
	}
	msg := errorField(body, fieldMessage)
	switch errorField(body, fieldCode) {
	case sqlstateUndefinedPrepared:
		if msg != "prepared statement "+string(unnamedQuoted)+" does not exist" {
			return body, false
		}
		return withErrorField(body, fieldMessage, "unnamed prepared statement does not exist"), true
	case sqlstateProtocolViolation:
		return withErrorField(body, fieldMessage, strings.ReplaceAll(msg, string(unnamedQuoted), `""`)), false
	}
	return body, false
}

// errorNamesOut is a server's error (body) with the client's words for a statement of the proxy's it names
// (stmtNameIn), as on a connection of the client's own: the unnamed statement's for unnamedStmtName
// (unnamedNameOut, which also reports dropped), the name the client's message that the error answers used for
// a server statement that carries a named one (pooledStmts.clientName; not for an error of the proxy's own
// messages, hiding), the client's SQL-level name for one of those (pooledSQLStmts.namesOut, before its failed
// forgets the names the Query defines). The server's detail and hint of these errors name no statement; a
// message of another form is left as it is (a client's own text may quote a name of the proxy's).
func (pl *pooledState) errorNamesOut(body []byte, hiding bool) (out []byte, dropped bool) {
	if !bytes.Contains(body, proxyNameQuoted) {
		return body, false
	}
	before, server, after, ok := stmtNameIn(errorField(body, fieldMessage))
	switch {
	case !ok:
		return body, false
	case server == unnamedStmtName:
		return unnamedNameOut(body)
	case !hiding && (strings.HasPrefix(server, serverStmtPrefix) || server == closedStmtName):
		if name, ok := pl.stmts.clientName(server); ok {
			return withErrorField(body, fieldMessage, before+name+after), false
		}
	}
	return pl.sqlStmts.namesOut(body), false
}

// withErrorField is an ErrorResponse or NoticeResponse body with field's value replaced by v (added last when
// it has none).
func withErrorField(body []byte, field byte, v string) []byte { return editErrorField(body, field, &v) }

// withoutErrorField is an ErrorResponse or NoticeResponse body without field.
func withoutErrorField(body []byte, field byte) []byte { return editErrorField(body, field, nil) }

// editErrorField is body with field's value replaced by *v, added last when it has none; v nil drops the
// field. The one walk of a body's fields that writes them (errorField reads them).
func editErrorField(body []byte, field byte, v *string) []byte {
	n := len(body)
	if v != nil {
		n += len(*v)
	}
	out := make([]byte, 0, n)
	found := false
	for len(body) > 0 && body[0] != 0 {
		f := body[0]
		old, rest, ok := cutNul(body[1:])
		if !ok {
			break
		}
		switch {
		case f != field:
			out = append(append(append(out, f), old...), 0)
		case v != nil:
			out, found = append(append(append(out, f), *v...), 0), true
		}
		body = rest
	}
	if v != nil && !found {
		out = append(append(append(out, field), *v...), 0)
	}
	return append(out, 0)
}

// clientStmt is a client's named statement: its server name, the fenced Parse body under that name (shared by
// every client whose statement has that server name: sharedParses), and the client's own text (what its words
// may do: the fenced one also holds the proxy's own SQL; it lies inside src). src is the client's Parse body and
// gen the generation of the planner that fenced it (plannerBox): a Bind or Describe under another fences src
// again first (refenceNamed), so that the server never runs it as an older table list had it.
type clientStmt struct {
	server string
	parse  *sharedParse
	text   []byte
	src    []byte
	gen    uint64
	read   stmtReading // how the server read the Parse (prepared again only so: readAgain)
}

// sharedParse is a server statement's Parse body: its name, the fenced text, the parameter types. Never
// changed once made: clients of any pool share it.
type sharedParse struct{ body []byte }

// sharedParses keeps one sharedParse per server statement name while some client's statement holds it. The
// fenced text of a protected table's write is the bulk of what a client's named statement keeps (its guard
// SQL is about 1.5 KB), and a pool's clients, running one application's code, prepare the same few statements:
// one copy for all of them, not one each (an idle client's memory). The map holds its entries weakly: the
// last client's statement to let go of one lets the collector reclaim it, and its entry goes with it.
type sharedParses struct {
	mu sync.Mutex
	m  map[string]weak.Pointer[sharedParse]
}

// of is the shared Parse body of the server statement server, whose text and parameter types are rest (as
// after the name in the body): the one already kept, when its body is the same, else a new one kept from now.
// A server name is a hash of rest (serverStmtName), so the two differ only on a collision, which keeps the
// entry as it was and gives the caller a body of its own.
func (sp *sharedParses) of(server string, rest []byte) *sharedParse {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if w, ok := sp.m[server]; ok {
		if p := w.Value(); p != nil {
			if b := p.body; len(b) == len(server)+1+len(rest) && bytes.Equal(b[len(server)+1:], rest) {
				return p
			}
			return &sharedParse{body: parseBody(server, rest)}
		}
	}
	if sp.m == nil {
		sp.m = map[string]weak.Pointer[sharedParse]{}
	}
	p := &sharedParse{body: parseBody(server, rest)}
	sp.m[server] = weak.Make(p)
	runtime.AddCleanup(p, sp.forget, server)
	return p
}

// forget drops the entry of server once the collector reclaimed its sharedParse (runtime.AddCleanup). A newer
// one made for the same name meanwhile stays.
func (sp *sharedParses) forget(server string) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if w, ok := sp.m[server]; ok && w.Value() == nil {
		delete(sp.m, server)
	}
}

// size is how many server statements' Parse bodies are kept (tests).
func (sp *sharedParses) size() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return len(sp.m)
}

// parseBody is a Parse body naming the statement server, with rest (text and parameter types) after the name.
func parseBody(server string, rest []byte) []byte {
	return append(append(append(make([]byte, 0, len(server)+1+len(rest)), server...), 0), rest...)
}

// stmtReading is how the server read a client's Parse: under the standard_conforming_strings and client_encoding
// reported when the proxy sent it, or, when a statement that ran before it may have changed them and the server
// has not answered yet (readAgainSettings: settings in flux), under settings the proxy does not know, in which
// case the core passed the text only if no reading of it touches a protected table (rewrite: a text read while
// settings are unsettled).
type stmtReading struct {
	scs   bool
	enc   string
	known bool
}

// readingOf is the stmtReading of a Parse sent under set.
func readingOf(set rewrite.Settings) stmtReading {
	return stmtReading{scs: set.StandardConformingStrings, enc: set.ClientEncoding, known: !set.Unsettled && set.ClientEncoding != ""}
}

// readAgain says why the server, reading the text of a Parse (parse, the body under the server name) again now,
// under set, may read another statement than it read at the client's Parse, under r; "" when it reads the same.
// PostgreSQL parses a statement once, at its Parse, so directly the client's statement keeps the reading of
// that moment; the proxy prepares it again on another server connection from its text, which the server lexes
// under the settings in force there and then. A text whose reading depends on them (a backslash: a '...'
// literal under the other standard_conforming_strings; a byte past ASCII: another client_encoding) read first
// under known settings and now under other or unknown ones could be another statement: one that writes a
// protected table the proxy fenced as a read. The proxy refuses it then (the caller sends a refusal in its
// place) rather than guess. A Parse read while settings were in flux was passed by the core only if it touches
// a protected table under no setting, so any reading of it is as safe, and it goes again as it is.
func (r stmtReading) readAgain(parse []byte, set rewrite.Settings) string {
	text := parsedText(parse)
	backslash := bytes.IndexByte(text, '\\') >= 0
	nonASCII := !isASCII(string(text))
	switch {
	case !r.known || !backslash && !nonASCII:
		return ""
	case set.Unsettled || set.ClientEncoding == "":
		return "standard_conforming_strings or client_encoding may be changing now"
	case backslash && set.StandardConformingStrings != r.scs:
		return "standard_conforming_strings changed since the statement was prepared"
	case nonASCII && set.ClientEncoding != r.enc:
		return "client_encoding changed since the statement was prepared"
	}
	return ""
}

// readAgainSettings are the reading settings under which the server reads a Parse the proxy sends now, for
// readAgain: the reported ones, in flux only when a message that ran statements may have changed them since
// everything was last answered (pooledState.ranUnsettled). The core's Unsettled counts any unanswered message,
// which would refuse every statement prepared again behind another client's Parse in one batch (pgx's
// pipelines): a Parse or a Bind changes no setting.
func (ss *session) readAgainSettings() rewrite.Settings {
	set := ss.readingSettings()
	set.Unsettled = set.Unsettled && ss.pooled.ranUnsettled
	return set
}

// readAgainRefusal is, in place of a Parse body (parse: under the server name) the server would read otherwise
// now (why, readAgain), one whose text is the refusal (55F04), with the same parameter types, under a server
// name of its own: the server answers it at that Parse, and the batch fails there, as the fenced refusals do.
// The client's statement stays as it is: under its reading settings again, or on a connection that holds it, it
// runs.
func readAgainRefusal(parse []byte, why string) (server string, body []byte) {
	rest := readAgainRefusalText(parse, why)
	server = serverStmtName(rest)
	return server, append(append([]byte(server), 0), rest...)
}

// readAgainRefusalText is the text and parameter types, after the statement name, of readAgainRefusal's Parse.
func readAgainRefusalText(parse []byte, why string) []byte {
	_, rest, _ := cutNul(parse)
	_, types, _ := cutNul(rest)
	refusal := rewrite.RefusalSQL(sqlstateUnfenceable, "", "unfenceable write: fenceproxy cannot prepare this statement again on this server connection as the server first read it ("+why+")", "Prepare it again, or set standard_conforming_strings and client_encoding back to what they were when it was prepared.")
	return append(append([]byte(refusal), 0), types...)
}

// answerHide says, for one Parse or Close sent to the server, whether its answer is the proxy's own, and the
// unit (the Sync, Query or FunctionCall that ends its batch) it belongs to; name is the client's statement name
// of a client's Parse.
type answerHide struct {
	hide bool
	unit uint64
	name string
	undo *unnamedUndo // a client's Parse or Close of its unnamed statement; nil otherwise
	// server is the server statement a Parse prepares, or the proxy's Close drops, on sc (serverConn.stmts
	// counts the Parse's statement prepared from the moment it is sent); "" for another message. seq orders
	// them (pooledStmts.serverSeq).
	server string
	sc     *serverConn
	seq    uint64
	closed *closedStmt // a client's Close of its named statement; nil otherwise
	// was is, for a client's Parse that gave its name a statement (parseNamed), what the name held before: a
	// Parse the server skips gives it back (failed).
	was *closedStmt
	// at is, for the proxy's Parse of a client's statement again (hide), the answers the unit's client messages
	// before it get when they succeed (sentAnswers; < 0: not known): with that many relayed, the server runs
	// that Parse, and a notice it sends then is the proxy's (ownParseRuns).
	at int
	// thenClosed is, for a client's Parse of a name, the client's Close of that name sent before the Parse was
	// answered: a ParseComplete then prepares nothing that stays (the Close drops it), unless the server skips
	// the Close, which then leaves the name prepared (thenClosed.prepared).
	thenClosed *closedStmt
}

// namedMsg is a client's Bind, Describe or Parse of its statement name that went naming another statement on
// the server: server, which carries name (or closedStmtName, for a name of the proxy's the client never
// prepared). The server's error about server that answers this message gets name in its place (clientName).
type namedMsg struct {
	unit   uint64
	at     int // the answers before it in its unit when they succeed (sentAnswer); -1: not known
	name   string
	server string
}

// closedStmt is a client's named statement as it was before the client's Close of it, or before its Parse of
// the name: what a Close or Parse the server skips (its batch failed) leaves.
type closedStmt struct {
	name     string
	stmt     clientStmt // the zero clientStmt: the name held none
	prepared bool
	// parsed is, for the state before a client's Parse, the server statement that Parse gave the name: it is
	// given back only while the name still holds that one (fixAfterFailedBatch). "" for a Close.
	parsed string
}

// unplacedStmt is a server statement counted prepared on sc whose Parse the server skipped or refused (its
// batch failed): not prepared after all.
type unplacedStmt struct {
	sc     *serverConn
	server string
}

// unnamedState is what the proxy keeps of a client's unnamed statement (pooledState.unnamed and the fields
// beside it).
type unnamedState struct {
	unnamed, src []byte
	token        string
	here         bool
}

// unnamedUndo is what a client's Parse or Close of its unnamed statement changed, for when the server does not
// run it as sent. After an error the server skips the rest of the batch: a skipped Parse or Close leaves the
// statement as it was before (before). A Parse that fails has already dropped the one before it: the client
// then has none. Which of the two happened, the answers tell: at is how many answers the server gives the
// unit's earlier client messages when they succeed (answersOf), and an error that comes after exactly that many
// is the Parse's own.
type unnamedUndo struct {
	before unnamedState
	parse  bool   // a Parse (else a Close, which never fails)
	at     int    // the answers before it in its unit; -1: not known (nothing is undone)
	ver    uint64 // pooledState.unnamedVer after it
	epoch  uint64 // pooledState.unnamedEpoch when it went
	// own: the proxy's Parse or Close placing the client's statement (placeUnnamed), its answer hidden. Skipped
	// or failed, it leaves the client's statement as it was, off the connection (before.here is false).
	own bool
}

// unnamedFix is what the client's unnamed statement is after a batch that failed (failed), for the client side
// to take (takeUnnamedFix) unless the client changed its unnamed statement since (ver).
type unnamedFix struct {
	state unnamedState // with here meaning: on the server connection, while the epoch is still epoch
	ver   uint64
	epoch uint64
}

// pooledStmts is a client session's named statements and the queues of answers to hide.
type pooledStmts struct {
	byName map[string]clientStmt // under pooledState.mu (client side only)

	mu        sync.Mutex // the queues and unit counters: both sides, never held during I/O
	parses    []answerHide
	closes    []answerHide
	unitsSent uint64 // Sync, Query and FunctionCall messages forwarded
	unitsDone uint64 // ReadyForQuery messages relayed
	// The answers of the current unit: expected for the client's messages sent so far (client side, with its
	// undo entries), relayed to the client so far (server side). They locate an error (unnamedUndo). Each is
	// one side's alone: no lock (a message's lock taken by both sides costs more than the message's count).
	sentAnswers    int
	relayedAnswers int
	// fix is the last failed batch's verdict on the unnamed statement, not yet taken: stored under mu, taken
	// without it (the client side looks at every message; a verdict is rare).
	fix atomic.Pointer[unnamedFix]
	// failedUnit: an ErrorResponse of the current unit (unitsDone) was relayed. The server skips the rest of it,
	// and a Parse or Close of the unnamed statement the client sends after that is judged when it is sent.
	failedUnit bool
	// unplaced are the server statements of the failed batches' Parses the server did not run (failed), for the
	// client side to take (takeSkipped); anySkipped says there are some of them or of reopened, for a look
	// without the lock.
	unplaced   []unplacedStmt
	anySkipped atomic.Bool
	serverSeq  uint64 // counts the Parse and Close messages of server statements and client names sent (answerHide.seq)
	// reopened are the client's named statements whose Close or Parse the server skipped (failed), the last
	// sent first, for the client side to take back in that order (takeSkipped): a Close and a Parse of a name
	// in one batch give back the name's statement from before both.
	reopened []closedStmt
	// prepared are the client's statement names whose Parse the server answered with ParseComplete, not closed
	// since: those PostgreSQL would refuse to Parse again (42P05). A Parse that failed prepared nothing.
	prepared map[string]bool
	// named are the client's messages of the units not yet answered that named its statement as another on the
	// server (sentNamed), in the order sent.
	named []namedMsg
}

// droppedAll forgets every prepared name: a DISCARD ALL or DEALLOCATE ALL completed, as on a connection of
// the client's own. A Close sent before it and not yet answered (one an error behind the drop makes the server
// skip) then leaves nothing to give back: the drop took the statement.
func (q *pooledStmts) droppedAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	clear(q.prepared)
	for _, e := range q.closes {
		if e.closed != nil {
			e.closed.prepared = false
		}
	}
}

// sent records a Parse or Close (kind '1' or '3' for its answer) sent to the server.
func (q *pooledStmts) sent(answer byte, hide bool) {
	q.mu.Lock()
	e := answerHide{hide: hide, unit: q.unitsSent}
	if answer == msgParseComplete {
		q.parses = append(q.parses, e)
	} else {
		q.closes = append(q.closes, e)
	}
	q.mu.Unlock()
}

// skipping reports whether the server skips a message sent now (q.mu held): an error of the unit it joins was
// relayed already (failedUnit), so the server skips the rest of that unit.
func (q *pooledStmts) skipping() bool { return q.failedUnit && q.unitsSent == q.unitsDone }

// sentServerParse records a Parse of the server statement server on sc: the proxy's own (hide), or a client's
// of its statement name, which held was before it (nil for the proxy's). It reports whether the statement is
// prepared once the server answers: not when the unit already failed (the server skips it: the caller gives the
// name back); one the failure comes after is handed to the client side then (failed, takeSkipped).
func (q *pooledStmts) sentServerParse(hide bool, name, server string, sc *serverConn, was *closedStmt) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.skipping() {
		return false
	}
	q.serverSeq++
	q.parses = append(q.parses, answerHide{hide: hide, unit: q.unitsSent, name: name, server: server, sc: sc, seq: q.serverSeq, was: was, at: q.sentAnswers})
	return true
}

// sentCheckParse records the proxy's Parse of a client's new text under closedStmtName before the Parse of a
// name in use (parseNamed): its answer hidden, its notices the client's (at -1: never ownParseRuns').
func (q *pooledStmts) sentCheckParse() {
	q.mu.Lock()
	q.parses = append(q.parses, answerHide{hide: true, unit: q.unitsSent, at: -1})
	q.mu.Unlock()
}

// sentServerClose records the proxy's Close of the server statement server, prepared on sc, before a Parse of
// it again (its answer hidden). Skipped with that Parse, it leaves the statement prepared (failed).
func (q *pooledStmts) sentServerClose(server string, sc *serverConn) {
	q.mu.Lock()
	q.serverSeq++
	q.closes = append(q.closes, answerHide{hide: true, unit: q.unitsSent, server: server, sc: sc, seq: q.serverSeq})
	q.mu.Unlock()
}

// sentClientClose records a client's Close of its named statement c.name (its answer the client's). It reports
// whether the statement is gone once the server answers: not when the unit already failed (the server skips
// it); one the failure comes after is handed back to the client side then (failed, takeSkipped).
func (q *pooledStmts) sentClientClose(c closedStmt) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.skipping() {
		return false
	}
	cp := &c
	for i := range q.parses {
		if q.parses[i].name == c.name {
			q.parses[i].name, q.parses[i].thenClosed = "", cp
		}
	}
	q.serverSeq++
	q.closes = append(q.closes, answerHide{unit: q.unitsSent, closed: cp, seq: q.serverSeq})
	return true
}

// takeSkipped returns, once (client side), the server statements that the failed batches left unprepared
// and the client's named statements whose Close they skipped.
func (q *pooledStmts) takeSkipped() ([]unplacedStmt, []closedStmt) {
	if !q.anySkipped.Load() {
		return nil, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	u, r := q.unplaced, q.reopened
	q.unplaced, q.reopened = nil, nil
	q.anySkipped.Store(false)
	return u, r
}

// reprepare counts the client's statement name prepared again: its Close did not run (takeSkipped).
func (q *pooledStmts) reprepare(name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.prepared == nil {
		q.prepared = map[string]bool{}
	}
	q.prepared[name] = true
}

// sentUnnamed records a client's Parse or Close of its unnamed statement sent to the server (answer '1' or '3'),
// with what it changed; its place in the unit is the answers counted so far (sentAnswer).
func (q *pooledStmts) sentUnnamed(answer byte, undo unnamedUndo) {
	q.mu.Lock()
	if q.skipping() {
		// Its unit already failed (the client may have read the error before it sent this): the server skips
		// it, and the statement stays what the verdict not yet taken says, or what it was before this.
		f := unnamedFix{state: undo.before, epoch: undo.epoch}
		if pending := q.fix.Load(); pending != nil {
			f = *pending
		}
		f.ver = undo.ver
		q.fix.Store(&f)
		q.mu.Unlock()
		return
	}
	undo.at = q.sentAnswers
	e := answerHide{hide: undo.own, unit: q.unitsSent, undo: &undo, at: undo.at}
	if answer == msgParseComplete {
		q.parses = append(q.parses, e)
	} else {
		q.closes = append(q.closes, e)
	}
	q.mu.Unlock()
}

// sentAnswer counts the answers a client message of the extended protocol sent now gets when it succeeds
// (answersOf; n < 0: not known, and no undo entry of the unit is used).
func (q *pooledStmts) sentAnswer(n int) {
	if n < 0 || q.sentAnswers < 0 {
		q.sentAnswers = -1 << 30
	} else {
		q.sentAnswers += n
	}
}

// relayedAnswer counts an answer relayed to the client that completes one of its messages (completesMessage).
func (q *pooledStmts) relayedAnswer() { q.relayedAnswers++ }

// sentNamed records a client's Bind, Describe or Parse of its statement name sent naming server (client side,
// before sentAnswer counts its answers), so that the server's error about server, if it answers this message,
// names name (clientName).
func (q *pooledStmts) sentNamed(name, server string) {
	if name == server {
		return // sent as the client wrote it: the server's words are the client's
	}
	at := max(q.sentAnswers, -1)
	q.mu.Lock()
	q.named = append(q.named, namedMsg{unit: q.unitsSent, at: at, name: name, server: server})
	q.mu.Unlock()
}

// clientName is the client's name for the server statement server in the error relayed now (server side, an
// error of the client's messages): the name in the client's message it answers, the one after the answers
// relayed so far in the unit (relayedAnswers), when that message named server (sentNamed). Where the place is
// not known (a message before was streamed uncounted), the name of the unit's messages of server, when they all
// used one name. Else none: the error names what the client's message named, or the proxy cannot tell, and the
// server's name stays, never a name of the client's that this message did not use.
func (q *pooledStmts) clientName(server string) (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	name, found := "", false
	for _, e := range q.named {
		if e.unit < q.unitsDone {
			continue
		}
		if e.unit > q.unitsDone {
			break
		}
		if e.at >= 0 {
			if e.at == q.relayedAnswers {
				return e.name, e.server == server
			}
			continue
		}
		if e.server == server {
			if found && e.name != name {
				return "", false
			}
			name, found = e.name, true
		}
	}
	return name, found
}

// unitSent counts a message that the server answers with ReadyForQuery.
func (q *pooledStmts) unitSent() {
	q.mu.Lock()
	q.unitsSent++
	q.sentAnswers = 0
	q.mu.Unlock()
}

// unitsUnsent takes back n unitSent: Syncs the server ignored, inside a COPY's data.
func (q *pooledStmts) unitsUnsent(n int) {
	q.mu.Lock()
	q.unitsSent -= uint64(n)
	q.mu.Unlock()
}

// takeUnnamedFix returns the verdict of the last failed batch on the client's unnamed statement, once.
func (q *pooledStmts) takeUnnamedFix() *unnamedFix {
	if q.fix.Load() == nil {
		return nil
	}
	return q.fix.Swap(nil)
}

// answersOf is how many answers that complete a message (completesMessage) a client message of the extended
// protocol gets when it succeeds; -1 for one that is not counted.
func answersOf(typ byte, body []byte) int {
	switch typ {
	case msgParse, msgBind, msgClose, msgExecute:
		return 1
	case msgDescribe:
		if len(body) > 0 && body[0] == 'S' {
			return 2 // ParameterDescription, then RowDescription or NoData
		}
		return 1
	case msgFlush:
		return 0
	}
	return -1
}

// completesMessage reports whether a server message is the answer that completes a client message of the
// extended protocol (or its first of two: a statement's ParameterDescription). Rows, notices, ParameterStatus
// and COPY's messages are not.
func completesMessage(typ byte) bool {
	switch typ {
	case msgParseComplete, msgBindComplete, msgCloseComplete, msgParameterDescription, msgRowDescription, msgNoData,
		msgCommandComplete, msgEmptyQueryResponse, msgPortalSuspended:
		return true
	}
	return false
}

// answered pops the entry of a ParseComplete or CloseComplete and reports whether it is the proxy's.
func (q *pooledStmts) answered(answer byte) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	queue := &q.closes
	if answer == msgParseComplete {
		queue = &q.parses
	}
	if len(*queue) == 0 {
		return false
	}
	e := (*queue)[0]
	*queue = (*queue)[1:]
	if e.name != "" {
		if q.prepared == nil {
			q.prepared = map[string]bool{}
		}
		q.prepared[e.name] = true
	}
	if e.thenClosed != nil {
		e.thenClosed.prepared = true // prepared until the Close runs, and after it if the server skips it
	}
	return e.hide
}

// ownParseRuns reports, for a NoticeResponse (server side), whether the server sends it while it runs the
// proxy's own Parse of a client's statement again (serverStmt, placeUnnamed): the next Parse it answers is that
// one, of the unit it answers now, and every answer of the client's messages sent before it in the unit has
// been relayed (only the proxy's Close of the statement, which sends no notice, may come between). Such a notice
// (22P06 for a backslash in a string under standard_conforming_strings off) is not the client's: directly it got
// it once, at its own Parse. An error of that Parse still is the client's (its Bind or Describe fails).
func (q *pooledStmts) ownParseRuns() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.parses) == 0 || q.failedUnit {
		return false
	}
	e := q.parses[0]
	return e.hide && e.unit == q.unitsDone && e.at >= 0 && e.at == q.relayedAnswers
}

// holds reports whether PostgreSQL would hold the client's statement name when a message sent now reaches it:
// prepared (its Parse succeeded, and no Close, DISCARD ALL or DEALLOCATE ALL dropped it since), or its Parse is
// sent and not yet answered (the server runs it first). A name whose Parse failed or was skipped with a failed
// batch, or that the client's DISCARD ALL or DEALLOCATE ALL dropped, is not: its Bind or Describe goes as a name
// nothing holds (foreignStmt), and the server says 26000, where preparing it again from the kept text would run
// it (or fail the Bind with the Parse's error).
//
// A DEALLOCATE ALL or DISCARD ALL run by the extended protocol is not seen until it is answered: a Parse of a
// name it dropped, sent in the same batch, is taken for a Parse of a name in use (docs/pooling.md).
func (q *pooledStmts) holds(name string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.prepared[name] {
		return true
	}
	for _, e := range q.parses {
		if e.name == name {
			return true
		}
	}
	return false
}

// isPrepared reports whether the client's statement name is prepared, as PostgreSQL would say.
func (q *pooledStmts) isPrepared(name string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.prepared[name]
}

// unprepare forgets a prepared name.
func (q *pooledStmts) unprepare(name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.prepared, name)
}

// failed drops the entries of the batch an ErrorResponse ended: the server skips its remaining messages. It
// judges what that leaves of the client's unnamed statement (unnamedUndo). hidden: the error is the answer to
// one of the proxy's own messages, which went before every message of the client's still unanswered.
func (q *pooledStmts) failed(hidden bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.failedUnit = true
	// One pass over the unit's Parse and Close messages the server did not answer: it skipped them all, or the
	// first failed. A server statement is as it was before the first of its messages there (firstOf): a Parse
	// first, the statement was not prepared (the Parse went because it was not, or after the proxy's Close that
	// ran), so it is not; a Close first, it was prepared, and stays. A client's Close of its named statement
	// leaves the name the client's, and its Parse of a name leaves the name what it held before (reopened, the
	// last sent first). A client's Parse that failed, not skipped, was of a name that held no statement (else
	// parseNamed sends the name's own statement, for 42P05): what it held before holds none either.
	var first, last *unnamedUndo // the unit's unanswered Parse or Close of the unnamed statement, in the order sent
	var undo []answerHide        // the unit's unanswered entries that changed a client's statement name
	type firstPending struct {
		seq   uint64
		parse bool
	}
	var firstOf map[unplacedStmt]firstPending
	for i, queue := range [][]answerHide{q.parses, q.closes} {
		for _, e := range queue {
			if e.unit > q.unitsDone {
				break
			}
			if u := e.undo; u != nil {
				if first == nil || u.at < first.at {
					first = u
				}
				if last == nil || u.at > last.at {
					last = u
				}
			}
			if e.server != "" {
				k := unplacedStmt{sc: e.sc, server: e.server}
				if f, seen := firstOf[k]; !seen || e.seq < f.seq {
					if firstOf == nil {
						firstOf = map[unplacedStmt]firstPending{}
					}
					firstOf[k] = firstPending{seq: e.seq, parse: i == 0}
				}
			}
			if e.closed != nil || e.was != nil {
				undo = append(undo, e)
			}
		}
	}
	slices.SortFunc(undo, func(a, b answerHide) int { return cmp.Compare(b.seq, a.seq) })
	for _, e := range undo {
		c := e.closed
		if c == nil {
			c = e.was
		}
		q.reopened = append(q.reopened, *c)
		q.anySkipped.Store(true)
	}
	if first != nil && first.at >= 0 && (hidden || first.at >= q.relayedAnswers) {
		f := &unnamedFix{state: first.before, ver: last.ver, epoch: first.epoch}
		if first.parse && !first.own && !hidden && first.at == q.relayedAnswers {
			f.state = unnamedState{here: true} // the Parse failed, its statement dropped: the client has none
		}
		q.fix.Store(f)
	}
	for k, f := range firstOf {
		if f.parse {
			q.unplaced = append(q.unplaced, k)
			q.anySkipped.Store(true)
		}
	}
	q.parses = dropUnit(q.parses, q.unitsDone)
	q.closes = dropUnit(q.closes, q.unitsDone)
}

// ready counts a ReadyForQuery: the unit it answers is over.
func (q *pooledStmts) ready() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.parses = dropUnit(q.parses, q.unitsDone)
	q.closes = dropUnit(q.closes, q.unitsDone)
	for len(q.named) > 0 && q.named[0].unit <= q.unitsDone {
		q.named = q.named[1:]
	}
	q.unitsDone++
	q.relayedAnswers = 0
	q.failedUnit = false
}

func dropUnit(queue []answerHide, unit uint64) []answerHide {
	for len(queue) > 0 && queue[0].unit <= unit {
		queue = queue[1:]
	}
	return queue
}

// serverStmtName is the server name of a fenced Parse body's statement (its text and parameter types).
func serverStmtName(textAndTypes []byte) string {
	h := sha256.Sum256(textAndTypes)
	return serverStmtPrefix + hex.EncodeToString(h[:10])
}

// fencedParse is the client's Parse (body) as the core fences it (p nil: no fencing, as it is), a whole message.
func (ss *session) fencedParse(body []byte, p Planner) ([]byte, error) {
	var fenced bytes.Buffer
	if p != nil {
		if err := ss.onClientMsg(msgParse, body, p, &fenced); err != nil {
			return nil, err
		}
	} else {
		ss.state.unsynced.Store(true)
		writeMsg(&fenced, msgParse, body, "")
	}
	return ss.parseSQLPrepared(fenced.Bytes()), nil // pooledsqlprep.go
}

// parseNamed forwards a client's Parse of a named statement (pl.mu held): fenced by the core into a scratch
// buffer, renamed, and sent (re-prepared when the server connection already has that statement).
func (ss *session) parseNamed(body []byte, p Planner) error {
	pl := ss.pooled
	sc := pl.sc
	name, _, _ := cutNul(body)
	read := readingOf(ss.readAgainSettings()) // as the server reads the Parse: before it counts as unsynced
	msg, err := ss.fencedParse(body, p)
	if err != nil {
		return err
	}
	if len(msg) < headerLen || msg[0] != msgParse {
		return fmt.Errorf("fenced Parse: unexpected message")
	}
	_, rest, ok := cutNul(msg[headerLen:])
	if !ok {
		return fmt.Errorf("fenced Parse: no statement name")
	}
	if pl.stmts.holds(string(name)) {
		// PostgreSQL refuses to Parse a name in use (42P05) and skips the rest of the batch: the server says so,
		// to a Parse of the client's statement as it is (its server name and text, so that a server statement
		// keeps its text whatever happens) where it is prepared (first, hidden, if it is not). PostgreSQL
		// parses and analyses the new text before it looks at the name: a text it refuses gets its own error
		// (42601, 42P01), as directly, from a Parse of it first under a name nothing holds (hidden, closed
		// after; its notices are the client's, at=-1), where a Parse of it under the server name would store
		// it there should the server have lost that statement meanwhile (a DEALLOCATE ALL of the batch).
		if server := ss.serverStmt(name); server != "" {
			none := append([]byte{'S'}, closedStmtName+"\x00"...)
			pl.writeHiddenClose(none)
			writeMsg(sc.w, msgParse, append(append([]byte(closedStmtName), 0), rest...), "")
			pl.stmts.sentCheckParse()
			pl.writeHiddenClose(none)
			writeMsg(sc.w, msgParse, pl.stmts.byName[string(name)].parse.body, "")
			pl.stmts.sent(msgParseComplete, false)
			pl.stmts.sentNamed(string(name), server)
			return nil
		}
	}
	server := serverStmtName(rest)
	parse := ss.srv.parses.of(server, rest)
	if pl.stmts.byName == nil {
		pl.stmts.byName = map[string]clientStmt{}
	}
	src := bytes.Clone(body)
	text, _ := planText(msgParse, src)
	prev, had := pl.stmts.byName[string(name)]
	was := &closedStmt{name: string(name), parsed: server}
	if had {
		was.stmt = prev // held, not prepared (holds): a Bind of it gets 26000, as before this Parse
	}
	pl.stmts.byName[string(name)] = clientStmt{server: server, parse: parse, text: text, src: src, gen: pl.plan.gen, read: read}
	// Closed first, prepared here or not: prepared again if it was (a client parses again to get a plan for a
	// changed schema), so that the client's ParseComplete comes in its place; and whatever another client's
	// function may have put under the name is gone (a name the proxy never prepared here would fail the Parse,
	// 42P05, every time). If the Parse fails (25P02 in a failed transaction) the Close has dropped it:
	// stmtParsed has the probe read the connection's statements again.
	writeMsg(sc.w, msgClose, append(append([]byte{'S'}, server...), 0), "")
	pl.stmts.sentServerClose(server, sc)
	writeMsg(sc.w, msgParse, parse.body, "")
	if pl.stmts.sentServerParse(false, string(name), server, sc, was) {
		sc.stmts[server] = true
		sc.stmtsFresh[server] = true
	} else if had { // skipped with the Close before it: the statement and the name as they were
		pl.stmts.byName[string(name)] = prev
	} else {
		delete(pl.stmts.byName, string(name))
	}
	pl.stmtParsed.Store(true)
	return nil
}

// serverStmt returns the server name of a client's statement name, preparing it (hidden) on the lent server
// connection when it is not there (pl.mu held); "" for a name the client never prepared (the server then says
// so, as it would).
func (ss *session) serverStmt(name []byte) string {
	pl := ss.pooled
	cs, ok := pl.stmts.byName[string(name)]
	if !ok || !pl.stmts.holds(string(name)) {
		return ""
	}
	if cs.gen != pl.plan.gen {
		cs = ss.refenceNamed(cs)
		pl.stmts.byName[string(name)] = cs
	}
	sc := pl.sc
	if !sc.stmtsFresh[cs.server] {
		// Not prepared here, or prepared before another client held the connection or a batch failed
		// (serverConn.stmtsFresh): closed first, whatever the name holds now (another client's function may have
		// put a statement under it, prepared here or not), then prepared from the client's text; or, when the
		// server would read that text otherwise than at the client's Parse, the refusal in its place (readAgain).
		if why := cs.read.readAgain(cs.parse.body, ss.readAgainSettings()); why != "" {
			var refusal []byte
			cs.server, refusal = readAgainRefusal(cs.parse.body, why)
			cs.parse = &sharedParse{body: refusal}
		}
		writeMsg(sc.w, msgClose, append(append([]byte{'S'}, cs.server...), 0), "")
		pl.stmts.sentServerClose(cs.server, sc)
		ss.prep.clientText(parsedText(cs.parse.body)) // the text's words, on this connection too (prepared.go)
		writeMsg(sc.w, msgParse, cs.parse.body, "")
		if pl.stmts.sentServerParse(true, "", cs.server, sc, nil) {
			sc.stmts[cs.server], sc.stmtsFresh[cs.server] = true, true
		} // else skipped with the Close before it: as it was
		pl.stmtParsed.Store(true)
	}
	return cs.server
}

// refenceNamed is the client's named statement cs fenced again, from the client's Parse, by the planner in force
// (pl.plan; pl.mu held): cs was fenced under another (a reload or a catalog refresh changed what is protected
// since). Its server name is its new text's (serverStmtName), so no server connection that holds the old text
// runs it for this name; a text the planner now refuses becomes that refusal, which the server answers at the
// Parse (before the client's Bind). The parameters and columns are the client's, as at its Parse.
func (ss *session) refenceNamed(cs clientStmt) clientStmt {
	pl := ss.pooled
	token, inlined := ss.inlineToken, ss.inlined
	ss.inlineToken = "" // a named statement never carries the token: it may run under a later one
	var fenced bytes.Buffer
	var err error
	if p := pl.plan.p; p != nil {
		err = ss.fenceParse(&fenced, p, cs.src, ss.readingSettings())
	} else {
		writeMsg(&fenced, msgParse, cs.src, "")
	}
	ss.inlineToken, ss.inlined = token, inlined
	msg := ss.parseSQLPrepared(fenced.Bytes())
	var rest []byte
	ok := err == nil && wholeParse(msg)
	if ok {
		_, rest, ok = cutNul(msg[headerLen:])
	}
	if !ok {
		// It parsed the first time, so this is not the client's doing; fail closed: the statement is refused
		// where it is prepared.
		ss.srv.log.Warn("fencing a prepared statement again after a reload failed; refused", "err", err)
		_, tail, _ := cutNul(cs.src)
		_, types, _ := cutNul(tail)
		refusal := rewrite.RefusalSQL(sqlstateUnfenceable, "", "unfenceable write: the statement could not be analysed again after the table list changed", "Prepare it again.")
		rest = append(append([]byte(refusal), 0), types...)
	}
	server := serverStmtName(rest)
	// Fenced under the settings in force now, as the server will read it now (a reading in flux: the core's
	// verdict holds under every setting).
	read := readingOf(ss.readingSettings())
	return clientStmt{server: server, parse: ss.srv.parses.of(server, rest), text: cs.text, src: cs.src, gen: pl.plan.gen, read: read}
}

// deallocateNamed maps an SQL DEALLOCATE of the client's protocol-level statement name (psycopg 3 with libpq
// before 17 evicts its statements so) to the statement's server name on the lent connection (pl.mu held), and
// forgets the name, as a Close of it does. The connection must then hold a statement of that name: when it may
// not (serverConn.stmtsFresh), prepare is a PREPARE of it to go right before the DEALLOCATE, its text nothing
// (the DEALLOCATE drops it at once; if an error skips the DEALLOCATE, the connection's statement of that name is prepared again before
// its next use, as it no longer counts). "" for a name PostgreSQL would not hold: the server then says 26000.
// was is the name's statement: a DEALLOCATE that an error of its Query keeps from running gives it back
// (pooledSQLStmts.failed, reopen). Right before it the PREPARE runs where the DEALLOCATE would, also after a
// statement of the Query that ends a failed block (a PREPARE in front of that one would be refused, 25P02).
func (ss *session) deallocateNamed(name string) (server, prepare string, was clientStmt) {
	pl := ss.pooled
	cs, ok := pl.stmts.byName[name]
	if !ok || !pl.stmts.holds(name) {
		return "", "", clientStmt{}
	}
	sc := pl.sc
	if !sc.stmtsFresh[cs.server] {
		prepare = "PREPARE " + cs.server + " AS SELECT"
	}
	delete(pl.stmts.byName, name)
	pl.stmts.unprepare(name)
	delete(sc.stmts, cs.server)
	delete(sc.stmtsFresh, cs.server)
	return cs.server, prepare, cs
}

// reopen gives back the client's named statements whose DEALLOCATE an error kept from running, for the client
// side to take (takeSkipped).
func (q *pooledStmts) reopen(names []closedStmt) {
	if len(names) == 0 {
		return
	}
	q.mu.Lock()
	q.reopened = append(q.reopened, names...)
	q.anySkipped.Store(true)
	q.mu.Unlock()
}

// parsedText is the text a Parse message's body prepares (nil when malformed: the server refuses it anyway).
func parsedText(body []byte) []byte {
	text, _ := planText(msgParse, body)
	return text
}

// renamedOut writes a client's Bind, Describe or Close (pl.mu held) with its statement name mapped; false when
// the message names no statement of the client's (it goes as it is).
func (ss *session) renamedOut(typ byte, body []byte) bool {
	pl := ss.pooled
	w := pl.sc.w
	switch typ {
	case msgBind:
		portal, rest, ok := cutNul(body)
		if !ok {
			return false
		}
		name, tail, ok := cutNul(rest)
		if !ok || len(name) == 0 {
			return false
		}
		server := ss.serverStmt(name)
		if server == "" {
			server = ss.foreignStmt(name)
		}
		pl.stmts.sentNamed(string(name), server)
		ss.state.unsynced.Store(true)
		b := append(append(append(append([]byte(nil), portal...), 0), server...), 0)
		writeMsg(w, msgBind, append(b, tail...), "")
		return true
	case msgDescribe, msgClose:
		if len(body) < 2 || body[0] != 'S' {
			return false
		}
		name, _, ok := cutNul(body[1:])
		if !ok || len(name) == 0 {
			return false
		}
		ss.state.unsynced.Store(true)
		if typ == msgClose {
			// The server statement stays on the connection (another name of the client's, or another client,
			// may use its text); the client's name goes, once the server runs the Close (a Close of a name
			// nothing has, which answers as the client's would).
			writeMsg(w, msgClose, append([]byte("S"+closedStmtName), 0), "")
			c := closedStmt{name: string(name), stmt: pl.stmts.byName[string(name)], prepared: pl.stmts.isPrepared(string(name))}
			if pl.stmts.sentClientClose(c) {
				delete(pl.stmts.byName, string(name))
				pl.stmts.unprepare(string(name))
			}
			return true
		}
		server := ss.serverStmt(name)
		if server == "" {
			server = ss.foreignStmt(name)
		}
		pl.stmts.sentNamed(string(name), server)
		writeMsg(w, msgDescribe, append(append([]byte{'S'}, server...), 0), "")
		return true
	}
	return false
}

// parseUnnamed forwards a client's Parse of the unnamed statement (pl.mu held), fenced by the core, and keeps
// it for the client's later transactions.
func (ss *session) parseUnnamed(body []byte, p Planner) error {
	pl := ss.pooled
	read := readingOf(ss.readAgainSettings()) // as the server reads the Parse: before it counts as unsynced
	msg, err := ss.fencedParse(body, p)
	if err != nil {
		return err
	}
	undo := pl.unnamedChange(true)
	pl.unnamed = nil
	if wholeParse(msg) {
		pl.unnamed = bytes.Clone(msg)
	}
	pl.unnamedToken, pl.unnamedSrc, pl.unnamedGen, pl.unnamedRead = "", bytes.Clone(body), pl.plan.gen, read
	if ss.inlined && ss.inlineToken != "" {
		pl.unnamedToken = ss.inlineToken
	}
	pl.unnamedHere = true
	pl.unnamedVer++
	undo.ver = pl.unnamedVer
	pl.writeUnnamedParse(msg)
	pl.stmts.sentUnnamed(msgParseComplete, undo)
	return nil
}

// writeUnnamedParse writes a client's Parse of its unnamed statement (msg, a whole fenced Parse message) to the
// lent connection as a Parse of unnamedStmtName, closed first (hidden), always: a function may have prepared
// that name (PREPARE, by dynamic SQL), which a Parse of it would fail at (42P05) (pl.mu held). A message that is
// not one whole Parse (the core refused the text) goes as it is, and the server's unnamed statement is then no
// longer known to hold a token statement.
func (pl *pooledState) writeUnnamedParse(msg []byte) {
	sc := pl.sc
	if !wholeParse(msg) || msg[headerLen] != 0 {
		sc.w.Write(msg)
		sc.unnamedToken = tokenNone
		return
	}
	pl.writeHiddenClose(unnamedStmtRef)
	body := msg[headerLen+1:] // after the empty name
	writeHeader(sc.w, msgParse, 4+len(unnamedStmtName)+1+len(body))
	sc.w.WriteString(unnamedStmtName)
	sc.w.WriteByte(0)
	sc.w.Write(body)
	sc.clientUnnamed, sc.unnamedOwner = true, pl
}

// unnamedOut writes a client's Bind or Describe of its unnamed statement (typ, body) to the lent connection
// naming unnamedStmtName instead (pl.mu held); false when it names another statement or is malformed (it goes
// as it is).
func (pl *pooledState) unnamedOut(typ byte, body []byte) bool {
	w := pl.sc.w
	switch typ {
	case msgBind:
		portal, rest, ok := cutNul(body)
		if !ok || len(rest) == 0 || rest[0] != 0 {
			return false
		}
		writeHeader(w, msgBind, 4+len(portal)+1+len(unnamedStmtName)+len(rest))
		w.Write(portal)
		w.WriteByte(0)
		w.WriteString(unnamedStmtName)
		w.Write(rest) // the statement name's terminator, then the rest
		return true
	case msgDescribe:
		if !namesUnnamedStmt(typ, body) {
			return false
		}
		writeMsg(w, typ, unnamedStmtRef, "")
		return true
	}
	return false
}

// placeUnnamed makes the lent server connection's unnamed statement the client's before a Bind or Describe of it
// (pl.mu held): its Parse again, or, when the client has none, a Close of whatever another client left there.
// A statement that carries a token (inline form) is fenced again first when another token is in force now, or
// when it is bound to a named portal (namedPortal), which may be executed after the token changed: only the
// unnamed portal, which any other Bind of it or any Query replaces, runs a statement carrying a token.
// Without a planner nothing is fenced, so nothing carries a token.
func (ss *session) placeUnnamed(p Planner, namedPortal bool) {
	pl := ss.pooled
	if pl.unnamed != nil && p != nil && (pl.unnamedGen != pl.plan.gen || pl.unnamedToken != "" && (namedPortal || pl.unnamedToken != pl.tokenInForce)) {
		ss.refenceUnnamed(p, !namedPortal)
	}
	if pl.unnamedDropped.Swap(false) {
		pl.unnamedHere = false
	}
	if pl.unnamedHere {
		return
	}
	pl.unnamedReplaced() // by the proxy's Parse or Close: what a verdict judged before says of it is past
	// The server skips it after an error of its batch (maybe one already relayed): judged as the client's are,
	// it then leaves the client's statement off the connection (before.here is false).
	undo := pl.unnamedChange(pl.unnamed != nil)
	undo.own, undo.ver = true, pl.unnamedVer
	pl.unnamedHere = true
	if pl.unnamed != nil {
		msg := pl.unnamed
		if why := pl.unnamedRead.readAgain(msg[headerLen:], ss.readAgainSettings()); why != "" {
			// The server would read it otherwise than at the client's Parse: the refusal goes in its place, and
			// fails; the client's statement stays the client's, off this connection (unnamedUndo.own).
			var b bytes.Buffer
			writeMsg(&b, msgParse, append([]byte{0}, readAgainRefusalText(msg[headerLen:], why)...), "")
			msg = b.Bytes()
		}
		ss.prep.clientText(parsedText(msg[headerLen:])) // the text's words, on this connection too
		pl.writeUnnamedParse(msg)
		pl.stmts.sentUnnamed(msgParseComplete, undo)
		return
	}
	writeMsg(pl.sc.w, msgClose, unnamedStmtRef, "")
	pl.sc.clientUnnamed = false
	pl.stmts.sentUnnamed(msgCloseComplete, undo)
}

// refenceUnnamed fences the client's unnamed statement again where the token it carries may not be the one in
// force when it runs (pl.mu held): carrying the token in force (when inline allows it and followTokenInForce
// would have it for its Parse now), else in the usual form; placeUnnamed then sends it. Only the text's fence
// changes: its parameters, columns and meaning are the client's, as before. A Parse the core cannot fence again
// (it could the first time) leaves the client without an unnamed statement: its Bind gets 26000.
func (ss *session) refenceUnnamed(p Planner, inline bool) {
	pl := ss.pooled
	src := pl.unnamedSrc
	text, _ := planText(msgParse, src)
	prev := ss.inlineToken
	ss.inlineToken = ""
	if inline && pl.tokenInForce != "" && ss.prep.max == 0 && text != nil && ss.plainText(text) {
		ss.inlineToken = pl.tokenInForce
	}
	var fenced bytes.Buffer
	set := ss.readingSettings()
	err := ss.fenceParse(&fenced, p, src, set)
	msg := ss.parseSQLPrepared(fenced.Bytes())
	// Fenced under the settings in force now, which placeUnnamed sends it under.
	pl.unnamed, pl.unnamedToken, pl.unnamedSrc, pl.unnamedGen, pl.unnamedRead = nil, "", nil, pl.plan.gen, readingOf(set)
	switch {
	case err != nil:
		ss.srv.log.Warn("fencing the unnamed statement again failed", "err", err)
	case wholeParse(msg):
		pl.unnamed, pl.unnamedSrc = bytes.Clone(msg), src
		if ss.inlined && ss.inlineToken != "" {
			pl.unnamedToken = ss.inlineToken
		}
	}
	ss.inlineToken = prev
	pl.unnamedHere = false
}

// wholeParse reports whether msg is one whole Parse message, header included, as fencedParse gives it.
func wholeParse(msg []byte) bool {
	return len(msg) > headerLen && msg[0] == msgParse && int(binary.BigEndian.Uint32(msg[1:]))+1 == len(msg)
}

// namesUnnamedStmt reports whether a Bind, Describe or Close names the unnamed statement.
func namesUnnamedStmt(typ byte, body []byte) bool {
	switch typ {
	case msgBind:
		_, rest, ok := cutNul(body)
		return ok && len(rest) > 0 && rest[0] == 0
	case msgDescribe, msgClose:
		return len(body) >= 2 && body[0] == 'S' && body[1] == 0
	}
	return false
}

// foreignStmt is the server name for a statement name the client has not prepared (pl.mu held), closed first,
// hidden, on the lent server connection: whatever another client left there under that name (PREPARE in a
// function the proxy does not see) is gone, and the server says 26000 naming it, as on a connection of one's
// own. A pinned client's connection is its own (statements it prepared in ways the proxy does not map are
// there): nothing is closed. A name of the proxy's own (fenceproxy_...) is never the client's: it becomes one
// that nothing holds.
func (ss *session) foreignStmt(name []byte) string {
	pl := ss.pooled
	server := string(name)
	if strings.HasPrefix(server, proxyNamePrefix) {
		server = closedStmtName
	} else if pl.pin != "" {
		return server
	}
	pl.writeHiddenClose(append(append([]byte{'S'}, server...), 0))
	return server
}
