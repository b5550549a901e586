package rewrite

import (
	"fmt"
	"testing"
)

// TestCacheTryPlan: TryPlan answers without parsing exactly when Plan would (prefilter, early decision, cached
// text, filled shape template), gives the same plan as Plan then, and on a miss changes and counts nothing, so
// that an event loop can send the miss elsewhere and find it cached afterwards.
func TestCacheTryPlan(t *testing.T) {
	r := testRewriter(t)
	obs := &countingObserver{}
	c := NewCacheObserved(r, 64, obs)
	if p, ok := c.TryPlan([]byte("SELECT 1"), DefaultSettings); !ok || p.Action != Pass {
		t.Fatalf("a prefiltered read: %+v, %v", p, ok)
	}
	if p, ok := c.TryPlan([]byte("SELECT * FROM accounts WHERE note = 'do not update'"), DefaultSettings); !ok || p.Action != Pass {
		t.Fatalf("a read decided without parsing: %+v, %v", p, ok)
	}
	q := []byte("UPDATE accounts SET n = m WHERE id = $1")
	if _, ok := c.TryPlan(q, DefaultSettings); ok {
		t.Fatal("TryPlan answered a miss")
	}
	if c.Len() != 0 || obs.hits.Load() != 0 || obs.misses.Load() != 0 {
		t.Fatalf("a TryPlan miss changed the cache (Len %d) or counted (hits %d, misses %d)", c.Len(), obs.hits.Load(), obs.misses.Load())
	}
	want := c.Plan(q, DefaultSettings)
	if got, ok := c.TryPlan(q, DefaultSettings); !ok || got.SQL != want.SQL || got.Action != Rewrite {
		t.Fatalf("after Plan, TryPlan = %+v, %v; want %+v", got, ok, want)
	}
	if obs.hits.Load() != 1 || obs.misses.Load() != 1 {
		t.Fatalf("hits %d, misses %d; want 1, 1", obs.hits.Load(), obs.misses.Load())
	}
	// Another setting is another entry: a miss again.
	other := DefaultSettings
	other.StandardConformingStrings = !other.StandardConformingStrings
	if _, ok := c.TryPlan(q, other); ok {
		t.Fatal("TryPlan answered from another setting's entry")
	}

	// Literal texts: the shape's template is built by Plan (on the second sighting); TryPlan then fills it.
	lit := func(i int) []byte { return []byte(fmt.Sprintf("UPDATE accounts SET n = %d WHERE id = %d", i, i+1)) }
	for i := range 2 {
		if _, ok := c.TryPlan(lit(i), DefaultSettings); ok {
			t.Fatalf("literal text %d before its shape's template: TryPlan answered", i)
		}
		c.Plan(lit(i), DefaultSettings)
	}
	got, ok := c.TryPlan(lit(7), DefaultSettings)
	if !ok {
		t.Fatal("TryPlan missed a text whose shape has a template")
	}
	if want := c.Plan(lit(7), DefaultSettings); got.SQL != want.SQL || got.Action != Rewrite {
		t.Fatalf("TryPlan %+v, Plan %+v", got, want)
	}
}
