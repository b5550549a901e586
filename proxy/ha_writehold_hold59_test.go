package proxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A unit sent with no transaction block open runs and commits as one: a lone simple Query `SELECT f()` whose
// PL/pgSQL function writes accounts, or an extended-protocol batch Parse/Bind/Execute/Sync of it. Nothing can be
// asked between its write and its commit, so the lock question of unplanned.go never sees it. From hold59
// (2026-12-06, measured by unseen58 and kept in docs/ha.md until then): during a split brain it committed on the
// old primary, where a fenced write is refused, in all three transports, the guard installed. Now the router
// holds every protected table of a host it refuses fenced writes on against writes inside the database
// (writehold.go: LOCK ... IN SHARE MODE in a transaction of its own): the write waits behind the hold, and the
// proxy ends its own session waiting there (FATAL 55F04: nothing of it committed).
func TestLoneUnitWritingInsideTheServerOnARefusedHost(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			serverSideWriters(ctx, t, admin, true)
			simple, extended := tokenClient(ctx, t, h, 5), tokenClient(ctx, t, h, 5)
			h.splitBrain(ctx, t)
			units := []struct {
				name string
				id   int
				run  func() error
			}{
				{"simple", 51, func() error {
					_, err := simple.PgConn().Exec(ctx, "SELECT w_insert_pl(51)").ReadAll()
					return err
				}},
				{"extended", 52, func() error {
					return extended.PgConn().ExecParams(ctx, "SELECT w_insert_pl($1)", [][]byte{[]byte("52")}, nil, nil, nil).Read().Err
				}},
			}
			for _, u := range units {
				err := u.run()
				var n int
				if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = $1", u.id).Scan(&n); err != nil {
					t.Fatal(err)
				}
				t.Logf("%s: %v", u.name, err)
				if n != 0 || sqlstate(err) != "55F04" {
					t.Errorf("%s: a lone unit whose function writes accounts, on a host in a split brain: %v; rows committed there %d; want FATAL 55F04 and none", u.name, err, n)
				}
			}
			// Reads, and writes to unprotected tables, go on there.
			c := tokenClient(ctx, t, h, 5)
			var n int
			if err := c.QueryRow(ctx, "SELECT count(*) FROM accounts").Scan(&n); err != nil {
				t.Errorf("a read of accounts on the held host: %v", err)
			}
			if _, err := c.Exec(ctx, "INSERT INTO notes VALUES (1)"); err != nil {
				t.Errorf("a write to an unprotected table on the held host: %v", err)
			}
		})
	}
}

// A cursor WITH HOLD that code inside the server declares (a PL/pgSQL function's EXECUTE of a built text, which
// never spells the letters the proxy looks for) runs the rest of its query at the COMMIT, after the lock
// question, which saw no write. From hold59 (2026-12-06; measured by review58 and kept in docs/ha.md until then):
// its write committed on a host in a split brain, in all three transports. Now the COMMIT's write waits behind
// the router's hold, and the proxy ends the session (FATAL 55F04).
func TestServerDeclaredHeldCursorOnARefusedHost(t *testing.T) {
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
			err := tx.Commit(ctx)
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 37").Scan(&n); err != nil {
				t.Fatal(err)
			}
			t.Logf("COMMIT: %v", err)
			if n != 0 || sqlstate(err) != "55F04" {
				t.Errorf("the COMMIT of a transaction whose function declared a cursor WITH HOLD that writes accounts, on a host in a split brain: %v; rows committed there %d, want FATAL 55F04 and none", err, n)
			}
		})
	}
}

// waitingOnLock waits until a backend of the server c is connected to waits for a lock while running a statement
// whose text is stmt.
func waitingOnLock(ctx context.Context, t *testing.T, c *pgx.Conn, stmt, what string) {
	t.Helper()
	eventually(t, 30*time.Second, what, func() bool {
		var n int
		err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND wait_event_type = 'Lock'", stmt).Scan(&n)
		return err == nil && n == 1
	})
}
