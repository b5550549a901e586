package main

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// TestDemo runs the whole demo, as `go run ./examples/demo` does, so that CI proves it tells the story: run
// returns nil only when A's late write was refused with 55F01, A's late INSERT of new rows was refused by the
// lock fence (55F01 naming the lock), the batch holds B's settlement and the same write without the proxy went
// through.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	err := run(&out)
	if errors.Is(err, pgtest.ErrNoBinaries) && os.Getenv(pgtest.SkipEnv) == "1" {
		t.Skipf("%v (%s=1)", err, pgtest.SkipEnv)
	}
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatalf("demo failed: %v", err)
	}
	for _, want := range []string{
		"writes its stale settlement via fenceproxy",
		"55F01 stale fencing token",
		"inserts its transfers as new rows",
		"55F01 stale fencing token: lock settlement has accepted a newer token",
		"A's transfers as new rows refused too",
		"OUTCOME: A refused with 55F01 stale fencing token",
		"the batch holds B's result",
		"without fenceproxy: the same late write of A straight to PostgreSQL",
		"succeeded silently",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
}
