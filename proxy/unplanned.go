package proxy

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// Writes the proxy did not plan. A transaction that wrote a protected table must not commit on a host the
// router no longer trusts with fenced writes (fencedTxRefused); the writes the proxy planned mark it
// (fencedTxOut), but a statement that names no protected table may write one inside the server: a function,
// a procedure, a trigger or a rule on another table, a DO block's dynamic SQL, a foreign key cascade. The server
// knows, whoever wrote: a write to a table takes a lock on it (RowExclusiveLock for a row's INSERT, UPDATE or
// DELETE, AccessExclusiveLock for a TRUNCATE) that the transaction holds until it ends, and a subtransaction
// rolled back gives back the locks it took along with its writes. So on a host the router refuses fenced writes
// on (and only there: the fast path asks nothing), before a message of an open transaction block that runs
// something (a Query, an Execute, a FunctionCall) goes, the proxy asks the host, over a connection of its own
// (the health check's role, in the session's database), which relations the session's backend holds such a
// lock on, and judges each by the planner (a write to it that the planner would fence or refuse is a write to a
// protected table). A transaction that holds one is noted as a fenced write notes it, and the existing rule
// ends the session before the message goes (FATAL 55F04; 08007 while an answer is still owed).
//
// The question is sound only between statements: the backend then runs nothing of the client's, so its locks
// say all the transaction wrote. Where the proxy cannot ask between a write and what may commit it, the
// transaction is judged one that wrote (fail closed): a message that runs something while an earlier one of the
// block may still run (pipelined: a second Execute before the batch's Sync, a Query before the last is
// answered), a Query of more than one statement (a write then a COMMIT in one text), and a transaction that
// wrote a table with a deferrable trigger of the user's (its events may run at the COMMIT, writing what cannot
// be known before: writeLockedSQL), or that sent a text that may declare a cursor WITH HOLD (holdWords). An
// answer the host does not give (the connection, the role, a timeout) is
// judged the same way. The question is asked where the client's message is read, bounded by health_timeout; with
// the event loop, off the loop, the message waiting (lockquestion.go). At the router's change itself, what a
// session-mode session sent before it may be queued at the server behind a running statement (a COMMIT): the
// sessions inside a block are asked about then too, and one with a message queued behind a running statement
// ends whatever the answer, the statement able to write after it (unplannedWritersRefused).
//
// What the rule does not cover: a unit sent while the session is outside a transaction block (a Query, an
// extended-protocol batch up to its Sync, and what is pipelined behind it) runs and commits as one; its write,
// if any, is the statement's own, after the router's change, and commits with its own end, where nothing can be
// asked in between. Nor a cursor WITH HOLD that code inside the server declares (a function's dynamic SQL):
// holdWords reads only the client's texts, and its query runs at the COMMIT, after the question. Both are held
// inside the database since 2026-12-06 (writehold.go: the router LOCKs the protected tables of such a host IN
// SHARE MODE, so their writes wait, and a session of the proxy's waiting there ends; until the hold is in place
// its sessions there are refused: TestLoneUnitWritingInsideTheServerOnARefusedHost,
// TestServerDeclaredHeldCursorOnARefusedHost). The rules above still hold for the moment between the router's
// change and the hold, and for a host the hold cannot be taken on.

// unplannedWrites is a session's state for the rule above, between the client's messages.
type unplannedWrites struct {
	// free: the messages under way began with the session at rest outside a transaction block (see above):
	// not judged, until the session is at rest again.
	free bool
	// execs counts the Executes sent since the last Sync: the one before may still run.
	execs int
	// holdTx: a Query of the transaction under way held the letters hold (holdWords); holdKept: a Parse ever
	// did, whose statement the server keeps for later transactions.
	holdTx, holdKept bool
	// behind: since the session was last at rest, a message that runs something was sent while one before it
	// may still run (a COMMIT pipelined behind a statement). Written by the client side, read at the router's
	// change (unplannedWritersRefused) on another goroutine.
	behind atomic.Bool
}

// holdWords are the letters of a text that may declare a cursor WITH HOLD: PostgreSQL runs the rest of such a
// cursor's query at the COMMIT, so what it writes (a function it calls) comes after any question asked before
// the COMMIT, and the proxy cannot see a session's cursors from a connection of its own. On a host the router
// refuses fenced writes on, a transaction that sent such a text is judged as one that wrote (unplannedWrite), by
// any text that holds the letters (a column threshold too): fail closed. (A cursor that code inside the server
// declares holds no letters the proxy reads: the write hold, writehold.go, makes its write wait.)
var holdWords = rewrite.NewFoldWords("hold")

// unplannedTables names, in errors, what a transaction whose writes the proxy could not judge may have written.
const unplannedTables = "protected tables (the transaction's writes inside the server could not be checked)"

// unplannedWriteRefused applies the rule above to the client's message typ (body: its body when the core reads
// it), before it is sent: nil when it may go, else the session's farewell. It also keeps the state of the rule,
// once per message of the client's (onClientMsg); errLockQuestionAsked when the message waits for its lock question
// (lockquestion.go), having changed nothing: it comes again with the answer.
func (ss *session) unplannedWriteRefused(typ byte, body []byte) (err error) {
	if ss.srv.router == nil || typ == msgTerminate {
		return nil
	}
	st, u := &ss.state, &ss.unplanned
	atRest := st.ready.Load() && st.pending.Load() <= 0 && st.internal.Load() <= 0 && u.execs == 0
	if atRest {
		u.behind.Store(false)
		u.free = byte(st.txStatus.Load()) == txIdle
		if u.free {
			u.holdTx = false // the transaction that sent it has ended: its held cursors have their rows
		}
	}
	if body != nil && (typ == msgQuery || typ == msgParse) {
		if text, ok := planText(typ, body); !ok || holdWords.In(text) {
			u.holdTx = u.holdTx || typ == msgQuery
			u.holdKept = u.holdKept || typ == msgParse
		}
	}
	switch typ {
	case msgExecute:
		defer func() {
			if err != errLockQuestionAsked {
				u.execs++
			}
		}()
	case msgSync:
		u.execs = 0 // what the batch runs is now counted as pending, until its ReadyForQuery
		return nil
	case msgQuery, msgFunctionCall:
	default:
		return nil // runs nothing: a Parse, Bind, Describe, Close, Flush; a COPY's data is its statement's
	}
	if !atRest {
		u.behind.Store(true)
	}
	if ss.srv.router.trusts(ss.host) {
		return nil // the fast path
	}
	why := ss.srv.router.writeRefusal(ss.host.addr, ss.host.epoch)
	if why == "" {
		return nil
	}
	if err := ss.writeHoldRefusal(why); err != nil {
		return err // fail closed until the host's write hold is in place (writehold.go)
	}
	if u.free || ss.fencedTxOut.Load() != nil {
		return nil // not judged, or judged already (fencedTxRefused)
	}
	table, err := ss.unplannedWrite(atRest, typ, body)
	if table == "" || err != nil {
		return err
	}
	ss.fencedTxOut.Store(&table) // as a fenced write notes it (fencedWriteRefusal); the session ends now anyway
	return fencedTxFarewell(why, table, st.pending.Load() > 0 || u.execs > 0)
}

// unplannedWrite says whether the transaction under way may have written a protected table on its host, which
// the router no longer trusts: the table's name, or unplannedTables when it cannot be told (the rule above);
// "" when it wrote none. atRest: nothing the client sent before may still run. errLockQuestionAsked: the event
// loop asks the host first (lockAnswer).
func (ss *session) unplannedWrite(atRest bool, typ byte, body []byte) (string, error) {
	u := &ss.unplanned
	if !atRest || u.holdTx || u.holdKept {
		return unplannedTables, nil // something may still run, or write at the COMMIT (holdWords)
	}
	if typ == msgQuery {
		text, ok := planText(msgQuery, body)
		if !ok {
			return unplannedTables, nil // not read (no planner): its statements are not known
		}
		if n, ok := rewrite.Statements(text, ss.readingSettings()); !ok || n > 1 {
			return unplannedTables, nil // a write and a COMMIT in one text: nothing can be asked in between
		}
	}
	pid, ok := ss.backendPID()
	if !ok {
		return unplannedTables, nil
	}
	a, ok := ss.lockAnswer(lockQuestion{host: ss.host.addr, db: ss.sessionDatabase(), pid: pid})
	if !ok {
		return "", errLockQuestionAsked
	}
	if a.err != nil {
		ss.logger().Warn("could not ask a host the router no longer trusts what a transaction wrote; judged as a write to a protected table", "host", ss.host.addr, "error", a.err)
		return unplannedTables, nil
	}
	return ss.srv.protectedOf(a.rels), nil
}

// backendPID is the PID of the backend that runs the client's transaction: the session's upstream connection's,
// or in transaction pooling the lent server connection's (read under the session's lock, which the core's
// caller holds).
func (ss *session) backendPID() (uint32, bool) {
	key := ss.cancelKey
	if ss.pooled != nil {
		if ss.pooled.sc == nil {
			return 0, false
		}
		key = ss.pooled.sc.key
	}
	if len(key) < 4 {
		return 0, false
	}
	return binary.BigEndian.Uint32(key), true
}

// writeLockedSQL lists, for the backends of the PIDs $1, the relations of the current database on which they
// hold a lock that a write may take (any but readLockModes), and every
// relation those inherit from or are partitions of: a write to a partition or a child is a write to its
// protected parent. A row with no name stands for a deferrable trigger of the user's on one of them: its
// events may run at the COMMIT (a constraint trigger INITIALLY DEFERRED, or SET CONSTRAINTS), and what they
// will write cannot be known before, so protectedOf judges it as a protected table (fail closed). The foreign
// keys' own triggers (internal) check rows; a cascade they make is not deferred.
const writeLockedSQL = `WITH RECURSIVE locked(pid, relid) AS (
	SELECT l.pid, l.relation FROM pg_catalog.pg_locks l
	WHERE l.pid = ANY($1::pg_catalog.int4[]) AND l.locktype = 'relation' AND l.granted
		AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
		AND l.mode NOT IN ` + readLockModes + `
	UNION
	SELECT locked.pid, i.inhparent FROM pg_catalog.pg_inherits i JOIN locked ON i.inhrelid = locked.relid
)
SELECT locked.pid, n.nspname::text, c.relname::text FROM locked JOIN pg_catalog.pg_class c ON c.oid = locked.relid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
UNION ALL
SELECT DISTINCT l.pid, '', '' FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_trigger t ON t.tgrelid = l.relation
WHERE l.pid = ANY($1::pg_catalog.int4[]) AND l.locktype = 'relation' AND l.granted
	AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
	AND l.mode NOT IN ` + readLockModes + ` AND t.tgdeferrable AND NOT t.tgisinternal`

// readLockModes are the lock modes no change of a table's rows comes with alone: a row's INSERT, UPDATE, DELETE
// or MERGE takes RowExclusiveLock on its table, which pg_locks shows even when the transaction holds a stronger
// one (a row per mode held), and TRUNCATE AccessExclusiveLock. AccessShareLock is a read's, RowShareLock a
// SELECT FOR UPDATE's, ShareLock a LOCK ... IN SHARE MODE's (a consistent read) or a CREATE INDEX's: counting
// them made such reads end the session on a host the router refuses. ShareUpdateExclusiveLock (ANALYZE) stays
// counted: ATTACH PARTITION takes it on the parent it adds rows to, and the pg_inherits row the attach made is not
// visible to the question's connection.
const readLockModes = "('AccessShareLock', 'RowShareLock', 'ShareLock')"

// writeLocked asks host, in database db, over a connection of the router's own role, which relations each
// backend of pids holds a write's lock on (writeLockedSQL), as schema and name, by PID.
func (r *router) writeLocked(ctx context.Context, host, db string, pids []uint32) (map[uint32][][2]string, error) {
	cc, err := r.login(host)
	if err != nil {
		return nil, err
	}
	cc.Database = db
	conn, err := connectOwnRole(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("connect to %s, database %s: %w", host, db, err)
	}
	defer conn.Close(context.Background())
	ask := make([]int32, len(pids))
	for i, pid := range pids {
		ask[i] = int32(pid)
	}
	rows, err := conn.Query(ctx, writeLockedSQL, ask)
	if err != nil {
		return nil, fmt.Errorf("read the locks of backends %v on %s: %w", pids, host, err)
	}
	defer rows.Close()
	rels := map[uint32][][2]string{}
	for rows.Next() {
		var pid int32
		var rel [2]string
		if err := rows.Scan(&pid, &rel[0], &rel[1]); err != nil {
			return nil, fmt.Errorf("read the locks of backends %v on %s: %w", pids, host, err)
		}
		rels[uint32(pid)] = append(rels[uint32(pid)], rel)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the locks of backends %v on %s: %w", pids, host, err)
	}
	return rels, nil
}

// protectedOf is the first of rels (schema and name) a write to which the planner in force fences or refuses:
// the same rule as for a write the client sends. "" when none is.
func (s *Server) protectedOf(rels [][2]string) string {
	p := s.currentPlanner()
	for _, rel := range rels {
		if rel[0] == "" {
			return unplannedTables // a deferrable trigger (writeLockedSQL)
		}
		sql := "INSERT INTO " + pgx.Identifier{rel[0], rel[1]}.Sanitize() + " DEFAULT VALUES"
		if p == nil || p.Plan([]byte(sql), rewrite.DefaultSettings).Action != rewrite.Pass {
			return rel[0] + "." + rel[1]
		}
	}
	return ""
}

// sessionDatabase is the database the session's client logged in to, as PostgreSQL defaults it.
func (ss *session) sessionDatabase() string {
	if db := ss.params["database"]; db != "" {
		return db
	}
	return ss.params["user"]
}

// unplannedWritersRefused is Server.fencedHostsRefused's rule for the writes the proxy did not plan: at a change
// that may make the router refuse fenced writes on a host, each session-mode session there inside a transaction
// block (its last ReadyForQuery said so) that no write the proxy planned marked is looked at, one question per
// host and database, and one whose backend holds a write's lock on a protected table ends at once, as a marked
// one does (endFencedTx: what runs is cancelled first): a COMMIT it pipelined before the change, behind a
// statement still running, must not commit there. When the host does not answer, those of them with something
// in flight end (fail closed); one at rest is judged at its next message (unplannedWriteRefused). Transaction
// pooling holds each message until the one before is answered and judges it then, so nothing of it is queued at
// the server. What a statement running at the change writes after the question is not seen here, so one with a
// message queued behind it (unplannedWrites.behind: the queued one may commit) ends whatever the answer, fail
// closed, and without waiting for it (looked at again after it: one judged before the change may be counted
// running only then); a statement running alone leaves the session at rest, whose next message is judged. It runs on a
// goroutine of its own, bounded by health_timeout: the coordinator does not wait for the host's answer.
func (s *Server) unplannedWritersRefused() {
	type group struct{ host, db string }
	s.mu.Lock()
	var seen []*session
	for ss := range s.sessions {
		// ready before cancelKey: the server side writes the key before it publishes ready.
		if ss.pooled == nil && ss.fencedTxOut.Load() == nil && ss.state.ready.Load() && ss.state.inTx() && len(ss.cancelKey) >= 4 {
			seen = append(seen, ss)
		}
	}
	s.mu.Unlock()
	groups := map[group][]*session{}
	whys := map[*session]string{}
	var wg sync.WaitGroup
	for _, ss := range seen {
		why := s.router.writeRefusal(ss.host.addr, ss.host.epoch)
		switch {
		case why == "":
		case ss.unplanned.behind.Load() && ss.state.running():
			// Ends whatever the answer, so at once: waiting for a host slow to answer (up to health_timeout) let
			// the statement ahead end and the queued COMMIT commit meanwhile
			// (TestQueuedCommitWhileTheLockQuestionStalls).
			wg.Go(func() { ss.endFencedTx(why, unplannedTables) })
		default:
			g := group{ss.host.addr, ss.sessionDatabase()}
			groups[g] = append(groups[g], ss)
			whys[ss] = why
		}
	}
	for g, members := range groups {
		wg.Go(func() {
			pids := make([]uint32, len(members))
			for i, ss := range members {
				pids[i], _ = ss.backendPID()
			}
			ctx, cancel := context.WithTimeout(context.Background(), s.router.timeout)
			defer cancel()
			locked, err := s.router.writeLocked(ctx, g.host, g.db, pids)
			if err != nil {
				s.log.Warn("could not ask a host the router no longer trusts what its open transactions wrote; those with a statement in flight end", "host", g.host, "database", g.db, "error", err)
			}
			for i, ss := range members {
				table := unplannedTables
				if err == nil && !(ss.unplanned.behind.Load() && ss.state.running()) {
					table = s.protectedOf(locked[pids[i]])
				} else if err != nil && !ss.state.running() {
					table = ""
				}
				if table != "" {
					ss.endFencedTx(whys[ss], table)
				}
			}
		})
	}
	wg.Wait()
}
