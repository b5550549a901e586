package tokens

import (
	"testing"
	"time"
)

// The listings' one rule for what they show of a lock: "-" for what a lock nobody holds has none of, "?" for
// what the store cannot tell, durations to 100ms.
func TestLockCells(t *testing.T) {
	for _, tc := range []struct {
		name string
		li   LockInfo
		want LockCells
	}{
		{"held", LockInfo{Holder: "h", Token: 7, LeaseLeft: 9940 * time.Millisecond, HeldFor: 1210 * time.Millisecond, Waiters: 2},
			LockCells{"h", "7", "9.9s", "1.2s", "2"}},
		{"waited for only", LockInfo{Waiters: 1, LeaseLeft: -1}, LockCells{"-", "-", "-", "-", "1"}},
		{"unknown (ZooKeeper lease, Redis queue)", LockInfo{Holder: "h", LeaseLeft: -1, Waiters: -1}, LockCells{"h", "?", "?", "?", "?"}},
	} {
		if got := tc.li.Cells(); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
