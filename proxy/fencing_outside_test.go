package proxy_test

import (
	"testing"
)

// Row 6 of the Semantics table, the applied half: an ON CONFLICT DO UPDATE that updates a row with C <= k (NULL
// counts as 0, equal is accepted) sets C = k, whatever the form: simple or extended protocol, parameters, an
// alias, RETURNING, inside a writable CTE.
func TestFencingOnConflictDoUpdateWritesToken(t *testing.T) {
	f := newFenced(t)
	ctx := ctxT(t)
	f.reset(t, "(1, 100, 30), (2, 100, NULL), (3, 100, 42)")
	c := f.conn(t, "42")
	upsert := "INSERT INTO %[1]s (id, balance) VALUES (1, 5) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance"
	if tag, err := c.Exec(ctx, f.sql(upsert)); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("upsert over token 30 under 42: %v %v", tag, err)
	}
	f.wantToken(t, 1, 42)
	if tag, err := c.Exec(ctx, f.sql("INSERT INTO %[1]s (id, balance) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance"), 2, 6); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("upsert with parameters over a NULL token under 42: %v %v", tag, err)
	}
	f.wantToken(t, 2, 42)
	if tag, err := execExtended(ctx, c, f.sql("INSERT INTO %[1]s AS a (id, balance) VALUES (3, 7) ON CONFLICT (id) DO UPDATE SET balance = a.balance + 1")); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("upsert (extended, alias) over the same token 42: %v %v", tag, err)
	}
	if got := f.snapshot(t); got != "1:5:42 2:6:42 3:101:42" {
		t.Fatalf("rows after upserts under 42: %s", got)
	}

	// A newer holder: RETURNING shows the token written, and so does the row.
	c43 := f.conn(t, "43")
	var tok int64
	if err := c43.QueryRow(ctx, f.sql("INSERT INTO %[1]s (id, balance) VALUES (1, 8) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance RETURNING fence_token")).Scan(&tok); err != nil || tok != 43 {
		t.Fatalf("upsert ... RETURNING fence_token under 43: %d %v", tok, err)
	}
	f.wantToken(t, 1, 43)
	c44 := f.conn(t, "44")
	if err := c44.QueryRow(ctx, f.sql("WITH u AS (INSERT INTO %[1]s (id, balance) VALUES (2, 9), (4, 9) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance RETURNING fence_token) SELECT min(fence_token) FROM u")).Scan(&tok); err != nil || tok != 44 {
		t.Fatalf("upsert in a writable CTE under 44: min token %d %v", tok, err)
	}
	if got := f.snapshot(t); got != "1:8:43 2:9:44 3:101:42 4:9:44" {
		t.Fatalf("rows after upserts under 43 and 44: %s", got)
	}
}

// An INSERT inside a writable CTE whose ON CONFLICT DO UPDATE meets a newer row is stale like the plain form:
// 55F01 in full, no row written (not the CTE's other rows, not the outer statement's), the transaction aborted.
func TestFencingStaleInsertInWritableCTE(t *testing.T) {
	f := newFenced(t)
	ctx := ctxT(t)
	f.reset(t, "(1, 100, 50)")
	before := f.snapshot(t)
	c := f.conn(t, "42")
	for _, q := range []string{
		"WITH i AS (INSERT INTO %[1]s (id, balance) VALUES (1, 5) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance RETURNING *) SELECT count(*) FROM i",
		"WITH i AS (INSERT INTO %[1]s (id, balance) VALUES (2, 1), (1, 5) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance RETURNING id) SELECT count(*) FROM i",
		"WITH src AS (SELECT 1 AS id), i AS (INSERT INTO %[1]s (id, balance) SELECT id, 9 FROM src ON CONFLICT (id) DO UPDATE SET balance = 9 RETURNING id) INSERT INTO %[1]s (id, balance) SELECT id + 10, 0 FROM i",
	} {
		q := f.sql(q)
		_, err := c.Exec(ctx, q)
		wantStale(t, err, f.label, 50, 42)
		_, err = execExtended(ctx, c, q)
		wantStale(t, err, f.label, 50, 42)
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tx.Exec(ctx, q)
		wantStale(t, err, f.label, 50, 42)
		wantAborted(t, ctx, tx)
		f.wantUnchanged(t, before)
	}
}
