package proxy_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// COPY FROM STDIN in transaction pooling when the client pipelines its data, its end and its next messages
// before the CopyInResponse comes, and cancels and drains during an extended COPY. From a review on 2026-12-03
// of that day's COPY accounting, which each test (but the simple-Query controls) failed: which Syncs the
// server ignores is decided by their place in the client's stream (pooledState.copySyncs).

// A simple COPY FROM STDIN whose data, end and a Sync are pipelined behind the Query (sent before the
// CopyInResponse came). Directly: G, COPY 1, Z, and the Sync — which comes after the CopyDone, so the server
// reads it outside copy mode — gets its own Z. Before the mend, the pool took the Sync for one inside the copy
// (the CopyDone went before the CopyInResponse, so nothing ended the copy): uncounted, its Z was left on the
// server connection.
func TestPooledCopyPipelinedTrailingSync(t *testing.T) {
	copySameAsDirect(t, []string{"pcp_copy1"},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "COPY pcp_copy1 FROM STDIN"}, &pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, &pgproto3.Sync{}},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 42 AS answer"}})
}

// libpq-style COPY by the extended protocol (Parse, Bind, Execute, Sync), its data, CopyDone and second Sync,
// and the client's next Query, all pipelined. Directly: G, COPY 1, Z (the first Sync is ignored in copy mode,
// the second answered), then the Query's answer. Before the mend, the second Sync went uncounted and the
// Query went out as a new unit with the COPY's answers still to come: the client got the token statement's
// answers and not the COPY's.
func TestPooledCopyExtendedPipelinedThenQuery(t *testing.T) {
	copySameAsDirect(t, []string{"pcp_copy3"},
		[]pgproto3.FrontendMessage{
			&pgproto3.Parse{Query: "COPY pcp_copy3 FROM STDIN"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
			&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, &pgproto3.Sync{},
			&pgproto3.Query{String: "SELECT pg_sleep(0.2)::text AS s"},
		})
}

// The extended pipelined COPY followed by a second extended batch (not a Query): before the mend its Sync went
// uncounted, and the connection stayed lent for good.
func TestPooledCopyExtendedPipelinedThenBatch(t *testing.T) {
	copySameAsDirect(t, []string{"pcp_copy5"},
		[]pgproto3.FrontendMessage{
			&pgproto3.Parse{Query: "COPY pcp_copy5 FROM STDIN"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
			&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, &pgproto3.Sync{},
			&pgproto3.Parse{Query: "SELECT pg_sleep(0.2)::text AS s"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
		},
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 42 AS answer"}})
}

// copyCancel sends a COPY by the extended protocol as libpq's PQexecParams does (Parse, Bind, Execute, Sync),
// waits for its CopyInResponse, sends one row, cancels, waits, then sends a row, CopyDone and Sync; it returns
// the answers to that last step and to a check of the table.
func copyCancel(t *testing.T, pc *pgconn.PgConn, table string, simple bool) [][]string {
	t.Helper()
	start := []pgproto3.FrontendMessage{&pgproto3.Parse{Query: "COPY " + table + " FROM STDIN"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}}
	end := []pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("2\n")}, &pgproto3.CopyDone{}, &pgproto3.Sync{}}
	if simple {
		start = []pgproto3.FrontendMessage{&pgproto3.Query{String: "COPY " + table + " FROM STDIN"}}
		end = end[:2]
	}
	out := wireSteps(t, pc, 300*time.Millisecond, nil, start, []pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("1\n")}})
	if err := pc.CancelRequest(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	return append(out, wireSteps(t, pc, 700*time.Millisecond, nil, end)...)
}

// A client cancels its COPY while it streams the data: directly the cancel fails the COPY (57014 at the next
// row). By the extended protocol (libpq-style) the pool had taken the batch's Sync back and found the client
// idle (open 0, not unsynced): it dropped the cancel, and the COPY committed. The simple Query's COPY is a
// control (its unit stays open).
func TestPooledCancelDuringCopy(t *testing.T) {
	for _, simple := range []bool{false, true} {
		t.Run(fmt.Sprintf("simple=%v", simple), func(t *testing.T) {
			f := newPooledFenced(t, 1, "")
			plainTable(t, f, "pcp_copy6")
			d := copyCancel(t, directPgConn(t), "pcp_copy6", simple)
			p := copyCancel(t, pooledPgConn(t, f, ""), "pcp_copy6", simple)
			if fmt.Sprint(d) != fmt.Sprint(p) {
				t.Fatalf("cancel during a COPY\n direct: %q\n pooled: %q", d, p)
			}
		})
	}
}

// The trailing Sync with the client's next Query pipelined too: client A must get the Sync's ReadyForQuery
// (before the mend it was left on the connection, which the next lend then closed); client B, waiting in the
// pool of one, is checked too.
func TestPooledCopyTrailingSyncThenQuery(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 10s\n")
	plainTable(t, f, "pcp_copy8")
	steps := []pgproto3.FrontendMessage{
		&pgproto3.Query{String: "COPY pcp_copy8 FROM STDIN"}, &pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, &pgproto3.Sync{},
		&pgproto3.Query{String: "SELECT pg_sleep(0.5)::text AS a_sleep, 'from A' AS who"},
	}
	d := wireSteps(t, directPgConn(t), 1000*time.Millisecond, nil, steps)
	a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	b := pooledPgConn(t, f, "&options=-c%20fence.token%3D7")
	pa := wireSteps(t, a, 100*time.Millisecond, d, steps)
	bq := []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 2 AS b_two, current_setting('fence.token', true) AS b_tok"}}
	pb := wireSteps(t, b, 1500*time.Millisecond, nil, bq)
	db := wireSteps(t, directPgConn(t), 700*time.Millisecond, nil, bq)
	if fmt.Sprint(pb) != fmt.Sprint([][]string{{"T(b_two,b_tok)", "D2,7", "SELECT 1", "ZI"}}) || fmt.Sprint(d) != fmt.Sprint(pa) {
		t.Fatalf("client A direct: %q\nclient A pooled: %q\nclient B direct (no token there): %q\nclient B pooled: %q", d, pa, db, pb)
	}
}

// The libpq-style extended COPY pipelined with a following batch, while client B waits for the pool of one
// (B sends its SELECT while A's batch runs pg_sleep): before the mend A's COPY settled the lend with A's batch
// in flight.
func TestPooledCopyExtendedPipelinedWaitingClient(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 10s\n")
	plainTable(t, f, "pcp_copy9")
	steps := []pgproto3.FrontendMessage{
		&pgproto3.Parse{Query: "COPY pcp_copy9 FROM STDIN"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
		&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, &pgproto3.Sync{},
		&pgproto3.Parse{Query: "SELECT pg_sleep(0.6)::text AS a_sleep, 'from A' AS who"}, &pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{},
	}
	d := wireSteps(t, directPgConn(t), 1000*time.Millisecond, nil, steps)
	a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	b := pooledPgConn(t, f, "&options=-c%20fence.token%3D7")
	bq := []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 2 AS b_two, current_setting('fence.token', true) AS b_tok"}}
	done := make(chan [][]string)
	go func() {
		time.Sleep(200 * time.Millisecond)
		done <- wireSteps(t, b, 1500*time.Millisecond, [][]string{{"", "", "", ""}}, bq) // up to 5 s for its 4 answers
	}()
	pa := wireSteps(t, a, 1500*time.Millisecond, d, steps)
	pb := <-done
	if fmt.Sprint(pb) != fmt.Sprint([][]string{{"T(b_two,b_tok)", "D2,7", "SELECT 1", "ZI"}}) || fmt.Sprint(d) != fmt.Sprint(pa) {
		t.Fatalf("client A direct: %q\nclient A pooled: %q\nclient B pooled: %q", d, pa, pb)
	}
}

// A batch that binds a stored VACUUM first gets no token statement (VACUUM must run outside a block), so the
// other statements of that batch meet the placeholder: a known limit (docs/pooling.md), which fails closed.
// Directly, with token 5 from the startup options, the SELECT would see 5 and the INSERT be written with it.
func TestPooledBoundVacuumBatchSeesThePlaceholder(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	plainTable(t, f, "pcp_vac")
	a := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	ins := []pgproto3.FrontendMessage{&pgproto3.Parse{Query: "INSERT INTO " + f.label + " (balance) VALUES (1) RETURNING fence_token"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}}
	got := wireSteps(t, a, 300*time.Millisecond, nil,
		[]pgproto3.FrontendMessage{&pgproto3.Parse{Name: "v", Query: "VACUUM pcp_vac"}, &pgproto3.Sync{}},
		[]pgproto3.FrontendMessage{
			&pgproto3.Bind{DestinationPortal: "pv", PreparedStatement: "v"},
			&pgproto3.Parse{Query: "SELECT current_setting('fence.token', true) AS tok"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
		},
		append([]pgproto3.FrontendMessage{&pgproto3.Bind{DestinationPortal: "pv", PreparedStatement: "v"}}, ins...),
		ins)
	want := [][]string{{"1", "ZI"}, {"2", "1", "2", "Dfenceproxy:pooled", "SELECT 1", "ZI"}, {"2", "1", "2", "E55F03", "ZI"}, {"1", "2", "D5", "INSERT 0 1", "ZI"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("want %q, got %q", want, got)
	}
}

// copyThroughDrain starts a COPY (simple, or libpq-style extended), sends a row, starts the proxy's graceful
// shutdown, then sends the rest of the data and the COPY's end: the answers to that last step.
func copyThroughDrain(t *testing.T, extended bool) [][]string {
	f := newPooledFenced(t, 1, "")
	plainTable(t, f, "pcp_drain")
	a := pooledPgConn(t, f, "")
	start := []pgproto3.FrontendMessage{&pgproto3.Query{String: "COPY pcp_drain FROM STDIN"}}
	end := []pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("2\n")}, &pgproto3.CopyDone{}}
	if extended {
		start = []pgproto3.FrontendMessage{&pgproto3.Parse{Query: "COPY pcp_drain FROM STDIN"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}}
		end = append(end, &pgproto3.Sync{})
	}
	wireSteps(t, a, 300*time.Millisecond, nil, start, []pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("1\n")}})
	startDrain(t, f.p)
	time.Sleep(300 * time.Millisecond)
	return wireSteps(t, a, 500*time.Millisecond, nil, end)
}

// A drain lets a client's COPY finish (the client streams its data, its unit open): the simple Query's COPY
// (a control, passes).
func TestPooledDrainDuringSimpleCopy(t *testing.T) {
	if got := copyThroughDrain(t, false); len(got[0]) < 2 || got[0][0] != "COPY 2" || got[0][1] != "ZI" {
		t.Fatalf("a drain during a simple COPY: %q", got)
	}
}

// The libpq-style extended COPY: before the mend the pool had taken its Sync back and the Sync had cleared
// unsynced, so the drain found the session idle between two CopyData and ended it mid-COPY (57P01).
func TestPooledDrainDuringExtendedCopy(t *testing.T) {
	if got := copyThroughDrain(t, true); len(got[0]) < 2 || got[0][0] != "COPY 2" || got[0][1] != "ZI" {
		t.Fatalf("a drain during an extended COPY: %q", got)
	}
}
