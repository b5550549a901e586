package proxy_test

import (
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A prepared transaction (two-phase commit) that wrote a protected table is not committed on a host that is no
// longer the published primary. From failover57 (2026-12-05, attack: PREPARE TRANSACTION while the host is the
// primary, COMMIT PREPARED after it was withdrawn): the transaction's writes were fenced and allowed, PREPARE
// TRANSACTION ended the transaction (the session idle again, so the rule for a transaction that wrote a protected
// table no longer held it), and COMMIT PREPARED, a statement that writes no table by its words, committed them on
// the old primary, where the new primary, which has the transaction prepared too (replicated), never sees it
// committed. A text that may commit a prepared transaction is judged as a fenced write now (55F04 on a host the
// router refuses fenced writes on). In transaction pooling the COMMIT PREPARED waits for the next primary, as
// every transaction of a client between transactions does, and commits there.
func TestCommitPreparedRefusedOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, map[string]string{"max_prepared_transactions": "5"})
			ctx := haCtx(t)
			c := connect(t, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
			for _, q := range []string{"SET fence.token = 5", "BEGIN", "UPDATE accounts SET v = 8 WHERE id = 1", "PREPARE TRANSACTION 'fp57'"} {
				if _, err := c.Exec(ctx, q); err != nil {
					t.Fatalf("%s on the published primary: %v", q, err)
				}
			}
			pooled := mode.name == "transaction"
			// Another session prepares the COMMIT PREPARED by Parse (extended protocol) while the host is the
			// primary, and runs it after.
			parsed := connect(t, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
			if !pooled {
				if _, err := parsed.Prepare(ctx, "cp", "COMMIT PREPARED 'fp57'"); err != nil {
					t.Fatal(err)
				}
			}
			h.splitBrain(ctx, t)
			hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
			done := execAsync(ctx, c, "COMMIT PREPARED 'fp57'")
			var commitErr, parsedErr error
			if !pooled {
				commitErr = <-done // answered at once, while the barrier still waits
				_, parsedErr = parsed.Exec(ctx, "cp")
			}
			if err := hold.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if pooled {
				commitErr = <-done
			}
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 1 AND v = 8").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("COMMIT PREPARED through a session on the withdrawn primary committed there (%v, %v)", commitErr, parsedErr)
			}
			if !pooled && (sqlstate(commitErr) != "55F04" || sqlstate(parsedErr) != "55F04") {
				t.Errorf("COMMIT PREPARED on the withdrawn primary: %v; prepared by Parse before: %v; want 55F04 for both", commitErr, parsedErr)
			}
			if pooled {
				np := connect(t, h.standby.SuperDSN())
				if err := np.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 1 AND v = 8").Scan(&n); err != nil {
					t.Fatal(err)
				}
				if commitErr != nil || n != 1 {
					t.Errorf("a pooled COMMIT PREPARED after the switch: %v, %d rows on the new primary, want it committed there", commitErr, n)
				}
			}
		})
	}
}
