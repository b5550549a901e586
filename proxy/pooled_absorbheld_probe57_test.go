package proxy_test

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A connection a client's cancel went to runs SELECT pg_catalog.pg_sleep(0) before it goes back to the pool
// (absorbCancel). Here that statement is held: it waits for a lock on pg_proc (its lookup of pg_sleep) that a
// direct transaction takes after the client's statement started, and its backend is then stopped (SIGSTOP), so
// that it never answers, while the lock goes. The client leaves meanwhile: the wait must end with it, as the
// probe's does (watchProbe), and the pool's one slot come back to the next client, who is served within 5 s
// while the absorb's backend is still stopped. Attack of probe57 on 2026-12-05: the absorb read its answer with
// no watch on the client, and held the connection and the slot as long as the backend did not answer.
func TestPooledClientVanishingWhileItsCancelIsAbsorbed(t *testing.T) {
	f := newPooledFenced(t, 1, "  admin_users: [admin]\n  max_client_wait: 15s\n")
	adm := adminConn(t, f)
	ctx := ctxT(t)
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	hold, err := direct(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hold.Rollback(context.Background()) })
	// Once first, so that the lookups of its functions are done (cached in the backend of the pool's one server
	// connection) before the lock on pg_proc is taken; pg_sleep never ran there.
	if _, err := a.Exec(ctx, "SELECT count(*) FROM generate_series(1, 2) AS absorb_subject"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := a.Exec(ctx, "SELECT count(*) FROM generate_series(1, 2000000000) AS absorb_subject")
		done <- err
	}()
	// The checks run in the holding transaction: another backend's look at pg_locks may need pg_proc too. Each
	// clears the transaction's snapshot of pg_stat_activity first, which would show the backends as they were
	// at the first look.
	look := func(sql string, args ...any) pgx.Row {
		if _, err := hold.Exec(ctx, "SELECT pg_catalog.pg_stat_clear_snapshot()"); err != nil {
			t.Fatal(err)
		}
		return hold.QueryRow(ctx, sql, args...)
	}
	waitingOn := func(rel, query string) (pid int) {
		eventually(t, 10*time.Second, query+" waiting for a lock on "+rel, func() bool {
			err := look("SELECT l.pid FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity s USING (pid) WHERE l.relation = $1::regclass AND NOT l.granted AND s.query LIKE $2", rel, query).Scan(&pid)
			return err == nil
		})
		return pid
	}
	eventually(t, 10*time.Second, "the client's statement running", func() bool {
		var n int
		err := look("SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE state = 'active' AND query LIKE '%absorb_subject%' AND pid <> pg_catalog.pg_backend_pid()").Scan(&n)
		return err == nil && n == 1
	})
	// Taken now: the token statement in front of the client's looked set_config up before.
	if _, err := hold.Exec(ctx, "LOCK TABLE pg_catalog.pg_proc IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	if err := a.PgConn().CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; sqlstate(err) != "57014" {
		t.Fatalf("the cancelled statement: %v, want 57014", err)
	}
	pid := waitingOn("pg_catalog.pg_proc", "SELECT pg_catalog.pg_sleep(0)")
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The lock goes (the stopped backend is granted its share, which blocks no other backend): only the stopped
	// backend holds the absorb now, and the next client's new server connection can look its functions up.
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	servedOnceGone(t, adm, b, "the next client's", func() error { return a.PgConn().Conn().Close() })
	for _, r := range adminRows(t, adm, "SHOW SERVERS") {
		if r["remote_pid"] == strconv.Itoa(pid) {
			t.Errorf("SHOW SERVERS still lists the connection whose absorb was held: %v", r)
		}
	}
}
