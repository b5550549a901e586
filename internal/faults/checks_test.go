package faults

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// The history judges (History.Check, History.CheckLocks), fed crafted histories: a history that keeps every
// guarantee yields no problem, and each way of breaking one is reported. Without this, a judge that says nothing
// passes every fault test.

// at is a point of a crafted history's clock, in milliseconds.
func at(ms int) time.Time {
	return time.Unix(1_700_000_000, 0).Add(time.Duration(ms) * time.Millisecond)
}

// judged fails t unless problems is empty (want "") or has one saying want.
func judged(t *testing.T, problems []string, want string) {
	t.Helper()
	switch {
	case want == "" && len(problems) > 0:
		t.Errorf("problems %q, want none", problems)
	case want != "" && !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, want) }):
		t.Errorf("problems %q, want one saying %q", problems, want)
	}
}

func TestHistoryProblems(t *testing.T) {
	// Worker a writes row 1 with token 5 (applied), then b with token 3 is refused: the row holds 5.
	good := func() ([]Attempt, []appliedWrite, map[int]rowState) {
		return []Attempt{
				{Worker: "a", Token: 5, Row: 1, Val: "a#1", Start: at(0), End: at(10), Outcome: Applied},
				{Worker: "b", Token: 3, Row: 1, Val: "b#2", Start: at(20), End: at(30), Outcome: Stale, Code: "55F01", RowToken: 5},
				{Worker: "b", Token: 3, Row: 1, Val: "b#3", Start: at(40), End: at(50), Outcome: Failed, Code: "40001"},
				{Worker: "c", Token: 4, Row: 1, Val: "c#4", Start: at(40), End: at(50), Outcome: Stale, Code: "55F01", RefusedLock: "L", LockMark: 6},
				{Worker: "c", Token: 4, Row: 2, Val: "c#5", Start: at(40), Outcome: Unknown},
			}, []appliedWrite{
				{Seq: 1, Row: 1, Op: "UPDATE", OldToken: 0, NewToken: 5, Val: "a#1", At: at(5)},
			}, map[int]rowState{1: {5, "a#1"}, 2: {0, "init"}}
	}
	for _, tc := range []struct {
		name   string
		break_ func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite)
		want   string
	}{
		{"a history that keeps every guarantee", nil, ""},
		{"a token lowered by a write", func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite) {
			a[0].Token, w[0].OldToken, w[0].NewToken, f[1] = 2, 3, 2, rowState{2, "a#1"}
			a[1].RowToken = 2
			return a, w
		}, "lowered row 1's token from 3 to 2"},
		{"a lost write (versions do not chain)", func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite) {
			a = append(a, Attempt{Worker: "d", Token: 7, Row: 1, Val: "d#6", Start: at(60), End: at(70), Outcome: Applied})
			f[1] = rowState{7, "d#6"}
			return a, append(w, appliedWrite{Seq: 2, Row: 1, Op: "UPDATE", OldToken: 6, NewToken: 7, Val: "d#6", At: at(65)})
		}, "replaced token 6, but the previous applied write (seq 1) left 5"},
		{"a row's token going down between versions", func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite) {
			a = append(a, Attempt{Worker: "d", Token: 4, Row: 1, Val: "d#6", Start: at(60), End: at(70), Outcome: Applied})
			return a, append(w, appliedWrite{Seq: 2, Row: 1, Op: "INSERT", OldToken: 0, NewToken: 4, Val: "d#6", At: at(65)})
		}, "row 1: token went down from 5 (seq 1) to 4 (seq 2)"},
		{"a write applied twice", func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite) {
			return a, append(w, appliedWrite{Seq: 2, Row: 1, Op: "UPDATE", OldToken: 5, NewToken: 5, Val: "a#1", At: at(8)})
		}, "write a#1 applied twice"},
		{"a write nobody attempted", func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite) {
			f[1] = rowState{9, "x#9"}
			return a, append(w, appliedWrite{Seq: 2, Row: 1, Op: "UPDATE", OldToken: 5, NewToken: 9, Val: "x#9", At: at(8)})
		}, "applied write seq 2 (x#9) matches no attempt"},
		{"a stale refusal applied", func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite) {
			a[1].Token, a[1].RowToken = 6, 7 // a refusal that is itself consistent
			a = append(a, Attempt{Worker: "d", Token: 7, Row: 1, Val: "d#6", Start: at(0), End: at(15), Outcome: Applied})
			f[1] = rowState{7, "b#2"}
			return a, append(w, appliedWrite{Seq: 2, Row: 1, Op: "UPDATE", OldToken: 5, NewToken: 7, Val: "d#6", At: at(12)},
				appliedWrite{Seq: 3, Row: 1, Op: "UPDATE", OldToken: 7, NewToken: 7, Val: "b#2", At: at(25)})
		}, "was refused to its worker but applied"},
		{"a failed write applied", func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite) {
			a[2].Token = 5
			f[1] = rowState{5, "b#3"}
			return a, append(w, appliedWrite{Seq: 2, Row: 1, Op: "UPDATE", OldToken: 5, NewToken: 5, Val: "b#3", At: at(45)})
		}, "val=b#3 failed 40001  was refused to its worker but applied"},
		{"a write applied with another token", func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite) {
			w[0].NewToken, f[1] = 6, rowState{6, "a#1"}
			a[1].RowToken = 6
			return a, w
		}, "applied with token 6, not its worker's"},
		{"a write applied to another row", func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite) {
			w[0].Row = 2
			f[1], f[2] = rowState{0, "init"}, rowState{5, "a#1"}
			return a, w
		}, "applied to row 2"},
		{"an acknowledged write lost", func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite) {
			a[1].RowToken = 0
			a[1].Outcome, a[1].Code = Failed, "40001"
			f[1] = rowState{0, "init"}
			return a, nil
		}, "acknowledged write a token=5 row=1 val=a#1 applied   is not in the database"},
		{"a stale refusal naming an older row token", func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite) {
			a[1].RowToken = 3
			return a, w
		}, "names row token 3, not above the presented token"},
		{"a stale refusal before the newer write", func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite) {
			w[0].At = at(35)
			return a, w
		}, "no write of row 1 with token 5 was applied before"},
		{"a row changed outside the history", func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite) {
			f[2] = rowState{0, "changed"}
			return a, w
		}, `row 2 is "changed"/0 with no write in its history`},
		{"a row that does not end as its last write", func(a []Attempt, w []appliedWrite, f map[int]rowState) ([]Attempt, []appliedWrite) {
			f[1] = rowState{5, "b#2"}
			return a, w
		}, `row 1 ends as "b#2"/5`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, w, f := good()
			if tc.break_ != nil {
				a, w = tc.break_(a, w, f)
			}
			judged(t, historyProblems(a, w, f), tc.want)
		})
	}
}

func TestLockProblems(t *testing.T) {
	// On lock L, worker a commits with token 5; b with token 3 is refused (L has accepted 5); row fencing's own
	// refusal (no lock named) is Check's.
	good := func() ([]Attempt, []committedWrite) {
		return []Attempt{
				{Worker: "a", Token: 5, Row: 1, Val: "a#1", Lock: "L", Start: at(0), End: at(10), Outcome: Applied},
				{Worker: "b", Token: 3, Row: 1, Val: "b#2", Lock: "L", Start: at(20), End: at(30), Outcome: Stale, Code: "55F01", RefusedLock: "L", LockMark: 5},
				{Worker: "c", Token: 2, Row: 1, Val: "c#3", Lock: "M", Start: at(20), End: at(30), Outcome: Applied},
				{Worker: "c", Token: 2, Row: 1, Val: "c#4", Start: at(40), End: at(50), Outcome: Stale, Code: "55F01", RowToken: 5},
			}, []committedWrite{
				{Seq: 1, Val: "a#1", Token: 5, Lock: "L", At: at(5)},
				{Seq: 2, Val: "c#3", Token: 2, Lock: "M", At: at(25)},
			}
	}
	for _, tc := range []struct {
		name   string
		break_ func(a []Attempt, c []committedWrite) ([]Attempt, []committedWrite)
		want   string
	}{
		{"a history that keeps every guarantee", nil, ""},
		{"an older token committed after a newer one", func(a []Attempt, c []committedWrite) ([]Attempt, []committedWrite) {
			a = append(a, Attempt{Worker: "d", Token: 4, Val: "d#5", Lock: "L", Start: at(1), End: at(12), Outcome: Applied})
			return a, append(c, committedWrite{Seq: 3, Val: "d#5", Token: 4, Lock: "L", At: at(11)})
		}, "lock L: write d#5 with token 4 committed (commit seq 3) after write a#1 with the newer token 5 had committed (seq 1)"},
		{"a commit nobody attempted", func(a []Attempt, c []committedWrite) ([]Attempt, []committedWrite) {
			return a, append(c, committedWrite{Seq: 3, Val: "x#9", Token: 9, Lock: "L", At: at(40)})
		}, "committed write seq 3 (x#9) matches no attempt"},
		{"a commit under another lock", func(a []Attempt, c []committedWrite) ([]Attempt, []committedWrite) {
			c[1].Lock = ""
			return a, c
		}, `committed under lock "", not its worker's "M"`},
		{"a commit with another token", func(a []Attempt, c []committedWrite) ([]Attempt, []committedWrite) {
			c[1].Token = 1
			return a, c
		}, "val=c#3 applied   committed with token 1"},
		{"a refused write committed", func(a []Attempt, c []committedWrite) ([]Attempt, []committedWrite) {
			return a, append(c, committedWrite{Seq: 3, Val: "c#4", Token: 2, At: at(45)})
		}, "was refused to its worker but committed (seq 3)"},
		{"an acknowledged write missing from the log", func(a []Attempt, c []committedWrite) ([]Attempt, []committedWrite) {
			return a, c[:1]
		}, "acknowledged write c token=2 row=1 val=c#3 applied   is not in the commit log"},
		{"an older token applied after a newer one was acknowledged", func(a []Attempt, c []committedWrite) ([]Attempt, []committedWrite) {
			a = append(a, Attempt{Worker: "d", Token: 4, Val: "d#5", Lock: "L", Start: at(11), End: at(14), Outcome: Applied})
			return a, append([]committedWrite{{Seq: 0, Val: "d#5", Token: 4, Lock: "L", At: at(4)}}, c...)
		}, "lock L: write d token=4 row=0 val=d#5 applied   was applied although it started after write a"},
		{"a refusal naming another lock", func(a []Attempt, c []committedWrite) ([]Attempt, []committedWrite) {
			a[1].RefusedLock = "M"
			return a, c
		}, `names lock "M", not the session's "L"`},
		{"a refusal naming an older accepted token", func(a []Attempt, c []committedWrite) ([]Attempt, []committedWrite) {
			a[1].LockMark = 3
			return a, c
		}, "names lock L's accepted token 3, not above the presented token"},
		{"a refusal before the newer token committed", func(a []Attempt, c []committedWrite) ([]Attempt, []committedWrite) {
			c[0].At = at(35)
			return a, c
		}, "no write on lock L with token 5 committed before"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, c := good()
			if tc.break_ != nil {
				a, c = tc.break_(a, c)
			}
			judged(t, lockProblems(a, c), tc.want)
		})
	}
}
