package main

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/lockservers"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// TestLocksZooKeeperAndRedis: `fenceproxy locks --zk` and `--redis` show a held lock with its token (and, for
// ZooKeeper, a waiter; Redis keeps no queue, so its waiters column says "?").
func TestLocksZooKeeperAndRedis(t *testing.T) {
	zk := lockservers.ZooKeeper(t)
	redis := lockservers.Redis(t)
	ctx := context.Background()
	for _, c := range []struct {
		flag    string
		open    func() (tokens.Store, error)
		waiters string
	}{
		{"--zk=" + zk.Addr(), func() (tokens.Store, error) {
			return tokens.NewZKStore(ctx, []string{zk.Addr()}, tokens.ZKOptions{ConnectTimeout: 30 * time.Second})
		}, "1"},
		{"--redis=" + redis.Addr(), func() (tokens.Store, error) { return tokens.NewRedisStore(ctx, redis.Addr(), tokens.RedisOptions{}) }, "?"},
	} {
		t.Run(strings.TrimPrefix(strings.SplitN(c.flag, "=", 2)[0], "--"), func(t *testing.T) {
			name := lockName(t)
			holder, err := c.open()
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Close()
			held, err := holder.Acquire(ctx, name, tokens.AcquireOptions{TTL: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release(ctx)
			if c.waiters == "1" {
				waiter, err := c.open()
				if err != nil {
					t.Fatal(err)
				}
				defer waiter.Close()
				wctx, cancel := context.WithCancel(ctx)
				defer cancel()
				go waiter.Acquire(wctx, name, tokens.AcquireOptions{})
			}
			var row []string
			waitFor(t, 30*time.Second, "the lock listed with its waiters", func() bool {
				var out, errOut bytes.Buffer
				if code := run([]string{"locks", c.flag}, &out, &errOut); code != 0 {
					t.Fatalf("locks: exit %d: %s", code, errOut.String())
				}
				for _, l := range strings.Split(out.String(), "\n") {
					if strings.HasPrefix(l, name+" ") {
						row = strings.Fields(l)
					}
				}
				return len(row) >= 3 && row[len(row)-1] == c.waiters
			})
			if !slices.Contains(row, strconv.FormatInt(held.Token(), 10)) {
				t.Fatalf("locks row %q: want token %d", row, held.Token())
			}
		})
	}
}
