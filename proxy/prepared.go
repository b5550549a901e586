package proxy

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// Prepared fences (upstream.prepared_fences, issue 20). A fenced statement that arrives as SQL with its
// constants inlined costs the server a parse, an analysis and a plan of the whole fence each time, about three
// times its own. When the rewrite serves it from a shape template that the server can prepare
// (rewrite/prepared.go: Plan.Prepared), the proxy prepares that template on the session's upstream connection
// once, and from then on sends the statement as EXECUTE name(constants).
//
// The rules, each in one place below:
//
//   - A PREPARE is sent only when the session is idle (nothing unanswered, no transaction block), as a Query of
//     its own just before the client's next Query, and its answers are not relayed (onPreparedAnswer). It runs
//     in a transaction of its own, so its failure touches nothing of the client's: the statement keeps being
//     sent as SQL on that connection; a template the server cannot prepare anywhere (templateFault) is not
//     offered again (rewrite.Prepared.MarkFailed).
//   - A PREPARE never waits for a lock (preparePrefix): analysing the template locks its tables, and the
//     client's next statement, whatever it touches, would wait behind it while another session holds or awaits
//     a conflicting lock (a migration's ALTER TABLE). It fails at once instead and, like one that was cancelled
//     or chosen as a deadlock victim (transientFault), is sent again at the next idle point after the
//     template's next use.
//   - A statement is sent as EXECUTE only when the server has answered that template's PREPARE with
//     CommandComplete on this connection. Until then, and for any other text, the fenced SQL is sent as before.
//   - EXECUTE is sent only while the statements are known to be the proxy's (issue 27). Any code the server
//     runs for the client (a function, a procedure, a DO block, a trigger, a default, a cast: almost any
//     statement) can run DEALLOCATE and PREPARE, reading the names from pg_prepared_statements, and put an
//     unfenced statement of the same name and parameter types in a template's place; no SQL name can be kept
//     from it. So trust is lost with every client message that may run code on the server (every Query but a
//     BEGIN alone, with transaction modes or without: isBareBegin; and every Parse, Bind, Execute and
//     FunctionCall: clientRan), and comes back only from a
//     verification sent after it (verifySQL, at an idle point, after the PREPAREs): the server must hold,
//     under each of the proxy's names, exactly the text the proxy prepared there. A name that holds another
//     text makes the proxy forget them all (the next idle point deallocates whatever has its prefix, and
//     prepares again). Until a clean answer has come back, with nothing of the client's run since it was
//     sent, statements go as SQL: a hijacked name never runs. The first fenced statement after a BEGIN (as
//     pgbench and most transactions send it) runs as EXECUTE; in autocommit, where every statement runs code
//     just before the next, fenced statements go as SQL.
//   - The proxy forgets every statement it prepared when the client's text may drop prepared statements (it
//     holds the word DISCARD or DEALLOCATE, unless it is one DEALLOCATE of another name) or change what they
//     would mean (below: CREATE, ALTER, transform_null_equals), when the client closes a statement named with the proxy's prefix
//     with the extended protocol (Close; a Parse may then put its own statement under the name), and when the
//     server says one of its statements does not exist (a function ran DEALLOCATE): it prepares again when
//     idle. The server may still hold what the proxy forgot (the text only mentioned the word, deallocated a
//     statement of the client's, or failed; a function deallocated one statement of several), so the next idle
//     point first deallocates every statement named with the proxy's prefix that the server holds (sweepSQL):
//     forgetting never leaves statements behind on the connection. Until that sweep (or an evicted entry's
//     DEALLOCATE) has succeeded, what it drops is still the proxy's own (retiring), to the transaction pool's
//     probe, which must not take it for the client's SQL PREPARE; one that fails (a statement_timeout the
//     client left) goes again at the next idle point. A client's cancel waits while these commands run before
//     its statement (forwardCancel, cancelPooled): cancelled, they would fail, and the client's statement run
//     on. A connection kept for reuse is reset with DISCARD ALL, and the next session starts with none.
//   - At most max templates per connection: beyond that, the least recently used one is deallocated at the next
//     idle point.
//
// What EXECUTE cannot see by itself: PostgreSQL resolves a prepared statement's names when it prepares it, and
// resolves them again only when search_path changes or an object the statement uses changes; a table (or
// function, or operator) created later that would now win the lookup of an unqualified name (a temporary table
// of the same name; a table in a schema earlier in search_path) is not seen: EXECUTE would write the table the
// template was prepared against, fenced, where the SQL writes the new one. Settings read at analysis
// (transform_null_equals) are likewise those of the PREPARE. So the proxy also forgets its statements when the
// client's text holds CREATE, ALTER (a rename) or transform_null_equals, and prepares again under the new names.
// What it cannot see is another session (or a function) creating such a table: clients whose tables are
// shadowed that way need upstream.prepared_fences: 0.
//
// Names are fenceproxy_p<n>, never reused on a connection; a name the client already uses makes that one
// PREPARE fail, and the statement is sent as SQL. The prefix is the proxy's: a sweep deallocates the client's
// statements of that name too.

// preparedPrefix starts the name of every statement the proxy prepares.
const preparedPrefix = "fenceproxy_p"

var preparedPrefixBytes = []byte(preparedPrefix)

// preparePrefix goes before every PREPARE of the proxy's, in the same Query: the implicit transaction that
// runs both gives up on a lock it cannot take at once (lock_timeout's least value; 0 would mean no limit), and
// the setting ends with it.
const preparePrefix = "SET LOCAL lock_timeout = '1ms'; "

// sweepSQL deallocates every prepared statement named with the proxy's prefix, without an error for those the
// server no longer holds (PostgreSQL has no DEALLOCATE IF EXISTS). Every name it uses is pg_catalog's, so no
// search_path changes what it does.
const sweepSQL = "DO $$DECLARE n pg_catalog.text; BEGIN FOR n IN SELECT name FROM pg_catalog.pg_prepared_statements " +
	"WHERE pg_catalog.starts_with(name, '" + preparedPrefix + "') LOOP EXECUTE pg_catalog.format('DEALLOCATE %I', n); END LOOP; END$$"

// Prepared-statement states (prepEntry.state).
const (
	prepWanted int32 = iota // seen; its PREPARE goes out at the next idle point
	prepSent                // PREPARE sent, not answered yet
	prepReady               // the server prepared it: EXECUTE may be sent
	prepFailed              // the server refused it: sent as SQL
	prepRetry               // the PREPARE failed for the moment (transientFault): queued again at its next use
)

// prepEntry is one template on one upstream connection.
type prepEntry struct {
	tmpl    *rewrite.Prepared
	name    string
	hash    string // md5 of the text that prepares it (prepareSQL), as the server holds it
	state   atomic.Int32
	lastUse uint64 // prepState.uses at its last use; client side only
	// seen is the number of the last verification that found the server holding this entry's text under its
	// name (server side writes; read when that verification's ReadyForQuery comes). Numbers start at 1: an
	// entry no verification listed is never seen.
	seen atomic.Uint64
}

// prepCommand is a statement the proxy sends on its own at an idle point: a PREPARE (entry set), a
// DEALLOCATE or a sweep (retire: the entries it takes off the server), or a verification of the names of
// entries (verify set, for trust epoch epoch, numbered n).
type prepCommand struct {
	sql      string
	entry    *prepEntry
	retire   []*prepEntry
	verify   bool
	epoch, n uint64
	entries  []*prepEntry
}

// noteSeen notes that a verification's answer lists name: the server holds that entry's text under it.
func (c prepCommand) noteSeen(name string) {
	for _, e := range c.entries {
		if e.name == name {
			e.seen.Store(c.n)
		}
	}
}

// unverified returns the first of a verification's entries that the proxy may EXECUTE (the server has
// prepared it: its PREPARE, in the same batch or before, was answered) and that the answer did not list; nil
// when there is none. An entry whose PREPARE failed is not required: the server may hold a client's statement
// under its name, and the proxy never executes it.
func (c prepCommand) unverified() *prepEntry {
	for _, e := range c.entries {
		if e.state.Load() == prepReady && e.seen.Load() != c.n {
			return e
		}
	}
	return nil
}

// dataRowText is the first column of a DataRow, as text ("" when NULL or malformed).
func dataRowText(body []byte) string {
	if len(body) < 6 || body[0] != 0 || body[1] == 0 {
		return ""
	}
	n := int(int32(uint32(body[2])<<24 | uint32(body[3])<<16 | uint32(body[4])<<8 | uint32(body[5])))
	if n < 0 || 6+n > len(body) {
		return ""
	}
	return string(body[6 : 6+n])
}

// prepState is a session's prepared templates.
//
// Concurrency: with the goroutine transport, byTmpl, queued, next and uses belong to the client side; the
// server side reads the answers to the commands in flight (inflight, under mu), sets their entries' states and
// may raise lost. With the event loop one goroutine does both.
type prepState struct {
	max    int // 0: off
	byTmpl map[*rewrite.Prepared]*prepEntry
	queued []prepCommand // to send at the next idle point
	next   int           // the next name's number
	uses   uint64
	// onServer: a PREPARE went out since the last sweep, so the server may hold statements of the proxy's;
	// sweep: a sweep goes out first at the next idle point (forget).
	onServer, sweep bool

	lost atomic.Bool // the server said a statement of ours does not exist: forget them all

	// retiring are the entries the proxy dropped (forget, evict) that the server may still hold until a sweep
	// or DEALLOCATE of them succeeds (under mu): still the proxy's own to the pool's probe (ownCond), never
	// EXECUTEd. resweep: such a command failed (a cancel, a statement_timeout the client left), so a sweep
	// goes again at the next idle point (server side sets it). retireFailed: the command being answered failed
	// (server side only).
	retiring     []*prepEntry
	resweep      atomic.Bool
	retireFailed bool

	// Trust (see the top of this file). epoch counts the client's messages that may have run code on the server
	// (client side); verified is the epoch for which a verification came back clean (server side writes);
	// verifySent the epoch of the last verification sent (client side); verifyFailed: the verification being
	// answered found a name holding another text, or failed (server side only).
	epoch, verifySent uint64
	verified          atomic.Uint64
	verifyFailed      bool
	// verifyText and verifyEntries: the verification of every entry (verifySQL), built when first needed after
	// the entries last changed (add, which also evicts; forget), not for every transaction; client side only.
	verifyText    string
	verifyEntries []*prepEntry
	verifications uint64 // verifications sent; client side only

	mu       sync.Mutex
	inflight []prepCommand // sent, in order; answered in order
}

// statementFor returns what to send for a fenced statement whose plan is p: EXECUTE of its prepared template
// when this connection has it, else p.SQL (noting the template to prepare at the next idle point).
func (ps *prepState) statementFor(p rewrite.Plan, m *Metrics) string {
	if ps.max == 0 || p.Prepared == nil {
		return p.SQL
	}
	if ps.lost.Swap(false) {
		ps.forget()
	}
	ps.uses++
	e := ps.byTmpl[p.Prepared]
	if e == nil {
		ps.add(p.Prepared)
		return p.SQL
	}
	e.lastUse = ps.uses
	if e.state.Load() != prepReady {
		if e.state.CompareAndSwap(prepRetry, prepWanted) {
			ps.queued = append(ps.queued, prepCommand{sql: prepareSQL(e), entry: e})
		}
		return p.SQL
	}
	if ps.verified.Load() != ps.epoch {
		return p.SQL // something may have replaced the statement since it was last verified
	}
	m.preparedExecuted()
	return "EXECUTE " + e.name + p.Args
}

// clientRan notes a client message that may run code on the server (trust is lost until a verification sent
// after it comes back clean): every Query but a bare BEGIN (isBareBegin), and every Parse, Bind, Execute and
// FunctionCall.
func (ps *prepState) clientRan(typ byte, body []byte) {
	if ps.max == 0 {
		return
	}
	if typ == msgQuery && isBareBegin(body) {
		return
	}
	ps.epoch++
}

// isBareBegin reports whether a Query's body is one BEGIN (or START TRANSACTION) alone, with transaction modes
// or without, which runs no code.
//
// Why that is airtight: the text is made of nothing but ASCII letters, spaces and commas (at most one ';' at
// its end), it starts with BEGIN or START TRANSACTION, and every later word is one of those the grammar of
// their transaction modes knows (beginModeWord). PostgreSQL reads such a text as one BEGIN or START
// TRANSACTION with modes, or refuses it as a syntax error: no expression, name or comment can hide in it.
// Neither runs code of the client's: the modes set transaction_isolation, transaction_read_only and
// transaction_deferrable, whose checks are PostgreSQL's own, and transaction control fires no trigger, event
// trigger or rule. Anything else counts as running code: COMMIT runs deferred constraint triggers, and
// SET, which could keep trust for plain settings, is not judged here.
func isBareBegin(body []byte) bool {
	t := bytes.TrimRight(body, "\x00")
	t = bytes.TrimSpace(bytes.TrimSuffix(bytes.TrimSpace(t), []byte(";")))
	for _, c := range t {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',') {
			return false
		}
	}
	words := strings.FieldsFunc(strings.ToLower(string(t)), func(r rune) bool { return r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == ',' })
	switch {
	case len(words) >= 1 && words[0] == "begin":
		words = words[1:]
	case len(words) >= 2 && words[0] == "start" && words[1] == "transaction":
		words = words[2:]
	default:
		return false
	}
	for _, w := range words {
		if !beginModeWord(w) {
			return false
		}
	}
	return true
}

// beginModeWord reports whether w may follow BEGIN or START TRANSACTION: WORK, TRANSACTION or a word of the
// transaction modes (ISOLATION LEVEL { SERIALIZABLE | REPEATABLE READ | READ COMMITTED | READ UNCOMMITTED },
// READ WRITE, READ ONLY, [ NOT ] DEFERRABLE).
func beginModeWord(w string) bool {
	switch w {
	case "work", "transaction", "isolation", "level", "serializable", "repeatable", "read", "committed", "uncommitted",
		"write", "only", "not", "deferrable":
		return true
	}
	return false
}

// verifySQL returns a query that lists the names among entries that the server holds with exactly the text
// the proxy prepared there (the pair of name and md5 of the text must be an entry's: a name holding another
// text, or an entry's text under another name, is not listed); "" when there is nothing to verify. An entry
// that the answer does not list is not verified (fail closed: prepCommand.unverified). Every name it uses is
// pg_catalog's, so no search_path changes what it does.
//
// It reads the function pg_prepared_statement() rather than the view pg_prepared_statements over it, and
// compares with an array rather than joining a VALUES list: the same rows, but the server plans it in about a
// quarter of the time (measured with pgbench -M simple, one statement: 31 µs a round trip against 54 µs for
// the view joined with VALUES, 24 µs for SELECT 1), and it runs before every transaction that EXECUTEs.
func verifySQL(entries []*prepEntry) string {
	if len(entries) == 0 {
		return ""
	}
	return "SELECT p.name FROM pg_catalog.pg_prepared_statement() AS p WHERE " + verifyCond(entries)
}

// verifyCond is the condition on p, a row of pg_prepared_statement(), that verifySQL lists.
func verifyCond(entries []*prepEntry) string {
	var b strings.Builder
	b.WriteString("p.name OPERATOR(pg_catalog.||) ' ' " +
		"OPERATOR(pg_catalog.||) pg_catalog.md5(p.statement) OPERATOR(pg_catalog.=) ANY ('{")
	for i, e := range entries {
		if i > 0 {
			b.WriteByte(',')
		}
		// Neither a name (fenceproxy_p<n>) nor a hash (hex) holds a quote, a backslash or a brace. The md5 is
		// always 32 characters, so the pair names one name.
		b.WriteString(`"` + e.name + " " + e.hash + `"`)
	}
	b.WriteString("}')")
	return b.String()
}

// verification returns the verification of every entry and its entries, built again only when the entries
// changed since the last one.
func (ps *prepState) verification() (string, []*prepEntry) {
	if ps.verifyText == "" {
		ps.verifyEntries = make([]*prepEntry, 0, len(ps.byTmpl))
		for _, e := range ps.byTmpl {
			ps.verifyEntries = append(ps.verifyEntries, e)
		}
		ps.verifyText = verifySQL(ps.verifyEntries)
	}
	return ps.verifyText, ps.verifyEntries
}

// ownCond is the condition on a row p of pg_prepared_statement() (or the view over it) that it is one of the
// connection's templates with the text the proxy prepared under its name (verifyCond): those it keeps, and
// those it dropped that the server may still hold (retiring: a probe between a forget and its sweep must not
// take them for the client's SQL PREPARE); "false" when there are none. Client side (in transaction pooling:
// under the lent client's pooledState.mu).
func (ps *prepState) ownCond() string {
	_, entries := ps.verification()
	ps.mu.Lock()
	if len(ps.retiring) > 0 {
		entries = append(slices.Clip(entries), ps.retiring...)
	}
	ps.mu.Unlock()
	if len(entries) > 0 {
		return verifyCond(entries)
	}
	return "false"
}

// retire notes entries dropped from byTmpl that the server may hold (prepSent or prepReady): they stay the
// proxy's until a sweep or DEALLOCATE of them succeeds.
func (ps *prepState) retire(entries ...*prepEntry) {
	ps.mu.Lock()
	for _, e := range entries {
		if st := e.state.Load(); st == prepSent || st == prepReady {
			ps.retiring = append(ps.retiring, e)
		}
	}
	ps.mu.Unlock()
}

// retired takes the entries of a sweep or DEALLOCATE that succeeded off retiring (server side).
func (ps *prepState) retired(gone []*prepEntry) {
	ps.mu.Lock()
	ps.retiring = slices.DeleteFunc(ps.retiring, func(e *prepEntry) bool { return slices.Contains(gone, e) })
	ps.mu.Unlock()
}

// add notes a template to prepare, making room for it when the connection holds max already.
func (ps *prepState) add(t *rewrite.Prepared) {
	if ps.byTmpl == nil {
		ps.byTmpl = make(map[*rewrite.Prepared]*prepEntry)
	}
	if len(ps.byTmpl) >= ps.max && !ps.evict() {
		return
	}
	ps.next++
	e := &prepEntry{tmpl: t, name: preparedPrefix + strconv.Itoa(ps.next), lastUse: ps.uses}
	sum := md5.Sum([]byte(prepareSQL(e)))
	e.hash = hex.EncodeToString(sum[:])
	ps.byTmpl[t] = e
	ps.verifyText = ""
	ps.queued = append(ps.queued, prepCommand{sql: prepareSQL(e), entry: e})
}

// prepareSQL is the Query that prepares e's template under e's name.
func prepareSQL(e *prepEntry) string {
	return preparePrefix + "PREPARE " + e.name + " " + e.tmpl.Body
}

// evict drops the least recently used entry that is not in flight, deallocating it on the server if it was
// prepared there; false when every entry is in flight.
func (ps *prepState) evict() bool {
	var victim *prepEntry
	for _, e := range ps.byTmpl {
		if e.state.Load() != prepSent && (victim == nil || e.lastUse < victim.lastUse) {
			victim = e
		}
	}
	if victim == nil {
		return false
	}
	delete(ps.byTmpl, victim.tmpl)
	switch victim.state.Load() {
	case prepWanted:
		ps.queued = deleteEntry(ps.queued, victim)
	case prepReady:
		ps.retire(victim)
		ps.queued = append(ps.queued, prepCommand{sql: "DEALLOCATE " + victim.name, retire: []*prepEntry{victim}})
	}
	return true
}

// deleteEntry removes e's command from cmds.
func deleteEntry(cmds []prepCommand, e *prepEntry) []prepCommand {
	for i := range cmds {
		if cmds[i].entry == e {
			return append(cmds[:i], cmds[i+1:]...)
		}
	}
	return cmds
}

// forget drops every entry: the server may no longer hold the statements (answers to PREPAREs in flight then
// set the state of entries nobody looks up). It may also still hold them: the next idle point sweeps them away
// before anything else goes out, DEALLOCATEs of evicted entries included.
func (ps *prepState) forget() {
	if ps.onServer {
		for _, e := range ps.byTmpl {
			ps.retire(e)
		}
	}
	clear(ps.byTmpl)
	ps.verifyText = ""
	ps.queued = ps.queued[:0]
	if ps.onServer {
		ps.sweep, ps.onServer = true, false
	}
}

// clientText looks at the text of a client's Query or Parse for what may drop prepared statements.
func (ps *prepState) clientText(text []byte) {
	if len(ps.byTmpl) == 0 {
		return
	}
	if rewrite.MayDropPrepared(text, preparedPrefix) {
		ps.forget()
	}
}

// clientClose looks at the body of a client's Close for a statement named with the proxy's prefix.
func (ps *prepState) clientClose(body []byte) {
	if len(body) > 0 && body[0] == 'S' && bytes.HasPrefix(body[1:], preparedPrefixBytes) {
		ps.forget()
	}
}

// sendQueued writes the queued commands to w, a sweep owed by forget first, each a Query of its own, and counts
// them as in flight in st. The caller has checked that the session is idle.
//
// A verification goes out only before a bare BEGIN: only there can its answer come back before the client's
// next statement with nothing run in between (in autocommit every statement may run code before the next).
func (ps *prepState) sendQueued(w msgSink, st *protoState, query []byte) {
	if ps.resweep.Swap(false) {
		ps.sweep = true
	}
	verify := ps.onServer && ps.verifySent != ps.epoch && isBareBegin(query)
	if len(ps.queued) == 0 && !ps.sweep && !verify {
		return
	}
	ps.mu.Lock()
	if ps.sweep {
		// It takes off the server every entry dropped so far; one dropped after it is sent waits for the next.
		ps.queued = append([]prepCommand{{sql: sweepSQL, retire: slices.Clone(ps.retiring)}}, ps.queued...)
		ps.sweep = false
	}
	send := func(c prepCommand) {
		ps.inflight = append(ps.inflight, c)
		st.internal.Add(1) // before the write: the server side must know the answers are not the client's
		writeMsg(w, msgQuery, nil, c.sql)
	}
	for _, c := range ps.queued {
		if c.entry != nil {
			if c.entry.tmpl.Failed() {
				c.entry.state.Store(prepFailed)
				continue
			}
			c.entry.state.Store(prepSent)
			ps.onServer = true
		}
		send(c)
	}
	// Last, after the PREPAREs: the verification of every name the proxy may EXECUTE, for the client's
	// messages so far (trust, at the top of this file). It names every entry; those whose PREPARE has not
	// succeeded by its answer are not required (prepCommand.unverified).
	if verify {
		if q, entries := ps.verification(); q != "" {
			ps.verifications++
			send(prepCommand{sql: q, verify: true, epoch: ps.epoch, n: ps.verifications, entries: entries})
			ps.verifySent = ps.epoch
		}
	}
	ps.mu.Unlock()
	ps.queued = ps.queued[:0]
}

// current returns the command being answered (the oldest in flight), taking it off the list when done (its
// ReadyForQuery came).
func (ps *prepState) current(done bool) prepCommand {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if len(ps.inflight) == 0 {
		return prepCommand{}
	}
	c := ps.inflight[0]
	if done {
		ps.inflight = ps.inflight[1:]
	}
	return c
}

// onPreparedAnswer handles a server message that answers a command of the proxy's own (state.internal > 0;
// onServerMsg passes notifications and parameter changes, which are not answers, on as usual): nothing of it
// reaches the client but a FATAL error, which ends the session.
func (ss *session) onPreparedAnswer(ps *prepState, typ byte, body []byte, out msgSink) (serverEvent, error) {
	st := &ss.state
	switch typ {
	case msgDataRow:
		if c := ps.current(false); c.verify {
			c.noteSeen(dataRowText(body))
		}
	case msgCommandComplete:
		if c := ps.current(false); c.entry != nil && string(body) == "PREPARE\x00" { // not preparePrefix's SET
			c.entry.state.Store(prepReady)
			ss.srv.metrics.preparedOutcome("prepared")
		}
	case msgErrorResponse:
		if sev := errorField(body, fieldSeverity); sev == "FATAL" || sev == "PANIC" {
			return 0, ss.errorOut(out, body)
		}
		if c := ps.current(false); c.verify {
			ps.verifyFailed = true // not verified: statements go as SQL until a later verification
		} else if c.retire != nil || c.sql == sweepSQL {
			ps.retireFailed = true // what it was to take off may still be there: swept again
		} else if c.entry != nil {
			code := errorField(body, fieldCode)
			if transientFault(code) {
				c.entry.state.Store(prepRetry)
				ss.srv.metrics.preparedOutcome("retried")
				ss.logger().Debug("a fenced statement shape could not be prepared for now; it is tried again", "code", code, "message", errorField(body, fieldMessage))
				break
			}
			c.entry.state.Store(prepFailed)
			if templateFault(code) {
				c.entry.tmpl.MarkFailed() // no connection tries again
			}
			ss.srv.metrics.preparedOutcome("failed")
			ss.logger().Info("a fenced statement shape could not be prepared; it is sent as SQL", "code", code, "message", errorField(body, fieldMessage))
		}
	case msgReadyForQuery:
		if len(body) != 1 {
			return 0, fmt.Errorf("upstream sent ReadyForQuery of %d bytes", len(body))
		}
		c := ps.current(true)
		switch {
		case ps.retireFailed:
			ps.retireFailed = false
			ps.resweep.Store(true)
		case c.retire != nil:
			ps.retired(c.retire)
		}
		if c.verify {
			// A name of the proxy's that does not hold the text it prepared there (dropped, or replaced by a
			// statement it did not prepare): never EXECUTE it (forget them all, and prepare again).
			if missing := c.unverified(); missing != nil && !ps.verifyFailed {
				ps.lost.Store(true)
				ss.preparedReplaced(missing)
			} else if !ps.verifyFailed && body[0] == txIdle {
				ps.verified.Store(c.epoch)
			}
			ps.verifyFailed = false
		}
		st.txStatus.Store(uint32(body[0]))
		if st.internal.Add(-1) == 0 {
			if o := st.takeOwedCancel(); o != nil {
				// Deferred by cancelAfterOwn: the client's statement runs now. The client's cancel
				// connections are answered once PostgreSQL has taken it.
				go func() {
					ss.cancelBackend()
					close(o.done)
				}()
			}
		}
		if ss.srv.draining.Load() && st.idle() {
			return evDrainNow, nil
		}
	}
	return 0, nil
}

// preparedReplaced counts and logs a verification that found a name of the proxy's not holding its text.
func (ss *session) preparedReplaced(missing *prepEntry) {
	ss.srv.metrics.preparedOutcome("replaced")
	ss.logger().Warn("a prepared fence was dropped or replaced on the server (by a function's DEALLOCATE or PREPARE?); the proxy prepares its statements again and sends SQL until then", "name", missing.name)
}

// noteMissingPrepared notes the SQLSTATE of an error that names a statement of the proxy's: the server no
// longer holds it.
func (ps *prepState) noteMissingPrepared(code string) {
	if code == sqlstateUndefinedPrepared {
		ps.lost.Store(true)
	}
}
