// Package patronitest runs a throwaway Patroni cluster (Debian's patroni package, etcd v3 as its DCS) of
// PostgreSQL nodes on loopback ports, for failover tests with a real HA engine. scripts/setup installs
// Patroni; without it Start fails the test (or skips it with FENCEPROXY_TEST_SKIP_PG=1, as pgtest does).
package patronitest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/freeport"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// Node is one Patroni member: its PostgreSQL and its REST API.
type Node struct {
	Name    string
	PGPort  int
	APIPort int
	dir     string
	cmd     *exec.Cmd
	done    chan struct{}
}

// Addr is the node's PostgreSQL address, 127.0.0.1:PORT.
func (n *Node) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.PGPort)) }

// DSN connects to the node's PostgreSQL as the superuser (trust) to dbname.
func (n *Node) DSN(dbname string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", pgtest.SuperUser, n.Addr(), dbname)
}

// SuperDSN connects to the node's PostgreSQL as the superuser to the database "postgres" (Patroni creates no
// other).
func (n *Node) SuperDSN() string { return n.DSN("postgres") }

// Exec runs sql (one or more statements, simple protocol) on the node as the superuser.
func (n *Node) Exec(sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.SuperDSN())
	if err != nil {
		return fmt.Errorf("patronitest: connect to %s: %w", n.Name, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("patronitest: exec on %s: %w", n.Name, err)
	}
	return nil
}

// Cluster is a running Patroni cluster.
type Cluster struct {
	Nodes []*Node
	scope string
}

// The cluster runs in Patroni's synchronous_mode: once a replica streams, it is the leader's synchronous
// standby, and Patroni promotes only it, so a failover loses no commit the client saw acknowledged (the
// history checkers in internal/faults demand every acknowledged write).
//
// Start runs a Patroni cluster of n nodes whose DCS is the etcd at etcdAddr (host:port) and waits until it has
// a leader and every other node streams from it. The cluster is stopped when the test ends.
func Start(t *testing.T, etcdAddr string, n int) *Cluster {
	t.Helper()
	if _, err := exec.LookPath("patroni"); err != nil {
		if os.Getenv(pgtest.SkipEnv) == "1" {
			t.Skipf("patroni not installed (%s=1)", pgtest.SkipEnv)
		}
		t.Fatalf("patroni not found (scripts/setup installs the Debian package patroni): %v", err)
	}
	binDir, err := pgtest.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	// Patroni runs every server program from one directory (pg_controldata, pg_basebackup too): the real one,
	// not a directory of links to some of them.
	if initdb, err := filepath.EvalSymlinks(filepath.Join(binDir, "initdb")); err == nil {
		binDir = filepath.Dir(initdb)
	}
	cred, err := pgtest.ServerCredential()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{scope: fmt.Sprintf("fp%d", time.Now().UnixNano())}
	for i := 0; i < n; i++ {
		node, err := c.startNode(t, i, etcdAddr, binDir, cred)
		if err != nil {
			t.Fatal(err)
		}
		c.Nodes = append(c.Nodes, node)
		if i == 0 {
			// The first node bootstraps the cluster; the others are made from it.
			if _, err := c.WaitLeader(90 * time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() {
		for _, n := range c.Nodes {
			n.stop()
		}
	})
	for _, n := range c.Nodes {
		if c.isLeader(n) {
			continue
		}
		if err := waitRole(n, "replica", "running", 120*time.Second); err != nil {
			t.Fatalf("%s: %v\n%s", n.Name, err, n.LogTail(30))
		}
	}
	return c
}

func (c *Cluster) startNode(t *testing.T, i int, etcdAddr, binDir string, cred *syscall.Credential) (*Node, error) {
	base := os.TempDir()
	if cred != nil {
		base = "/tmp" // reachable by the postgres OS user
	}
	dir, err := os.MkdirTemp(base, "fenceproxy-patroni-")
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	n := &Node{Name: fmt.Sprintf("node%d", i), dir: dir, done: make(chan struct{})}
	if n.PGPort, err = freeport.Pick(); err != nil {
		return nil, err
	}
	if n.APIPort, err = freeport.Pick(); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(`scope: %[1]s
namespace: /fenceproxy-test/
name: %[2]s
log:
  level: INFO
restapi:
  listen: 127.0.0.1:%[3]d
  connect_address: 127.0.0.1:%[3]d
etcd3:
  hosts: ["%[4]s"]
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 1
    retry_timeout: 5
    maximum_lag_on_failover: 1073741824
    synchronous_mode: true
    postgresql:
      use_pg_rewind: false
      parameters:
        max_connections: 100
        fsync: "off"
        full_page_writes: "off"
  initdb:
    - encoding: UTF8
    - locale: C
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:%[5]d
  connect_address: 127.0.0.1:%[5]d
  data_dir: %[6]s/data
  bin_dir: %[7]s
  pgpass: %[6]s/pgpass
  authentication:
    superuser: {username: %[8]s, password: unused}
    replication: {username: %[8]s, password: unused}
  parameters:
    unix_socket_directories: %[6]s
`, c.scope, n.Name, n.APIPort, etcdAddr, n.PGPort, dir, binDir, pgtest.SuperUser)
	confPath := filepath.Join(dir, "patroni.yml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "patroni.log"))
	if err != nil {
		return nil, err
	}
	n.cmd = exec.Command("patroni", confPath)
	n.cmd.Dir = dir
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	n.cmd.Env = append(env, "HOME="+dir)
	// Its own process group: Kill takes Patroni and its PostgreSQL down together, as a crashed host.
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := n.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start patroni: %w", err)
	}
	go func() { n.cmd.Wait(); logf.Close(); close(n.done) }()
	return n, nil
}

// status is what Patroni's REST API says of a node (GET /patroni).
type status struct {
	Role  string `json:"role"`
	State string `json:"state"`
}

func (n *Node) status() (status, error) {
	var s status
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/patroni", n.APIPort))
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&s)
	return s, err
}

func (c *Cluster) isLeader(n *Node) bool {
	s, err := n.status()
	return err == nil && (s.Role == "master" || s.Role == "primary") && s.State == "running"
}

// WaitLeader waits until a running node is the leader (and accepts writes) and returns it.
func (c *Cluster) WaitLeader(within time.Duration) (*Node, error) {
	deadline := time.Now().Add(within)
	for {
		alive := false
		for _, n := range c.Nodes {
			if n.alive() && c.isLeader(n) {
				return n, nil
			}
			alive = alive || n.alive()
		}
		if !alive || time.Now().After(deadline) {
			tails := ""
			for _, n := range c.Nodes {
				tails += fmt.Sprintf("--- %s ---\n%s\n", n.Name, n.LogTail(60))
			}
			return nil, fmt.Errorf("patronitest: no leader (waited up to %v; a node alive: %v)\n%s", within, alive, tails)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitRole(n *Node, role, state string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		s, err := n.status()
		if err == nil && s.Role == role && s.State == state {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("patronitest: %s is %+v (%v), not %s %s after %v", n.Name, s, err, role, state, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (n *Node) alive() bool {
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// Kill crashes the node as a host that dies: SIGKILL to Patroni (its process group) and to its PostgreSQL,
// which Patroni runs detached from itself (the postmaster and every backend). It returns once nothing of
// either is left.
func (n *Node) Kill() error {
	if n.cmd.Process == nil {
		return nil
	}
	pm := n.postmasterPID()
	if err := syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("patronitest: kill patroni: %w", err)
	}
	<-n.done
	if pm > 0 {
		return pgtest.KillServer(pm)
	}
	return nil
}

// postmasterPID is the PID in the node's postmaster.pid, 0 when there is none.
func (n *Node) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(n.dir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

func (n *Node) stop() {
	defer func() {
		// A postmaster.pid left after Patroni is gone names a server it did not stop (a clean shutdown removes
		// the file, so the PID is not one reused by another process since).
		if pm := n.postmasterPID(); pm > 0 {
			pgtest.KillServer(pm)
		}
	}()
	if n.cmd.Process != nil && n.alive() {
		// Patroni stops its PostgreSQL on SIGTERM; then the group is taken down whatever is left.
		syscall.Kill(-n.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-n.done:
		case <-time.After(30 * time.Second):
		}
	}
	if n.cmd.Process != nil {
		syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// LogTail is the last lines of the node's Patroni log, for diagnostics.
func (n *Node) LogTail(lines int) string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "patroni.log"))
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
