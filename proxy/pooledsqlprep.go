package proxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// SQL-level prepared statements (PREPARE, EXECUTE, DEALLOCATE) under transaction pooling. As with protocol-level
// named statements (pooledstmts.go) the client's names are the client's and the server's names are the proxy's:
//
//   - A Query whose text uses such a name is fenced by the core as always; then the names are replaced in its
//     parse tree (rewrite.RenamePrepared) and the text deparsed. A client's PREPARE n of statement S is sent as
//     PREPARE fenceproxy_q<hash of n and the fenced S>: the server analyses it and answers (PREPARE, or its error)
//     as it would the client's; the client's n maps to it once the server answered it with CommandComplete (a
//     PREPARE that failed prepared nothing; one that succeeded stays whatever the transaction does, as in
//     PostgreSQL).
//   - EXECUTE n and DEALLOCATE n (also under EXPLAIN and CREATE TABLE AS) use the server name. When the server
//     connection may not hold that statement (another client used it since, or it was never prepared there), it
//     is first closed (a protocol Close: no error when absent) and prepared again, from the fenced text kept for
//     n, in the same Query right before the first of its statements that uses n (rewrite.PutBefore), its answer
//     hidden (pooledState.hide; pooledSQLStmts.hideAt where client statements come before it). So it runs
//     after what the Query does before, as the client's own statement would: a failed block ended (in front
//     of a ROLLBACK it would be refused, 25P02, and the whole Query with it), a table made again, work
//     committed that a failed PREPARE must not undo. DEALLOCATE n drops the server statement on that
//     connection only.
//   - A name the client has not prepared is left as it is, after a Close of it on the server connection: whatever
//     another client left there under that name (PREPARE in a function the proxy does not see) is gone, and the
//     server says 26000 naming it, as on a connection of one's own. A pinned client's connection is its own:
//     nothing is closed there. A name starting with fenceproxy_ is replaced by one that nothing holds (the
//     server's own statements are never the client's).
//   - DEALLOCATE ALL and DISCARD ALL forget all of the client's names.
//   - DEALLOCATE n of a protocol-level statement of the client's drops it as its Close would (deallocateNamed).
//
// In a Parse (the extended protocol) the names are not mapped (a statement of the client's cannot be prepared in
// front of it there): a PREPARE leaves a statement of the client's own name, which pins the client, and EXECUTE
// or DEALLOCATE of a name mapped above gets 26000. The names it uses are closed first as above, and those of the
// proxy's own replaced (parseSQLPrepared): the proxy's statements are never the client's.
//
// The mapping needs the text read exactly as the server reads it: ASCII, or UTF-8 with UTF-8 on both sides, and
// no backslash unless standard_conforming_strings is on. A text that holds one of the words (PREPARE, EXECUTE,
// DEALLOCATE) and cannot be mapped (not read exactly, or pg_query cannot parse it, or its names cannot be
// replaced) is refused (55F04, unmappedRefusal), by a Query or a Parse: sent as it is, its names would be the
// server connection's, where the proxy's own statements are (fenceproxy_c, which sets settings at session level
// with any values: a token no SET gave, past token.scope and verification; fenceproxy_u; the clients'
// statements), and a PREPARE or DEALLOCATE in it would change them behind the proxy's back. Before 2026-12-05
// such a text went as it is (TestPooledUnmappableTextIsRefused).

// sqlStmtPrefix starts the name of every server statement that carries a client's SQL-level prepared statement.
const sqlStmtPrefix = "fenceproxy_q"

// proxyNamePrefix starts the names of all of the proxy's own server statements.
const proxyNamePrefix = "fenceproxy_"

// sqlStmt is a client's SQL-level prepared statement: its server name and the PREPARE that makes it there. src
// is the client's PREPARE as it wrote it (rewrite.PreparedRef.Body: named p), "" when the proxy could not tell
// it; gen the generation of the planner that fenced it (plannerBox). Used under another, it is fenced again from
// src first (refenceSQL), or refused without one.
type sqlStmt struct {
	server, prepare string
	src             string
	gen             uint64
}

// sqlPending is a change to the client's names that the server's CommandComplete of statement stmt (its index in
// the Query) makes true: name defined as def, or forgotten (def.server "").
type sqlPending struct {
	stmt int
	name string
	def  sqlStmt
	// reopen is, for a DEALLOCATE of a protocol-level name of the client's (deallocateNamed, which forgot it
	// when it was sent), the name's statement: an error that keeps the DEALLOCATE from running leaves it the
	// client's (failed).
	reopen *closedStmt
}

// pooledSQLStmts is a client session's SQL-level prepared statements.
type pooledSQLStmts struct {
	mu      sync.Mutex // both sides: the session goroutine maps, the lend's server side applies answers
	byName  map[string]sqlStmt
	pending []sqlPending // of the Query being answered
	done    int          // its statements the server answered with CommandComplete
	// doubt: an error or a DEALLOCATE ALL / DISCARD ALL since the last Query was mapped; the server connection's
	// statements are not known (serverConn.sqlStmts is forgotten).
	doubt bool
	// closedAs is the first name of the proxy's own that the Query being answered uses and the client never
	// prepared, sent as closedStmtName: the server's 26000 names the first of them, which namesOut puts back.
	closedAs string
	// hideAt are the hidden PREPAREs that go right before a statement of the Query being answered other than
	// its first, in the order of the statements: the answers to hide after the client's statement before
	// (completed). spans are where all of its hidden PREPAREs are in the Query's text after the token
	// statement (characters), for the positions of errors (shiftPosition).
	hideAt []hiddenAt
	spans  []charSpan
	// own is how many of the hidden statements still to be answered (pooledState.hide) are the proxy's
	// PREPAREs: the last ones, as the token statement goes first. A notice the server sends while one of them
	// runs (its analysis: a TIMESTAMP precision reduced, WARNING 22023) is the proxy's (ownPrepareRuns). The
	// raw parse of the whole text, before any statement runs, sends none: the text is deparsed (a long
	// identifier already cut, 42622) and holds no backslash where it would warn (sqlUnreadable).
	own int
}

// hiddenAt is n hidden statements right before the statement of index stmt of a Query's text.
type hiddenAt struct{ stmt, n int }

// charSpan is n characters of a text from character at (0-based).
type charSpan struct{ at, n int }

// completed applies a CommandComplete (body: the tag) of the client's, and returns how many hidden statements
// the server answers next (hideAt), before the client's next statement.
func (q *pooledSQLStmts) completed(tag []byte) (hide int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if t := string(tag); t == "DISCARD ALL\x00" || t == "DEALLOCATE ALL\x00" {
		clear(q.byName)
		q.doubt = true
	}
	for len(q.pending) > 0 && q.pending[0].stmt == q.done {
		p := q.pending[0]
		q.pending = q.pending[1:]
		if p.reopen != nil {
			continue // it ran: the name stays forgotten
		}
		if p.def.server == "" {
			delete(q.byName, p.name)
			continue
		}
		if q.byName == nil {
			q.byName = map[string]sqlStmt{}
		}
		q.byName[p.name] = p.def
	}
	q.done++
	if len(q.hideAt) > 0 && q.hideAt[0].stmt == q.done {
		hide = q.hideAt[0].n
		q.hideAt = q.hideAt[1:]
		q.own = hide
	}
	return hide
}

// hiddenAnswered counts a hidden statement's CommandComplete (server side), hide the hidden statements still
// to be answered with it: the last own of them are the proxy's PREPAREs.
func (q *pooledSQLStmts) hiddenAnswered(hide int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ownRuns(hide) {
		q.own--
	}
}

// ownPrepareRuns reports, for a NoticeResponse that comes while answers are hidden (server side, hide the
// hidden statements still to be answered), whether the server sends it while it runs a hidden PREPARE of the
// proxy's: directly the client got the notice once, at its own PREPARE, and none at its EXECUTE.
func (q *pooledSQLStmts) ownPrepareRuns(hide int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.ownRuns(hide)
}

// ownRuns reports whether the statement the server runs now is one of the proxy's hidden PREPAREs (q.mu held):
// hide statements are still to be answered, and the last own of them are the proxy's.
func (q *pooledSQLStmts) ownRuns(hide int64) bool { return q.own > 0 && hide <= int64(q.own) }

// failed drops the changes of the statements an ErrorResponse kept from running, and returns the protocol-level
// names whose DEALLOCATE was among them (sqlPending.reopen).
func (q *pooledSQLStmts) failed() []closedStmt {
	q.mu.Lock()
	defer q.mu.Unlock()
	var reopen []closedStmt
	for _, p := range q.pending {
		if p.reopen != nil {
			reopen = append(reopen, *p.reopen)
		}
	}
	q.pending, q.hideAt, q.own, q.doubt = nil, nil, 0, true // the server skips the rest of the Query, hidden PREPAREs too
	return reopen
}

// ready ends the answer to a Query (or a batch).
func (q *pooledSQLStmts) ready() {
	q.mu.Lock()
	q.pending, q.done, q.closedAs, q.hideAt, q.spans, q.own = nil, 0, "", nil, nil, 0
	q.mu.Unlock()
}

// shiftPosition is an error (body) with its position moved into the client's text (shiftPosition), past the
// prefix characters of the token statement and the hidden PREPAREs of the Query being answered.
func (q *pooledSQLStmts) shiftPosition(body []byte, prefix int) []byte {
	q.mu.Lock()
	spans := q.spans
	q.mu.Unlock()
	if prefix == 0 && len(spans) == 0 {
		return body
	}
	return shiftPosition(body, prefix, spans)
}

// preparedNameMessages are the server's messages that name a prepared statement (a prefix and a suffix around
// the name, as PostgreSQL quotes it: between double quotes, nothing escaped): 26000, 42P05, and a wrong number
// of parameters (42601). A Bind's wrong number of parameters (08P01) holds numbers around the name: bindCountHead.
var preparedNameMessages = [...][2]string{
	{`prepared statement "`, `" does not exist`},
	{`prepared statement "`, `" already exists`},
	{`wrong number of parameters for prepared statement "`, `"`},
}

// The server's 08P01 to a Bind with a wrong number of parameters (postgres.c, exec_bind_message), in three
// pieces: bind message supplies N parameters, but prepared statement "name" requires M.
const (
	bindCountHead = "bind message supplies "
	bindCountMid  = ` parameters, but prepared statement "`
	bindCountTail = `" requires `
)

// stmtNameIn returns the statement name in a server's message that names one (preparedNameMessages,
// bindCountHead), and the message before and after it.
func stmtNameIn(msg string) (before, name, after string, ok bool) {
	for _, f := range preparedNameMessages {
		n, ok := strings.CutPrefix(msg, f[0])
		if !ok {
			continue
		}
		if n, ok = strings.CutSuffix(n, f[1]); ok {
			return f[0], n, f[1], true
		}
	}
	rest, ok := strings.CutPrefix(msg, bindCountHead)
	if !ok {
		return "", "", "", false
	}
	// The name may be any text (a client's): it lies between the first middle piece and the last tail piece.
	i, j := strings.Index(rest, bindCountMid), strings.LastIndex(rest, bindCountTail)
	if i < 0 || j < i+len(bindCountMid) || !allDigits(rest[:i]) || !allDigits(rest[j+len(bindCountTail):]) {
		return "", "", "", false
	}
	at := len(bindCountHead) + i + len(bindCountMid)
	return msg[:at], rest[i+len(bindCountMid) : j], msg[len(bindCountHead)+j:], true
}

// allDigits reports whether s is a number as the server writes a count: one or more decimal digits.
func allDigits(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

// proxyNameQuoted starts a statement name of the proxy's as the server's messages quote it.
var proxyNameQuoted = []byte(`"` + proxyNamePrefix)

// namesOut is a server's error (body) with the client's name in place of the server statement that carries one
// of the client's SQL-level statements, where the message is one that names a statement (stmtNameIn): the
// client reads the name it wrote, as on a connection of its own (not a name of the proxy's, which it cannot
// use).
func (q *pooledSQLStmts) namesOut(body []byte) []byte {
	if !bytes.Contains(body, proxyNameQuoted) {
		return body
	}
	before, server, after, ok := stmtNameIn(errorField(body, fieldMessage))
	if !ok || !strings.HasPrefix(server, proxyNamePrefix) {
		return body
	}
	if name, ok := q.nameOf(server); ok {
		return withErrorField(body, fieldMessage, before+name+after)
	}
	return body
}

// nameOf is the client's name for the server statement server: one it holds, or one the Query being answered
// defines.
func (q *pooledSQLStmts) nameOf(server string) (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if server == closedStmtName {
		return q.closedAs, q.closedAs != ""
	}
	for name, d := range q.byName {
		if d.server == server {
			return name, true
		}
	}
	for _, p := range q.pending {
		if p.def.server == server {
			return p.name, true
		}
	}
	return "", false
}

// mentionsSQLPrepared reports whether a Query text may use an SQL-level prepared statement's name.
func mentionsSQLPrepared(text []byte) bool { return sqlPreparedWords.In(text) }

// sqlPreparedWords are mentionsSQLPrepared's words.
var sqlPreparedWords = rewrite.NewFoldWords("prepare", "execute", "deallocate")

// sqlStmtName is the server name of the client's statement name prepared as body (rewrite.PreparedRef.Body).
func sqlStmtName(name, body string) string {
	h := sha256.Sum256([]byte(name + "\x00" + body))
	return sqlStmtPrefix + hex.EncodeToString(h[:10])
}

// querySQLPrepared forwards a client's Query that may use SQL-level prepared statements (pl.mu held): fenced by
// the core into a scratch buffer, its names mapped, with the Closes it needs in front and the hidden PREPAREs
// among its statements.
func (ss *session) querySQLPrepared(body []byte, p Planner) error {
	pl := ss.pooled
	sc := pl.sc
	// What goes before the Query is taken now, as the core below writes into a scratch buffer, and written right
	// before it (front): a token statement sent by the extended protocol (procedureAlone) must have nothing of the
	// proxy's own between it and the Query, such as the prepared fences' commands below.
	prefix, token := ss.queryPrefix, ss.queryToken
	ss.queryPrefix, ss.queryToken = "", tokenNone
	front := func() string {
		if token != tokenNone {
			ss.procedureAlone(sc.w, token)
		}
		return prefix
	}
	var fenced bytes.Buffer
	if p != nil {
		// An idle point all the same (prepared.go): the proxy's own commands go straight to the connection,
		// before the text's words may make it forget them (as the core sends them before it looks at the text).
		// Their answers may all come back before the Query is counted: the pool's side of them
		// (preparedAnswer) acts on no idle moment.
		if ss.state.idle() {
			ss.prep.sendQueued(sc.w, &ss.state, body)
		}
		// The core fences the text into the scratch buffer as SQL: every EXECUTE name in it must be the
		// client's (mapped below).
		ss.sqlOnly = true
		err := ss.onClientMsg(msgQuery, body, p, &fenced)
		ss.sqlOnly = false
		if err != nil {
			return err
		}
	} else {
		ss.state.pending.Add(1)
		writeQueryMsg(&fenced, "", body, "")
	}
	msg := fenced.Bytes()
	if len(msg) < headerLen+1 || msg[0] != msgQuery {
		return fmt.Errorf("fenced Query: unexpected message")
	}
	text := msg[headerLen : len(msg)-1]
	// Positions count characters after the token statement: a prefix that cannot be counted (prefixChars
	// negative) leaves them as they are.
	m, err := ss.mapSQLPrepared(text, clientText(body), pl.prefixChars.Load() >= 0)
	switch {
	case errors.Is(err, errNoSQLNames):
		writeQueryMsg(sc.w, front(), msg[headerLen:], "")
		return nil
	case err != nil:
		// Never as it is: its names would be the server connection's (the top of this file).
		writeQueryMsg(sc.w, front(), nil, ss.refusal(unmappedRefusal(err)))
		return nil
	}
	if m.own && ss.ownStale() {
		// It executes a name the client never prepared here: maybe one of its own (ownStmts).
		writeQueryMsg(sc.w, front(), nil, ownStmtsRefusal())
		return nil
	}
	// The CloseCompletes come first: while statements in front are hidden (the token statement, the PREPAREs) they
	// are hidden with them, as the token statement's ParseComplete; else the queue of answers to hide says they are the proxy's.
	// Counted before anything is written: a full buffer may send the Closes.
	queued := pl.hide.Load() == 0 && m.front == 0
	pl.hide.Add(int64(m.front))
	for _, name := range m.closes {
		writeMsg(sc.w, msgClose, append(append([]byte{'S'}, name...), 0), "")
		if queued {
			pl.stmts.sent(msgCloseComplete, true)
		}
	}
	ss.resentAs(m.named) // positions.go
	writeQueryMsg(sc.w, front(), nil, m.text)
	return nil
}

// errNoSQLNames: a text that reads exactly uses no SQL-level statement name (the words were in a string, a
// comment, another name): there is nothing to map, and it goes as it is.
var errNoSQLNames = errors.New("the text uses no SQL-level prepared statement name")

// unmappedRefusal is the refusal of a text that may use SQL-level statement names the proxy cannot map (why).
func unmappedRefusal(why error) rewrite.Plan {
	return rewrite.Plan{Action: rewrite.Refuse, Code: sqlstateUnfenceable, Message: fmt.Sprintf(
		"unfenceable write: fenceproxy cannot map the prepared statement names of this text under transaction pooling (%v); send PREPARE, EXECUTE and DEALLOCATE in a text the proxy can read (no backslash with standard_conforming_strings off, UTF-8 characters only)", why)}
}

// sqlRefs are the uses of SQL-level statement names in a text that holds one of the words (PREPARE, EXECUTE,
// DEALLOCATE), to be mapped; errNoSQLNames when it uses none, another error when they cannot be mapped
// (querySQLPrepared, parseSQLPrepared: refused).
func (ss *session) sqlRefs(text []byte) ([]rewrite.PreparedRef, error) {
	if err := ss.unreadable(text); err != nil {
		// pg_query cannot read it as the server does, so its names cannot be replaced in it; but read as the
		// planner reads it (decoded, literals with backslashes respelled), it may use none, and then there is
		// nothing to map (a word in a string with a backslash, a LATIN1 text that mentions EXECUTE).
		set := ss.readingSettings()
		set.Unsettled = false
		if refs, rerr := rewrite.PreparedRefsAs(text, set); rerr == nil && len(refs) == 0 {
			return nil, errNoSQLNames
		}
		return nil, err
	}
	refs, err := rewrite.PreparedRefs(string(text))
	switch {
	case err != nil:
		return nil, err
	case len(refs) == 0:
		return nil, errNoSQLNames
	}
	return refs, nil
}

// unreadable says why pg_query may not read a client's text as the server does under the session's reading
// settings as last reported (sqlUnreadable), nil when it does. The message itself already counts as pending
// here (the core), which would make them unsettled for every text.
func (ss *session) unreadable(text []byte) error {
	set := ss.readingSettings()
	set.Unsettled = false
	return sqlUnreadable(text, set)
}

// sqlUnreadable says why a text may not read the same to pg_query as to the server under set, nil when it does.
func sqlUnreadable(text []byte, set rewrite.Settings) error {
	switch {
	case !isASCII(string(text)) && (set.ClientEncoding != "UTF8" || set.ServerEncoding != "UTF8" || !utf8.Valid(text)):
		return fmt.Errorf("characters read in client_encoding %s, server_encoding %s", set.ClientEncoding, set.ServerEncoding)
	case !set.StandardConformingStrings && bytes.IndexByte(text, '\\') >= 0:
		return errors.New("a backslash, and standard_conforming_strings is off")
	}
	return nil
}

// ownStmts applies the rule for statements the server holds under the client's own names (ownPrepared; pl.mu
// held), to a text the proxy does not map (a Parse's, or a Query's it cannot read) whose uses of names are refs
// (err: not known): a text that may PREPARE one marks the session; a text that may EXECUTE one after the planner
// changed since is refused (true).
func (ss *session) ownStmts(refs []rewrite.PreparedRef, err error) (refuse bool) {
	has := func(k rewrite.PreparedKind) bool {
		return err != nil || slices.ContainsFunc(refs, func(r rewrite.PreparedRef) bool { return r.Kind == k })
	}
	if ss.ownStale() && has(rewrite.ExecuteName) {
		return true
	}
	if has(rewrite.PrepareName) {
		ss.ownSQLPrep.mark(ss.pooled.plan.gen)
	}
	return false
}

// ownStale reports whether the pooled client may have statements of its own names on the server prepared under a
// planner that is not the one in force (pl.mu held; ownStmts).
func (ss *session) ownStale() bool { return ss.ownSQLPrep.stale(ss.pooled.plan.gen) }

// ownStmtsRefusal is the refusal of a text ownStmts refuses.
func ownStmtsRefusal() string {
	return rewrite.RefusalSQL(sqlstateUnfenceable, "", ownPreparedMessage, ownPreparedHint)
}

// parseSQLPrepared is a fenced Parse message (whole) whose text may use SQL-level statement names (pl.mu held):
// each name it uses is closed first on the lent server connection unless the client is pinned (foreignStmt), one
// of the proxy's own replaced by a name nothing holds, the text then deparsed. A PREPARE in it leaves a statement
// of the client's own name: ownStmts.
func (ss *session) parseSQLPrepared(msg []byte) []byte {
	if len(msg) < headerLen || msg[0] != msgParse {
		return msg
	}
	name, rest, ok := cutNul(msg[headerLen:])
	if !ok {
		return msg
	}
	query, tail, ok := cutNul(rest)
	if !ok || !mentionsSQLPrepared(query) {
		return msg
	}
	refused := func(why error) []byte {
		// Never as it is: its names would be the server connection's (the top of this file). The refusal goes
		// in the Parse's place, as the core puts one (fenceParseAs).
		var b bytes.Buffer
		sql := ss.refusal(unmappedRefusal(why))
		writeMsg(&b, msgParse, append(append(append(append(append([]byte(nil), name...), 0), sql...), 0), tail...), "")
		return b.Bytes()
	}
	refs, err := ss.sqlRefs(query)
	if err == nil && ss.ownStmts(refs, nil) {
		var b bytes.Buffer
		writeMsg(&b, msgParse, append(append(append(append(append([]byte(nil), name...), 0), ownStmtsRefusal()...), 0), tail...), "")
		return b.Bytes()
	}
	switch {
	case errors.Is(err, errNoSQLNames):
		return msg
	case err != nil:
		return refused(err)
	}
	names := make([]string, len(refs))
	renamed, closed := false, map[string]bool{}
	for i, r := range refs {
		if r.Kind == rewrite.DeallocateAll {
			continue
		}
		if closed[r.Name] {
			names[i] = closedStmtName
			if !strings.HasPrefix(r.Name, proxyNamePrefix) {
				names[i] = r.Name
			}
			continue
		}
		closed[r.Name] = true
		names[i] = ss.foreignStmt([]byte(r.Name)) // pooledstmts.go
		renamed = renamed || names[i] != r.Name
	}
	if !renamed {
		return msg
	}
	out, _, err := rewrite.RenamePrepared(string(query), names)
	if err != nil {
		// Its name cannot be replaced: the statement is refused by the server, as one naming nothing.
		out = "EXECUTE " + closedStmtName
	}
	var b bytes.Buffer
	writeMsg(&b, msgParse, append(append(append(append(append([]byte(nil), name...), 0), out...), 0), tail...), "")
	return b.Bytes()
}

// sqlMapping is a Query text with the client's statement names mapped and its hidden PREPAREs put in, and the
// Closes that go before it.
type sqlMapping struct {
	text string
	// named is text without its hidden PREPAREs: what an error's position counts in once shiftPosition moved
	// it past them.
	named  string
	closes []string
	front  int // hidden PREPAREs in front of the text's first statement
	// own: the text EXECUTEs a name the client has not prepared here, as it is: a statement of the client's own
	// name, when it is pinned (ownStmts).
	own bool
}

// clientText is the text of a client's Query body (nil when malformed).
func clientText(body []byte) []byte {
	text, _ := planText(msgQuery, body)
	return text
}

// clientPrepares are the client's own PREPAREs (their bodies, rewrite.PreparedRef.Body) of the client's Query
// text orig, by the index of the fenced text's reference (refs) they are: "" where the two texts do not have the
// same references (a refusal replaced the text), or orig cannot be read exactly.
func (ss *session) clientPrepares(orig []byte, refs []rewrite.PreparedRef) []string {
	out := make([]string, len(refs))
	if orig == nil || !slices.ContainsFunc(refs, func(r rewrite.PreparedRef) bool { return r.Kind == rewrite.PrepareName }) ||
		ss.unreadable(orig) != nil {
		return out // no PREPARE: the client's text is not parsed again (an EXECUTE's Query, the common one)
	}
	own, err := rewrite.PreparedRefs(string(orig))
	if err != nil || len(own) != len(refs) {
		return out
	}
	for i, r := range refs {
		if o := own[i]; o.Kind != r.Kind || o.Name != r.Name || o.Stmt != r.Stmt {
			return make([]string, len(refs))
		}
	}
	for i, r := range own {
		if r.Kind == rewrite.PrepareName {
			out[i] = r.Body
		}
	}
	return out
}

// refenceSQL is the client's SQL-level statement d, of name, fenced again from the client's PREPARE (d.src) by
// the planner in force (pl.plan; pl.mu held): d was fenced under another (a reload or a catalog refresh changed
// what is protected since). Its server name is its new text's (sqlStmtName), so no server connection that holds
// the old text runs it for this name. Without the client's PREPARE, or when the planner now refuses it, the
// hidden PREPARE is of the refusal, which the server answers before the client's statement that uses it.
func (ss *session) refenceSQL(name string, d sqlStmt) sqlStmt {
	pl := ss.pooled
	text := d.src
	if p := pl.plan.p; p != nil && d.src != "" {
		set := ss.readingSettings()
		set.InlineToken = false
		switch plan := ss.checkPlan(p.Plan([]byte(d.src), set)); plan.Action {
		case rewrite.Rewrite:
			text = plan.SQL
		case rewrite.Refuse:
			text = "PREPARE p AS " + ss.refusal(plan)
		}
	}
	if refs, err := rewrite.PreparedRefs(text); err == nil && len(refs) == 1 && refs[0].Kind == rewrite.PrepareName {
		server := sqlStmtName(name, refs[0].Body)
		if _, prepares, err := rewrite.RenamePrepared(text, []string{server}); err == nil {
			return sqlStmt{server: server, prepare: prepares[0], src: d.src, gen: pl.plan.gen}
		}
	}
	refusal := rewrite.RefusalSQL(sqlstateUnfenceable, "", "unfenceable write: the prepared statement "+name+
		" could not be analysed again after the table list changed", "Prepare it again.")
	server := sqlStmtName(name, refusal)
	return sqlStmt{server: server, prepare: "PREPARE " + server + " AS " + refusal, src: d.src, gen: pl.plan.gen}
}

// mapSQLPrepared maps the statement names of a fenced Query text (pl.mu held), puts in the hidden PREPAREs it
// needs, and records what the server's answers will make of the client's names and which answers are hidden;
// spans: where the hidden PREPAREs are is recorded for the positions of errors. orig is the client's text before
// fencing: its PREPAREs are kept, to be fenced again should the planner change (refenceSQL). errNoSQLNames when
// the text uses no names; another error when it cannot be read exactly or mapped (querySQLPrepared refuses it).
func (ss *session) mapSQLPrepared(text, orig []byte, spans bool) (sqlMapping, error) {
	pl := ss.pooled
	sc := pl.sc
	refs, err := ss.sqlRefs(text)
	if err != nil {
		return sqlMapping{}, err
	}
	srcs := ss.clientPrepares(orig, refs)
	q := &pl.sqlStmts
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.doubt {
		clear(sc.sqlStmts)
		q.doubt = false
	}
	if sc.sqlStmts == nil {
		sc.sqlStmts = map[string]bool{}
	}
	// The client's names and the connection's statements as each statement of the text finds them.
	names := map[string]*sqlStmt{} // changed by the text so far (nil: forgotten)
	allGone := false               // DEALLOCATE ALL: q.byName no longer counts
	lookup := func(n string) (sqlStmt, bool) {
		if d, ok := names[n]; ok {
			if d == nil {
				return sqlStmt{}, false
			}
			return *d, true
		}
		if allGone {
			return sqlStmt{}, false
		}
		d, ok := q.byName[n]
		if ok && d.gen != pl.plan.gen {
			// Fenced under another planner: fenced again now, under a server name of its new text, which the
			// connection then does not hold (ensure prepares it).
			d = ss.refenceSQL(n, d)
			q.byName[n] = d
		}
		return d, ok
	}
	var m sqlMapping
	closed := map[string]bool{}
	closeFirst := func(name string) {
		if !closed[name] {
			closed[name] = true
			m.closes = append(m.closes, name)
		}
	}
	present := func(h string) bool { return sc.sqlStmts[h] }
	// hidden are the PREPAREs the text needs, each right before the first statement that uses its statement,
	// in the order of the statements.
	var hidden []rewrite.Put
	// used are the server names the text names so far: where one is named again, the text's own statements before
	// decide what the connection holds under it then, and a Close in front of the Query would undo them.
	used := map[string]bool{}
	// ensure: a statement of the client's that statement stmt uses, prepared right before it when the
	// connection may not hold it.
	ensure := func(stmt int, d sqlStmt) {
		used[d.server] = true
		if !present(d.server) {
			closeFirst(d.server)
			hidden = append(hidden, rewrite.Put{Before: stmt, SQL: d.prepare})
			sc.sqlStmts[d.server] = true
		}
	}
	failed := byte(ss.state.txStatus.Load()) == txFailed
	renamed := make([]string, len(refs))
	closedAs := ""
	var pend []sqlPending
	newDefs := map[int]int{} // ref index -> index in pend of a PREPARE that defines a name
	for i, r := range refs {
		switch r.Kind {
		case rewrite.DeallocateAll:
			allGone = true
			clear(names)
			clear(sc.sqlStmts)
		case rewrite.ExecuteName, rewrite.DeallocateName:
			d, ok := lookup(r.Name)
			// A DEALLOCATE that starts its Query in a failed block is refused (25P02) and the name stays: it is
			// left as it is. One after a statement of the Query that may end the failed state (ROLLBACK, COMMIT,
			// ROLLBACK TO) is mapped.
			if !ok && r.Kind == rewrite.DeallocateName && !allGone && (r.Stmt > 0 || !failed) {
				if server, prepare, was := ss.deallocateNamed(r.Name); server != "" { // pooledstmts.go
					pend = append(pend, sqlPending{stmt: r.Stmt, reopen: &closedStmt{name: r.Name, stmt: was, prepared: true}})
					renamed[i] = server
					if prepare != "" {
						closeFirst(server)
						hidden = append(hidden, rewrite.Put{Before: r.Stmt, SQL: prepare})
					}
					continue
				}
			}
			switch {
			case ok:
				ensure(r.Stmt, d)
				renamed[i] = d.server
				if r.Kind == rewrite.DeallocateName {
					names[r.Name] = nil
					pend = append(pend, sqlPending{stmt: r.Stmt, name: r.Name})
					sc.sqlStmts[d.server] = false
				}
			case strings.HasPrefix(r.Name, proxyNamePrefix):
				renamed[i] = closedStmtName
				closeFirst(closedStmtName)
				if closedAs == "" {
					closedAs = r.Name
				}
			default:
				renamed[i] = r.Name
				if pl.pin == "" {
					closeFirst(r.Name)
				} else if r.Kind == rewrite.ExecuteName {
					m.own = true
				}
			}
		case rewrite.PrepareName:
			if d, ok := lookup(r.Name); ok {
				// PostgreSQL refuses a name in use (42P05): the server says so, to the statement that holds it.
				ensure(r.Stmt, d)
				renamed[i] = d.server
				continue
			}
			h := sqlStmtName(r.Name, r.Body)
			// Whatever the connection holds under it, the client's PREPARE must succeed as its own would: it is
			// closed first, unless known gone, or named earlier in the text (DEALLOCATE n; PREPARE n AS the same
			// text: the DEALLOCATE needs it there).
			if held, known := sc.sqlStmts[h]; !used[h] && (held || !known) {
				closeFirst(h)
			}
			used[h] = true
			renamed[i] = h
			sc.sqlStmts[h] = true
			def := &sqlStmt{server: h, src: srcs[i], gen: pl.plan.gen}
			names[r.Name] = def
			newDefs[i] = len(pend)
			pend = append(pend, sqlPending{stmt: r.Stmt, name: r.Name})
		}
	}
	out, prepares, err := rewrite.RenamePrepared(string(text), renamed)
	if err != nil {
		clear(sc.sqlStmts) // what was marked above is not sent
		return sqlMapping{}, err
	}
	for i, k := range newDefs {
		pend[k].def = sqlStmt{server: renamed[i], prepare: prepares[i], src: srcs[i], gen: pl.plan.gen}
	}
	m.named = out
	var at []rewrite.Span
	if len(hidden) > 0 {
		if out, at, err = rewrite.PutBefore(out, hidden); err != nil {
			clear(sc.sqlStmts)
			return sqlMapping{}, fmt.Errorf("hidden PREPAREs: %w", err)
		}
	}
	var hideAt []hiddenAt
	for _, h := range hidden {
		switch {
		case h.Before == 0:
			m.front++ // hidden from the start (querySQLPrepared)
		case len(hideAt) > 0 && hideAt[len(hideAt)-1].stmt == h.Before:
			hideAt[len(hideAt)-1].n++
		default:
			hideAt = append(hideAt, hiddenAt{stmt: h.Before, n: 1})
		}
	}
	// Characters, not bytes: a PREPARE may hold some that are not ASCII (sqlUnreadable: UTF-8 then).
	var cs []charSpan
	for _, a := range at {
		cs = append(cs, charSpan{at: utf8.RuneCountInString(out[:a.At]), n: utf8.RuneCountInString(out[a.At : a.At+a.Len])})
	}
	if !spans {
		cs = nil
	}
	m.text = out
	q.pending, q.done, q.closedAs, q.hideAt, q.spans = pend, 0, closedAs, hideAt, cs
	q.own = m.front
	return m, nil
}
