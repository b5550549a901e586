package proxy_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// A text that may name SQL-level prepared statements and that the proxy cannot map (here: a backslash under
// standard_conforming_strings off, which the mapping cannot read as the server does) is refused with 55F04, by
// the simple and the extended protocol: sent as it is, its names were the shared server connection's own, and
// EXECUTE of the proxy's settings statement (fenceproxy_c, set_config at session level of whatever it is given)
// gave a client without a token one that no SET of its set (past token.scope and verification), and a write
// landed with it. The name of the setting is spelled so that nothing in the text names it. Before 2026-12-05
// the EXECUTE ran, SHOW gave 98 and the write was UPDATE 1 "98". A text that, read as the server reads it,
// uses no names (the words in a string) goes as it is.
func TestPooledUnmappableTextIsRefused(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
	upd := "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1 RETURNING fence_token"
	victim := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	hostile := pooledPgConn(t, f, "")
	step := func(c *pgconn.PgConn, sql, want string) {
		t.Helper()
		if got := simpleOutcome(ctx, c, sql); got != want {
			t.Fatalf("%s\n got  %s\n want %s", sql, got, want)
		}
	}
	// The hostile client's settings differ from the victim's: each transaction of either first puts its own
	// on the one server connection by the proxy's settings statement, which is then there.
	step(hostile, "SET standard_conforming_strings = off", "SET; ")
	step(victim, "SELECT 1", `SELECT 1 "1"; `)
	step(hostile, `SELECT 'a\\b'; EXECUTE fenceproxy_c(ARRAY[concat('fen', 'ce.token')], ARRAY['98'])`, "ERROR 55F04")
	step(hostile, "SHOW fence.token", `SHOW ""; `)
	step(hostile, upd, "ERROR 55F02")
	step(victim, "SELECT 1", `SELECT 1 "1"; `)
	// The extended protocol: one statement in a Parse, the backslash in a comment.
	_, err := hostile.ExecParams(ctx, `EXECUTE fenceproxy_c(ARRAY[concat('fen', 'ce.token')], ARRAY['97']) -- \`, nil, nil, nil, nil).Close()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "55F04" {
		t.Fatalf("EXECUTE of the settings statement by a Parse: %v", err)
	}
	step(hostile, "SHOW fence.token", `SHOW ""; `)
	step(hostile, upd, "ERROR 55F02")
	step(victim, upd, `UPDATE 1 "5"; `)
	// A text that uses no names, read as the server reads it (the word in a string), goes as it is.
	step(hostile, `SELECT 'no EXECUTE here: a\\b'`, `SELECT 1 "no EXECUTE here: a\\b"; `)
	rr := hostile.ExecParams(ctx, `SELECT 'EXECUTE fenceproxy_c: a\\b'`, nil, nil, nil, nil).Read()
	if rr.Err != nil || len(rr.Rows) != 1 || string(rr.Rows[0][0]) != `EXECUTE fenceproxy_c: a\b` {
		t.Fatalf("a Parse that uses no names: %v %q", rr.Err, rr.Rows)
	}
	f.wantToken(t, 1, 5)
}

// The proxy's own statement names in the spellings a readable text may give them (quoted, U& with and without
// UESCAPE, upper case folded, in EXPLAIN) are mapped to a name nothing holds, whichever statement of the
// proxy's is on the server connection (fenceproxy_c, the settings statement, after another client's settings
// were put there): EXECUTE and DEALLOCATE get 26000, nothing runs and nothing is dropped, and the client's
// token stays what it set (none).
func TestPooledProxyNameSpellingsAreNotTheClients(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	other := pooledPgConn(t, f, "")
	hostile := pooledPgConn(t, f, "")
	step := func(c *pgconn.PgConn, sql, want string) {
		t.Helper()
		if got := simpleOutcome(ctx, c, sql); got != want {
			t.Fatalf("%s\n got  %s\n want %s", sql, got, want)
		}
	}
	step(other, "SET work_mem = '5MB'", "SET; ")
	args := `(ARRAY[concat('fen', 'ce.token')], ARRAY['95'])`
	for _, sql := range []string{
		`EXECUTE "fenceproxy_c"` + args,
		`EXECUTE FENCEPROXY_C` + args,
		`EXECUTE U&"\0066enceproxy_c"` + args,
		`EXECUTE U&"!0066enceproxy_c" UESCAPE '!'` + args,
		`EXPLAIN (COSTS OFF) EXECUTE fenceproxy_c` + args,
		`DEALLOCATE "fenceproxy_c"`,
		`DEALLOCATE PREPARE U&"\0066enceproxy_c"`,
	} {
		step(other, "SELECT 1", `SELECT 1 "1"; `) // the connection's settings are the other client's again
		step(hostile, sql, "ERROR 26000")
		step(hostile, "SHOW fence.token", `SHOW ""; `)
	}
	step(other, "SELECT count(*) FROM pg_prepared_statements WHERE name = 'fenceproxy_c'", `SELECT 1 "1"; `)
}
