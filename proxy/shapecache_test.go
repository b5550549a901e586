package proxy_test

import (
	"fmt"
	"testing"
)

// Issue 20: writes that inline their values (every text new, one shape) are served by the shape cache through
// the real proxy: the rewrite cache hit ratio from the metrics is at least 99% after the first statement of each
// shape, and the templated statements are fenced (they stamp the token, and a stale token is refused).
func TestShapeCacheLiteralWrites(t *testing.T) {
	f := newFenced(t)
	ctx := ctxT(t)
	f.reset(t, "(1, 0, null), (2, 0, null)")
	c := f.conn(t, "7")
	const n = 600
	for i := range n {
		sql := f.sql(fmt.Sprintf("UPDATE %%[1]s SET balance = balance + %d, note = 'n%d' WHERE id = %d", i-n/2, i, 1+i%2))
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if got, want := f.snapshot(t), "1:-300:7 2:0:7"; got != want { // sums of i-n/2 over even and odd i < n
		t.Errorf("rows %q, want %q", got, want)
	}
	hits := fxCounter(t, f.p.Registry, "fenceproxy_rewrite_cache_hits_total", nil)
	misses := fxCounter(t, f.p.Registry, "fenceproxy_rewrite_cache_misses_total", nil)
	// Misses: the SET of the token, and the first two UPDATEs of each shape (a negative delta, a non-negative
	// one): the template is built on a shape's second sighting.
	if misses > 5 || hits < n-4 || hits/(hits+misses) < 0.99 {
		t.Errorf("rewrite cache: %v hits, %v misses for %d literal-only variants", hits, misses, n)
	}
	// A stale token is refused by the templated statement too.
	f.reset(t, "(1, 0, 9)")
	_, err := c.Exec(ctx, f.sql("UPDATE %[1]s SET balance = balance + 5 WHERE id = 1"))
	wantStale(t, err, f.label, 9, 7)
}
