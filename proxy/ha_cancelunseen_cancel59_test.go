//go:build linux

package proxy_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A fenced write flushed to the server just before the router stops trusting its host, and not yet read by the
// backend when the proxy's cancel reaches it, must not run there. From cancel59 (2026-12-06): at the change
// the proxy shuts the session's server connection and cancels what the backend runs (endFencedTx; cancelLent in
// transaction pooling); PostgreSQL ignores a cancel that finds its backend waiting for a command, so the backend
// read the UPDATE after the cancel, waited for the row lock, and committed on the withdrawn primary once the
// lock was released. The backend is held (SIGSTOP) from before the UPDATE is sent until the cancel is pending on
// it: the order a busy machine or a descheduled backend gives, made certain.
func TestWriteUnreadWhenTheCancelComesOnAWithdrawnPrimary(t *testing.T) {
	modes := []struct{ name, yaml string }{
		{"transaction", pooledYAML("size: 1")}, // one server connection: the one pg_backend_pid() names
		{"session", ""},
		{"session-goroutines", "relay:\n  mode: goroutines\n"},
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			h := startHAPairConf(t, nil, "", mode.yaml, nil, nil)
			ctx := haCtx(t)
			admin := connect(t, h.primary.SuperDSN())
			c := tokenClient(ctx, t, h, 5)
			var pid int
			if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			lock := beginWith(ctx, t, connect(t, h.primary.SuperDSN()), "SELECT 1 FROM accounts WHERE id = 2 FOR UPDATE")
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			pc := c.PgConn()
			fe := pc.Frontend()
			fe.Send(&pgproto3.Query{String: "UPDATE accounts SET v = 7 WHERE id = 2"})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "the UPDATE to reach the stopped backend's socket", func() bool {
				n, err := socketUnread(pid)
				return err == nil && n > 0
			})
			h.splitBrain(ctx, t)
			eventually(t, 30*time.Second, "the proxy's cancel to reach the stopped backend", func() bool {
				return signalPending(pid, syscall.SIGINT)
			})
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			// The backend ignores the cancel (it waits for a command), reads the UPDATE and waits for the row
			// lock; only the proxy can still stop it.
			stopped := waitFor(15*time.Second, func() bool { return processGone(pid) })
			if !stopped {
				t.Errorf("the backend of the session still runs on the withdrawn primary after the proxy's cancel (the UPDATE it read after the cancel waits for the row lock)")
			}
			if err := lock.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			tags, codes := tagsAndCodesUntilReady(pc, 1)
			t.Logf("tags %q, errors %q", tags, codes)
			// Session mode tells the client at the change: the backend may still run the UPDATE then.
			eventually(t, 30*time.Second, "the backend to end the UPDATE", func() bool {
				var running int
				err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active'", pid).Scan(&running)
				return err == nil && running == 0
			})
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE id = 2 AND v = 7").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("a fenced UPDATE sent before the change and read by the backend after the proxy's cancel committed on the withdrawn primary (%d rows) once the lock was released, the client told %q %q; want none", n, tags, codes)
			}
			if slices.Contains(tags, "UPDATE 1") {
				t.Errorf("the client was told %q for a write on the withdrawn primary", tags)
			}
		})
	}
}

// waitFor polls cond until it holds (true) or within passes (false).
func waitFor(within time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(within); !cond(); {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// processGone reports whether the process pid has exited (reaped, or a zombie).
func processGone(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) state ...: comm may hold spaces and parentheses; the state follows the last ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// signalPending reports whether sig is pending on process pid (sent, not yet delivered: the process is stopped).
func signalPending(pid int, sig syscall.Signal) bool {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, mask, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "ShdPnd" && name != "SigPnd") {
			continue
		}
		bits, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64)
		if err == nil && bits&(1<<(uint(sig)-1)) != 0 {
			return true
		}
	}
	return false
}

// socketUnread is how many bytes wait, unread, in the receive queues of process pid's TCP sockets.
func socketUnread(pid int) (int, error) {
	fds, err := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	if err != nil {
		return 0, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(fd)
		if err == nil && strings.HasPrefix(target, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] = true
		}
	}
	unread := 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local rem st tx_queue:rx_queue tr:when retrnsmt uid timeout inode ...
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || !inodes[fields[9]] {
				continue
			}
			_, rx, _ := strings.Cut(fields[4], ":")
			n, err := strconv.ParseUint(rx, 16, 32)
			if err == nil {
				unread += int(n)
			}
		}
		f.Close()
	}
	return unread, nil
}
