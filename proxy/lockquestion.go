package proxy

import (
	"context"
	"errors"
	"time"
)

// The lock question off the event loop. A client message of an open block on a host the router refuses fenced
// writes on waits for the host to say which relations the session's backend holds a write's lock on
// (unplanned.go); the host may take up to health_timeout to answer, or not answer at all. The goroutine
// transport asks where it reads the client: only that session's goroutine waits, as it waits for the server.
// The event loop must not wait: it relays every other session of the loop, whatever their host. So there the core
// hands the question back (errLockQuestionAsked) before the message changes anything, the message stays unread
// at the front of the session's input, a goroutine asks (one per session at most: the session's client side is
// not read until the answer comes), and the answer comes back to the loop as a command, which gives the message
// to the core again: the core then takes the answer (lockAnswer) and the message goes or the session ends, by
// the same rule (evsession_linux.go: askLock, lockAnswered). This is how the loop plans a statement whose plan is
// not cached (planJob). Token verification needs no such path: a session with a verifier is never relayed by the
// loop (loopEligible). The wait for a database's write hold (writehold.go: writeHoldRefusal) takes the same path:
// a question whose answer is the hold's first outcome, waited for up to the attempt's bound (holdAttempt).

// lockQuestion is one client message's lock question: which relations the backend pid holds a write's lock on,
// in database db of host; and, once asked, its answer. With hold set, the question is instead the wait for the
// first outcome of db's write hold there (hold closes then): answered when it comes or the attempt's bound
// passes (holdAttempt), the caller then looking whether the hold is in place.
type lockQuestion struct {
	host, db string
	pid      uint32
	hold     <-chan struct{}
	answered bool        // asked: rels, or err, is the answer
	rels     [][2]string // the relations (schema and name) the backend holds a write's lock on
	err      error       // no answer: the connection, the role, a timeout (judged as a write: unplannedWrite)
}

// ask asks q's host, bounded by health_timeout as the health check is, and keeps the answer in q.
func (q *lockQuestion) ask(s *Server) {
	if q.hold != nil {
		t := time.NewTimer(s.router.holdAttempt())
		select {
		case <-q.hold:
		case <-t.C:
		}
		t.Stop()
		q.answered = true
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.router.timeout)
	defer cancel()
	locked, err := s.router.writeLocked(ctx, q.host, q.db, []uint32{q.pid})
	q.rels, q.err, q.answered = locked[q.pid], err, true
	if s.lockAnswered != nil {
		s.lockAnswered()
	}
}

// errLockQuestionAsked is the core's answer to a message whose lock question the event loop asks off its
// goroutine: the message has changed nothing and waits; the loop gives it to the core again with the answer.
var errLockQuestionAsked = errors.New("the message waits for the answer to its lock question")

// lockAnswer returns the answer to q, false when the event loop asks it first (the caller then returns
// errLockQuestionAsked). The goroutine transport asks here. ss.ev is read without evMu: runInLoop sets it, on the
// session goroutine, before the loop runs the core, and nothing changes it after.
func (ss *session) lockAnswer(q lockQuestion) (lockQuestion, bool) {
	if ss.ev == nil {
		q.ask(ss.srv)
		return q, true
	}
	return ss.ev.lockAnswer(q)
}
