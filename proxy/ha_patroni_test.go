package proxy_test

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/patronitest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/schema"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// TestPatroniLeaderKilled runs the real HA engine: Patroni (etcd as its DCS) with two PostgreSQL nodes,
// and `fenceproxy lock` workers writing a lock-fenced table through the proxy. The leader's host dies (SIGKILL
// to Patroni and its PostgreSQL); Patroni promotes the other node; the proxy follows it and the workers' writes
// go on there. The commit log on the new leader shows no stale write committed: in commit order, the tokens
// of lock "ledger" never go down.
func TestPatroniLeaderKilled(t *testing.T) {
	e := etcdtest.Start(t)
	cluster := patronitest.Start(t, e.ClientAddr(), 2)
	leader, err := cluster.WaitLeader(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // bootstrap, a failover (ttl 20 s), writes
	defer cancel()
	admin := connect(t, leader.DSN("postgres"))
	if _, err := admin.Exec(ctx, `
CREATE TABLE accounts (id int PRIMARY KEY, v int NOT NULL, fence_token bigint);
INSERT INTO accounts VALUES (1, 0, NULL);
CREATE TABLE commits (seq bigserial PRIMARY KEY, token bigint, lock text);
CREATE FUNCTION commit_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO commits (token, lock) VALUES (NEW.fence_token, current_setting('fence.lock', true));
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER commits AFTER INSERT OR UPDATE ON accounts DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION commit_record();`); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("t.yaml", []byte("upstream:\n  address: a:1\ntables:\n  - name: accounts\n    token_column: fence_token\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := schema.Install(ctx, admin, schema.FromConfig(cfg)); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)

	p := proxytest.Start(t, "", proxytest.Options{
		Hosts:    []string{cluster.Nodes[0].Addr(), cluster.Nodes[1].Addr()},
		Upstream: fmt.Sprintf("  health_interval: %s\n  health_timeout: 1s\n  connect_timeout: 2s\n", haInterval),
		YAML:     "tables:\n  - name: accounts\n    token_column: fence_token\nlimits:\n  startup_timeout: 5s\n",
		Grants:   tokens.NewEtcdStore(e.Client(), tokens.DefaultPrefix),
	})
	bin := proxytest.Binary(t, t.TempDir())
	host, port := splitAddr(t, p.Addr)

	// Workers: each takes the lock with `fenceproxy lock`, writes once with psql through the proxy, releases.
	var ok, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				cmd := exec.CommandContext(wctx, bin, "lock", "--etcd", e.ClientAddr(), "--ttl", "5s", "--wait", "20s", "ledger", "--",
					pg.Bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", port, "-U", "postgres", "-d", "postgres",
					"-c", "UPDATE accounts SET v = v + 1 WHERE id = 1")
				cmd.Env = append(cmd.Environ(), "PGCONNECT_TIMEOUT=10")
				if err := cmd.Run(); err != nil {
					failed.Add(1)
				} else {
					ok.Add(1)
				}
				cancel()
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()

	eventually(t, 60*time.Second, "workers' writes through the proxy", func() bool { return ok.Load() >= 5 })
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	before := ok.Load()
	if c, err := pgx.Connect(ctx, leader.DSN("postgres")); err == nil {
		c.Close(ctx)
		t.Fatalf("the killed leader's PostgreSQL %s still accepts connections", leader.Addr())
	}
	next, err := cluster.WaitLeader(90 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if next == leader {
		t.Fatal("the killed node is still the leader")
	}
	eventually(t, 60*time.Second, "workers' writes to go on after the failover", func() bool { return ok.Load() >= before+5 })
	t.Logf("writes: %d before the kill, %d in all, %d failed; the new leader %s took %v", before, ok.Load(), failed.Load(), next.Name, time.Since(killed))

	// The commit log on the new leader: tokens of the lock never go down in commit order, and the writes made
	// after the failover are there.
	conn := connect(t, next.DSN("postgres"))
	rows, err := conn.Query(ctx, "SELECT token FROM commits WHERE lock = 'ledger' ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	tokensSeen, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(tokensSeen); i++ {
		if tokensSeen[i] < tokensSeen[i-1] {
			t.Errorf("stale write committed: token %d after %d (commit %d of %d)", tokensSeen[i], tokensSeen[i-1], i, len(tokensSeen))
		}
	}
	if int64(len(tokensSeen)) < 5 {
		t.Errorf("the new leader holds %d fenced commits, want at least the 5 made after the failover", len(tokensSeen))
	}
}

func splitAddr(t *testing.T, addr string) (string, string) {
	t.Helper()
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			if _, err := strconv.Atoi(addr[i+1:]); err == nil {
				return addr[:i], addr[i+1:]
			}
		}
	}
	t.Fatalf("not host:port: %q", addr)
	return "", ""
}
