package schema_test

import (
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

const statementSetup = `
CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL DEFAULT 0, note text, fence_token bigint);
CREATE TABLE parts (id int PRIMARY KEY, note text, fence_token bigint) PARTITION BY RANGE (id);
CREATE TABLE parts_1 PARTITION OF parts FOR VALUES FROM (0) TO (1000);
INSERT INTO t VALUES (100, 0, 'old', 5);
-- lower sets the token to 1 and returns its argument; inner does that, then writes t itself.
CREATE FUNCTION lower_token(x text) RETURNS text LANGUAGE sql AS $$ SELECT x || left(set_config('fence.token', '1', false), 0) $$;
CREATE FUNCTION inner_write(i int) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	PERFORM set_config('fence.token', '1', false);
	INSERT INTO t (id, note) VALUES (i, 'inner');
	RETURN 'outer';
END $$;
-- caught: a write that fails inside an exception block (a savepoint), then one that succeeds.
CREATE FUNCTION caught(i int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	BEGIN
		INSERT INTO t (id, note) VALUES (i, 'dup'), (i, 'dup');
	EXCEPTION WHEN unique_violation THEN NULL;
	END;
END $$;
`

func statementDB(t *testing.T) string {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, statementSetup)
	cfg := guardConfig(table("t", "fence_token"), table("parts", "fence_token"))
	cfg.Settings.Ceiling = true // as with token verification on
	install(t, su, cfg)
	return db
}

// rowTokens reads id → fence_token of t.
func rowTokens(t *testing.T, db, where string) map[int64]int64 {
	t.Helper()
	rows, err := superConn(t, db).Query(t.Context(), "SELECT id, coalesce(fence_token, -1) FROM t WHERE "+where)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]int64{}
	for rows.Next() {
		var id, tok int64
		if err := rows.Scan(&id, &tok); err != nil {
			t.Fatal(err)
		}
		out[id] = tok
	}
	return out
}

// TestGuardOneTokenPerStatement: the guard checks and stamps the token in force when the statement started,
// whatever the statement does to the setting while it runs (issue 27, item 1), on a direct connection.
func TestGuardOneTokenPerStatement(t *testing.T) {
	db := statementDB(t)
	c := connect(t, db, pgtest.SuperUser, "-c fence.token=10")

	// The attack: a VALUES row lowers the token; both rows are stamped 10.
	exec(t, c, "INSERT INTO t (id, v, note) VALUES (1, 0, set_config('fence.token', '1', false)), (2, 0, 'b')")
	// The set_config did happen: the next statement runs with token 1 (as if SET before it).
	if got := queryInt(t, c, "SELECT current_setting('fence.token')::bigint"); got != 1 {
		t.Fatalf("token after the statement: %d", got)
	}
	exec(t, c, "SET fence.token = 10")
	// A SET list, a function in a WHERE, a partitioned table, ON CONFLICT DO UPDATE.
	exec(t, c, "UPDATE t SET note = lower_token(note) WHERE id IN (1, 2)")
	exec(t, c, "SET fence.token = 10")
	exec(t, c, "INSERT INTO parts VALUES (1, 'a'), (2, lower_token('b')), (3, 'c')")
	exec(t, c, "SET fence.token = 10")
	exec(t, c, "INSERT INTO t (id, note) VALUES (100, 'x') ON CONFLICT (id) DO UPDATE SET note = lower_token(excluded.note)")
	exec(t, c, "SET fence.token = 10")
	// A write inside the statement (a function in a VALUES row that lowers the token and writes t itself):
	// the outermost write's token is the statement's, for the inner write too.
	exec(t, c, "INSERT INTO t (id, note) VALUES (3, inner_write(4)), (5, 'after')")
	want := map[int64]int64{1: 10, 2: 10, 3: 10, 4: 10, 5: 10, 100: 10}
	got := rowTokens(t, db, "true")
	for id, tok := range want {
		if got[id] != tok {
			t.Errorf("row %d holds token %d, want %d (all: %v)", id, got[id], tok, got)
		}
	}
	if n := queryInt(t, superConn(t, db), "SELECT count(*) FROM parts WHERE fence_token <> 10"); n != 0 {
		t.Errorf("%d rows of parts not stamped 10", n)
	}

	// Between statements the token is the session's again, inside one transaction too (the end trigger took
	// the copy back), after a write that failed inside an exception block as well.
	exec(t, c, "SET fence.token = 10")
	exec(t, c, "BEGIN; SELECT caught(6); INSERT INTO t (id, note) VALUES (7, 'a'); SET LOCAL fence.token = 20; INSERT INTO t (id, note) VALUES (8, 'b'); COMMIT")
	if got := rowTokens(t, db, "id IN (6, 7, 8)"); got[7] != 10 || got[8] != 20 || len(got) != 2 {
		t.Fatalf("rows 6..8: %v, want 7:10 8:20", got)
	}
	// A function whose statements write after it set the token: each is a statement of its own and takes the
	// token in force when it starts (as a SET before it would).
	exec(t, c, "SELECT inner_write(9)")
	if got := rowTokens(t, db, "id = 9"); got[9] != 1 {
		t.Fatalf("row 9: %v, want token 1", got)
	}

	// Staleness is checked against the statement's token: a statement that raises the token while it runs
	// still fails on a row holding more than its own.
	exec(t, c, "SET fence.token = 7")
	sql := "UPDATE t SET note = note || left(set_config('fence.token', '50', false), 0) WHERE id = 1"
	wantCode(t, sql, execErr(c, sql), rewrite.CodeStale, "stale fencing token")
	// And a statement that starts without a token fails, even if it sets one while it runs.
	c2 := connect(t, db, pgtest.SuperUser, "")
	sql = "INSERT INTO t (id, note) VALUES (10, set_config('fence.token', '99', false)), (11, 'x')"
	wantCode(t, sql, execErr(c2, sql), rewrite.CodeMissing, "missing fencing token")
}

// TestGuardOneLockPerStatement: with lock fences, the lock is the one named when the statement started.
func TestGuardOneLockPerStatement(t *testing.T) {
	db := statementDB(t)
	c := connect(t, db, pgtest.SuperUser, "-c fence.token=10 -c fence.lock=settle")
	exec(t, c, "INSERT INTO t (id, note) VALUES (1, set_config('fence.lock', 'other', false)), (2, 'b')")
	su := superConn(t, db)
	if m := mark(t, db, "settle"); m != 10 {
		t.Fatalf("mark of settle: %d, want 10", m)
	}
	if n := queryInt(t, su, "SELECT count(*) FROM fenceproxy.lock_marks WHERE name = 'other'"); n != 0 {
		t.Fatalf("lock other got a mark from a statement that started under lock settle")
	}
}

// TestGuardCeiling: with a ceiling row (token verification), no write lands with a token above it, whichever
// path set the token (a user function here), and no lock mark is raised above it.
func TestGuardCeiling(t *testing.T) {
	db := statementDB(t)
	su := superConn(t, db)
	exec(t, su, `CREATE FUNCTION tok(x text) RETURNS text LANGUAGE sql AS $$ SELECT set_config('fence.token', x, false) $$;
CREATE ROLE app LOGIN; GRANT ALL ON t, parts TO app; GRANT EXECUTE ON FUNCTION tok(text) TO app`)
	c := connect(t, db, "app", "-c fence.token=10 -c fence.lock=settle")
	// No ceiling row: verification is off, any valid token writes.
	exec(t, c, "SET fence.lock = early; SELECT tok('999999999'); INSERT INTO t (id, note) VALUES (1, 'a'); SET fence.lock = settle")
	// The application cannot write the ceiling.
	sql := "INSERT INTO fenceproxy.token_ceiling VALUES ('etcd', 9223372036854775807)"
	wantCode(t, sql, execErr(c, sql), "42501", "permission denied")

	exec(t, su, "INSERT INTO fenceproxy.token_ceiling VALUES ('etcd', 1000)")
	for _, sql := range []string{
		"SELECT tok('1001'); INSERT INTO t (id, note) VALUES (2, 'a')",
		"SELECT tok('999999999'); UPDATE t SET note = 'b' WHERE id = 100",
		"SELECT tok('999999999'); DELETE FROM t WHERE id = 100",
		"SELECT tok('999999999'); INSERT INTO parts VALUES (5, 'a')",
		// lock_accept called directly cannot raise a mark above the ceiling either.
		"SELECT tok('999999999'); SELECT fenceproxy.lock_accept('t')",
	} {
		pe := wantCode(t, sql, execErr(c, sql), rewrite.CodeInvalid, "invalid fencing token")
		if pe.Detail == "" || pe.TableName == "" {
			t.Errorf("%s: detail %q table %q", sql, pe.Detail, pe.TableName)
		}
	}
	if n := queryInt(t, su, "SELECT count(*) FROM t WHERE fence_token > 1000 AND id <> 1"); n != 0 {
		t.Fatalf("%d rows hold a token above the ceiling", n)
	}
	if n := queryInt(t, su, "SELECT count(*) FROM fenceproxy.lock_marks WHERE mark > 1000 AND name <> 'early'"); n != 0 {
		t.Fatalf("a lock mark above the ceiling")
	}
	// At the ceiling, writes go on; a raised ceiling admits the newer token.
	exec(t, c, "SELECT tok('1000'); INSERT INTO t (id, note) VALUES (3, 'a')")
	exec(t, su, "UPDATE fenceproxy.token_ceiling SET ceiling = 2000")
	exec(t, c, "SELECT tok('1001'); INSERT INTO t (id, note) VALUES (4, 'a')")
	if got := rowTokens(t, db, "id IN (3, 4)"); got[3] != 1000 || got[4] != 1001 {
		t.Fatalf("rows 3, 4: %v", got)
	}
}
