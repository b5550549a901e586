package proxy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// A Sync sent between a COPY's data rows, pipelined before the CopyInResponse (a COPY run by an Execute). A
// COPY that fails on a row before that Sync (PostgreSQL parses each row as it reads it) skips to the Sync and
// answers it, then answers the last Sync too; one that runs to its end ignores it. The pool cannot tell which
// when it must count: before 2026-12-05 it counted the Sync as ignored, the lend ended one ReadyForQuery early,
// and the subject waited, for ever, for an answer that went away with the connection (or, had the next
// client taken the connection before it came, to that client). Now, as for such a Sync sent once the COPY
// is known to run (forwardCopyIn), a COPY that fails with one sent ends the session (FATAL 08P01), after the
// answers up to the failure; one that runs to its end is answered as directly. A second client on the pool
// of one gets its own answers either way.
func TestPooledCopyBadRowBeforeAPipelinedSync(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 15s\n")
	tbl := fxName(t, "cl")
	fxExec(t, f.d, "CREATE TABLE "+tbl+" (x int)")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP TABLE IF EXISTS "+tbl) })
	seq := func(first string) []woMsg {
		return []woMsg{woP("", "COPY "+tbl+" FROM STDIN"), woB("", ""), woE("", 0),
			{&pgproto3.CopyData{Data: []byte(first + "\n")}, "CopyData"}, woS,
			{&pgproto3.CopyData{Data: []byte("5\n")}, "CopyData"}, {&pgproto3.CopyDone{}, "CopyDone"}, woS,
			woQ("SELECT 'after'")}
	}
	for _, c := range []struct {
		name, first string
		readies     int
		pooled      func(direct string) string // what the pool must answer, from what the server answers directly
	}{
		{"a bad row", "bad", 3, func(d string) string { return d[:strings.Index(d, "Z:I")+len("Z:I")] + " FATAL:08P01" }},
		{"good rows", "4", 2, func(d string) string { return d }},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, dc := copyhangRun(t, pg.SuperDSN()+woOpts, seq(c.first), c.readies)
			dc.Close(context.Background())
			p, _ := copyhangRun(t, f.dsn()+woOpts, seq(c.first), c.readies)
			ds, ps := strings.Join(d, " "), strings.Join(p, " ")
			if strings.Contains(ds, "HANG") || !strings.Contains(ds, "Z:I") {
				t.Fatalf("directly: %s", ds)
			}
			if want := c.pooled(ds); ps != want {
				t.Fatalf("pooled\n  got:  %s\n  want: %s\n  (direct: %s)", ps, want, ds)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			other, err := pgconn.Connect(ctx, f.dsn())
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close(context.Background())
			for i := range 3 {
				rs, err := other.Exec(ctx, "SELECT 'mine'").ReadAll()
				if err != nil || len(rs) != 1 || len(rs[0].Rows) != 1 || string(rs[0].Rows[0][0]) != "mine" {
					t.Fatalf("the second client's query %d: %v %v", i, rs, err)
				}
			}
		})
	}
}
