package proxy_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// The rule for a transaction that wrote a protected table (fencedTxRefused: nothing more of it reaches a host the
// router no longer trusts with fenced writes) holds for every message, the two that are not statements too: a
// CopyDone, which ends a COPY and, when that COPY is the last statement of a Query holding a fenced UPDATE,
// commits the Query's implicit transaction; and a FunctionCall. From mutate58 (2026-12-06): with the check
// skipped for them, nothing failed (in session mode the router's change ends such a session at once,
// Server.fencedHostsRefused, whatever the message; the tests that pin the per-message rule sent a COMMIT or a
// Sync). In transaction pooling the CopyDone then reached the withdrawn primary (which answered 57014 only
// because the change had cancelled the COPY: cancelLent) and the FunctionCall was answered there
// (FunctionCallResponse, no error). Each must end the session with a FATAL and commit nothing there: 08007 while
// the COPY's Query is owed its answer, 55F04 inside the block, where nothing is (with 55F04 whatever was owed,
// as a mutation of fencedTxFarewell made it, every other test of the rule passed).
func TestCopyDoneAndFunctionCallRefusedOnAWithdrawnPrimary(t *testing.T) {
	for _, mode := range barrierModes {
		for _, msg := range []string{"CopyDone", "FunctionCall"} {
			t.Run(mode.name+"/"+msg, func(t *testing.T) {
				h, admin := startBarrierPair(t, mode.yaml, nil)
				ctx := haCtx(t)
				if _, err := admin.Exec(ctx, "CREATE TABLE notes (v int)"); err != nil {
					t.Fatal(err)
				}
				var fn uint32
				if err := admin.QueryRow(ctx, "SELECT 'pg_catalog.pg_backend_pid'::regproc::oid").Scan(&fn); err != nil {
					t.Fatal(err)
				}
				c := tokenClient(ctx, t, h, 5)
				pc := c.PgConn()
				fe := pc.Frontend()
				if msg == "CopyDone" {
					// One Query, one implicit transaction: the fenced UPDATE, then a COPY whose CopyDone ends both.
					fe.Send(&pgproto3.Query{String: "UPDATE accounts SET v = 7 WHERE id = 2; COPY notes FROM STDIN"})
					if err := fe.Flush(); err != nil {
						t.Fatal(err)
					}
					untilCopyIn(t, pc)
					fe.Send(&pgproto3.CopyData{Data: []byte("1\n")})
					if err := fe.Flush(); err != nil {
						t.Fatal(err)
					}
				} else {
					for _, q := range []string{"BEGIN", "UPDATE accounts SET v = 7 WHERE id = 2"} {
						if _, err := c.Exec(ctx, q); err != nil {
							t.Fatalf("%s on the published primary: %v", q, err)
						}
					}
				}
				h.splitBrain(ctx, t)
				hold := withdrawBehindAHeldBarrier(ctx, t, h, admin)
				if msg == "CopyDone" {
					fe.Send(&pgproto3.CopyDone{})
				} else {
					fe.Send(&pgproto3.FunctionCall{Function: fn})
				}
				_ = fe.Flush() // in session mode the session may be ended already: what it reads says so
				answered, codes := answersUntilReady(pc)
				t.Logf("answers %q, errors %q", answered, codes)
				if err := hold.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
				var n int
				if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 2 AND v = 7").Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 0 {
					t.Errorf("%s of a fenced transaction on the withdrawn primary committed it there (%d rows; answers %q, errors %q)", msg, n, answered, codes)
				}
				// The COPY's Query is still owed its answer when the session ends: the proxy cannot say the
				// transaction did not commit (08007). Inside the block nothing is owed: it did not (55F04).
				want := "55F04"
				if msg == "CopyDone" {
					want = "08007"
				}
				if len(answered) > 0 || len(codes) == 0 || codes[0] != want {
					t.Errorf("%s of a fenced transaction on the withdrawn primary: answers %q, errors %q; want none, then FATAL %s", msg, answered, codes, want)
				}
			})
		}
	}
}

// untilCopyIn reads pc's answers up to a CopyInResponse, failing on an error or anything else that ends them.
func untilCopyIn(t *testing.T, pc *pgconn.PgConn) {
	t.Helper()
	pc.Conn().SetDeadline(time.Now().Add(20 * time.Second))
	defer pc.Conn().SetDeadline(time.Time{})
	for {
		m, err := pc.Frontend().Receive()
		if err != nil {
			t.Fatalf("reading up to the COPY: %v", err)
		}
		switch m := m.(type) {
		case *pgproto3.CopyInResponse:
			return
		case *pgproto3.ErrorResponse:
			t.Fatalf("the fenced UPDATE and COPY on the published primary: %s %s", m.Code, m.Message)
		case *pgproto3.ReadyForQuery:
			t.Fatal("the Query ended without a COPY")
		}
	}
}

// answersUntilReady reads pc's answers up to a ReadyForQuery or the connection's end (20 s at most) and returns
// what the server answered (command tags, "FunctionCallResponse") and the error codes.
func answersUntilReady(pc *pgconn.PgConn) (answered, codes []string) {
	pc.Conn().SetDeadline(time.Now().Add(20 * time.Second))
	for {
		m, err := pc.Frontend().Receive()
		if err != nil {
			return answered, codes
		}
		switch m := m.(type) {
		case *pgproto3.CommandComplete:
			answered = append(answered, string(m.CommandTag))
		case *pgproto3.FunctionCallResponse:
			answered = append(answered, "FunctionCallResponse")
		case *pgproto3.ErrorResponse:
			codes = append(codes, m.Code)
		case *pgproto3.ReadyForQuery:
			return answered, codes
		}
	}
}
