package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A fenced statement prepared before a split brain (or before the session's host stopped being the primary) and
// run during it is refused as the same text sent then is: 55F04 naming both hosts, and nothing written. The
// router's refusal is judged when a statement is planned; a named statement (extended protocol) or a SQL
// PREPARE planned earlier ran later without it. A Query that may EXECUTE one is refused as a fenced text is; an
// Execute ends the session with FATAL 55F04 before it reaches the server. From a review on 2026-12-05 (attack: a write that reaches a
// node the proxy no longer trusts, through state prepared before the switch).
func TestPreparedFencedWriteRefusedInSplitBrain(t *testing.T) {
	for _, mode := range []struct{ name, yaml string }{
		{"session", ""}, // the event loop relays it
		{"session-goroutines", "relay:\n  mode: goroutines\n"},
		{"transaction", pooledYAML("size: 1")},
	} {
		t.Run(mode.name, func(t *testing.T) {
			h := startHAPairWith(t, nil, "", mode.yaml)
			ctx := haCtx(t)
			// c prepares a named statement, s (another session: each is judged by what it prepared) a SQL one.
			c := connect(t, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
			s := connect(t, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
			for _, conn := range []*pgx.Conn{c, s} {
				if _, err := conn.Exec(ctx, "SET fence.token = 5"); err != nil {
					t.Fatal(err)
				}
			}
			const upd = "UPDATE accounts SET v = $1 WHERE id = 1"
			if _, err := c.Prepare(ctx, "upd", upd); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Exec(ctx, "upd", 1); err != nil {
				t.Fatalf("prepared fenced write before the split brain: %v", err)
			}
			if _, err := s.Exec(ctx, "PREPARE sqlupd(int) AS UPDATE accounts SET v = $1 WHERE id = 1", pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Exec(ctx, "EXECUTE sqlupd(2)", pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Fatalf("SQL-level prepared fenced write before the split brain: %v", err)
			}
			h.splitBrain(ctx, t) // the standby is promoted while the primary runs on: two primaries
			// Each probe on a session of its own: one whose fenced write runs when the split brain begins is ended
			// then (Server.fencedHostsRefused, since review57), and c and s must stay as they were.
			eventually(t, 30*time.Second, "a fenced write to be refused during the split brain", func() bool {
				probe, err := pgx.Connect(ctx, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
				if err != nil {
					return false
				}
				defer probe.Close(ctx)
				if _, err := probe.Exec(ctx, "SET fence.token = 5"); err != nil {
					return false
				}
				_, err = probe.Exec(ctx, "UPDATE accounts SET v = 2 WHERE id = 1", pgx.QueryExecModeSimpleProtocol) // the value it holds: only the runs below write another
				return sqlstate(err) == "55F04"
			})
			for _, w := range []struct {
				what string
				run  func() error
			}{
				// The session goes on after this one (an error of the Query's own).
				{"a SQL PREPARE made before", func() error { _, err := s.Exec(ctx, "EXECUTE sqlupd(4)", pgx.QueryExecModeSimpleProtocol); return err }},
				// The session ends (FATAL): the Execute names a portal in the middle of a batch.
				{"a named statement prepared before", func() error { _, err := c.Exec(ctx, "upd", 4); return err }},
			} {
				err := w.run()
				if sqlstate(err) != "55F04" || !strings.Contains(err.Error(), h.standby.Addr()) {
					t.Errorf("%s, run during the split brain: %v, want 55F04 naming %s", w.what, err, h.standby.Addr())
				}
			}
			if _, err := s.Exec(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Errorf("a read by the session whose EXECUTE was refused: %v", err)
			}
			old := connect(t, h.primary.SuperDSN())
			var v int
			if err := old.QueryRow(ctx, "SELECT v FROM accounts WHERE id = 1").Scan(&v); err != nil {
				t.Fatal(err)
			}
			if v != 2 {
				t.Errorf("accounts.v on the published primary is %d after the split brain began, want 2 (no fenced write)", v)
			}
		})
	}
}
