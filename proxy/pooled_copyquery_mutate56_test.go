package proxy_test

import (
	"strings"
	"testing"
)

// A Query whose text holds the word copy but starts no COPY, and, pipelined behind it before its answer, an
// extended-protocol batch whose Execute does start one: the CopyInResponse answers that Execute, not the Query
// (the Query was answered first). Counted as the Query's COPY, the Syncs sent since the Query would be taken as
// swallowed by it, and the lend would end before the batch's answers came, which the next client of the
// connection would then read. Sent in one write directly and through a pool of one, the answers must be the
// same, and a second client must then get the pool's one connection and its own answers. In a transaction
// block the Query's ReadyForQuery does not end the lend: the batch behind it goes on the same connection.
func TestPooledCopyByAnExecuteAfterAQueryWithTheWord(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 15s\n")
	tbl := copyTestTable(t, f, "cq")
	copyData, copyDone := woCopyData("5"), woCopyDone()
	count := woQ("SELECT count(*) FROM " + tbl)
	for _, c := range []struct {
		name    string
		seq     []woMsg
		readies int
	}{
		{"a Sync swallowed", []woMsg{woQ("SELECT 'copy'"), woP("", "COPY "+tbl+" FROM STDIN"), woB("", ""), woE("", 0), woS, copyData, copyDone, woS, count}, 3},
		{"no Sync swallowed", []woMsg{woQ("SELECT 'copy'"), woP("", "COPY "+tbl+" FROM STDIN"), woB("", ""), woE("", 0), copyData, copyDone, woS, count}, 3},
		{"in a block, a Sync swallowed", []woMsg{woQ("BEGIN"), woQ("SELECT 'copy'"), woP("", "COPY "+tbl+" FROM STDIN"), woB("", ""), woE("", 0), woS, copyData, copyDone, woS, count, woQ("COMMIT")}, 5},
		{"in a block, a stray end", []woMsg{woQ("BEGIN"), woQ("SELECT 'copy'"), woP("", "SELECT 1"), woB("", ""), woE("", 0), copyDone, woP("", "COPY "+tbl+" FROM STDIN"), woB("", ""), woE("", 0), woS, copyData, copyDone, woS, count, woQ("COMMIT")}, 5},
		{"two Queries", []woMsg{woQ("SELECT 'copy'"), woQ("SELECT 'copy'"), woP("", "COPY "+tbl+" FROM STDIN"), woB("", ""), woE("", 0), woS, copyData, copyDone, woS, count}, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			ds, ps := copyhangBoth(t, f, tbl, c.seq, c.readies)
			if strings.Contains(ds, "HANG") {
				t.Fatalf("the test's sequence hangs directly: %s", ds)
			}
			if ds != ps {
				t.Fatalf("differs\n  direct: %s\n  pooled: %s", ds, ps)
			}
			secondClientServed(t, f)
		})
	}
}
