package proxy_test

// Every path that can set the token in force, with verification on (class 6 of issue 11) and with
// token.scope: transaction (class 7): each one the proxy can see is verified or refused.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// setConfigOID is pg_catalog.set_config's OID (checked against pg_proc by TestFastpathSetConfigOID).
const setConfigOID = 2078

// fastpath sends a FunctionCall of the function oid with text arguments (nil is NULL) and reads to
// ReadyForQuery, returning the result or the server's error.
func fastpath(t *testing.T, c *pgx.Conn, oid uint32, args ...[]byte) ([]byte, error) {
	t.Helper()
	pc := c.PgConn()
	pc.Conn().SetDeadline(time.Now().Add(20 * time.Second))
	defer pc.Conn().SetDeadline(time.Time{})
	fe := pc.Frontend()
	fe.Send(&pgproto3.FunctionCall{Function: oid, ArgFormatCodes: []uint16{0}, Arguments: args, ResultFormatCode: 0})
	if err := fe.Flush(); err != nil {
		t.Fatalf("send FunctionCall: %v", err)
	}
	var result []byte
	var callErr error
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatalf("FunctionCall: %v", err)
		}
		switch m := msg.(type) {
		case *pgproto3.FunctionCallResponse:
			result = append([]byte(nil), m.Result...)
		case *pgproto3.ErrorResponse:
			callErr = pgconn.ErrorResponseToPgError(m)
		case *pgproto3.ReadyForQuery:
			return result, callErr
		}
	}
}

// loCreatOID is the OID of lo_creat(integer), a fastpath function clients use for large objects.
func loCreatOID(t *testing.T, d *pgx.Conn) uint32 {
	t.Helper()
	var oid uint32
	if err := d.QueryRow(ctxT(t), "SELECT 'pg_catalog.lo_creat(integer)'::regprocedure::oid").Scan(&oid); err != nil {
		t.Fatal(err)
	}
	return oid
}

func TestFastpathSetConfigOID(t *testing.T) {
	d := direct(t)
	var oid uint32
	if err := d.QueryRow(ctxT(t), "SELECT 'pg_catalog.set_config(text, text, boolean)'::regprocedure::oid").Scan(&oid); err != nil {
		t.Fatal(err)
	}
	if oid != setConfigOID {
		t.Fatalf("set_config's OID is %d, the proxy assumes %d", oid, setConfigOID)
	}
}

func wantCodeHint(t *testing.T, what string, err error, code, hintPart string) {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != code {
		t.Fatalf("%s: want SQLSTATE %s, got %v", what, code, err)
	}
	if hintPart != "" && !strings.Contains(pe.Hint, hintPart) {
		t.Fatalf("%s: hint %q lacks %q", what, pe.Hint, hintPart)
	}
}

// TestVerifyEveryTokenPath: with verification on, a forged token cannot be put in force through any path the
// proxy sees, on both relay paths.
func TestVerifyEveryTokenPath(t *testing.T) {
	for _, goroutines := range []bool{false, true} {
		t.Run(fmt.Sprintf("goroutines=%v", goroutines), func(t *testing.T) {
			s := vfStart(t, vfOptions{goroutines: goroutines})
			ctx := ctxT(t)
			valid := strconv.FormatInt(s.revision(t), 10)
			forged := strconv.FormatInt(vfForged, 10)
			c := s.mustConnect(t, "")

			// Two set_config calls in one statement: each is verified, whichever is left in force.
			for _, q := range []string{
				fmt.Sprintf("SELECT set_config('fence.token', '%s', false), set_config('fence.token', '%s', false)", valid, forged),
				fmt.Sprintf("SELECT set_config('fence.token', '%s', false), set_config('fence.token', '%s', false)", forged, valid),
				fmt.Sprintf("SELECT set_config('fence.token', '%s', false) FROM (VALUES (1)) v WHERE set_config('fence.token', '%s', true) IS NOT NULL", valid, forged),
				// A function's SET clause puts its value in force while the function runs.
				fmt.Sprintf("CREATE FUNCTION vf_forge() RETURNS int LANGUAGE sql SET fence.token = '%s' AS 'SELECT 1'", forged),
			} {
				_, err := c.Exec(ctx, q)
				vfWantCode(t, q, err, "55F03", "invalid fencing token")
			}
			// A persistent default is refused even with a token etcd issued: later sessions would start with it.
			for _, q := range []string{
				"ALTER ROLE " + pgtest.SuperUser + " SET fence.token = '" + valid + "'",
				"ALTER ROLE " + pgtest.SuperUser + " IN DATABASE " + pgtest.TestDB + " SET fence.token = " + valid,
				"ALTER DATABASE " + pgtest.TestDB + " SET fence.token = '" + forged + "'",
				"ALTER SYSTEM SET fence.token = '" + valid + "'",
			} {
				_, err := c.Exec(ctx, q)
				vfWantCode(t, q, err, "55F03", "invalid fencing token", "ALTER ROLE/DATABASE/SYSTEM")
			}
			// FunctionCall of set_config is refused for the token setting, whatever the value; other fastpath
			// calls (set_config of another setting, large objects) work.
			_, err := fastpath(t, c, setConfigOID, []byte("fence.token"), []byte(forged), []byte("false"))
			wantCodeHint(t, "FunctionCall set_config(fence.token, forged)", err, "55F03", "SET fence.token")
			_, err = fastpath(t, c, setConfigOID, []byte("FENCE.TOKEN"), []byte(valid), []byte("false"))
			wantCodeHint(t, "FunctionCall set_config(FENCE.TOKEN, valid)", err, "55F03", "")
			res, err := fastpath(t, c, setConfigOID, []byte("application_name"), []byte("vf-app"), []byte("false"))
			if err != nil || string(res) != "vf-app" {
				t.Fatalf("FunctionCall set_config(application_name): %q, %v", res, err)
			}
			if _, err := c.Exec(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
			if res, err := fastpath(t, c, loCreatOID(t, s.direct), []byte("-1")); err != nil || len(res) == 0 {
				t.Fatalf("FunctionCall lo_creat: %q, %v", res, err)
			}
			if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
				t.Fatal(err)
			}
			// Nothing forged is in force: a write has no token at all.
			err = s.update(ctx, c, 1)
			vfWantCode(t, "write after the refused paths", err, "55F02", "missing fencing token")
			if got := s.maxToken(t); got != 2 {
				t.Fatalf("max token %d after refused forgeries, want 2", got)
			}
			var role string
			if err := s.direct.QueryRow(ctx, "SELECT coalesce(string_agg(array_to_string(setconfig, ','), ';'), '') FROM pg_db_role_setting").Scan(&role); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(role, "fence.token") {
				t.Fatalf("a persistent token default landed: %s", role)
			}
			// The issued token still works, through SET and through both set_config forms.
			vfExec(t, c, fmt.Sprintf("SELECT set_config('fence.token', '%s', false), set_config('fence.token', '%s', false)", valid, valid))
			if err := s.update(ctx, c, 1); err != nil {
				t.Fatalf("write with an issued token: %v", err)
			}
		})
	}
}

// scoped is a proxy with token.scope: transaction protecting one fresh table.
type scoped struct {
	p     *proxytest.Proxy
	d     *pgx.Conn
	table string // public.<name>
}

func startScoped(t *testing.T, goroutines bool) *scoped {
	t.Helper()
	d := direct(t)
	name := fxName(t, "sc")
	fxCreateTable(t, d, "public."+name)
	fxExec(t, d, "INSERT INTO public."+name+" (id, balance, fence_token) VALUES (1, 0, 3)")
	p := startProxy(t, proxytest.Options{YAML: fxTables("public."+name) + "token:\n  scope: transaction\n", DisableEventLoop: goroutines})
	return &scoped{p: p, d: d, table: "public." + name}
}

func (s *scoped) connect(t *testing.T, options string) (*pgx.Conn, error) {
	t.Helper()
	cfg, err := pgx.ParseConfig(s.p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	if err != nil {
		t.Fatal(err)
	}
	if options != "" {
		cfg.RuntimeParams["options"] = options
	}
	c, err := pgx.ConnectConfig(ctxT(t), cfg)
	if err == nil {
		t.Cleanup(func() { c.Close(context.Background()) })
	}
	return c, err
}

func (s *scoped) token(t *testing.T) int64 {
	t.Helper()
	var tok int64
	if err := s.d.QueryRow(ctxT(t), "SELECT fence_token FROM "+s.table+" WHERE id = 1").Scan(&tok); err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestScopeTransaction: with token.scope: transaction every session-level token is refused with 55F03 and a
// hint to use SET LOCAL, and transaction-level tokens work, on both relay paths and both protocols.
func TestScopeTransaction(t *testing.T) {
	for _, goroutines := range []bool{false, true} {
		t.Run(fmt.Sprintf("goroutines=%v", goroutines), func(t *testing.T) {
			s := startScoped(t, goroutines)
			ctx := ctxT(t)
			c, err := s.connect(t, "")
			if err != nil {
				t.Fatal(err)
			}
			for _, mode := range vfModes {
				for _, q := range []string{
					"SET fence.token = 50",
					"SET SESSION fence.token = 50",
					"SET fence.token TO '50'",
					"SELECT set_config('fence.token', '50', false)",
					"SELECT set_config('fence.token', '50', 'f')",
					"SELECT set_config('fence.token', '50', random() < 2)",
					"SELECT set_config('fence.' || 'token', '50', false)",
					"ALTER ROLE " + pgtest.SuperUser + " SET fence.token = 50",
					"ALTER DATABASE " + pgtest.TestDB + " SET fence.token = 50",
					"BEGIN; SET fence.token = 50; COMMIT",
				} {
					_, err := c.Exec(ctx, q, mode)
					wantCodeHint(t, fmt.Sprintf("%s (%v)", q, mode), err, "55F03", "SET LOCAL fence.token")
				}
			}
			_, err = fastpath(t, c, setConfigOID, []byte("fence.token"), []byte("50"), []byte("false"))
			wantCodeHint(t, "FunctionCall set_config", err, "55F03", "SET LOCAL")
			// Nothing is in force: a write outside a transaction has no token.
			_, err = c.Exec(ctx, "UPDATE "+s.table+" SET balance = balance + 1 WHERE id = 1")
			wantCodeHint(t, "write after refused session tokens", err, "55F02", "")

			// Transaction-level tokens work: SET LOCAL, set_config(..., true), simple and extended.
			for i, q := range []string{
				"SET LOCAL fence.token = %d",
				"SELECT set_config('fence.token', '%d', true)",
				"SELECT set_config('fence.token', '%d', 'on')",
			} {
				for j, mode := range vfModes {
					tok := int64(10 + 2*i + j)
					tx, err := c.Begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := tx.Exec(ctx, fmt.Sprintf(q, tok), mode); err != nil {
						t.Fatalf("%s: %v", q, err)
					}
					if _, err := tx.Exec(ctx, "UPDATE "+s.table+" SET balance = balance + 1 WHERE id = 1", mode); err != nil {
						t.Fatalf("write after %s: %v", q, err)
					}
					if err := tx.Commit(ctx); err != nil {
						t.Fatal(err)
					}
					if got := s.token(t); got != tok {
						t.Fatalf("after %s: row token %d, want %d", q, got, tok)
					}
				}
			}
			// After the transaction the token is gone.
			_, err = c.Exec(ctx, "UPDATE "+s.table+" SET balance = balance + 1 WHERE id = 1")
			wantCodeHint(t, "write after COMMIT", err, "55F02", "")

			// Startup options and parameters carrying the token are session-level: refused at connect.
			_, err = s.connect(t, "-c fence.token=60")
			wantCodeHint(t, "startup options", err, "55F03", "SET LOCAL")
			// Other startup options still work.
			if _, err := s.connect(t, "-c statement_timeout=5s"); err != nil {
				t.Fatalf("startup options without the token: %v", err)
			}
		})
	}
}
