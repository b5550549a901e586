package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// The admin console's RELOAD does what SIGHUP does: the configuration file's new table list applies to a
// pooled client already connected; a file that does not validate answers RELOAD with an error and changes
// nothing. SHOW CONFIG shows the running pool settings.
func TestServeAdminReload(t *testing.T) {
	cl := pgtest.MustStart(t, pgtest.Options{})
	if err := cl.Exec("CREATE TABLE accounts(id int PRIMARY KEY, fence_token bigint); CREATE TABLE ledger(id int PRIMARY KEY, fence_token bigint); INSERT INTO accounts VALUES (1, NULL); INSERT INTO ledger VALUES (1, NULL)"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := proxytest.Binary(t, dir)
	addr := freeAddr(t)
	configPath := filepath.Join(dir, "fenceproxy.yaml")
	size := 2
	writeConfig := func(tables ...string) {
		var b strings.Builder
		fmt.Fprintf(&b, "listen: %s\nupstream:\n  address: %s\npool:\n  mode: transaction\n  size: %d\n  admin_users: [admin]\nauth:\n  type: trust\ntables:\n", addr, cl.Addr(), size)
		for _, tb := range tables {
			fmt.Fprintf(&b, "  - name: %s\n    token_column: fence_token\n", tb)
		}
		if err := os.WriteFile(configPath, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeConfig("public.accounts")
	pp := startServe(t, bin, configPath, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, proxytest.DSN(addr, pgtest.SuperUser, "", pgtest.TestDB))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	adm, err := pgx.Connect(ctx, proxytest.DSN(addr, "admin", "", "fenceproxy")+"&default_query_exec_mode=simple_protocol")
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close(ctx)
	if _, err := c.Exec(ctx, "UPDATE ledger SET id = 1 WHERE id = 1"); err != nil {
		t.Fatalf("ledger is not protected yet: %v", err)
	}

	writeConfig("public.accounts", "ledger")
	if _, err := adm.Exec(ctx, "RELOAD"); err != nil {
		t.Fatalf("RELOAD: %v", err)
	}
	var pgErr *pgconn.PgError
	if _, err := c.Exec(ctx, "UPDATE ledger SET id = 1 WHERE id = 1"); !errors.As(err, &pgErr) || pgErr.Code != "55F02" {
		t.Fatalf("after RELOAD, a write to ledger without a token: want 55F02, got %v\n%s", err, pp.stderr.String())
	}

	os.WriteFile(configPath, []byte("listen: [\n"), 0o644)
	_, err = adm.Exec(ctx, "RELOAD")
	if !errors.As(err, &pgErr) || pgErr.Code != "55000" || !strings.Contains(pgErr.Message, "RELOAD failed") {
		t.Fatalf("RELOAD of a broken file: %v", err)
	}
	if _, err := c.Exec(ctx, "UPDATE ledger SET id = 1 WHERE id = 1"); !errors.As(err, &pgErr) || pgErr.Code != "55F02" {
		t.Fatalf("after a failed RELOAD: want 55F02, got %v", err)
	}

	var value string
	rows, err := adm.Query(ctx, "SHOW CONFIG")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var key, val, def, changeable string
		if err := rows.Scan(&key, &val, &def, &changeable); err != nil {
			t.Fatal(err)
		}
		if key == "pool.mode" {
			value = val
		}
	}
	if rows.Err() != nil || value != "transaction" {
		t.Fatalf("SHOW CONFIG pool.mode = %q (%v)", value, rows.Err())
	}

	// A change RELOAD does not apply (pgbouncer applies pool sizes at RELOAD; the running pools keep theirs) is
	// said to the admin, not only logged: the RELOAD fails, naming it (TestReload59PoolChangesItCannotFollowAreRefused).
	size = 3
	writeConfig("public.accounts", "ledger")
	adm2, _ := adminKeepingNotices(ctx, t, addr)
	if _, err := adm2.Exec(ctx, "RELOAD"); !errors.As(err, &pgErr) || !strings.Contains(pgErr.Message, "pool.size") {
		t.Fatalf("RELOAD after a pool.size change: %v, want an error naming pool.size", err)
	}
}

// adminKeepingNotices connects to the admin console at addr as admin, keeping the messages of the NOTICEs it
// gets (a RELOAD names there what it did not apply); the connection closes when the test ends.
func adminKeepingNotices(ctx context.Context, t *testing.T, addr string) (*pgx.Conn, *[]string) {
	t.Helper()
	acfg, err := pgx.ParseConfig(proxytest.DSN(addr, "admin", "", "fenceproxy") + "&default_query_exec_mode=simple_protocol")
	if err != nil {
		t.Fatal(err)
	}
	notices := &[]string{}
	acfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { *notices = append(*notices, n.Message) }
	adm, err := pgx.ConnectConfig(ctx, acfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { adm.Close(context.Background()) })
	return adm, notices
}
