package faults

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

var (
	longRun  = flag.Bool("faults.long", false, "run the randomized fault schedules longer (more workers, iterations and faults)")
	seedFlag = flag.Int64("faults.seed", 0, "seed of the randomized schedules (0: time-based); a failing run prints its seed")
)

// pg is the package's shared cluster. Tests that restart or kill PostgreSQL start their own.
var pg *pgtest.Cluster

func TestMain(m *testing.M) {
	// The test binary doubles as the worker process that `fenceproxy lock` runs (see worker_test.go).
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain(os.Getenv(helperEnv), os.Args[1:]))
	}
	code := pgtest.RunMain(m, pgtest.Options{}, &pg)
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// The fenceproxy binary is built once per test binary.
var (
	binOnce sync.Once
	binDir  string
	binPath string
)

func fenceproxyBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fenceproxy-faults-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binDir = dir
		binPath = proxytest.Binary(t, dir)
	})
	if binPath == "" {
		t.Fatal("building the fenceproxy binary failed in an earlier test")
	}
	return binPath
}

// seed returns the seed for a randomized schedule and makes a failing test print how to replay it.
func seed(t *testing.T) int64 {
	s := *seedFlag
	if s == 0 {
		s = time.Now().UnixNano()
	}
	t.Logf("seed %d", s)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replay this schedule with: go test ./internal/faults -run '^%s$' -faults.seed=%d", t.Name(), s)
		}
	})
	return s
}

// waitFor polls cond every 10ms until it holds, failing t when within passes.
func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

var nameSeq atomic.Int64

// uniqueName returns a lower-case SQL identifier (and lock name) no other test in this process uses.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), nameSeq.Add(1))
}

// connect opens a pgx connection and closes it when the test ends.
func connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// backends counts the server processes of client sessions whose application_name is app.
func backends(t testing.TB, cl *pgtest.Cluster, app string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, cl.SuperDSN())
	if err != nil {
		t.Fatalf("connect to count backends: %v", err)
	}
	defer c.Close(context.Background())
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()", app).Scan(&n); err != nil {
		t.Fatalf("count backends: %v", err)
	}
	return n
}

// noLeakedBackends waits until no backend of app is left.
func noLeakedBackends(t testing.TB, cl *pgtest.Cluster, app string, within time.Duration) {
	t.Helper()
	waitFor(t, within, fmt.Sprintf("no backends left for application_name %q", app), func() bool { return backends(t, cl, app) == 0 })
}
