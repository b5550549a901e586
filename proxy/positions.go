package proxy

import (
	"strconv"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// Positions of errors and notices in the client's text.
//
// The server's position field (P) counts characters of the text it ran. For a statement the proxy rewrote that
// is the deparsed fenced text, hundreds of characters longer than the client's; rewrite.ClientPosition maps it
// back (rewrite/positions.go). The core keeps, per answer in flight, what the map needs: the client's text, the
// settings it was planned under and the text sent; the map itself is built only when an error or a notice with
// a position comes back. In transaction mode the pool first moves the position past its own text (the token
// statement in front, hidden PREPAREs: shiftPosition), then the core maps it through the rewrite.
//
// The answers are told apart only when one Query, or one extended-protocol batch, is in flight: a Query or a
// Parse that comes while another's answers are pending (pipelining) makes the positions of every answer until
// the session is quiet again dropped, if any of them was rewritten (a wrong caret is worse than none; the
// server itself omits P when it has no position). A rewrite sent as EXECUTE of a template the proxy prepared
// (prepared.go) drops them too: they count in the EXECUTE's text, not the client's.

// positionMapper maps a position in a rewritten text to the client's (rewrite.Cache).
type positionMapper interface {
	ClientPosition(client []byte, s rewrite.Settings, sent []byte, pos int) (int, bool)
}

// sourcedPlanner is a planner that answers with a plan another made (the event loop's fixedPlan).
type sourcedPlanner interface{ source() Planner }

// sentRewrite is what maps the positions of the answers in flight; m nil: they are dropped.
type sentRewrite struct {
	m      positionMapper
	client []byte // the client's text, a copy
	set    rewrite.Settings
	sent   string // the text sent, after the pool's prefix, in the client's encoding
}

// quiet reports whether no answer of the client's is pending: a Query or Parse now starts the only one.
func (st *protoState) quiet() bool { return st.pending.Load() <= 0 && !st.unsynced.Load() }

// notePositions records, for the Query or Parse of text just fenced (plan, sent as sent), what maps the
// positions of its answers; quiet: nothing was in flight before it (protoState.quiet, read before it counted).
func (ss *session) notePositions(quiet bool, p Planner, text []byte, set rewrite.Settings, plan *rewrite.Plan, sent string) {
	cur := ss.positions.Load()
	rewritten := plan.Action == rewrite.Rewrite
	switch {
	case !quiet:
		if cur != nil || rewritten {
			ss.positions.Store(&sentRewrite{}) // answers not told apart
		}
	case !rewritten:
		if cur != nil {
			ss.positions.Store(nil)
		}
	default:
		if sp, ok := p.(sourcedPlanner); ok {
			p = sp.source()
		}
		if m, ok := p.(positionMapper); ok && (plan.TokenSegs != nil || sent == plan.SQL) {
			ss.positions.Store(&sentRewrite{m: m, client: append([]byte(nil), text...), set: set, sent: sent})
		} else {
			ss.positions.Store(quietDropped) // a prepared fence's EXECUTE, the hot path: no allocation
		}
	}
}

// quietDropped is the map of a rewrite whose positions are dropped, stored when nothing else was in flight.
// Shared: a CompareAndSwap that forgets it (positionsAnswered, positionsOther) cannot take another unit's store
// of it for its own, as a unit is quiet only once the one before was counted answered, after its
// positionsAnswered. A map stored while others are in flight is a new one each time for that reason.
var quietDropped = &sentRewrite{}

// positionsOther notes a client message that starts another unit of answers without a text of its own to
// fence: a Bind, Execute, Describe, Close or Sync that opens an extended-protocol batch (no Parse: a statement
// prepared earlier), a FunctionCall, a Query or Parse not fenced (no planner after a reload). Its errors may carry positions (a named statement is analysed again at a
// Bind after a change to its tables), which count in its own text: a map stored for a Query or Parse still
// answering would move them into that text. quiet as in notePositions.
func (ss *session) positionsOther(quiet bool) {
	cur := ss.positions.Load()
	if cur == nil {
		return
	}
	if quiet {
		ss.positions.CompareAndSwap(cur, nil) // nothing is in flight: the map is no answer's
		return
	}
	if cur.m != nil {
		ss.positions.Store(&sentRewrite{}) // answers not told apart
	}
}

// resentAs notes that the text sent for the Query being fenced counts positions as sent (a pooled text whose
// SQL-level statement names were mapped: pooledsqlprep.go), if its positions are mapped at all.
func (ss *session) resentAs(sent string) {
	if e := ss.positions.Load(); e != nil && e.m != nil {
		c := *e
		c.sent = sent
		ss.positions.Store(&c)
	}
}

// positionsUncounted notes that the pool could not move a position past its prefix (pooled.go): one that
// would be mapped through the rewrite is dropped instead.
func (ss *session) positionsUncounted() {
	if e := ss.positions.Load(); e != nil && e.m != nil {
		ss.positions.Store(&sentRewrite{})
	}
}

// positionsAnswered forgets the map at the ReadyForQuery that ends the last answer in flight (before it is
// counted: the client side may then start another).
func (ss *session) positionsAnswered() {
	if e := ss.positions.Load(); e != nil && ss.state.pending.Load() <= 1 {
		ss.positions.CompareAndSwap(e, nil)
	}
}

// clientPositions is an ErrorResponse or NoticeResponse body with its position moved into the client's text
// (or dropped, see above); body itself when it has none or the text was not rewritten.
func (ss *session) clientPositions(body []byte) []byte {
	e := ss.positions.Load()
	if e == nil {
		return body
	}
	v := errorField(body, fieldPosition)
	if v == "" {
		return body
	}
	pos, err := strconv.Atoi(v)
	if err == nil && e.m != nil {
		if to, ok := e.m.ClientPosition(e.client, e.set, []byte(e.sent), pos); ok {
			return withErrorField(body, fieldPosition, strconv.Itoa(to))
		}
	}
	return withoutErrorField(body, fieldPosition)
}
