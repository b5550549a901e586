package tokens_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

func TestPGOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		inherited, setting string
		token              int64
		want               string
	}{
		{"", "", 42, "-c fence.token=42"},
		{"  ", "fence.token", 42, "-c fence.token=42"},
		{"-c application_name=job", "", 7, "-c application_name=job -c fence.token=7"},
		{"-c fence.token=3", "", 9, "-c fence.token=3 -c fence.token=9"},
		{"", "app.fence", 9223372036854775807, "-c app.fence=9223372036854775807"},
	} {
		if got := tokens.PGOptions(tc.inherited, tc.setting, tc.token); got != tc.want {
			t.Errorf("PGOptions(%q, %q, %d) = %q, want %q", tc.inherited, tc.setting, tc.token, got, tc.want)
		}
	}
}

// TestTokenReachesPostgres checks, against a real server, that SetToken and PGOptions set what the proxy reads:
// PostgreSQL's own value of the setting, the last -c winning in PGOPTIONS (as for a nested lock).
func TestTokenReachesPostgres(t *testing.T) {
	t.Parallel()
	pg := pgtest.MustStart(t, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	show := func(conn *pgx.Conn, setting string) string {
		t.Helper()
		var v string
		if err := conn.QueryRow(ctx, "SELECT coalesce(current_setting($1, true), '')", setting).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}

	conn, err := pgx.Connect(ctx, pg.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := tokens.SetToken(ctx, conn, 42, ""); err != nil {
		t.Fatal(err)
	}
	if got := show(conn, "fence.token"); got != "42" {
		t.Fatalf("fence.token = %q after SetToken 42", got)
	}
	if err := tokens.SetToken(ctx, conn, 9223372036854775807, "app.fence"); err != nil {
		t.Fatal(err)
	}
	if got := show(conn, "app.fence"); got != "9223372036854775807" {
		t.Fatalf("app.fence = %q", got)
	}
	// Session-level: it survives the end of a transaction, and a rolled-back SET is undone as in PostgreSQL.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tokens.SetToken(ctx, tx.Conn(), 43, ""); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	if got := show(conn, "fence.token"); got != "42" {
		t.Fatalf("fence.token = %q after a rolled-back SetToken, want 42", got)
	}
	for _, bad := range []int64{0, -1} {
		if err := tokens.SetToken(ctx, conn, bad, ""); err == nil {
			t.Fatalf("SetToken(%d) succeeded", bad)
		}
	}

	// A startup option from PGOPTIONS, after an inherited one for the same setting.
	cfg, err := pgx.ParseConfig(pg.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["options"] = tokens.PGOptions("-c application_name=outer -c fence.token=5", "", 77)
	conn2, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close(ctx)
	if got := show(conn2, "fence.token"); got != "77" {
		t.Fatalf("fence.token = %q from options %q, want 77", got, cfg.RuntimeParams["options"])
	}
	if got := show(conn2, "application_name"); got != "outer" {
		t.Fatalf("inherited option lost: application_name = %q", got)
	}
}
