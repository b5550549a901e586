package tokens

import (
	"testing"
	"time"
)

// A holder whose lease read as unknown in the reading before its key vanished (etcd: revoked between the
// listing and its TimeToLive) is judged by the last lease time known: an expiry stays an expiry, a release a
// release. Taking the unknown reading counted the expiry as a release (TestEtcdObserverMetricsMove, flaky on a
// busy machine).
func TestInferKeepsTheLastKnownLease(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name       string
		leaseLeft  time.Duration // known at t0
		vanish     time.Duration // when the key is gone, after t0
		expiration bool
	}{
		{"expired", time.Second, 1200 * time.Millisecond, true},
		{"released", 30 * time.Second, 1200 * time.Millisecond, false},
	} {
		ob := &Observer{byName: map[string]*observedLock{}}
		ob.infer(LockInfo{Name: "l", Holder: "h", Token: 7, LeaseLeft: tc.leaseLeft}, t0)
		ob.infer(LockInfo{Name: "l", Holder: "h", Token: 7, LeaseLeft: -1}, t0.Add(900*time.Millisecond))
		ob.infer(LockInfo{Name: "l"}, t0.Add(tc.vanish))
		c := ob.byName["l"].counters
		if got := c.Expirations == 1 && c.Releases == 0; got != tc.expiration || c.Expirations+c.Releases != 1 {
			t.Errorf("%s: counters %+v", tc.name, c)
		}
	}
}
