package schema_test

import (
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

// TestGuardUnderClientOnlyEncodings: sessions whose client_encoding is one PostgreSQL accepts only from clients
// (SJIS, BIG5, GBK, UHC, GB18030, JOHAB) write guarded tables. PL/pgSQL compiles the guard function in the
// session that first calls it, with that session's client_encoding, and under the default backslash_quote
// (safe_encoding) the scanner refuses \' in a literal there (22P06): the generated bodies must double quotes instead.
// Each encoding gets new sessions, so the function is compiled under it; the stale write shows the 55F01 HINT
// (it holds an apostrophe) arrives whole.
func TestGuardUnderClientOnlyEncodings(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL DEFAULT 0, fence_token bigint); INSERT INTO accounts VALUES (1, 0, 42)")
	install(t, su, guardConfig(table("accounts", "fence_token")))
	_, _, staleHint := rewrite.Marker{Code: rewrite.CodeStale, Table: "accounts", RowToken: "42", Token: "41"}.Describe()
	for _, enc := range []string{"SJIS", "BIG5", "GBK", "UHC", "GB18030", "JOHAB"} {
		fresh := connect(t, db, pgtest.SuperUser, "-c fence.token=42")
		exec(t, fresh, "SET client_encoding = '"+enc+"'")
		if err := execErr(fresh, "UPDATE accounts SET balance = balance + 1 WHERE id = 1"); err != nil {
			t.Errorf("%s: a write with the row's own token: %v", enc, err)
		}
		stale := connect(t, db, pgtest.SuperUser, "-c fence.token=41")
		exec(t, stale, "SET client_encoding = '"+enc+"'")
		pe := wantCode(t, enc+": a stale write", execErr(stale, "UPDATE accounts SET balance = 0 WHERE id = 1"), rewrite.CodeStale, "stale fencing token")
		if pe.Hint != staleHint {
			t.Errorf("%s: hint %q, want %q", enc, pe.Hint, staleHint)
		}
	}
	if got := queryInt(t, su, "SELECT balance FROM accounts WHERE id = 1"); got != 6 {
		t.Errorf("balance %d after six fresh writes, want 6", got)
	}
}
