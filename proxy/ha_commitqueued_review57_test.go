package proxy_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A COMMIT the client pipelined behind a statement of a fenced transaction, while the host was still the only
// primary, does not commit there once that host is no longer trusted with fenced writes (two primaries, then the
// old one withdrawn while the barrier runs on the new one) before the statement ahead of it ends. From review57
// (2026-12-05, attack: a message already on its way before the change). fencedTxRefused judges a message when
// the proxy reads it from the client. In transaction pooling the proxy holds the COMMIT until the statement
// before it is answered and the core judges it again as it goes (onClientMsg): refused (held). In session mode
// the COMMIT went to the server at once, waited there behind the statement, committed on the withdrawn primary
// when the statement ended, and the client was told COMMIT: a write the new primary never sees. Now the router's
// change ends such a session at once (Server.fencedHostsRefused), cancelling what runs first.
func TestQueuedCommitRefusedOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) { queuedCommit(t, mode.yaml) })
	}
}

func queuedCommit(t *testing.T, yaml string) {
	h, admin := startBarrierPair(t, yaml, nil)
	ctx := haCtx(t)
	c, lock := fencedTxBesideALockedTable(ctx, t, h, admin)
	// Both sent while the host is the only primary: the SELECT waits for the lock, the COMMIT behind it.
	tags, codes := commitQueuedAcrossAWithdrawal(ctx, t, h, admin, c, lock, "SELECT count(*) FROM notes", "%SELECT count(*) FROM notes")
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 2 AND v = 7").Scan(&n); err != nil {
		t.Fatal(err)
	}
	committed := false
	for _, tag := range tags {
		committed = committed || tag == "COMMIT"
	}
	if n != 0 || committed || len(codes) == 0 {
		t.Errorf("a COMMIT queued behind a running statement, the host withdrawn meanwhile: tags %q, errors %q, rows committed on the old primary %d; want no COMMIT, a FATAL and none", tags, codes, n)
	}
	// 57014: the proxy cancelled the statement ahead of the COMMIT (transaction pooling, where the connection
	// stays open for the server's answers: the cancel, then ROLLBACK for the COMMIT); session mode shuts the
	// connection, then cancels (08007). Both end the transaction there.
	if len(codes) > 0 && codes[0] != "55F04" && codes[0] != "08007" && codes[0] != "57014" {
		t.Errorf("refused with %q, want 55F04, 08007 or 57014", codes)
	}
}

// A fenced write in an implicit transaction (a lone UPDATE) that waits for a row lock on the primary when the
// router stops trusting the host must not commit there and be acknowledged once the lock is released: its
// commit is the end of its own statement, sent while the host was trusted. From review57 (2026-12-05, attack:
// a message already at the server before the change): every mode acknowledged UPDATE 1 and the row stayed on
// the old primary. Session mode holds since Server.fencedHostsRefused (57014), transaction pooling since that
// hook cancels what the client's lent connection runs there (cancelLent, under the session's lock, so never a
// connection lent on to another client meanwhile).
func TestInFlightFencedWriteOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		t.Run(mode.name, func(t *testing.T) {
			h, admin := startBarrierPair(t, mode.yaml, nil)
			ctx := haCtx(t)
			c := tokenClient(ctx, t, h, 5)
			lock := beginWith(ctx, t, connect(t, h.primary.SuperDSN()), "SELECT 1 FROM accounts WHERE id = 2 FOR UPDATE")
			pc := c.PgConn()
			fe := pc.Frontend()
			fe.Send(&pgproto3.Query{String: "UPDATE accounts SET v = 7 WHERE id = 2"})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "the UPDATE to wait for the row lock", func() bool {
				var n int
				err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%accounts%' AND query NOT LIKE '%pg_stat_activity%' AND wait_event_type = 'Lock'").Scan(&n)
				return err == nil && n == 1
			})
			h.splitBrain(ctx, t)
			hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
			if err := lock.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			tags, codes := tagsAndCodesUntilReady(pc, 1)
			t.Logf("tags %q, errors %q", tags, codes)
			if err := hold.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 2 AND v = 7").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if len(codes) == 0 {
				t.Errorf("a fenced UPDATE waiting on the withdrawn primary was acknowledged (%q, rows committed there %d); want it cancelled or 08007", tags, n)
			}
			if n != 0 && !slices.Contains(codes, "08007") {
				t.Errorf("a fenced UPDATE committed on the withdrawn primary (%d rows), the client told %q %q; want none, or 08007", n, tags, codes)
			}
		})
	}
}

// commitQueuedAcrossAWithdrawal sends stmt and a COMMIT behind it on c, waits until stmt waits for the lock the
// caller holds in lock (stmt's text in pg_stat_activity matched by like), makes a split brain and withdraws the
// old primary behind a held barrier, lets stmt run, and returns the tags and error codes of both answers.
func commitQueuedAcrossAWithdrawal(ctx context.Context, t *testing.T, h *haPair, admin *pgx.Conn, c *pgx.Conn, lock pgx.Tx, stmt, like string) (tags, codes []string) {
	t.Helper()
	pc := c.PgConn()
	fe := pc.Frontend()
	fe.Send(&pgproto3.Query{String: stmt})
	fe.Send(&pgproto3.Query{String: "COMMIT"})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the statement to wait for the lock", func() bool {
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE $1 AND wait_event_type = 'Lock'", like).Scan(&n)
		return err == nil && n == 1
	})
	h.splitBrain(ctx, t)
	hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	tags, codes = tagsAndCodesUntilReady(pc, 2)
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("tags %q, errors %q", tags, codes)
	return tags, codes
}

// tagsAndCodesUntilReady reads pc's answers up to the readies-th ReadyForQuery (20 s at most) and returns the command
// tags and the error codes in them; the connection's end adds a code "closed: " and the error.
func tagsAndCodesUntilReady(pc *pgconn.PgConn, readies int) (tags, codes []string) {
	fe := pc.Frontend()
	pc.Conn().SetDeadline(time.Now().Add(20 * time.Second))
	for readies > 0 {
		m, err := fe.Receive()
		if err != nil {
			return tags, append(codes, "closed: "+err.Error())
		}
		switch m := m.(type) {
		case *pgproto3.CommandComplete:
			tags = append(tags, string(m.CommandTag))
		case *pgproto3.ErrorResponse:
			codes = append(codes, m.Code)
		case *pgproto3.ReadyForQuery:
			readies--
		}
	}
	return tags, codes
}

// fencedTxBesideALockedTable opens, through the proxy on the pair's primary, a transaction with token 5 that
// wrote accounts (a fenced write), and locks a table notes made for it there (admin's server) in a transaction
// it returns: a statement of the client's on notes waits until the caller rolls that back.
func fencedTxBesideALockedTable(ctx context.Context, t *testing.T, h *haPair, admin *pgx.Conn) (*pgx.Conn, pgx.Tx) {
	t.Helper()
	if _, err := admin.Exec(ctx, "CREATE TABLE notes (v int)"); err != nil {
		t.Fatal(err)
	}
	c := tokenClient(ctx, t, h, 5)
	for _, q := range []string{"BEGIN", "UPDATE accounts SET v = 7 WHERE id = 2"} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s on the published primary: %v", q, err)
		}
	}
	return c, beginWith(ctx, t, connect(t, h.primary.SuperDSN()), "LOCK TABLE notes IN ACCESS EXCLUSIVE MODE")
}

// tokenClient is a client of the pair's proxy with fence.token set to token.
func tokenClient(ctx context.Context, t *testing.T, h *haPair, token int) *pgx.Conn {
	t.Helper()
	c := connect(t, h.proxy.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	if _, err := c.Exec(ctx, fmt.Sprintf("SET fence.token = %d", token)); err != nil {
		t.Fatal(err)
	}
	return c
}
