package faults

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/lockservers"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// lockService is a real ZooKeeper or Redis server, how `fenceproxy lock` reaches it, and how the test's own
// holder B takes a lock from it.
type lockService struct {
	name string
	// start runs a server for t and returns it.
	start func(t testing.TB) *lockservers.Server
	// flags reach the server at addr.
	flags func(addr string) []string
	// open is B's store.
	open func(t *testing.T, addr string) tokens.Store
}

var lockServices = []lockService{
	{
		name:  "zookeeper",
		start: lockservers.ZooKeeper,
		// A JVM on a loaded 2-core machine can take seconds to open a session: longer than the harness's 2s.
		flags: func(addr string) []string { return []string{"--zk", addr, "--dial-timeout", "30s"} },
		open: func(t *testing.T, addr string) tokens.Store {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := tokens.NewZKStore(ctx, []string{addr}, tokens.ZKOptions{SessionTimeout: 10 * time.Second, ConnectTimeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
	},
	{
		name:  "redis",
		start: lockservers.Redis,
		flags: func(addr string) []string { return []string{"--redis", addr, "--dial-timeout", "30s"} },
		open: func(t *testing.T, addr string) tokens.Store {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := tokens.NewRedisStore(ctx, addr, tokens.RedisOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
	},
}

// TestPausedHolderLateWriteIsFencedZKRedis is the acceptance scenario with ZooKeeper and with Redis: A's
// `fenceproxy lock` and its writer are frozen past the lease (ZooKeeper: the session timeout, which the server
// raises to at least 4 s; Redis: the key's TTL); B takes the lock and writes through the other proxy; on
// SIGCONT A's late write fails with 55F01 naming B's token, B's row is intact, and A's lock exits 122.
func TestPausedHolderLateWriteIsFencedZKRedis(t *testing.T) {
	pgtest.Require(t, pg)
	for _, svc := range lockServices {
		t.Run(svc.name, func(t *testing.T) {
			srv := svc.start(t)
			table := fencedTable(t, pg, 1)
			p1 := startProxyProc(t, proxyConfig{Upstream: pg.Addr(), Tables: []string{table}})
			p2 := startProxyProc(t, proxyConfig{Upstream: pg.Addr(), Tables: []string{table}})
			dir, name := t.TempDir(), uniqueName(svc.name+"paused")
			a := startLockStore(t, svc.flags(srv.Addr()), []string{"--ttl", "1s"}, name, "late", dir, workerDSN(p1, "faults-"+svc.name+"-a"), table, "1")
			pausedHolderScenario(t, a, dir, table, p2, "faults-"+svc.name+"-b", func(ctx context.Context) (tokens.Held, error) {
				return svc.open(t, srv.Addr()).Acquire(ctx, name, tokens.AcquireOptions{TTL: 20 * time.Second})
			})
		})
	}
}

// TestLockServiceFaultsZKRedis: with the holder's command running, (1) the connection between `fenceproxy lock`
// and the lock service is cut, (2) the lock service is restarted: each time the holder's command gets SIGTERM
// (the "hold" worker writes DIR/sigterm) and `fenceproxy lock` exits 122, and a new holder's write is applied
// while the old token's write is refused.
func TestLockServiceFaultsZKRedis(t *testing.T) {
	pgtest.Require(t, pg)
	for _, svc := range lockServices {
		for _, fault := range []string{"cut", "restart"} {
			t.Run(svc.name+"/"+fault, func(t *testing.T) {
				srv := svc.start(t)
				relay := lockservers.NewRelay(t, srv.Addr())
				table := fencedTable(t, pg, 1)
				p := startProxyProc(t, proxyConfig{Upstream: pg.Addr(), Tables: []string{table}})
				ctx := ctxFor(t, 90*time.Second)
				dir, name := t.TempDir(), uniqueName(svc.name+fault)
				// Raise the store's counter first, so that a counter the fault resets starts below A's token.
				for range 2 {
					warm, err := svc.open(t, srv.Addr()).Acquire(ctx, name+"_warm", tokens.AcquireOptions{TTL: 5 * time.Second})
					if err != nil {
						t.Fatal(err)
					}
					warm.Release(ctx)
				}
				a := startLockStore(t, svc.flags(relay.Addr()), []string{"--ttl", "2s"}, name, "hold", dir, workerDSN(p, "faults-"+svc.name+"-hold"), table, "1")
				var ready workerReady
				readJSON(t, filepath.Join(dir, "ready"), 60*time.Second, &ready)
				h := &History{}
				var first Attempt // the hold worker's own write, under A's token
				readJSON(t, filepath.Join(dir, "result"), 10*time.Second, &first)
				h.Record(first)
				switch fault {
				case "cut":
					relay.Cut()
				case "restart":
					if err := srv.Stop(); err != nil {
						t.Fatal(err)
					}
					if err := srv.Start(); err != nil {
						t.Fatal(err)
					}
				}
				if code := a.wait(60 * time.Second); code != exitLeaseLost {
					t.Fatalf("fenceproxy lock exited %d, want %d (lease lost)", code, exitLeaseLost)
				}
				if !exists(filepath.Join(dir, "sigterm")) {
					t.Fatal("the holder's command did not get SIGTERM")
				}
				// A new holder (the lease has ended on the server, or the server forgot it) writes; the old token
				// cannot write again.
				b, err := svc.open(t, srv.Addr()).Acquire(ctx, name, tokens.AcquireOptions{TTL: 20 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				defer b.Release(context.Background())
				if b.Token() > ready.Token {
					bc := connect(t, p.DSN("faults-"+svc.name+"-new"))
					if err := tokens.SetToken(ctx, bc, b.Token(), ""); err != nil {
						t.Fatal(err)
					}
					if w := h.Write(ctx, bc, table, "B", b.Token(), 1); w.Outcome != Applied {
						t.Fatalf("the new holder's write: %v", w)
					}
					ac := connect(t, p.DSN("faults-"+svc.name+"-old"))
					if err := tokens.SetToken(ctx, ac, ready.Token, ""); err != nil {
						t.Fatal(err)
					}
					if w := h.Write(ctx, ac, table, "A", ready.Token, 1); w.Outcome != Stale {
						t.Fatalf("the old holder's write after the fault: %v, want 55F01", w)
					}
				} else {
					// Redis without persistence forgot its counter (docs/locks.md): the new token is below the
					// old one, and the database refuses it rather than let it overwrite the newer row.
					if svc.name != "redis" || fault != "restart" {
						t.Fatalf("new token %d is not above the old %d", b.Token(), ready.Token)
					}
					bc := connect(t, p.DSN("faults-"+svc.name+"-new"))
					if err := tokens.SetToken(ctx, bc, b.Token(), ""); err != nil {
						t.Fatal(err)
					}
					if w := h.Write(ctx, bc, table, "B", b.Token(), 1); w.Outcome != Stale {
						t.Fatalf("a token below the row's after Redis forgot its counter: %v, want 55F01 (fail safe)", w)
					}
				}
				h.Check(t, pg, table)
			})
		}
	}
}

// TestLockContentionZKRedis: 10 `fenceproxy lock` processes per store contend for one lock (runLockContention:
// never two holders at once, tokens strictly increasing, every waiter served or timed out at --wait).
func TestLockContentionZKRedis(t *testing.T) {
	pgtest.Require(t, pg)
	for _, svc := range lockServices {
		t.Run(svc.name, func(t *testing.T) {
			srv := svc.start(t)
			runLockContention(t, svc.flags(srv.Addr()), 10, *contentionFor)
		})
	}
}

// curatorClassPath is Curator 5 and the ZooKeeper client, from Debian's packages (libcurator-recipes-java).
var curatorClassPath = "/usr/share/java/" + strings.Join([]string{"curator-recipes", "curator-framework", "curator-client",
	"zookeeper", "zookeeper-jute", "guava", "slf4j-api", "slf4j-nop"}, ".jar:/usr/share/java/") + ".jar"

// curator runs testdata/curator/CuratorMutex.java: a Curator InterProcessMutex on path.
type curator struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

func startCurator(t *testing.T, servers, path string, waitMillis int) *curator {
	t.Helper()
	cmd := exec.Command("java", "-cp", curatorClassPath, "testdata/curator/CuratorMutex.java", servers, path, strconv.Itoa(waitMillis))
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("java (scripts/setup installs Debian's libcurator-recipes-java): %v", err)
	}
	c := &curator{cmd: cmd, in: in, lines: make(chan string, 4)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	return c
}

// next is the program's next line; a program that never prints fails the test by its timeout.
func (c *curator) next(t *testing.T) string {
	t.Helper()
	l, ok := <-c.lines
	if !ok {
		t.Fatal("CuratorMutex ended without a word")
	}
	return l
}

// lockTrue runs `fenceproxy lock --zk SERVERS --wait 0 NAME -- true` and returns its exit status.
func lockTrue(t *testing.T, servers, name string) int {
	t.Helper()
	cmd := exec.Command(fenceproxyBinary(t), "lock", "--zk", servers, "--dial-timeout", "30s", "--wait", "0", name, "--", "true")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("fenceproxy lock: %v\n%s", err, out)
	}
	t.Logf("fenceproxy lock: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	return cmd.ProcessState.ExitCode()
}

// TestCuratorInterop: a Curator InterProcessMutex and `fenceproxy lock --zk` on the same path exclude each
// other, both ways, because fenceproxy names and orders its nodes as Curator does.
func TestCuratorInterop(t *testing.T) {
	srv := lockservers.ZooKeeper(t)
	name := uniqueName("curator")
	path := tokens.DefaultZKRoot + "/" + name

	// Curator holds: fenceproxy cannot take the lock; once Curator releases, it can.
	c := startCurator(t, srv.Addr(), path, 30000)
	if l := c.next(t); !strings.HasPrefix(l, "held ") {
		t.Fatalf("Curator: %q", l)
	}
	if code := lockTrue(t, srv.Addr(), name); code != exitBusy {
		t.Fatalf("fenceproxy lock while Curator holds the mutex: exit %d, want %d", code, exitBusy)
	}
	fmt.Fprintln(c.in)
	if l := c.next(t); l != "released" {
		t.Fatalf("Curator: %q", l)
	}
	if code := lockTrue(t, srv.Addr(), name); code != 0 {
		t.Fatalf("fenceproxy lock after Curator released: exit %d", code)
	}

	// fenceproxy holds: Curator cannot take the mutex; once fenceproxy releases, it can.
	ctx := ctxFor(t, 60*time.Second)
	s, err := tokens.NewZKStore(ctx, []string{srv.Addr()}, tokens.ZKOptions{ConnectTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h, err := s.Acquire(ctx, name, tokens.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l := startCurator(t, srv.Addr(), path, 1000).next(t); l != "busy" {
		t.Fatalf("Curator while fenceproxy holds the lock: %q, want busy", l)
	}
	h.Release(ctx)
	c2 := startCurator(t, srv.Addr(), path, 30000)
	l := c2.next(t)
	if !strings.HasPrefix(l, "held ") {
		t.Fatalf("Curator after fenceproxy released: %q", l)
	}
	// Curator's node was created after fenceproxy's: its czxid, the token it would present, is higher.
	if czxid, err := strconv.ParseInt(strings.Fields(l)[1], 10, 64); err != nil || czxid <= h.Token() {
		t.Fatalf("Curator's node czxid %d (%v) is not above fenceproxy's token %d", czxid, err, h.Token())
	}
	fmt.Fprintln(c2.in)
}
