package proxy_test

import (
	"strings"
	"testing"
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
	tbl := copyTestTable(t, f, "cl")
	seq := func(first string) []woMsg {
		return []woMsg{woP("", "COPY "+tbl+" FROM STDIN"), woB("", ""), woE("", 0),
			woCopyData(first), woS, woCopyData("5"), woCopyDone(), woS,
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
			ds, ps := copyhangBoth(t, f, tbl, seq(c.first), c.readies)
			if strings.Contains(ds, "HANG") || !strings.Contains(ds, "Z:I") {
				t.Fatalf("directly: %s", ds)
			}
			if want := c.pooled(ds); ps != want {
				t.Fatalf("pooled\n  got:  %s\n  want: %s\n  (direct: %s)", ps, want, ds)
			}
			secondClientServed(t, f)
		})
	}
}
