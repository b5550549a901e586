package proxy_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The lock question a host the router refuses does not answer (here pg_inherits is locked there, so the question
// waits for it until health_timeout) fails closed: a transaction whose writes it could not check does not commit
// there. From mutate59 (2026-12-06): with the question's failure taken for "wrote nothing" at the COMMIT
// (session.unplannedWrite), every unseen58 and review58 test passed, their hosts always answering, and the
// transaction that wrote accounts through a function committed on the withdrawn primary. Since the write hold
// (hold59, merged beside it), the host's hold cannot be placed while pg_inherits is locked, and a COMMIT refused
// for that is as closed (55F04, nothing committed); the mutant the test was written for then goes uncaught here,
// the hold refusing first (a transaction holding a write's lock and an in-place hold cannot coexist: the hold
// ends it).
func TestUnansweredLockQuestionOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run("commit/"+mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			serverSideWriters(ctx, t, admin, true)
			tx := beginWith(ctx, t, tokenClient(ctx, t, h, 5), "SELECT w_insert_pl(51)")
			// Unanswered from before the change: in session mode the change asks about the session too (at rest,
			// it is then judged at its next message).
			unanswered := beginWith(ctx, t, connect(t, h.primary.SuperDSN()), "LOCK TABLE pg_catalog.pg_inherits IN ACCESS EXCLUSIVE MODE")
			h.splitBrain(ctx, t)
			hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
			err := tx.Commit(ctx)
			t.Logf("COMMIT: %v", err)
			if err := unanswered.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := hold.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			// The write hold (writehold.go) reads pg_inherits too, so it cannot be placed here either: the COMMIT may
			// be refused for the want of it before its question is asked, as fail closed as the question's own refusal.
			if n := countAccountsRow(ctx, t, admin, 51); n != 0 || sqlstate(err) != "55F04" || !strings.Contains(err.Error(), "could not be checked") && !strings.Contains(err.Error(), "could not hold") {
				t.Errorf("the COMMIT of a transaction that wrote accounts through a function, the withdrawn primary not answering the lock question: %v; rows committed there %d, want FATAL 55F04 and none", err, n)
			}
		})
	}
}

// A COMMIT pipelined behind a running statement of a transaction that wrote a protected table inside the server
// ends the session at the router's change whatever the lock question answers (unplannedWritersRefused: behind),
// so it must not wait for that answer. From mutate59 (2026-12-06, found writing the test above): the change asked
// first and ended the session once the host answered or health_timeout passed; a host slow to answer (here
// pg_inherits locked there) left the statement ahead free to end and the COMMIT queued behind it to commit on the
// withdrawn primary meanwhile (session: tags [SELECT 1 COMMIT], rows committed there 1). Session mode only:
// transaction pooling holds a COMMIT until the statement before it is answered, and judges it then.
func TestQueuedCommitWhileTheLockQuestionStalls(t *testing.T) {
	for _, mode := range barrierModes[1:] {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			serverSideWriters(ctx, t, admin, true)
			c := tokenClient(ctx, t, h, 5)
			beginWith(ctx, t, c, "SELECT w_insert_pl(52)")
			// The statement ahead of the COMMIT waits for notes; the question at the change waits for pg_inherits.
			// Both locks go at once, before the question's health_timeout.
			lock := beginWith(ctx, t, connect(t, h.primary.SuperDSN()), "LOCK TABLE notes IN ACCESS EXCLUSIVE MODE",
				"LOCK TABLE pg_catalog.pg_inherits IN ACCESS EXCLUSIVE MODE")
			tags, codes := commitQueuedAcrossAWithdrawal(ctx, t, h, admin, c, lock, "SELECT count(*) FROM notes", "%SELECT count(*) FROM notes")
			if n := countAccountsRow(ctx, t, admin, 52); n != 0 || slices.Contains(tags, "COMMIT") || len(codes) == 0 {
				t.Errorf("a COMMIT queued behind a running statement of a transaction that wrote accounts inside the server, the withdrawn primary slow to answer the question at the change: tags %q, errors %q, rows committed there %d; want no COMMIT, a FATAL and none", tags, codes, n)
			}
		})
	}
}

// countAccountsRow counts the rows of accounts with id, on the server admin is connected to.
func countAccountsRow(ctx context.Context, t *testing.T, admin *pgx.Conn, id int) int {
	t.Helper()
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = $1", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
