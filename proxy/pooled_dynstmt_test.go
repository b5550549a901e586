package proxy_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// A client's text that, read as the server reads it, uses no statement names (PL/pgSQL dynamic SQL: the names
// are in strings the server builds when it runs) drops and prepares again, under the proxy's server name, the
// statement another client's named statement is carried in (fenceproxy_s..., which clients of the same text
// share on a connection), with a text of its own: an UPDATE of the protected table that writes a token column
// value of its choosing and checks nothing. The other client, stale (token 5, the row holds 10), then runs its
// own fenced statement by its name, which directly is refused 55F01. It held on 2026-12-05: a lend to
// another client makes the statements of the clients prepared afresh before their next use (stmtsFresh).
func TestPooledDynamicSQLNeverReplacesAnotherClientsStatement(t *testing.T) {
	for _, how := range []string{"DO block", "function"} {
		t.Run(how, func(t *testing.T) {
			f := newPooledFenced(t, 1, "")
			ctx := ctxT(t)
			fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token, balance) VALUES (1, 10, 0)")
			victim := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
			hostile := pooledPgConn(t, f, "")
			upd := "UPDATE " + f.label + " SET balance = balance + $1::int WHERE id = $2::int RETURNING fence_token"
			if _, err := victim.Prepare(ctx, "w", upd, nil); err != nil {
				t.Fatal(err)
			}
			run := func() (string, error) {
				rr := victim.ExecPrepared(ctx, "w", [][]byte{[]byte("1"), []byte("1")}, nil, nil).Read()
				if len(rr.Rows) > 0 {
					return string(rr.Rows[0][0]), rr.Err
				}
				return rr.CommandTag.String(), rr.Err
			}
			if got, err := run(); !isCode(err, "55F01") {
				t.Fatalf("the stale write: %q %v, want 55F01", got, err)
			}
			// Nothing in the text spells the proxy's names, the table's or the token column's.
			half := len(f.label) / 2
			body := fmt.Sprintf(`DECLARE r record;
BEGIN
  FOR r IN SELECT name, parameter_types::text[] AS ty FROM pg_catalog.pg_prepared_statements WHERE name LIKE 'f' || 'enceproxy_s%%' LOOP
    EXECUTE 'DEALLOCATE ' || pg_catalog.quote_ident(r.name);
    EXECUTE 'PREPARE ' || pg_catalog.quote_ident(r.name) || '(' || pg_catalog.array_to_string(r.ty, ',') || ') AS UPD' || 'ATE %s' || '%s SET balance = balance + $1, f' || 'ence_token = 999 WHERE id = $2 RETURNING f' || 'ence_token';
  END LOOP;
`, f.label[:half], f.label[half:])
			switch how {
			case "DO block":
				if got := simpleOutcome(ctx, hostile, "DO $b$"+body+"END$b$"); got != "DO; " {
					t.Fatalf("the DO block: %s", got)
				}
			case "function":
				fxExec(t, f.d, "CREATE OR REPLACE FUNCTION pooled_dyn_swap() RETURNS int LANGUAGE plpgsql AS $b$"+body+"RETURN 1; END$b$")
				t.Cleanup(func() { f.d.Exec(ctx, "DROP FUNCTION IF EXISTS pooled_dyn_swap()") })
				if got := simpleOutcome(ctx, hostile, "SELECT pooled_dyn_swap()"); got != `SELECT 1 "1"; ` {
					t.Fatalf("the function: %s", got)
				}
			}
			if got, err := run(); !isCode(err, "55F01") {
				t.Errorf("the stale write ran another client's text: %q %v, want 55F01", got, err)
			}
			f.wantToken(t, 1, 10)
		})
	}
}

// isCode reports whether err is a server error with SQLSTATE code.
func isCode(err error, code string) bool {
	pe, ok := err.(*pgconn.PgError)
	return ok && pe.Code == code
}
