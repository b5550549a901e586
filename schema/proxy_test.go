package schema_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

// TestGuardSameErrorsAsProxy: for the same refused write, the proxy's rewrite (no guard installed) and the
// guard (a direct connection) send the same SQLSTATE, message, DETAIL and HINT; through the proxy with the
// guard installed the client sees them too. Legitimate fenced writes through the proxy still pass, and the
// guard's own errors pass through the proxy unchanged and are counted.
func TestGuardSameErrorsAsProxy(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, `CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL DEFAULT 0, fence_token bigint);
INSERT INTO accounts VALUES (1, 0, 42), (2, 0, 42);
CREATE FUNCTION settle() RETURNS void LANGUAGE sql AS 'UPDATE accounts SET balance = 0';`)
	p := proxytest.Start(t, pg.Addr(), proxytest.Options{YAML: "tables:\n  - name: accounts\n    token_column: fence_token\n"})
	proxyConn := func(options string) *pgx.Conn {
		cfg, err := pgx.ParseConfig(p.DSN(pgtest.SuperUser, "", db))
		if err != nil {
			t.Fatal(err)
		}
		if options != "" {
			cfg.RuntimeParams["options"] = options
		}
		c, err := pgx.ConnectConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	cases := []struct{ name, options, sql, code string }{
		{"stale UPDATE", "-c fence.token=41", "UPDATE accounts SET balance = 1 WHERE id = 1", rewrite.CodeStale},
		{"stale DELETE", "-c fence.token=0041", "DELETE FROM accounts WHERE id = 2", rewrite.CodeStale},
		{"stale upsert", "-c fence.token=41", "INSERT INTO accounts (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET balance = 2", rewrite.CodeStale},
		{"no token", "", "UPDATE accounts SET balance = 1 WHERE id = 1", rewrite.CodeMissing},
		{"no token INSERT", "", "INSERT INTO accounts (id) VALUES (7)", rewrite.CodeMissing},
		{"invalid token", "", "SELECT set_config('fence.token', '4' || 'x2', false); UPDATE accounts SET balance = 1 WHERE id = 1", rewrite.CodeInvalid},
		{"token out of range", "", "SELECT set_config('fence.token', '9223372036854775' || '808', false); DELETE FROM accounts", rewrite.CodeInvalid},
	}
	run := func(c *pgx.Conn, sql string) *pgconn.PgError {
		err := execErr(c, sql)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			t.Fatalf("%s: want a server error, got %v", sql, err)
		}
		return pe
	}
	same := func(what string, a, b *pgconn.PgError) {
		t.Helper()
		if a.Code != b.Code || a.Message != b.Message || a.Detail != b.Detail || a.Hint != b.Hint {
			t.Errorf("%s differ:\n  %s %q / %q / %q\n  %s %q / %q / %q", what, a.Code, a.Message, a.Detail, a.Hint, b.Code, b.Message, b.Detail, b.Hint)
		}
	}
	var fromProxy []*pgconn.PgError
	for _, c := range cases {
		pe := run(proxyConn(c.options), c.sql)
		if pe.Code != c.code {
			t.Fatalf("%s through the proxy: %s %s", c.name, pe.Code, pe.Message)
		}
		fromProxy = append(fromProxy, pe)
	}

	install(t, su, guardConfig(table("accounts", "fence_token")))
	for i, c := range cases {
		same(c.name+": proxy (no guard) vs guard (direct)", fromProxy[i], run(connect(t, db, pgtest.SuperUser, c.options), c.sql))
		same(c.name+": proxy (no guard) vs proxy with guard", fromProxy[i], run(proxyConn(c.options), c.sql))
	}

	// The guard's errors for writes the proxy cannot see pass through it unchanged, and are counted.
	stale := proxyConn("-c fence.token=41")
	before := counter(t, p, "fenceproxy_stale_rejections_total", "table", "accounts")
	pe := run(stale, "SELECT settle()")
	same("in-server write through the proxy", fromProxy[0], &pgconn.PgError{Code: pe.Code, Message: pe.Message, Detail: pe.Detail, Hint: pe.Hint})
	if after := counter(t, p, "fenceproxy_stale_rejections_total", "table", "accounts"); after != before+1 {
		t.Errorf("stale rejections of accounts: %v -> %v, want +1", before, after)
	}

	// Legitimate fenced writes through the proxy pass with the guard installed, in both protocols.
	fresh := proxyConn("-c fence.token=43")
	exec(t, fresh, `UPDATE accounts SET balance = 5 WHERE id = 1; INSERT INTO accounts (id, balance) VALUES (3, 1), (4, 1);
INSERT INTO accounts (id) VALUES (5) ON CONFLICT (id) DO UPDATE SET balance = 3; DELETE FROM accounts WHERE id = 2`)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := fresh.Exec(ctx, "UPDATE accounts SET balance = $1 WHERE id = $2", 9, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Exec(ctx, "INSERT INTO accounts (id, balance) VALUES ($1, $2)", 6, 1); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, su, "SELECT count(*) FROM accounts WHERE fence_token = 43"); n != 5 {
		t.Fatalf("rows written with token 43: %d, want 5", n)
	}
	if n := queryInt(t, su, "SELECT count(*) FROM accounts"); n != 5 {
		t.Fatalf("rows: %d, want 5", n)
	}
}

// counter reads the counter name{label="value"} from the proxy's registry.
func counter(t *testing.T, p *proxytest.Proxy, name, label, value string) float64 {
	t.Helper()
	mfs, err := p.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestLockFencesThroughProxy: a session that names a lock, through the proxy, in a database without the
// fenceproxy schema gets row fencing (fenceproxy lock names the lock for every writer), except on a
// require_lock table, where it is refused (55F04), never fenced by rows only; require_lock without a lock
// gives the guard's 55F02 text; with the schema installed lock fences hold through the proxy, and tokens
// without a lock behave as before.
func TestLockFencesThroughProxy(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	exec(t, su, `CREATE TABLE transfers (id int PRIMARY KEY, amount int, fence_token bigint);
CREATE TABLE strict (id int PRIMARY KEY, fence_token bigint);`)
	p := proxytest.Start(t, pg.Addr(), proxytest.Options{YAML: "tables:\n  - name: transfers\n    token_column: fence_token\n" +
		"  - name: strict\n    token_column: fence_token\n    require_lock: true\n"})
	proxyConn := func(options string) *pgx.Conn {
		cfg, err := pgx.ParseConfig(p.DSN(pgtest.SuperUser, "", db))
		if err != nil {
			t.Fatal(err)
		}
		if options != "" {
			cfg.RuntimeParams["options"] = options
		}
		c, err := pgx.ConnectConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	locked := proxyConn("-c fence.token=41 -c fence.lock=settle")
	wantCode(t, "require_lock table (lock, no schema)", execErr(locked, "INSERT INTO strict (id) VALUES (1)"), rewrite.CodeUnfenceable,
		"unfenceable write: this session names lock settle in fence.lock, but this database has no lock fences")
	// Row fencing only, as without a lock: the row gets the token, and an older token is refused by the row.
	exec(t, locked, "INSERT INTO transfers (id) VALUES (1); UPDATE transfers SET amount = 1; DELETE FROM transfers; INSERT INTO transfers (id) SELECT 2; DELETE FROM transfers")
	plain := proxyConn("-c fence.token=41")
	exec(t, plain, "INSERT INTO transfers (id) VALUES (1); UPDATE transfers SET amount = 2")
	proxyMissing := wantCode(t, "require_lock through the proxy", execErr(plain, "INSERT INTO strict (id) VALUES (1)"), rewrite.CodeMissing,
		"missing fencing token: writes to strict need fence.lock to be set")

	strict := table("strict", "fence_token")
	strict.RequireLock = true
	install(t, su, guardConfig(table("transfers", "fence_token"), strict))
	guardMissing := wantCode(t, "require_lock in the guard", execErr(connect(t, db, pgtest.SuperUser, "-c fence.token=41"), "INSERT INTO strict (id) VALUES (1)"),
		rewrite.CodeMissing, "missing fencing token")
	if proxyMissing.Message != guardMissing.Message || proxyMissing.Hint != guardMissing.Hint || proxyMissing.Detail != guardMissing.Detail {
		t.Errorf("require_lock: proxy %q/%q, guard %q/%q", proxyMissing.Message, proxyMissing.Hint, guardMissing.Message, guardMissing.Hint)
	}

	exec(t, locked, "INSERT INTO transfers (id) VALUES (3); INSERT INTO strict (id) VALUES (1)")
	newer := proxyConn("-c fence.token=42 -c fence.lock=settle")
	exec(t, newer, "INSERT INTO transfers (id) VALUES (4)")
	for _, sql := range []string{"INSERT INTO transfers (id) VALUES (5)", "UPDATE transfers SET amount = 3 WHERE id = 1", "DELETE FROM transfers WHERE id = 3"} {
		pe := wantCode(t, sql+" (stale lock)", execErr(locked, sql), rewrite.CodeStale, "stale fencing token: lock settle has accepted a newer token; refusing the write to transfers")
		if pe.Detail != "Lock settle has accepted fencing token 42; this session presented token 41." {
			t.Errorf("detail %q", pe.Detail)
		}
	}
	if n := counter(t, p, "fenceproxy_lock_stale_rejections_total", "lock", "settle"); n != 3 {
		t.Errorf("lock stale rejections of settle: %v, want 3", n)
	}
	// No lock: row fencing as before (row 1 was written with 41, so 41 may write it again).
	exec(t, plain, "UPDATE transfers SET amount = 4 WHERE id = 1; INSERT INTO transfers (id) VALUES (6)")
	if n := queryInt(t, su, "SELECT count(*) FROM transfers"); n != 4 {
		t.Fatalf("transfers: %d rows, want 4", n)
	}
}
