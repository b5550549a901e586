package proxy_test

// fenceproxy with a real pgbouncer, in front of it and behind it, in session and transaction pool mode, with
// token.scope session and transaction (docs/poolers.md). Every pgbouncer has one server connection per user and
// database, so consecutive clients share it: what one client leaves on it, the next one gets.

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgbouncertest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// pooled is one arrangement of client, pgbouncer, fenceproxy and PostgreSQL.
type pooled struct {
	d     *pgx.Conn
	table string
	dsn   string // where the application connects
}

// newPooled builds the chain: in front (client -> pgbouncer -> fenceproxy -> PostgreSQL) or behind (client ->
// fenceproxy -> pgbouncer -> PostgreSQL), with pgbouncer in mode and the proxy's token.scope.
func newPooled(t *testing.T, inFront bool, mode, scope string) *pooled {
	t.Helper()
	d := direct(t)
	name := fxName(t, "pl")
	fxCreateTable(t, d, "public."+name)
	fxExec(t, d, "INSERT INTO public."+name+" (id, balance, fence_token) VALUES (1, 0, 3)")
	yaml := fxTables("public."+name) + "token:\n  scope: " + scope + "\n"
	pl := &pooled{d: d, table: "public." + name}
	if inFront {
		p := startProxy(t, proxytest.Options{YAML: yaml})
		b := pgbouncertest.Start(t, pgbouncertest.Options{Upstream: p.Addr, PoolMode: mode})
		pl.dsn = b.DSN(pgtest.SuperUser, pgtest.TestDB)
	} else {
		pgtest.Require(t, pg)
		b := pgbouncertest.Start(t, pgbouncertest.Options{Upstream: pg.Addr(), PoolMode: mode})
		// Without upstream reuse: a kept connection would hold pgbouncer's one server connection (in session
		// mode) while the next client's new one waits for it.
		p := proxytest.Start(t, b.Addr, proxytest.Options{YAML: yaml, Upstream: "  reuse:\n    max_idle: 0\n"})
		pl.dsn = p.DSN(pgtest.SuperUser, "", pgtest.TestDB)
	}
	// pgbouncer 1.18 keeps no prepared statements across transactions: the simple protocol everywhere.
	pl.dsn += "&default_query_exec_mode=simple_protocol"
	return pl
}

func (pl *pooled) client(t *testing.T) *pgx.Conn {
	t.Helper()
	return connect(t, pl.dsn)
}

func (pl *pooled) token(t *testing.T) int64 {
	t.Helper()
	var tok int64
	if err := pl.d.QueryRow(ctxT(t), "SELECT fence_token FROM "+pl.table+" WHERE id = 1").Scan(&tok); err != nil {
		t.Fatal(err)
	}
	return tok
}

func (pl *pooled) update(ctx context.Context, c *pgx.Conn) error {
	_, err := c.Exec(ctx, "UPDATE "+pl.table+" SET balance = balance + 1 WHERE id = 1")
	return err
}

// localWrite writes in a transaction with SET LOCAL of tok and checks the row then holds tok.
func (pl *pooled) localWrite(t *testing.T, c *pgx.Conn, tok int64) {
	t.Helper()
	ctx := ctxT(t)
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL fence.token = %d", tok)); err != nil {
		t.Fatalf("SET LOCAL: %v", err)
	}
	if err := pl.update(ctx, tx.Conn()); err != nil {
		t.Fatalf("write after SET LOCAL: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := pl.token(t); got != tok {
		t.Fatalf("row token %d after a SET LOCAL write with %d", got, tok)
	}
}

// leakAttack: client 1 sets a session token; client 2, with no token, writes. It returns client 2's error.
func (pl *pooled) leakAttack(t *testing.T) (setErr, writeErr error) {
	t.Helper()
	ctx := ctxT(t)
	c1, c2 := pl.client(t), pl.client(t)
	_, setErr = c1.Exec(ctx, "SET fence.token = 42")
	writeErr = pl.update(ctx, c2)
	return setErr, writeErr
}

// TestPoolerTransactionModeInFront (a): pgbouncer in transaction mode in front of fenceproxy. With scope session
// a session token leaks to the next client of the pooled connection (issue 11's attack); with scope transaction
// it is refused and SET LOCAL works.
func TestPoolerTransactionModeInFront(t *testing.T) {
	t.Run("scope=session", func(t *testing.T) {
		pl := newPooled(t, true, pgbouncertest.Transaction, "session")
		setErr, writeErr := pl.leakAttack(t)
		if setErr != nil || writeErr != nil {
			t.Fatalf("the leak this deployment is exposed to did not happen: SET %v, write %v", setErr, writeErr)
		}
		if got := pl.token(t); got != 42 {
			t.Fatalf("row token %d; the tokenless client should have written with the leaked 42", got)
		}
	})
	t.Run("scope=transaction", func(t *testing.T) {
		pl := newPooled(t, true, pgbouncertest.Transaction, "transaction")
		setErr, writeErr := pl.leakAttack(t)
		wantCodeHint(t, "session SET behind a transaction pooler", setErr, "55F03", "SET LOCAL")
		wantCodeHint(t, "tokenless write", writeErr, "55F02", "")
		if got := pl.token(t); got != 3 {
			t.Fatalf("row token %d, want 3 untouched", got)
		}
		c := pl.client(t)
		pl.localWrite(t, c, 42)
		// The local token ended with its transaction: the next client (or the same one) has none.
		wantCodeHint(t, "write after the transaction", pl.update(ctxT(t), pl.client(t)), "55F02", "")
	})
}

// TestPoolerSessionModeInFront (b): pgbouncer in session mode in front of fenceproxy: both scopes work, and
// pgbouncer's DISCARD ALL between clients ends a session token with its client.
func TestPoolerSessionModeInFront(t *testing.T) {
	t.Run("scope=session", func(t *testing.T) {
		pl := newPooled(t, true, pgbouncertest.Session, "session")
		ctx := ctxT(t)
		c1 := pl.client(t)
		fxExec(t, c1, "SET fence.token = 42")
		if err := pl.update(ctx, c1); err != nil {
			t.Fatalf("write with a session token: %v", err)
		}
		c1.Close(ctx)
		c2 := pl.client(t) // same server connection, after pgbouncer's DISCARD ALL
		wantCodeHint(t, "next client's tokenless write", pl.update(ctx, c2), "55F02", "")
		if got := pl.token(t); got != 42 {
			t.Fatalf("row token %d, want 42", got)
		}
	})
	t.Run("scope=transaction", func(t *testing.T) {
		pl := newPooled(t, true, pgbouncertest.Session, "transaction")
		c := pl.client(t)
		_, err := c.Exec(ctxT(t), "SET fence.token = 42")
		wantCodeHint(t, "session SET", err, "55F03", "SET LOCAL")
		pl.localWrite(t, c, 43)
	})
}

// TestPoolerTransactionModeBehind (c): fenceproxy in front of pgbouncer in transaction mode. The proxy's sessions
// share pgbouncer's server connection just as applications would: scope session leaks, scope transaction refuses
// session tokens and SET LOCAL works.
func TestPoolerTransactionModeBehind(t *testing.T) {
	t.Run("scope=session", func(t *testing.T) {
		pl := newPooled(t, false, pgbouncertest.Transaction, "session")
		setErr, writeErr := pl.leakAttack(t)
		if setErr != nil || writeErr != nil || pl.token(t) != 42 {
			t.Fatalf("the leak this deployment is exposed to did not happen: SET %v, write %v, token %d", setErr, writeErr, pl.token(t))
		}
	})
	t.Run("scope=transaction", func(t *testing.T) {
		pl := newPooled(t, false, pgbouncertest.Transaction, "transaction")
		setErr, writeErr := pl.leakAttack(t)
		wantCodeHint(t, "session SET in front of a transaction pooler", setErr, "55F03", "SET LOCAL")
		wantCodeHint(t, "tokenless write", writeErr, "55F02", "")
		pl.localWrite(t, pl.client(t), 42)
		wantCodeHint(t, "write after the transaction", pl.update(ctxT(t), pl.client(t)), "55F02", "")
	})
}

// TestPoolerSessionModeBehind (d): fenceproxy in front of pgbouncer in session mode: both scopes work.
func TestPoolerSessionModeBehind(t *testing.T) {
	t.Run("scope=session", func(t *testing.T) {
		pl := newPooled(t, false, pgbouncertest.Session, "session")
		ctx := ctxT(t)
		c1 := pl.client(t)
		fxExec(t, c1, "SET fence.token = 42")
		if err := pl.update(ctx, c1); err != nil {
			t.Fatalf("write with a session token: %v", err)
		}
		c1.Close(ctx)
		wantCodeHint(t, "next client's tokenless write", pl.update(ctx, pl.client(t)), "55F02", "")
		if got := pl.token(t); got != 42 {
			t.Fatalf("row token %d, want 42", got)
		}
	})
	t.Run("scope=transaction", func(t *testing.T) {
		pl := newPooled(t, false, pgbouncertest.Session, "transaction")
		c := pl.client(t)
		_, err := c.Exec(ctxT(t), "SET fence.token = 42")
		wantCodeHint(t, "session SET", err, "55F03", "SET LOCAL")
		pl.localWrite(t, c, 43)
	})
}
