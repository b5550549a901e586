package proxy_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// In transaction pooling a persistent default of the lock setting is refused as the token's is: a pooled
// server connection opened after it would give the default to every client of the pool that set no lock
// (SET LOCAL ... TO DEFAULT), a lock the client never chose. Before, it was accepted in every spelling. The
// role's defaults are left as they were.
func TestPooledLockDefaultRefused(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	t.Cleanup(func() {
		f.d.Exec(context.Background(), "ALTER ROLE "+pgtest.SuperUser+" RESET fence.lock")
		f.d.Exec(context.Background(), "ALTER DATABASE "+pgtest.TestDB+" RESET fence.lock")
	})
	for _, mode := range []string{"simple_protocol", "exec"} {
		c := pooledConn(t, f, "&default_query_exec_mode="+mode)
		for _, q := range []string{
			"ALTER ROLE " + pgtest.SuperUser + " SET fence.lock = 'L'",
			"ALTER ROLE " + pgtest.SuperUser + " IN DATABASE " + pgtest.TestDB + " SET fence.lock TO 'L'",
			"ALTER ROLE ALL SET \"fence\".\"lock\" = 'L'",
			"ALTER DATABASE " + pgtest.TestDB + " SET FENCE.LOCK = 'L'",
			"ALTER SYSTEM SET fence.lock = 'L'",
			"SET LOCAL fence.lock = 'L'; ALTER ROLE " + pgtest.SuperUser + " SET fence.lock FROM CURRENT",
		} {
			_, err := c.Exec(ctxT(t), q)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "55F03" || !strings.Contains(pe.Hint, "SET fence.lock") {
				t.Fatalf("%s (%s): %v, want 55F03", q, mode, err)
			}
		}
		// Resetting a default leaves nothing behind: it goes.
		fxExec(t, c, "ALTER ROLE "+pgtest.SuperUser+" RESET fence.lock")
	}
	var n int
	if err := f.d.QueryRow(ctxT(t), "SELECT count(*) FROM pg_db_role_setting s, unnest(s.setconfig) c WHERE c LIKE 'fence.lock=%'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d lock defaults landed", n)
	}
}

// The startup token a pooled client gets is the one PostgreSQL would give it: a parameter of its own wins over
// options (the server applies options first), options are read as the server's getopt reads them, and the same
// setting in two spellings of its name is refused (the server takes the later one in the packet, an order the
// proxy does not keep). Before, options won, grouped flags were not read, and the spelling was chosen at random.
func TestPooledStartupTokenAsPostgresGivesIt(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	for _, tc := range []struct{ query, want string }{
		{"&fence.token=7&options=-c%20fence.token%3D5", "7"},
		{"&options=-c%20fence.token%3D5%20-ec%20fence.token%3D8", "8"},
		{"&options=-c%20fence.token%3D5%20-e-fence.token%3D9", "9"},
	} {
		for _, dsn := range []string{pg.DSN(pgtest.SuperUser, "", pgtest.TestDB), f.dsn()} {
			c := connect(t, dsn+tc.query)
			var got string
			if err := c.QueryRow(ctxT(t), "SELECT current_setting('fence.token')").Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("%s%s: fence.token %q, want %q", dsn, tc.query, got, tc.want)
			}
		}
	}
	_, err := pgx.Connect(ctxT(t), f.dsn()+"&fence.token=7&FENCE.TOKEN=8")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "55F03" {
		t.Fatalf("the token in two spellings at startup: %v, want 55F03", err)
	}
}

// A startup parameter the server refuses (it knows no such setting) reaches the pooled client as the server's
// own error, as directly, not as the proxy's 08006 with the server's words in DETAIL.
func TestPooledServerRefusalAtLoginIsTheServers(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	_, direct := pgx.Connect(ctxT(t), pg.DSN(pgtest.SuperUser, "", pgtest.TestDB)+"&nosuch_setting=1")
	_, pooled := pgx.Connect(ctxT(t), f.dsn()+"&nosuch_setting=1")
	var d, p *pgconn.PgError
	if !errors.As(direct, &d) || !errors.As(pooled, &p) || d.Code != p.Code || d.Message != p.Message {
		t.Fatalf("a startup parameter the server refuses: directly %v, pooled %v", direct, pooled)
	}
}
