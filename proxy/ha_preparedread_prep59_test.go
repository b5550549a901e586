package proxy_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// TestReadHoldingPreparedOnARefusedHost: during a split brain a text that may end a prepared transaction is
// judged as a fenced write (55F04), and only such a text: the keywords COMMIT or ROLLBACK then PREPARED as the
// server reads them (rewrite.CommitsPrepared), not the letters. Until 2026-12-06 any text holding them was
// refused there as a write, reads of a column prepared_at, of pg_prepared_xacts or of a string 'prepared' too,
// and in session mode a Parse of such a read ended the session at its Execute (FATAL 55F04), while every other
// read went on. Both kinds are sent through the simple and the extended protocol in one session each.
func TestReadHoldingPreparedOnARefusedHost(t *testing.T) {
	reads := []string{
		"SELECT count(*) AS prepared_at FROM pg_prepared_xacts",
		"SELECT 'COMMIT PREPARED x' AS prepared /* COMMIT PREPARED */",
		`SELECT 1 AS "COMMIT", 2 AS prepared`,
	}
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h := startHAPairWith(t, nil, "", mode.yaml)
			ctx := haCtx(t)
			h.splitBrain(ctx, t)
			for _, exec := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
				c := connect(t, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
				for _, q := range reads {
					if _, err := c.Exec(ctx, q, exec); err != nil {
						t.Errorf("%v: a read holding the letters prepared during a split brain: %q: %v; want it answered", exec, q, err)
					}
				}
				if mode.name == "transaction" {
					continue // a pooled COMMIT PREPARED waits for the next primary (TestCommitPreparedRefusedOnAWithdrawnPrimary)
				}
				// The statement itself is still refused: nothing prepared is named, so it would fail on the server
				// (42704) if the proxy let it go.
				_, err := c.Exec(ctx, "/* two-phase */ Rollback\n\tPrepared 'fp59'", exec)
				if sqlstate(err) != "55F04" {
					t.Errorf("%v: ROLLBACK PREPARED during a split brain: %v; want 55F04", exec, err)
				}
			}
		})
	}
}
