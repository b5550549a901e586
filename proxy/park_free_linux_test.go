package proxy

import (
	"testing"
	"time"
)

// The parker gives the memory of parked clients back at the end of a wave of parking (a sweep period with no
// park), not only every freeEvery: a wave's clients that parked after its first freeAfterParks kept their memory
// for half a minute. It never does for fewer than freeAfterParks parks, nor more often than freeQuiet.
func TestParkerFreesAfterAWave(t *testing.T) {
	for _, c := range []struct {
		parks int64
		quiet bool
		since time.Duration
		want  bool
	}{
		{freeAfterParks, true, freeQuiet, true},                // a wave ended
		{freeAfterParks, false, freeQuiet, false},              // a wave going on
		{freeAfterParks, false, freeEvery, true},               // parking all the time: every freeEvery
		{freeAfterParks, true, freeQuiet - time.Second, false}, // not more often than freeQuiet
		{freeAfterParks - 1, true, freeEvery, false},           // too few parks to be worth a collection
		{10 * freeAfterParks, true, 2 * time.Second, false},    // however many
		{10 * freeAfterParks, true, freeQuiet + time.Second, true},
	} {
		if got := freeDue(c.parks, c.quiet, c.since); got != c.want {
			t.Errorf("freeDue(%d parks, quiet %v, %v since the last) = %v, want %v", c.parks, c.quiet, c.since, got, c.want)
		}
	}
}
