package faults

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// Outcome is what a writer learned about one write.
type Outcome int

const (
	// Applied: the server acknowledged the write (the statement, and its transaction, committed).
	Applied Outcome = iota
	// Stale: refused with 55F01.
	Stale
	// Failed: a definite error from the server; the write was not applied.
	Failed
	// Unknown: no answer (timeout, connection lost); the write may or may not have been applied.
	Unknown
)

func (o Outcome) String() string {
	return [...]string{"applied", "stale", "failed", "unknown"}[o]
}

// Attempt is one write a worker tried: UPDATE table SET val = Val WHERE id = Row, under Token. Val is unique
// per attempt, so that the history table tells which attempt a row version came from.
type Attempt struct {
	Worker     string
	Token      int64
	Row        int
	Val        string
	Start, End time.Time
	Outcome    Outcome
	Code       string // SQLSTATE for Stale and Failed
	RowToken   int64  // for Stale: the token the row held, from the error's DETAIL
	Err        string
	// Lock fences (lockhistory_test.go): Lock is the lock the session named (fence.lock), "" for row fencing
	// only; a lock fence's 55F01 names the lock (RefusedLock) and the token it has accepted (LockMark).
	Lock        string
	RefusedLock string
	LockMark    int64
}

func (a Attempt) String() string {
	return fmt.Sprintf("%s token=%d row=%d val=%s %s %s %s", a.Worker, a.Token, a.Row, a.Val, a.Outcome, a.Code, a.Err)
}

// History records every attempted write of a run.
type History struct {
	// Mode, when set, is the pgx query execution mode of Write (for instance QueryExecModeExec: Parse, Bind and
	// Execute in one round trip).
	Mode pgx.QueryExecMode

	mu       sync.Mutex
	attempts []Attempt
	seq      int
}

// NextVal returns a value no other attempt of this history writes.
func (h *History) NextVal(worker string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	return fmt.Sprintf("%s#%d", worker, h.seq)
}

// Record adds an attempt made elsewhere (by a worker process, say).
func (h *History) Record(a Attempt) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.attempts = append(h.attempts, a)
}

// Attempts returns a copy of what was recorded so far.
func (h *History) Attempts() []Attempt {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Attempt(nil), h.attempts...)
}

var staleDetail = regexp.MustCompile(`row holds fencing token (\d+); this session presented token (\d+)`)

// Classify fills in a's outcome from the error a single-statement write (or its COMMIT) returned.
func (a *Attempt) Classify(err error) {
	a.End = time.Now()
	if err == nil {
		a.Outcome = Applied
		return
	}
	a.Err = err.Error()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		a.Outcome = Unknown
		return
	}
	a.Code = pgErr.Code
	switch {
	case pgErr.Code == "55F01":
		a.Outcome = Stale
		if m := staleDetail.FindStringSubmatch(pgErr.Detail); m != nil {
			a.RowToken, _ = strconv.ParseInt(m[1], 10, 64)
		}
		if m := lockStaleDetail.FindStringSubmatch(pgErr.Detail); m != nil {
			a.RefusedLock = m[1]
			a.LockMark, _ = strconv.ParseInt(m[2], 10, 64)
		}
	case pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC" || strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P"):
		// The session ended with the statement: a shutdown can end a backend after its commit and before the
		// acknowledgement.
		a.Outcome = Unknown
	default:
		a.Outcome = Failed
	}
}

// Write runs one autocommit UPDATE through conn and records it. The session's token must already be Token.
func (h *History) Write(ctx context.Context, conn *pgx.Conn, table, worker string, token int64, row int) Attempt {
	a := Attempt{Worker: worker, Token: token, Row: row, Val: h.NextVal(worker), Start: time.Now()}
	args := []any{a.Val, row}
	if h.Mode != 0 {
		args = append([]any{h.Mode}, args...)
	}
	tag, err := conn.Exec(ctx, fmt.Sprintf("UPDATE %s SET val = $1 WHERE id = $2", table), args...)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("UPDATE matched %d rows, want 1", tag.RowsAffected())
		a.Classify(err)
		a.Outcome = Failed
	} else {
		a.Classify(err)
	}
	h.Record(a)
	return a
}

// appliedWrite is one row version the database applied, from the history table.
type appliedWrite struct {
	Seq      int64
	Row      int
	Op       string
	OldToken int64 // NULL reads as 0
	NewToken int64
	Val      string
	At       time.Time
}

// Check asserts the fencing guarantees over what h recorded and what the database applied to table:
//
//   - no applied write ever lowered a row's token, and each row's versions chain (no applied write lost);
//   - every write acknowledged to its worker is in the database, with its worker's token;
//   - no write refused to its worker (55F01 or another error) is in the database;
//   - every stale refusal was for a token below the row's at that time: the DETAIL names a higher token that a
//     write applied before the refusal came back;
//   - each row's final state is the last write of the highest token applied to it.
//
// It returns the counts of outcomes, for the caller's own expectations.
func (h *History) Check(t testing.TB, cl *pgtest.Cluster, table string) map[Outcome]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := pgx.Connect(ctx, cl.SuperDSN())
	if err != nil {
		t.Fatalf("history check: %v", err)
	}
	defer db.Close(context.Background())

	rows, err := db.Query(ctx, fmt.Sprintf("SELECT seq, id, op, coalesce(old_token, 0), coalesce(new_token, 0), val, at FROM %s_history ORDER BY seq", table))
	if err != nil {
		t.Fatalf("history check: %v", err)
	}
	var applied []appliedWrite
	for rows.Next() {
		var w appliedWrite
		if err := rows.Scan(&w.Seq, &w.Row, &w.Op, &w.OldToken, &w.NewToken, &w.Val, &w.At); err != nil {
			t.Fatalf("history check: %v", err)
		}
		applied = append(applied, w)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("history check: %v", err)
	}
	final := map[int]rowState{}
	frows, err := db.Query(ctx, fmt.Sprintf("SELECT id, coalesce(fence_token, 0), val FROM %s", table))
	if err != nil {
		t.Fatalf("history check: %v", err)
	}
	for frows.Next() {
		var id int
		var s rowState
		if err := frows.Scan(&id, &s.token, &s.val); err != nil {
			t.Fatalf("history check: %v", err)
		}
		final[id] = s
	}
	if err := frows.Err(); err != nil {
		t.Fatalf("history check: %v", err)
	}

	attempts := h.Attempts()
	problems := historyProblems(attempts, applied, final)
	counts := map[Outcome]int{}
	for _, a := range attempts {
		counts[a.Outcome]++
	}
	if len(problems) > 0 {
		sort.SliceStable(attempts, func(i, j int) bool { return attempts[i].Start.Before(attempts[j].Start) })
		var b strings.Builder
		for _, a := range attempts {
			fmt.Fprintf(&b, "  %s %v\n", a.Start.Format("15:04:05.000000"), a)
		}
		b.WriteString("applied:\n")
		for _, w := range applied {
			fmt.Fprintf(&b, "  seq %d %s row %d %d->%d %s\n", w.Seq, w.At.Format("15:04:05.000000"), w.Row, w.OldToken, w.NewToken, w.Val)
		}
		t.Errorf("history check of %s failed:\n%s\nattempts:\n%s", table, strings.Join(problems, "\n"), b.String())
	}
	t.Logf("history of %s: %d attempts (%v), %d applied", table, len(attempts), counts, len(applied))
	return counts
}

// rowState is a row of the table as a run left it (a NULL token reads as 0).
type rowState struct {
	token int64
	val   string
}

// historyProblems is Check's judgement (see Check) of attempts, the row versions the database applied and
// the rows as the run left them: one line per violation.
func historyProblems(attempts []Attempt, applied []appliedWrite, final map[int]rowState) []string {
	byVal := map[string]Attempt{}
	for _, a := range attempts {
		byVal[a.Val] = a
	}
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	// Row versions, per row, in the order the database applied them (row locks serialize them).
	last := map[int]appliedWrite{}
	seen := map[string]appliedWrite{}
	for _, w := range applied {
		if w.NewToken < w.OldToken {
			fail("applied write seq %d (%s) lowered row %d's token from %d to %d", w.Seq, w.Val, w.Row, w.OldToken, w.NewToken)
		}
		prev, ok := last[w.Row]
		if w.Op == "UPDATE" && ok && prev.NewToken != w.OldToken {
			fail("row %d: write seq %d replaced token %d, but the previous applied write (seq %d) left %d", w.Row, w.Seq, w.OldToken, prev.Seq, prev.NewToken)
		}
		if ok && w.NewToken < prev.NewToken {
			fail("row %d: token went down from %d (seq %d) to %d (seq %d)", w.Row, prev.NewToken, prev.Seq, w.NewToken, w.Seq)
		}
		last[w.Row] = w
		if _, dup := seen[w.Val]; dup {
			fail("write %s applied twice", w.Val)
		}
		seen[w.Val] = w
		a, ok := byVal[w.Val]
		switch {
		case !ok:
			fail("applied write seq %d (%s) matches no attempt", w.Seq, w.Val)
		case a.Outcome == Stale || a.Outcome == Failed:
			fail("write %v was refused to its worker but applied (seq %d, token %d)", a, w.Seq, w.NewToken)
		case w.NewToken != a.Token:
			fail("write %v applied with token %d, not its worker's", a, w.NewToken)
		case w.Row != a.Row:
			fail("write %v applied to row %d", a, w.Row)
		}
	}
	for _, a := range attempts {
		switch a.Outcome {
		case Applied:
			if _, ok := seen[a.Val]; !ok {
				fail("acknowledged write %v is not in the database", a)
			}
		case Stale:
			if a.RefusedLock != "" {
				continue // a lock fence's refusal names no row: CheckLocks judges it
			}
			if a.RowToken <= a.Token {
				fail("stale refusal %v names row token %d, not above the presented token", a, a.RowToken)
			}
			// The row's newer token must come from a write applied before the refusal came back.
			found := false
			for _, w := range applied {
				if w.Row == a.Row && w.NewToken == a.RowToken && !w.At.After(a.End) {
					found = true
					break
				}
			}
			if !found {
				fail("stale refusal %v: no write of row %d with token %d was applied before %s", a, a.Row, a.RowToken, a.End.Format(time.RFC3339Nano))
			}
		}
	}
	for id, s := range final {
		w, ok := last[id]
		if !ok {
			if s.val != "init" || s.token != 0 {
				fail("row %d is %q/%d with no write in its history", id, s.val, s.token)
			}
			continue
		}
		var max int64
		for _, v := range applied {
			if v.Row == id && v.NewToken > max {
				max = v.NewToken
			}
		}
		if s.token != max || s.token != w.NewToken || s.val != w.Val {
			fail("row %d ends as %q/%d; the last write of the highest applied token %d is %q/%d", id, s.val, s.token, max, w.Val, w.NewToken)
		}
	}
	return problems
}
