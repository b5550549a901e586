package proxy_test

import (
	"testing"
)

// A cursor WITH HOLD declared by code inside the server, not by the client's text, writes at the COMMIT just
// the same. From review58 (2026-12-06, attack on unseen58s rule): the proxy judges a transaction that may hold
// such a cursor by the letters hold in the texts the client sent (holdWords), a list of spellings; a PL/pgSQL
// function that builds the DECLARE in dynamic SQL declares one from a text that never passes the proxy. The
// lock question before the COMMIT sees no write (the cursor query has not run, and a function call locks no
// table at planning), so the COMMIT goes, runs the cursor query, and commits its write on the withdrawn primary.
func TestServerDeclaredHeldCursorWritesAtCommitOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			serverSideWriters(ctx, t, admin, true)
			// The dynamic text is split so that even the function body never spells the letters.
			if _, err := admin.Exec(ctx, `CREATE FUNCTION w_open(i int) RETURNS void LANGUAGE plpgsql AS $f$
				BEGIN EXECUTE 'DECLARE c CURSOR WITH H' || 'OLD FOR SELECT w_insert_pl(' || i || ')'; END $f$`); err != nil {
				t.Fatal(err)
			}
			tx := beginWith(ctx, t, tokenClient(ctx, t, h, 5), "SELECT w_open(37)")
			h.splitBrain(ctx, t)
			hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
			err := tx.Commit(ctx)
			t.Logf("COMMIT: %v", err)
			if err := hold.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 37").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("the COMMIT of a transaction whose function declared a cursor WITH HOLD that writes accounts, on the withdrawn primary: %v; rows committed there %d, want none", err, n)
			}
		})
	}
}
