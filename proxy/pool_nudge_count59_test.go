package proxy

import "testing"

// TestNudgeWithoutAKeeperTouchesNoChannel: with pool.min_idle 0 (no keeper started) a nudge, which every lend
// makes (connFor), sends nothing to refill: before 2026-12-06 it tried a send per lend to a channel nobody read
// (reload59 made refill always there), counted in docs/benchmark.md's thirty-second pass. Once the keeper runs,
// nudges reach it.
func TestNudgeWithoutAKeeperTouchesNoChannel(t *testing.T) {
	p := &txPool{refill: make(chan struct{}, 1)}
	p.nudge()
	if n := len(p.refill); n != 0 {
		t.Fatalf("a nudge without a keeper left %d in refill; want none", n)
	}
	p.keeping.Store(true) // as startKeeper sets it before the keeper runs
	p.nudge()
	if n := len(p.refill); n != 1 {
		t.Fatalf("a nudge with a keeper left %d in refill; want 1", n)
	}
}
