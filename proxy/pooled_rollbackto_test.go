package proxy_test

import (
	"net/url"
	"strings"
	"testing"
)

// A batch that starts with a Parse of ROLLBACK TO (only parsed) and then binds and runs a write: the write is the
// client's transaction and runs with the client's token, as directly. ROLLBACK TO ends no block (outside one
// PostgreSQL refuses it, 25P01, whatever runs before it), but until 2026-12-05 the proxy classed it with COMMIT
// and ROLLBACK (rewrite.PoolingClass.Own), gave the batch no token statement, and the write met the placeholder
// (55F03) where directly it ran with the client's token (the fenced oracle, TestPooledFencedOracle seed 17 #29,
// where directly the lock refused it, 55F01). Executed outside a block, it fails as directly.
func TestPooledBatchLedByRollbackToGetsTheToken(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	opts := "&options=" + strings.ReplaceAll(url.QueryEscape("-c fence.token=5"), "+", "%20")
	a, err := sfConnect(f.dsn() + opts)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	ins := "INSERT INTO " + f.label + " (id, balance) VALUES (7, 1) RETURNING fence_token"
	for _, c := range []struct {
		name string
		msgs []woMsg
		want string
	}{
		{"parsed", []woMsg{woP("", "ROLLBACK TO a"), woP("s1", ins), woB("", "s1"), woE("", 0), woS}, "1 1 2 D[5] C:INSERT 0 1 Z:I"},
		{"executed", []woMsg{woP("", "ROLLBACK TO SAVEPOINT a"), woB("", ""), woE("", 0), woB("", "s1"), woE("", 0), woS}, "1 2 E:25P01 Z:I"},
	} {
		if got, _ := a.send(c.msgs); strings.Join(got, " ") != c.want {
			t.Errorf("%s: got %v, want %s", c.name, got, c.want)
		}
	}
}
