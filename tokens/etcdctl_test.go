package tokens_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// requireEtcdctl returns etcdctl's path. scripts/setup installs it; its absence fails the test unless
// FENCEPROXY_TEST_SKIP_PG=1 (the switch for missing external tools) is set.
func requireEtcdctl(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("etcdctl")
	if err != nil {
		if os.Getenv("FENCEPROXY_TEST_SKIP_PG") == "1" {
			t.Skipf("etcdctl not found (FENCEPROXY_TEST_SKIP_PG=1): %v", err)
		}
		t.Fatalf("etcdctl not found: run scripts/setup (apt-get install etcd-client): %v", err)
	}
	return path
}

// etcdctlLock starts `etcdctl lock name -- sh -c script sh args...` and returns a channel with the lines it
// prints.
func etcdctlLock(t *testing.T, etcdctl string, e *etcdtest.Etcd, name, script string, args ...string) (*exec.Cmd, <-chan string) {
	t.Helper()
	argv := append([]string{"--endpoints", strings.Join(e.Endpoints(), ","), "lock", name, "--", "sh", "-c", script, "sh"}, args...)
	cmd := exec.Command(etcdctl, argv...)
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return cmd, lines
}

func readRev(t *testing.T, lines <-chan string, timeout time.Duration) int64 {
	t.Helper()
	select {
	case line, ok := <-lines:
		if !ok {
			t.Fatal("etcdctl printed nothing")
		}
		rev, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
		if err != nil || rev <= 0 {
			t.Fatalf("ETCD_LOCK_REV %q: %v", line, err)
		}
		return rev
	case <-time.After(timeout):
		t.Fatalf("etcdctl did not print ETCD_LOCK_REV within %v", timeout)
		return 0
	}
}

func waitExit(t *testing.T, cmd *exec.Cmd, timeout time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("etcdctl lock: %v", err)
		}
	case <-time.After(timeout):
		t.Fatalf("etcdctl lock did not exit within %v", timeout)
	}
}

// TestEtcdctlInterop: with prefix "", our lock and `etcdctl lock NAME` are the same lock, exclude each other,
// and hand out the same kind of token (ETCD_LOCK_REV), increasing across both.
func TestEtcdctlInterop(t *testing.T) {
	t.Parallel()
	etcdctl := requireEtcdctl(t)
	e := etcdtest.Start(t)
	admin := e.Client()
	name := "/fenceproxy-test/" + lockName(t)
	noPrefix := tokens.WithPrefix("")
	ctx := context.Background()

	// etcdctl holds the lock until the file exists.
	releaseFile := filepath.Join(t.TempDir(), "release")
	holder, lines := etcdctlLock(t, etcdctl, e, name, `echo "$ETCD_LOCK_REV"; while [ ! -e "$1" ]; do sleep 0.02; done`, releaseFile)
	rev1 := readRev(t, lines, 10*time.Second)
	resp, err := admin.Get(ctx, name+"/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("etcdctl's lock key under %q: %v %v", name+"/", resp, err)
	}
	if resp.Kvs[0].CreateRevision != rev1 {
		t.Fatalf("uncontended ETCD_LOCK_REV %d differs from its key's create revision %d", rev1, resp.Kvs[0].CreateRevision)
	}
	if l, err := tokens.TryAcquire(ctx, admin, name, noPrefix); !errors.Is(err, tokens.ErrLocked) {
		t.Fatalf("TryAcquire while etcdctl holds the lock: %v, %v; want ErrLocked", l, err)
	}
	ours := acquireAsync(ctx, e.Client(), name, noPrefix)
	waitFor(t, 5*time.Second, "our waiter queued", func() bool { return etcdtest.QueueLen(t, admin, name) == 2 })
	notYet(t, ours, "our lock")
	// A write between queueing and grant: our key's create revision and the grant revision differ, and the
	// token must be the grant revision (the revision that deleted etcdctl's key), as ETCD_LOCK_REV is.
	ourCreate := queuedCreateRevision(t, admin, name, clientv3.LeaseID(resp.Kvs[0].Lease))
	if _, err := admin.Put(ctx, "unrelated", "1"); err != nil {
		t.Fatal(err)
	}
	deleted := watchDelete(t, admin, string(resp.Kvs[0].Key))
	if err := os.WriteFile(releaseFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitExit(t, holder, 10*time.Second)
	grant := waitDeleteRevision(t, deleted, string(resp.Kvs[0].Key))
	l := waitAcquired(t, ours, 10*time.Second)
	if l.Token() != grant || ourCreate >= grant {
		t.Fatalf("our token %d after waiting, want the grant revision %d (our key's create revision is %d)", l.Token(), grant, ourCreate)
	}

	// We hold it: etcdctl waits, and gets it, with a higher revision, when we release.
	waiter, lines := etcdctlLock(t, etcdctl, e, name, `echo "$ETCD_LOCK_REV"`)
	waitFor(t, 10*time.Second, "etcdctl queued", func() bool { return etcdtest.QueueLen(t, admin, name) == 2 })
	select {
	case line := <-lines:
		t.Fatalf("etcdctl got the lock while we held it: %q", line)
	default:
	}
	// etcdctl's ETCD_LOCK_REV after waiting is the grant revision too, not its key's create revision.
	ectlCreate := queuedCreateRevision(t, admin, name, l.Lease())
	if _, err := admin.Put(ctx, "unrelated", "2"); err != nil {
		t.Fatal(err)
	}
	deleted = watchDelete(t, admin, l.Key())
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	grant = waitDeleteRevision(t, deleted, l.Key())
	rev3 := readRev(t, lines, 10*time.Second)
	if rev3 != grant || ectlCreate >= grant {
		t.Fatalf("etcdctl's ETCD_LOCK_REV %d after waiting, want the grant revision %d (its key's create revision is %d)", rev3, grant, ectlCreate)
	}
	waitExit(t, waiter, 10*time.Second)
	t.Logf("etcdctl %d, ours %d, etcdctl %d", rev1, l.Token(), rev3)
}
