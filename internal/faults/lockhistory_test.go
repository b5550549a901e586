package faults

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/schema"
)

// lockStaleDetail is the DETAIL of a lock fence's 55F01 (rewrite.Marker, the guard's text).
var lockStaleDetail = regexp.MustCompile(`^Lock (.+) has accepted fencing token (\d+); this session presented token (\d+)\.$`)

// installLockFence makes table (from fencedTable) a lock-fenced table: `fenceproxy install` for it (the guard, with
// lock_marks and lock_accept), and a commit log filled at commit time with the token and the lock
// (fence.lock) of every row version a transaction commits.
//
// The log's trigger is a deferred constraint trigger: it runs when the transaction commits, after all its
// statements, so the log's order is the order in which transactions reached their commit. A transaction on a
// lock holds the lock's advisory lock (shared or exclusive, docs/lock-fences.md) until it ends, so under a
// working fence a newer token's first write cannot get past lock_accept before every older transaction on
// the lock has ended; an older write that committed after a newer one shows in the log as a token going down.
func installLockFence(t testing.TB, cl *pgtest.Cluster, table string) {
	t.Helper()
	sql := fmt.Sprintf(`
CREATE TABLE %[1]s_commits (
	seq bigserial PRIMARY KEY,
	val text NOT NULL,
	token bigint,
	lock text,
	at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION %[1]s_commit_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO %[1]s_commits (val, token, lock) VALUES (NEW.val, NEW.fence_token, current_setting('fence.lock', true));
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER %[1]s_commits AFTER INSERT OR UPDATE ON %[1]s DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION %[1]s_commit_record();
`, table)
	if err := cl.Exec(sql); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, cl.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	cfg := schema.Config{
		Tables:   []config.Table{{Name: table, Relation: table, TokenColumn: "fence_token"}},
		Settings: schema.Settings{Token: "fence.token", Lock: "fence.lock"},
	}
	if err := schema.Install(ctx, conn, cfg); err != nil {
		t.Fatalf("fenceproxy install for %s: %v", table, err)
	}
}

// writeLocked is one autocommit write through conn, whose session names lock and token (startup options, as
// `fenceproxy lock` gives them): an UPDATE of row, or with insert an INSERT of the new row.
func (h *History) writeLocked(ctx context.Context, mode pgx.QueryExecMode, conn *pgx.Conn, table, worker, lock string, token int64, row int, insert bool) Attempt {
	a := Attempt{Worker: worker, Token: token, Row: row, Val: h.NextVal(worker), Lock: lock, Start: time.Now()}
	sql := fmt.Sprintf("UPDATE %s SET val = $1 WHERE id = $2", table)
	if insert {
		sql = fmt.Sprintf("INSERT INTO %s (val, id) VALUES ($1, $2)", table)
	}
	args := []any{a.Val, row}
	if mode != 0 {
		args = append([]any{mode}, args...)
	}
	tag, err := conn.Exec(ctx, sql, args...)
	if err == nil && tag.RowsAffected() != 1 {
		a.Classify(fmt.Errorf("%s matched %d rows, want 1", strings.Fields(sql)[0], tag.RowsAffected()))
		a.Outcome = Failed
	} else {
		a.Classify(err)
	}
	h.Record(a)
	return a
}

// committedWrite is one row version in the commit log of a lock-fenced table.
type committedWrite struct {
	Seq   int64
	Val   string
	Token int64
	Lock  string
	At    time.Time
}

// CheckLocks asserts the lock fence's guarantees over what h recorded and the commit log of table (lockFence):
//
//   - the lock-level invariant: no write with token t on lock L commits after a write with a newer token on L
//     has committed (in commit-log order, each lock's tokens never go down; and in real time, no write on L
//     that was acknowledged applied started after a newer token's write on L had been acknowledged);
//   - every write acknowledged to its worker committed with its worker's token and under its worker's lock
//     (the sessions kept fence.lock), and every committed write is an attempt's, with that attempt's lock;
//   - every lock fence refusal names the worker's own lock and a newer token that a write on that lock
//     committed before the refusal came back.
//
// Call it besides Check, which judges the rows.
func (h *History) CheckLocks(t testing.TB, cl *pgtest.Cluster, table string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := pgx.Connect(ctx, cl.SuperDSN())
	if err != nil {
		t.Fatalf("lock check: %v", err)
	}
	defer db.Close(context.Background())
	rows, err := db.Query(ctx, fmt.Sprintf("SELECT seq, val, coalesce(token, 0), coalesce(lock, ''), at FROM %s_commits ORDER BY seq", table))
	if err != nil {
		t.Fatalf("lock check: %v", err)
	}
	committed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (committedWrite, error) {
		var c committedWrite
		err := r.Scan(&c.Seq, &c.Val, &c.Token, &c.Lock, &c.At)
		return c, err
	})
	if err != nil {
		t.Fatalf("lock check: %v", err)
	}

	attempts := h.Attempts()
	problems := lockProblems(attempts, committed)
	if len(problems) > 0 {
		sort.SliceStable(attempts, func(i, j int) bool { return attempts[i].Start.Before(attempts[j].Start) })
		var b strings.Builder
		for _, a := range attempts {
			fmt.Fprintf(&b, "  %s-%s lock=%s %v\n", a.Start.Format("15:04:05.000000"), a.End.Format("15:04:05.000000"), a.Lock, a)
		}
		b.WriteString("commit log:\n")
		for _, c := range committed {
			fmt.Fprintf(&b, "  seq %d %s lock=%s token=%d %s\n", c.Seq, c.At.Format("15:04:05.000000"), c.Lock, c.Token, c.Val)
		}
		t.Errorf("lock check of %s failed:\n%s\nattempts:\n%s", table, strings.Join(problems, "\n"), b.String())
	}
	t.Logf("lock history of %s: %d attempts, %d committed writes", table, len(attempts), len(committed))
}

// lockProblems is CheckLocks's judgement (see CheckLocks) of attempts and the commit log: one line per
// violation.
func lockProblems(attempts []Attempt, committed []committedWrite) []string {
	byVal := map[string]Attempt{}
	for _, a := range attempts {
		byVal[a.Val] = a
	}
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	newest := map[string]committedWrite{} // per lock, the committed write with the highest token so far
	byCommit := map[string]committedWrite{}
	for _, c := range committed {
		byCommit[c.Val] = c
		if c.Lock != "" {
			if n, ok := newest[c.Lock]; ok && c.Token < n.Token {
				fail("lock %s: write %s with token %d committed (commit seq %d) after write %s with the newer token %d had committed (seq %d)",
					c.Lock, c.Val, c.Token, c.Seq, n.Val, n.Token, n.Seq)
			}
			if n, ok := newest[c.Lock]; !ok || c.Token >= n.Token {
				newest[c.Lock] = c
			}
		}
		a, ok := byVal[c.Val]
		switch {
		case !ok:
			fail("committed write seq %d (%s) matches no attempt", c.Seq, c.Val)
		case c.Lock != a.Lock:
			fail("write %v committed under lock %q, not its worker's %q (the session lost its fence.lock)", a, c.Lock, a.Lock)
		case c.Token != a.Token:
			fail("write %v committed with token %d", a, c.Token)
		case a.Outcome == Stale || a.Outcome == Failed:
			fail("write %v was refused to its worker but committed (seq %d)", a, c.Seq)
		}
	}
	for _, a := range attempts {
		switch a.Outcome {
		case Applied:
			if _, ok := byCommit[a.Val]; !ok {
				fail("acknowledged write %v is not in the commit log", a)
			}
			if a.Lock == "" {
				continue
			}
			for _, b := range attempts {
				if b.Outcome == Applied && b.Lock == a.Lock && b.Token > a.Token && b.End.Before(a.Start) {
					fail("lock %s: write %v was applied although it started after write %v with the newer token had been acknowledged", a.Lock, a, b)
					break
				}
			}
		case Stale:
			if a.RefusedLock == "" {
				continue // a row fence's refusal: Check judges it
			}
			if a.RefusedLock != a.Lock {
				fail("stale refusal %v names lock %q, not the session's %q", a, a.RefusedLock, a.Lock)
			}
			if a.LockMark <= a.Token {
				fail("stale refusal %v names lock %s's accepted token %d, not above the presented token", a, a.RefusedLock, a.LockMark)
			}
			found := false
			for _, c := range committed {
				if c.Lock == a.RefusedLock && c.Token == a.LockMark && !c.At.After(a.End) {
					found = true
					break
				}
			}
			if !found {
				fail("stale refusal %v: no write on lock %s with token %d committed before %s", a, a.RefusedLock, a.LockMark, a.End.Format(time.RFC3339Nano))
			}
		}
	}
	return problems
}
