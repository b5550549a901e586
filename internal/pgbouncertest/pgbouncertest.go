// Package pgbouncertest runs a real pgbouncer for tests: its own ini and userlist in a temporary directory, a free
// loopback port, trust authentication, run as the postgres OS user when the test runs as root (pgbouncer refuses
// to run as root), and stopped when the test ends.
package pgbouncertest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/freeport"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// Pool modes.
const (
	Session     = "session"
	Transaction = "transaction"
)

// Options configure a pgbouncer.
type Options struct {
	// Upstream is the server pgbouncer connects to, host:port (PostgreSQL or fenceproxy).
	Upstream string
	// PoolMode is Session or Transaction.
	PoolMode string
	// PoolSize is default_pool_size: server connections per user and database; 0 means 1, so that every client
	// shares one server connection, which is what makes leaks between clients visible.
	PoolSize int
	// Users are the user names allowed in (trust); empty means just "postgres".
	Users []string
}

// Bouncer is a running pgbouncer.
type Bouncer struct {
	Addr string
	dir  string
	log  string
}

// Binary finds pgbouncer: $PATH, else /usr/sbin/pgbouncer (Debian puts it there, off a normal user's PATH).
func Binary() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", fmt.Errorf("pgbouncer not found; run scripts/setup as root (or apt-get install pgbouncer)")
}

// Start runs a pgbouncer until the test ends. It fails the test when pgbouncer is missing or does not come up.
func Start(t testing.TB, o Options) *Bouncer {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	if o.PoolSize == 0 {
		o.PoolSize = 1
	}
	if len(o.Users) == 0 {
		o.Users = []string{"postgres"}
	}
	host, port, err := net.SplitHostPort(o.Upstream)
	if err != nil {
		t.Fatalf("pgbouncertest: upstream %q: %v", o.Upstream, err)
	}
	dir, err := os.MkdirTemp("", "pgbouncertest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cred, err := credential()
	if err != nil {
		t.Fatal(err)
	}
	listen, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	b := &Bouncer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(listen)), dir: dir, log: filepath.Join(dir, "pgbouncer.log")}
	var users bytes.Buffer
	for _, u := range o.Users {
		fmt.Fprintf(&users, "%q \"\"\n", u)
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 100
server_reset_query = DISCARD ALL
server_check_delay = 0
ignore_startup_parameters = extra_float_digits
logfile = %s
pidfile = %s
`, host, port, listen, filepath.Join(dir, "userlist.txt"), o.PoolMode, o.PoolSize, b.log, filepath.Join(dir, "pgbouncer.pid"))
	for name, data := range map[string][]byte{"userlist.txt": users.Bytes(), "pgbouncer.ini": []byte(ini)} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if cred != nil {
		for _, p := range []string{dir, filepath.Join(dir, "userlist.txt"), filepath.Join(dir, "pgbouncer.ini")} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				t.Fatal(err)
			}
		}
		// The temporary directory's parents must let the postgres user through.
		os.Chmod(dir, 0o755)
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	var out proxytest.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	var once sync.Once
	go func() { cmd.Wait(); once.Do(func() { close(exited) }) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGINT) // immediate shutdown
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("pgbouncer log:\n%s%s", b.Log(), out.String())
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", b.Addr, time.Second)
		if err == nil {
			c.Close()
			return b
		}
		select {
		case <-exited:
			t.Fatalf("pgbouncer exited at start: %s%s", b.Log(), out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer did not listen on %s within 15s: %s%s", b.Addr, b.Log(), out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// DSN is a connection URL through pgbouncer.
func (b *Bouncer) DSN(user, dbname string) string { return proxytest.DSN(b.Addr, user, "", dbname) }

// Log is pgbouncer's log so far.
func (b *Bouncer) Log() string {
	data, _ := os.ReadFile(b.log)
	return string(data)
}

// credential is the postgres OS user's when running as root, else nil (run as ourselves).
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgbouncertest: running as root needs the postgres OS user (pgtest creates it): %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
