package proxy_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// A client turns standard_conforming_strings off on its pooled server connection where the proxy does not
// look: dynamic SQL in a DO block (the same in a function), no word of the probe's in the text, a tag (DO) that
// says nothing. The server reports the change (ParameterStatus) to that client only. The connection's next
// client has the setting on, as the proxy reads its texts, and the server reads them with it off: a text that,
// read with it on, is a SELECT of two strings (what an application that escapes quotes by doubling them sends
// for a value holding a backslash) runs, read with it off, an UPDATE of a protected table that the proxy never
// fenced (no token: directly 55F02, and through the proxy, as read, no write at all). On 2026-12-05 the UPDATE
// ran unfenced (balance 1, fence_token as it was) and the next client read the setting as off. The contract:
// the proxy reads SQL as the server will; docs/pooling.md: standard_conforming_strings is the client's before
// the server lexes the client's text.
func TestPooledHiddenStandardConformingStringsNeverReachesTheNextClient(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token, balance) VALUES (1, 1, 0)")
	hostile := pooledPgConn(t, f, "")
	victim := pooledPgConn(t, f, "")
	step := func(c *pgconn.PgConn, sql, want string) {
		t.Helper()
		if got := simpleOutcome(ctx, c, sql); got != want {
			t.Errorf("%s\n got  %s\n want %s", sql, got, want)
		}
	}
	step(hostile, "DO $b$BEGIN EXECUTE 'SET standard_conforming_strings = off'; END$b$", "DO; ")
	step(victim, "SHOW standard_conforming_strings", `SHOW "on"; `)
	sql := `SELECT 'a\', '; UPDATE ` + f.label + ` SET balance = balance + 1 WHERE id = 1; --'`
	got := simpleOutcome(ctx, victim, sql)
	var balance int
	if err := f.d.QueryRow(ctx, "SELECT balance FROM "+f.label+" WHERE id = 1").Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if balance != 0 {
		t.Errorf("a write to the protected table ran unfenced, read by the server as the proxy did not read it: %s (balance %d)", got, balance)
	}
	f.wantToken(t, 1, 1)
}

// The same change seen from the client that made it: the server told it (ParameterStatus), so the proxy reads
// its texts with the setting off, and its next transaction goes to another server connection (the first is
// held by a client in a block), where the setting is on. The connection must read the client's text as the
// proxy does: read with it off, the text is a SELECT of one string; with it on, an UPDATE of a protected table
// follows, which the proxy never fenced.
func TestPooledHiddenStandardConformingStringsFollowTheClient(t *testing.T) {
	f := newPooledFenced(t, 2, "")
	ctx := ctxT(t)
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token, balance) VALUES (1, 1, 0)")
	hostile := pooledPgConn(t, f, "")
	holder := pooledPgConn(t, f, "")
	first := simpleOutcome(ctx, hostile, "DO $b$BEGIN EXECUTE 'SET standard_conforming_strings = off'; END$b$; SELECT pg_backend_pid()")
	held := simpleOutcome(ctx, holder, "BEGIN; SELECT pg_backend_pid()")
	if "BEGIN; "+first[len("DO; "):] != held {
		t.Fatalf("the holder is not on the first connection: %s, %s", first, held)
	}
	sql := `SELECT 'a\'; UPDATE ` + f.label + ` SET balance = balance + 1 WHERE id = 1; --'`
	got := simpleOutcome(ctx, hostile, sql)
	simpleOutcome(ctx, holder, "ROLLBACK")
	var balance int
	if err := f.d.QueryRow(ctx, "SELECT balance FROM "+f.label+" WHERE id = 1").Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if balance != 0 {
		t.Errorf("a write to the protected table ran unfenced, read by the server as the proxy did not read it: %s (balance %d)", got, balance)
	}
	f.wantToken(t, 1, 1)
}

// client_encoding changed by dynamic SQL the same way: the next client's UTF-8 text is read by the server in
// the client's encoding, as the proxy reads it, never in the one the other client left (LATIN1, where é would
// be two characters).
func TestPooledHiddenClientEncodingNeverReachesTheNextClient(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx := ctxT(t)
	hostile := pooledPgConn(t, f, "")
	victim := pooledPgConn(t, f, "")
	if got := simpleOutcome(ctx, hostile, "DO $b$BEGIN EXECUTE 'SET client_encoding = LATIN1'; END$b$"); got != "DO; " {
		t.Fatalf("the DO block: %s", got)
	}
	if got := simpleOutcome(ctx, victim, "SELECT length('é') || ' ' || current_setting('client_encoding')"); got != `SELECT 1 "1 UTF8"; ` {
		t.Errorf("the next client's text was read in another encoding: %s", got)
	}
}
