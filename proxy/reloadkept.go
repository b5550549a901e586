package proxy

import (
	"fmt"
	"slices"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// Statements a session-mode client prepared before the protected table list changed (a reload, a catalog
// refresh: Server.SetPlanner). The server holds them under the client's own names as the planner of then fenced
// them, and the client runs them later (a Bind; an SQL EXECUTE): one prepared before a reload that protects its
// table would write it unfenced after, one whose table the reload fences otherwise would run the old fence. The
// transaction pool prepares a client's statements again from its text under the planner in force
// (pooledstmts.go, pooledsqlprep.go); session mode relays the client's names to its own server connection and
// cannot, so it judges them again instead, by one rule: a statement runs only while the planner in force makes
// of the client's text the statement the server holds; otherwise the session is refused.
//
//   - A Parse (named or unnamed) is remembered with the planner generation it was fenced under, the client's
//     text and what the planner made of it (keptStmt). At the first Bind after a change of planner every
//     statement the session holds is planned again from its text: the same action, the same protected tables
//     and, rewritten, the same fenced text (fencedText: the token column, a lock check; compared as parse trees,
//     rewrite.SameRewrite, since a shape's template spells a fence with other blanks) mark it current; any
//     other goes to keptChanged. A Bind of one of those (or one whose body was not read while there is any)
//     ends the session with FATAL 55F04 before it reaches the server (an answer of the proxy's own has no place
//     in the middle of the client's batch); a Parse of the name again takes it out. The Bind's body is read only
//     while that may matter (keptNeedsBind). A statement refused when it was prepared is refused by the server
//     whatever the list says now.
//   - What the server holds under a name the proxy does not keep is judged as a whole (unkeptGen): an SQL
//     PREPARE (in a Query or a Parse) can be bound by the protocol too, and a Close may be skipped by the server
//     (an error earlier in its batch) while the proxy forgets the name. After a change of planner since, a Bind
//     of a name not kept ends the session so.
//   - A portal runs the statement as it was when bound: after a change of planner, while a portal bound before
//     it may be open (portalGen: until the session is idle, when no portal outlives its transaction), an
//     Execute ends the session so if any statement it holds, or held at the Bind and replaced or closed since
//     (keptRetired), or holds unkept, is judged otherwise.
//   - An SQL PREPARE is not followed statement by statement: a Query or Parse that may PREPARE marks the session
//     with the generation in force (ownPrepared, the rule transaction pooling keeps for the statements it does not
//     map), and after a change of planner a Query that may EXECUTE is refused (55F04, the session goes on) until
//     the client reconnects; a Parse that may EXECUTE is judged otherwise (above).
//
// None of this reads a message body in steady state: without a change of planner, a Bind is read once after
// the session's first Parse, and an Execute never (TestKeptBindBodyNotReadInSteadyState).
//
// The transaction pool's sessions (pooled != nil) keep their own rule (they prepare statements again) and reach
// none of these but a rule for portals of their own (portalsPooled).

// keptStmt is a statement the server holds for a session-mode client: the generation of the planner that fenced
// it, the client's text, and what that planner made of it: its action, the protected tables it touches and the
// fenced text.
type keptStmt struct {
	gen    uint64
	src    []byte
	action rewrite.Action
	tables []string         // the protected tables it touches (rewrite.Plan.Tables: shared, read only)
	sql    string           // for Rewrite, the fenced text (the token a parameter or left out): it names the token column
	set    rewrite.Settings // the settings the server read the text under (at its Parse), to read it so again
}

// keepStmt remembers a session-mode client's Parse (body: name, query, ...) as p planned it into plan, reading
// it under set.
func (ss *session) keepStmt(body, query []byte, plan rewrite.Plan, set rewrite.Settings) {
	if ss.pooled != nil {
		return
	}
	name := stmtKey(body)
	gen := ss.planGen // p's (the transport read them together)
	if ss.keptStmts == nil {
		ss.keptStmts = map[string]*keptStmt{}
	}
	k := ss.keptStmts[string(name)]
	if k != nil && ss.portalGen != 0 {
		ss.retire(k) // a portal bound from it may still run it
		k = nil
	}
	if k == nil {
		k = &keptStmt{}
		ss.keptStmts[string(name)] = k
	}
	*k = keptStmt{gen: gen, src: append(k.src[:0], query...), action: plan.Action, tables: plan.Tables, sql: fencedText(plan), set: set}
	delete(ss.keptChanged, string(name))
	if gen != ss.keptGen {
		ss.keptGen = 0 // judged again at the next Bind (keptStmtsCurrent)
	}
	if prepareWords.In(query) {
		ss.noteUnkept(gen) // an SQL PREPARE sent in a Parse: the server holds it under a name the proxy does not keep
		ss.ownSQLPrep.mark(gen)
	}
	if ss.ownSQLPrep.stale(gen) && executeWords.In(query) {
		ss.changed(string(name)) // it may EXECUTE what the session prepared under another list (sqlPrepared)
	}
}

// stmtKey is the statement name at the front of b (up to its zero byte) as the server tells statements apart:
// by their first NAMEDATALEN-1 bytes (its hash table of prepared statements compares no more), so two long names
// that share them are one statement there, and must be one here.
func stmtKey(b []byte) []byte {
	name, _, _ := cutNul(b)
	if len(name) > stmtNameMax {
		name = name[:stmtNameMax]
	}
	return name
}

// stmtNameMax is NAMEDATALEN-1 of a default PostgreSQL build.
const stmtNameMax = 63

// changed marks a kept statement as one the planner in force makes otherwise: a Bind of it is refused.
func (ss *session) changed(name string) {
	if ss.keptChanged == nil {
		ss.keptChanged = map[string]bool{}
	}
	ss.keptChanged[name] = true
}

// noteUnkept records that the server may hold, under a name not in keptStmts, a statement fenced under the
// planner of generation gen (unkeptGen keeps the oldest).
func (ss *session) noteUnkept(gen uint64) {
	if ss.unkeptGen == 0 || gen < ss.unkeptGen {
		ss.unkeptGen = gen
	}
}

// retire keeps a statement the client replaced or closed while a portal bound from it may still be open
// (portalGen), so that an Execute after a change of planner judges it too; past maxRetired only the fact is
// kept, and such an Execute is refused.
func (ss *session) retire(k *keptStmt) {
	if len(ss.keptRetired) >= maxRetired {
		ss.retiredLost = true
		return
	}
	ss.keptRetired = append(ss.keptRetired, k)
}

// maxRetired bounds the statements a session keeps for its open portals (retire): a long transaction that
// parses the unnamed statement again and again must not grow the session without bound.
const maxRetired = 64

// forgetStmt forgets a statement the client closed (a Close's body: 'S', name).
func (ss *session) forgetStmt(body []byte) {
	if ss.keptStmts == nil || len(body) == 0 || body[0] != 'S' {
		return
	}
	name := stmtKey(body[1:])
	k := ss.keptStmts[string(name)]
	if k == nil {
		return
	}
	// The server skips a Close after an error earlier in its batch and then still holds the statement: the
	// name may be bound again, as the fence of then, where the proxy no longer judges it (unkeptGen).
	ss.noteUnkept(k.gen)
	if ss.portalGen != 0 {
		ss.retire(k) // a portal bound from it outlives the Close
	}
	delete(ss.keptStmts, string(name))
	delete(ss.keptChanged, string(name))
}

// unkeptStale reports whether the server may hold, under a name the proxy does not keep, a statement fenced
// under a planner other than box's.
func (ss *session) unkeptStale(box plannerBox) bool {
	return ss.unkeptGen != 0 && ss.unkeptGen != box.gen
}

// keptNeedsBind reports whether a session-mode client's Bind must be read (clientNeedsBody) for keptStmtsCurrent:
// after a change of planner until its statements are judged, and while one of them is refused.
func (ss *session) keptNeedsBind() bool {
	if ss.pooled != nil {
		return false
	}
	box := ss.srv.plannerNow()
	return len(ss.keptChanged) > 0 || (len(ss.keptStmts) > 0 && ss.keptGen != box.gen) || ss.unkeptStale(box)
}

// keptStmtsCurrent judges a session-mode client's Bind (body; nil: not read): after a change of planner every
// statement the session holds is judged once (judgeKept; those the change makes otherwise go to keptChanged),
// and a Bind of one of those, or one not read while there is any, is refused (sessionRefused); nil when it may
// run.
func (ss *session) keptStmtsCurrent(body []byte) error {
	if ss.pooled != nil {
		return nil
	}
	box := ss.srv.plannerNow()
	if box.p == nil {
		return nil // nothing is fenced now: what was fenced then only refuses more
	}
	ss.judgeAll(box)
	unkept := ss.unkeptStale(box)
	if len(ss.keptChanged) == 0 && !unkept {
		return nil
	}
	what := "a statement this session prepared"
	if body != nil {
		_, rest, ok := cutNul(body)
		if !ok {
			return nil // malformed: the server refuses it
		}
		name := stmtKey(rest)
		_, known := ss.keptStmts[string(name)]
		if !ss.keptChanged[string(name)] && (known || !unkept) {
			return nil
		}
		what = "the unnamed statement"
		if len(name) > 0 {
			what = fmt.Sprintf("prepared statement %q", name)
		}
	}
	return keptRefusal(what + " was prepared")
}

// judgeAll judges every kept statement once per change of planner (box): those the change makes otherwise go
// to keptChanged.
func (ss *session) judgeAll(box plannerBox) {
	if ss.keptGen == box.gen {
		return
	}
	for name, k := range ss.keptStmts {
		if !ss.judgeKept(box, k) {
			ss.changed(name)
		}
	}
	ss.keptGen = box.gen
}

// keptRefusal is the FATAL that ends a session about to run what it prepared under another list.
func keptRefusal(what string) error {
	return &sessionRefused{code: sqlstateUnfenceable,
		msg:    fmt.Sprintf("unfenceable write: the protected table list changed since %s", what),
		detail: "The server holds the statement as fenceproxy fenced it under the table list of then.",
		hint:   "Connect again: statements prepared now are fenced as the list in force says."}
}

// bound records a session-mode client's Bind judged under the planner of generation gen: the portal runs the
// statement as fenced then, at any later Execute (portalsCurrent). At a point where the session holds no
// portal (idle: every Sync answered outside a transaction block) the portals of before are forgotten.
func (ss *session) bound(gen uint64) {
	if ss.pooled == nil && ss.portalGen == 0 {
		ss.portalGen = gen
	}
}

// pooledPortals is what a transaction-pool client's portals were bound under, for portalsPooled: by portal
// name, the generation of the planner that fenced the statement of its oldest Bind since the session was last
// idle and of its last Bind, and the batch of that last one (portalsBatch).
type pooledPortals struct {
	byName map[string]boundPortal
	batch  uint64
	// lost: a Bind of a name beyond maxPooledPortals was not recorded; an Execute of a name not in byName is then
	// judged by the oldest portal of all.
	lost bool
}

// maxPooledPortals bounds byName: a client that pipelines transactions without a pause is never idle at a Bind,
// and its portals' names would pile up.
const maxPooledPortals = 64

type boundPortal struct{ oldest, last, batch uint64 }

// portalsPooled applies the rule for portals to a transaction-pool client's message (pooled.go, after pl.plan
// is read for it, before it goes). The pool prepares a statement fenced under another planner again at its
// Bind (pooledstmts.go, pooledsqlprep.go), but a portal holds the statement as fenced at its Bind, and the pool
// does not bind it again: an Execute after a change of planner may run a portal bound before it, as the list
// of then fenced it (not at all, for a table the reload added). So an Execute runs only when the portal it
// names was bound under the planner in force (pl.plan); otherwise the session ends with FATAL 55F04 before
// the Execute reaches the server (an answer of the proxy's own has no place in the middle of the batch).
//
// Which Bind made the portal: the last Bind of its name in the Execute's own batch, if any (should that Bind
// fail, or be skipped after an error, the server skips the Execute too, up to the batch's Sync); otherwise any
// Bind of the name since the session was last idle (a Bind that failed leaves the portal of before, which a
// ROLLBACK TO SAVEPOINT keeps), so the oldest. A portal name not bound since is none of the pool's fencing
// (an SQL cursor, a read). An Execute whose body was not read (pooled.go reads it when a portal may be stale)
// is judged by the oldest portal of all.
//
// Until 2026-12-06 a portal bound inside a transaction block before a reload that protected its table,
// executed after it, wrote the table unfenced with a stale token (TestReload58PortalBoundBeforeTheReload).
func (ss *session) portalsPooled(typ byte, body []byte) error {
	pl := ss.pooled
	pp := &ss.pooledPortals
	switch typ {
	case msgBind:
		if ss.portalGen != 0 && ss.state.idle() {
			ss.portalsGone()
		}
		gen := pl.plan.gen
		if ss.portalGen == 0 {
			ss.portalGen = gen
		}
		name, _, ok := cutNul(body)
		if !ok {
			return nil // malformed: the server refuses it
		}
		if pp.byName == nil {
			pp.byName = map[string]boundPortal{}
		}
		b, seen := pp.byName[string(name)]
		if !seen && len(pp.byName) >= maxPooledPortals {
			pp.lost = true
			return nil
		}
		if !seen {
			b.oldest = gen
		}
		b.last, b.batch = gen, pp.batch
		pp.byName[string(name)] = b
	case msgExecute:
		if ss.portalGen == 0 || pl.plan.p == nil || ss.portalGen == pl.plan.gen {
			return nil // every portal that may be open was bound under the planner in force
		}
		gen := ss.portalGen
		if body != nil {
			name, _, ok := cutNul(body)
			if !ok {
				return nil // malformed: the server refuses it
			}
			b, seen := pp.byName[string(name)]
			switch {
			case !seen && pp.lost: // maybe bound, not recorded: the oldest portal of all
			case !seen:
				return nil
			case b.batch == pp.batch:
				gen = b.last
			default:
				gen = b.oldest
			}
		}
		if gen != pl.plan.gen {
			return keptRefusal("this session bound a portal")
		}
	}
	return nil
}

// portalsBatch counts a transaction-pool client's message that ends a batch (pooledPortals.batch), first
// thing in forwardPooled: every one, whatever path then sends, skips or refuses it. One counted that the server
// does not see as the end of a batch only makes portalsPooled judge by more Binds; one missed could make it
// take a Bind the server skipped for the one that made the portal.
func (ss *session) portalsBatch(typ byte) {
	switch typ {
	case msgSync, msgQuery, msgFunctionCall:
		ss.pooledPortals.batch++
	}
}

// portalsParked lets a transaction-pool client that parks keep nothing of its portals when it holds none.
func (ss *session) portalsParked() {
	if ss.state.idle() {
		ss.portalsGone()
		ss.pooledPortals.byName = nil
	}
}

// portalsStale reports whether a transaction-pool client's Execute must be read for portalsPooled: a portal
// that may be open was bound under a planner other than the one in force.
func (ss *session) portalsStale() bool {
	return ss.portalGen != 0 && ss.portalGen != ss.srv.plannerNow().gen
}

// portalsGone forgets the portals and the statements kept for them when the session can hold none (idle).
func (ss *session) portalsGone() {
	ss.portalGen = 0
	clear(ss.pooledPortals.byName)
	ss.pooledPortals.lost = false
	ss.keptRetired = nil
	ss.retiredLost = false
}

// portalsCurrent judges a session-mode client's Execute: a portal bound before a change of planner runs the
// statement as the planner of then fenced it, so after one, while such a portal may be open, the Execute is
// refused (sessionRefused) if any statement the session holds, or held when it bound them, is one the planner
// in force makes otherwise; nil when it may run. The Execute's body is not read: which portal it names does not
// matter.
func (ss *session) portalsCurrent() error {
	if ss.pooled != nil || ss.portalGen == 0 {
		return nil
	}
	box := ss.srv.plannerNow()
	if box.p == nil || ss.portalGen == box.gen {
		return nil
	}
	ss.judgeAll(box)
	bad := len(ss.keptChanged) > 0 || ss.retiredLost || ss.unkeptStale(box)
	for _, k := range ss.keptRetired {
		bad = bad || !ss.judgeKept(box, k)
	}
	if bad {
		return keptRefusal("this session bound a portal")
	}
	return nil
}

// judgeKept reports whether a kept statement may run under the planner in force (box): fenced under it, refused
// when prepared, or planned again into what the server holds (then marked current).
func (ss *session) judgeKept(box plannerBox, k *keptStmt) bool {
	if k.action == rewrite.Refuse {
		return true
	}
	if ss.ownSQLPrep.stale(box.gen) && executeWords.In(k.src) {
		return false // it may EXECUTE what the session prepared under another list (sqlPrepared)
	}
	if k.gen == box.gen {
		return true
	}
	set := k.set // as the server read it, whatever the settings are now
	set.InlineToken = ss.inlineToken != ""
	plan := box.p.Plan(k.src, set)
	if plan.Action == k.action && slices.Equal(plan.Tables, k.tables) && rewrite.SameRewrite(fencedText(plan), k.sql, k.set) {
		k.gen = box.gen
		return true
	}
	return false
}

// fencedText is what a plan sends for a kept statement, as far as a change of planner may change it: the
// fenced text of a Rewrite (another token column, a lock check, another fence), nothing for the others (a Pass
// sends the client's text; its SQL may be empty or not, as the planner's prefilter says).
func fencedText(plan rewrite.Plan) string {
	if plan.Action != rewrite.Rewrite {
		return ""
	}
	return plan.SQL
}

// sqlPrepared applies the SQL PREPARE rule to a session-mode client's Query text and its plan: a text that may
// PREPARE marks the session; one that may EXECUTE after the planner changed since is refused.
func (ss *session) sqlPrepared(text []byte, plan rewrite.Plan) rewrite.Plan {
	if ss.pooled != nil || plan.Action == rewrite.Refuse {
		return plan
	}
	box := ss.srv.plannerNow()
	if ss.ownSQLPrep.stale(box.gen) && executeWords.In(text) {
		return rewrite.Plan{Action: rewrite.Refuse, Code: sqlstateUnfenceable, Message: ownPreparedMessage, Hint: ownPreparedHint}
	}
	if prepareWords.In(text) {
		// The statement it prepares can also be bound by the protocol's Bind, under a name not kept (unkeptGen).
		ss.noteUnkept(ss.planGen) // p's (the transport read them together)
		ss.ownSQLPrep.mark(ss.planGen)
	}
	return plan
}

// ownPrepared is the rule for statements the server holds under the client's own names, which the proxy can
// neither see nor prepare again: every SQL PREPARE in session mode (sqlPrepared, keepStmt); in transaction mode
// a PREPARE sent in a Parse or in a text the proxy cannot read (ownStmts; the others it maps and fences again).
// Such a statement stays as fenced under the planner in force when it was prepared. A text that may PREPARE one
// marks the session with that planner's generation (the first only: it is the oldest that may run); after a
// change of planner a text that may EXECUTE one is refused (ownPreparedMessage) until the client reconnects.
type ownPrepared struct{ gen uint64 } // 0: nothing prepared so

// mark notes that the client may have prepared a statement of its own name under the planner of generation gen.
func (o *ownPrepared) mark(gen uint64) {
	if o.gen == 0 {
		o.gen = gen
	}
}

// stale reports whether a statement of the client's own name may have been prepared under a planner other than
// the one of generation gen, the one in force.
func (o ownPrepared) stale(gen uint64) bool { return o.gen != 0 && o.gen != gen }

// The refusal of a text that may EXECUTE a statement ownPrepared calls stale, in both pool modes.
const (
	ownPreparedMessage = "unfenceable write: this session prepared statements under its own names (SQL PREPARE, which the proxy does not follow) " +
		"before the protected table list changed; they would run as fenced then"
	ownPreparedHint = "Reconnect, and PREPARE them again."
)
