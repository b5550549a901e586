package faults

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// database is a PostgreSQL server the tables and checks run on: a pgtest.Cluster, or a Patroni node.
type database interface {
	Exec(sql string) error
	SuperDSN() string
}

// proxyConfig is what a fenceproxy process is started with.
type proxyConfig struct {
	Upstream string   // host:port of PostgreSQL, or of a netRelay in front of it
	Tables   []string // protected tables; the token column is always fence_token
	Etcd     []string // token.verify.etcd.endpoints; nil: no verification
	FailOpen bool     // token.verify.etcd.fail_open
	Extra    string   // more YAML, appended
	// NoReuse turns upstream.reuse off (it is on by default, as in production; kept connections show the
	// application_name "fenceproxy: kept for reuse", so the leak checks, which count backends by
	// application_name, do not see them).
	NoReuse bool
}

func (c proxyConfig) yaml(listen string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %s\nupstream:\n  address: %s\n  connect_timeout: 5s\n", listen, c.Upstream)
	if c.NoReuse {
		b.WriteString("  reuse:\n    max_idle: 0\n")
	}
	if len(c.Tables) > 0 {
		b.WriteString("tables:\n")
		for _, tb := range c.Tables {
			fmt.Fprintf(&b, "  - name: %s\n    token_column: fence_token\n", tb)
		}
	}
	if len(c.Etcd) > 0 {
		fmt.Fprintf(&b, "token:\n  verify:\n    etcd:\n      endpoints: [%s]\n      timeout: 1s\n      fail_open: %t\n", strings.Join(c.Etcd, ", "), c.FailOpen)
	}
	b.WriteString("log:\n  level: debug\n")
	b.WriteString(c.Extra)
	return b.String()
}

// proxyProc is a real `fenceproxy serve` process. Restart starts a new process on the same address.
type proxyProc struct {
	t    *testing.T
	bin  string
	conf string
	Addr string
	Logs *proxytest.SyncBuffer // stderr of every process run so far

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProxyProc(t *testing.T, c proxyConfig) *proxyProc {
	t.Helper()
	dir := t.TempDir()
	p := &proxyProc{t: t, bin: fenceproxyBinary(t), conf: filepath.Join(dir, "fenceproxy.yaml"), Addr: freeAddr(t), Logs: &proxytest.SyncBuffer{}}
	if err := os.WriteFile(p.conf, []byte(c.yaml(p.Addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("fenceproxy %s logs (tail):\n%s", p.Addr, tail(p.Logs.String(), 60))
		}
	})
	p.Start()
	return p
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// Start starts the process and waits until it accepts connections.
func (p *proxyProc) Start() {
	t := p.t
	t.Helper()
	cmd := exec.Command(p.bin, "serve", "--config", p.conf)
	cmd.Stderr = p.Logs
	cmd.Stdout = p.Logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.err = cmd, done, nil
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", p.Addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			t.Fatalf("fenceproxy exited at start: %v\n%s", p.err, p.Logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("fenceproxy did not listen on %s:\n%s", p.Addr, p.Logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Signal sends sig to the running process.
func (p *proxyProc) Signal(sig syscall.Signal) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd != nil {
		cmd.Process.Signal(sig)
	}
}

// Wait waits for the process to exit and returns its exit error (nil for status 0).
func (p *proxyProc) Wait(within time.Duration) error {
	p.t.Helper()
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	select {
	case <-done:
	case <-time.After(within):
		p.t.Fatalf("fenceproxy %s still running after %v", p.Addr, within)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Kill ends the process with SIGKILL, if it runs, and waits for it.
func (p *proxyProc) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
}

// DSN connects through the proxy as the superuser to the test database, tagged with application_name app.
func (p *proxyProc) DSN(app string) string {
	return dsnApp(proxytest.DSN(p.Addr, pgtest.SuperUser, "", pgtest.TestDB), app)
}

func dsnApp(dsn, app string) string {
	return dsn + "&application_name=" + app
}

// fencedTable creates a protected table with rows 1..rows, and a history table filled by a trigger with every
// write the database applies (committed or not: rows written by an aborted transaction vanish with it).
func fencedTable(t testing.TB, cl database, rows int) string {
	t.Helper()
	name := uniqueName("ledger")
	sql := fmt.Sprintf(`
CREATE TABLE %[1]s (id int PRIMARY KEY, val text NOT NULL, fence_token bigint);
INSERT INTO %[1]s (id, val) SELECT g, 'init' FROM generate_series(1, %[2]d) g;
CREATE TABLE %[1]s_history (
	seq bigserial PRIMARY KEY,
	id int NOT NULL,
	op text NOT NULL,
	old_token bigint,
	new_token bigint,
	val text NOT NULL,
	at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION %[1]s_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO %[1]s_history (id, op, old_token, new_token, val)
	VALUES (NEW.id, TG_OP, CASE WHEN TG_OP = 'UPDATE' THEN OLD.fence_token END, NEW.fence_token, NEW.val);
	RETURN NULL;
END $$;
CREATE TRIGGER %[1]s_history AFTER UPDATE OR INSERT ON %[1]s FOR EACH ROW EXECUTE FUNCTION %[1]s_record();
`, name, rows)
	if err := cl.Exec(sql); err != nil {
		t.Fatal(err)
	}
	return name
}
