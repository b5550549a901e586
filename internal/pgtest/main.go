package pgtest

import (
	"errors"
	"fmt"
	"os"
	"testing"
)

// RunMain starts one cluster for a test package, stores it in *c, runs the
// tests and stops the cluster. Use it as the whole body of TestMain:
//
//	var pg *pgtest.Cluster
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.RunMain(m, pgtest.Options{}, &pg)) }
//
// When the server binaries are missing the package fails with a message
// naming what to install, unless FENCEPROXY_TEST_SKIP_PG=1 is set: then *c
// stays nil, the tests run, and Require skips those that need PostgreSQL.
// If the test binary dies without returning here (a panic, a timeout, a
// signal), the cluster's reaper process still stops the server.
func RunMain(m *testing.M, opts Options, c **Cluster) int {
	cl, err := Start(opts)
	if err != nil {
		if errors.Is(err, ErrNoBinaries) && os.Getenv(SkipEnv) == "1" {
			fmt.Fprintf(os.Stderr, "%v\npgtest: %s=1, so tests that need PostgreSQL skip\n", err, SkipEnv)
			*c = nil
			return m.Run()
		}
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	*c = cl
	code := m.Run()
	if code != 0 {
		// Server-side errors often explain a failed test.
		fmt.Fprintf(os.Stderr, "--- pgtest: tail of %s ---\n%s\n", cl.LogFile(), cl.LogTail(40))
	}
	if err := cl.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Require skips or fails t when c is nil, that is when RunMain could not
// start a cluster because FENCEPROXY_TEST_SKIP_PG=1 let it go on without
// one. Call it first in every test that uses the package's cluster.
func Require(t testing.TB, c *Cluster) {
	t.Helper()
	if c != nil {
		return
	}
	if os.Getenv(SkipEnv) == "1" {
		t.Skipf("PostgreSQL server binaries missing and %s=1", SkipEnv)
	}
	t.Fatal("pgtest: no PostgreSQL cluster: TestMain must call pgtest.RunMain")
}

// MustStart starts a cluster owned by one test (for options the package's
// shared cluster does not have) and stops it when the test ends. It skips
// the test when the binaries are missing and FENCEPROXY_TEST_SKIP_PG=1, and
// fails it on any other error.
func MustStart(t testing.TB, opts Options) *Cluster {
	t.Helper()
	c, err := Start(opts)
	if err != nil {
		if errors.Is(err, ErrNoBinaries) && os.Getenv(SkipEnv) == "1" {
			t.Skipf("%v (%s=1)", err, SkipEnv)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	return c
}
