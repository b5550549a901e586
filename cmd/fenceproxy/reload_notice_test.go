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

// RELOAD of an unchanged file (a catalog section, durations, a repeated admin user) names no section, twice; a
// token.setting change is named as not applied and changes nothing the clients see. From a review on
// 2026-12-03: the planner was built from the whole new file, so it took the new setting while the rest of the
// proxy kept the old one, and the same write was refused 55F02 after the RELOAD.
func TestServeReloadAppliesOnlyTheTables(t *testing.T) {
	cl := pgtest.MustStart(t, pgtest.Options{})
	if err := cl.Exec("CREATE TABLE accounts(id int PRIMARY KEY, fence_token bigint); INSERT INTO accounts VALUES (1, NULL)"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := proxytest.Binary(t, dir)
	addr := freeAddr(t)
	configPath := filepath.Join(dir, "fenceproxy.yaml")
	base := fmt.Sprintf("listen: %s\nupstream:\n  address: %s\n  connect_timeout: 5s\npool:\n  mode: transaction\n  size: 2\n  max_client_wait: 1m30s\n  admin_users: [admin, admin]\nlimits:\n  startup_timeout: 10s\nauth:\n  type: trust\ncatalog:\n  user: %s\n  database: %s\n  refresh: 30s\nfence:\n  synchronous_commit: \"on\"\ntables:\n  - name: public.accounts\n    token_column: fence_token\n", addr, cl.Addr(), pgtest.SuperUser, pgtest.TestDB)
	write := func(extra string) {
		if err := os.WriteFile(configPath, []byte(base+extra), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	startServe(t, bin, configPath, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	adm, notices := adminKeepingNotices(ctx, t, addr)
	for i := 0; i < 2; i++ {
		if _, err := adm.Exec(ctx, "RELOAD"); err != nil {
			t.Fatalf("RELOAD %d: %v", i, err)
		}
		if len(*notices) != 0 {
			t.Errorf("RELOAD %d of an unchanged file: notices %q", i, *notices)
		}
		*notices = nil
	}

	c, err := pgx.Connect(ctx, proxytest.DSN(addr, pgtest.SuperUser, "", pgtest.TestDB)+"&default_query_exec_mode=simple_protocol")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	upd := func() error {
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "SET LOCAL fence.token = 5"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "UPDATE accounts SET id = 1 WHERE id = 1"); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	if err := upd(); err != nil {
		t.Fatalf("write with a token before: %v", err)
	}
	write("token:\n  setting: app.tok\n")
	if _, err := adm.Exec(ctx, "RELOAD"); err != nil {
		t.Fatal(err)
	}
	if len(*notices) != 1 || !strings.Contains((*notices)[0], "changes to token need a restart") {
		t.Errorf("RELOAD after a token.setting change: notices %q, want one naming token", *notices)
	}
	if err := upd(); err != nil {
		t.Errorf("after a RELOAD that did not apply the token section, the same write: %v", err)
	}
	// The new name means nothing yet: a client that sets it at session level has no token.
	if _, err := c.Exec(ctx, "SET app.tok = 999"); err != nil {
		t.Fatalf("SET app.tok: %v", err)
	}
	var pgErr *pgconn.PgError
	if _, err := c.Exec(ctx, "UPDATE accounts SET id = 1 WHERE id = 1"); !errors.As(err, &pgErr) || pgErr.Code != "55F02" {
		t.Errorf("a write with only app.tok set: %v, want 55F02", err)
	}
}
