package proxy_test

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// TestGuardTrigger checks deploy/guard-trigger.sql, the README's cure for writes that bypass the proxy: fenced
// writes through the proxy pass it, unfenced and stale writes straight to PostgreSQL do not.
func TestGuardTrigger(t *testing.T) {
	pgtest.Require(t, pg)
	d := direct(t)
	ctx := ctxT(t)
	if _, err := d.Exec(ctx, "DROP TABLE IF EXISTS guarded; CREATE TABLE guarded(id int PRIMARY KEY, v int, fence_token bigint)"); err != nil {
		t.Fatal(err)
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "deploy", "guard-trigger.sql")
	host, port, _ := net.SplitHostPort(pg.Addr())
	psql := exec.Command("psql", "-X", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", port, "-U", pgtest.SuperUser, "-d", pgtest.TestDB,
		"-v", "table=guarded", "-v", "column=fence_token", "-f", script)
	psql.Env = append(os.Environ(), "PGSSLMODE=disable")
	if out, err := psql.CombinedOutput(); err != nil {
		t.Fatalf("install the guard trigger: %v\n%s", err, out)
	}
	p := startProxy(t, proxytest.Options{YAML: "tables:\n  - name: guarded\n    token_column: fence_token\n"})
	c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	for _, q := range []string{"SET fence.token = 42", "INSERT INTO guarded (id, v) VALUES (1, 1)", "UPDATE guarded SET v = 2 WHERE id = 1"} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("through the proxy, %s: %v", q, err)
		}
	}
	code := func(err error) string {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return pgErr.Code
		}
		return ""
	}
	if _, err := d.Exec(ctx, "UPDATE guarded SET v = 3 WHERE id = 1"); code(err) != "55F02" {
		t.Errorf("direct write without a token: want 55F02, got %v", err)
	}
	if _, err := d.Exec(ctx, "SET fence.token = 41"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Exec(ctx, "UPDATE guarded SET v = 3, fence_token = 41 WHERE id = 1"); code(err) != "55F01" {
		t.Errorf("direct stale write: want 55F01, got %v", err)
	}
	if _, err := d.Exec(ctx, "DELETE FROM guarded WHERE id = 1"); code(err) != "55F01" {
		t.Errorf("direct stale delete: want 55F01, got %v", err)
	}
	if _, err := d.Exec(ctx, "SET fence.token = 43"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Exec(ctx, "UPDATE guarded SET v = 4 WHERE id = 1"); code(err) != "55F04" {
		t.Errorf("direct write that does not carry the token: want 55F04, got %v", err)
	}
	var v int
	if err := d.QueryRow(ctx, "SELECT v FROM guarded WHERE id = 1").Scan(&v); err != nil || v != 2 {
		t.Errorf("row changed by a refused write: v = %d, %v", v, err)
	}
}
