package proxy

import (
	"bytes"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// textClass is what the transaction pooler reads from a client's text by its words: the class the rewrite
// gives it (rewrite.ClassifyPooling: whether it runs outside a block, opens one, is plain) and whether it may
// leave session state (mayLeaveSessionState).
type textClass struct {
	rewrite.PoolingClass
	leaves bool
	// effects: what the text may do to the token, lock and application_name at session level
	// (rewrite.SessionEffects), read for a text that holds one of classMemo.effectWords; none for the others.
	effects rewrite.SessionEffects
	// dropsStmts: the text holds the word DISCARD or DEALLOCATE, so it may drop the server statement that
	// carries the client's unnamed one (unnamedStmtName), as it does not the unnamed statement itself.
	dropsStmts bool
	// undoes: the text holds the word ROLLBACK or ABORT, so what the transaction did before it may be undone
	// (pooledState.mayUndo).
	undoes bool
	// copies: the text holds the word COPY, so it may start a COPY FROM STDIN (pooledState.copyEnds). Only a
	// client's own statement starts one: PostgreSQL refuses COPY to or from the client in functions, procedures
	// and DO blocks, and SQL-level PREPARE takes no COPY. A keyword is never spelled otherwise than by its
	// letters, in any case.
	copies bool
}

// copyWords is the word of a text that may start a COPY FROM STDIN (textClass.copies).
var copyWords = rewrite.NewFoldWords("copy")

// undoWords are the words of a text that may roll back what its transaction did (textClass.undoes).
var undoWords = rewrite.NewFoldWords("rollback", "abort")

// dropStmtWords are the words of a text that may drop prepared statements (textClass.dropsStmts).
var dropStmtWords = rewrite.NewFoldWords("discard", "deallocate")

// plain reports whether the text may have the plain token statement (plainText).
func (c textClass) plain() bool { return c.Plain && !c.leaves }

// classMemo keeps the classes of the last sixteen texts a pooled session asked about, with the reading settings
// each was read under. One client message asks several questions of the same text (injectTokens,
// followTokenInForce, answersTo, batchOf), and a client of the extended protocol sends the same texts
// transaction after transaction: a hit compares bytes instead of lexing the text again. A session's client
// side alone uses it (forwardPooled), so it needs no lock. Sixteen, because a TPC-B transaction of the
// extended protocol asks about seven texts (its statements' and the BEGIN's and END's): four entries, replaced
// in turn, missed every time.
type classMemo struct {
	entries []classEntry // up to classMemoSize, grown as texts come (a client that connects per transaction sends one or two)
	next    int          // the entry the next miss replaces, once all are there
	// effectWords are the words of a text that may change the token, lock or application_name at session level
	// (Server.effectWords), and effectsOf reads what it does (the planner's SessionEffects): textClass.effects.
	effectWords *rewrite.FoldWords
	effectsOf   func([]byte, rewrite.Settings) rewrite.SessionEffects
}

// classMemoSize is how many texts the memo keeps.
const classMemoSize = 16

// classEntry is one remembered text: a copy in a buffer of its own, reused by the entry's next text.
type classEntry struct {
	text  []byte
	set   rewrite.Settings
	class textClass
}

// classMemoMaxText is the longest text the memo copies: longer ones are classified every time (a bulk
// INSERT's text is seldom sent twice, and its copy would stay in the entry's buffer).
const classMemoMaxText = 4096

// classOf is the class of text read under set.
func (m *classMemo) classOf(text []byte, set rewrite.Settings) textClass {
	for i := range m.entries {
		// The length first: a connection's texts seldom share one, and comparing it costs less than the settings
		// (strings) that every entry matches.
		if e := &m.entries[i]; len(e.text) == len(text) && e.set == set && bytes.Equal(e.text, text) {
			return e.class
		}
	}
	c := textClass{PoolingClass: rewrite.ClassifyPooling(text, set), leaves: mayLeaveSessionState(text), dropsStmts: dropStmtWords.In(text),
		undoes: undoWords.In(text), copies: copyWords.In(text)}
	if m.effectsOf != nil && m.effectWords.In(text) {
		c.effects = m.effectsOf(text, set)
	}
	if len(text) <= classMemoMaxText {
		if len(m.entries) < classMemoSize {
			m.entries = append(m.entries, classEntry{})
			m.next = len(m.entries) - 1
		}
		e := &m.entries[m.next]
		m.next = (m.next + 1) % classMemoSize
		e.text = append(e.text[:0], text...)
		e.set, e.class = set, c
	}
	return c
}

// classOf is the class of a client's text under the session's reading settings now.
func (ss *session) classOf(text []byte) textClass {
	return ss.caches().classes.classOf(text, ss.readingSettings())
}
