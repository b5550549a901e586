// Package lockservers runs real Redis and ZooKeeper servers for tests: each a child process on a free loopback
// port with its own temporary directory, which a test can stop, start again on the same port, pause (SIGSTOP)
// and resume. The servers come from the Debian packages redis-server and zookeeper, which scripts/setup --all
// installs; a missing server fails the test (it never skips).
package lockservers

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/freeport"
)

// readyTimeout bounds the wait for a server to accept connections: ZooKeeper is a JVM and takes seconds on a
// busy 2-core machine.
const readyTimeout = 60 * time.Second

// Server is a running (or stopped) server process.
type Server struct {
	name  string
	port  int
	dir   string
	argv  func(port int, dir string) []string
	ready func(addr string) error

	mu  sync.Mutex
	cmd *exec.Cmd
	log *os.File
}

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Redis starts a redis-server for t (no persistence) and stops it when t ends.
func Redis(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found (scripts/setup --all installs the Debian package redis-server): %v", err)
	}
	return start(t, "redis", func(port int, dir string) []string {
		return []string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--save", "",
			"--appendonly", "no", "--protected-mode", "no", "--daemonize", "no"}
	}, func(addr string) error { return probe(addr, "PING\r\n", "+PONG") })
}

// ZooKeeperJar is where Debian's zookeeper package puts the server (its manifest names the libraries it needs).
const ZooKeeperJar = "/usr/share/java/zookeeper.jar"

// ZooKeeper starts a standalone ZooKeeper server for t and stops it when t ends.
func ZooKeeper(t testing.TB) *Server {
	t.Helper()
	java, err := exec.LookPath("java")
	if err != nil {
		t.Fatalf("java not found (scripts/setup --all installs the Debian package zookeeper, which needs it): %v", err)
	}
	if _, err := os.Stat(ZooKeeperJar); err != nil {
		t.Fatalf("ZooKeeper not found (scripts/setup --all installs the Debian package zookeeper): %v", err)
	}
	return start(t, "zookeeper", func(port int, dir string) []string {
		return []string{java, "-Xmx128m", "-XX:+UseSerialGC", "-Dzookeeper.admin.enableServer=false",
			"-Dzookeeper.4lw.commands.whitelist=srvr,ruok", "-cp", ZooKeeperJar,
			"org.apache.zookeeper.server.ZooKeeperServerMain", strconv.Itoa(port), filepath.Join(dir, "data")}
	}, func(addr string) error {
		// "ruok" answers imok as soon as the process runs; "srvr" reports the version only once the server
		// serves requests (before that: "This ZooKeeper instance is not currently serving requests"). A restart
		// that a test waited for with ruok could leave its next client without a session.
		return probe(addr, "srvr", "Zookeeper version:")
	})
}

func start(t testing.TB, name string, argv func(int, string) []string, ready func(string) error) *Server {
	t.Helper()
	port, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{name: name, port: port, dir: t.TempDir(), argv: argv, ready: ready}
	if err := os.MkdirAll(filepath.Join(s.dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// Start starts the server (again, on the same port and directory) and waits until it answers.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return fmt.Errorf("%s: already running", s.name)
	}
	log, err := os.OpenFile(filepath.Join(s.dir, s.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := s.argv(s.port, s.dir)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, so that a test's SIGSTOP of a lock holder's group never reaches the server, and
	// Pdeathsig, so that a test binary that dies does not leave it running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(readyTimeout)
	for {
		err := s.ready(s.Addr())
		if err == nil {
			break
		}
		select {
		case werr := <-exited:
			log.Close()
			return fmt.Errorf("%s exited before it was ready (%v); log %s:\n%s", s.name, werr, log.Name(), tail(log.Name()))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			log.Close()
			return fmt.Errorf("%s not ready within %v: %v; log:\n%s", s.name, readyTimeout, err, tail(log.Name()))
		}
	}
	s.cmd, s.log = cmd, log
	go func() {
		// Keep the exit status for Stop; a server that dies by itself shows up as refused connections.
		err := <-exited
		s.mu.Lock()
		if s.cmd == cmd {
			s.cmd = nil
			s.log.Close()
			s.log = nil
		}
		s.mu.Unlock()
		_ = err
	}()
	return nil
}

// Stop kills the server (SIGKILL: as abrupt as a crash) and waits until its port refuses connections.
func (s *Server) Stop() error {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	if s.log != nil {
		s.log.Close()
		s.log = nil
	}
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", s.Addr(), 200*time.Millisecond)
		if err != nil {
			return nil
		}
		c.Close()
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s still accepts connections after SIGKILL", s.name)
}

// Pause stops the server's processes (SIGSTOP); Resume continues them.
func (s *Server) Pause() error  { return s.signal(syscall.SIGSTOP) }
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return fmt.Errorf("%s is not running", s.name)
	}
	return syscall.Kill(-s.cmd.Process.Pid, sig)
}

// probe sends request and requires the answer to start with want.
func probe(addr, request, want string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(request)); err != nil {
		return err
	}
	buf := make([]byte, len(want))
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if err != nil {
			break
		}
	}
	if string(buf[:n]) != want {
		return errors.New("answered " + strconv.Quote(string(buf[:n])))
	}
	return nil
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Relay is a TCP relay in front of a server, whose connections a test can cut (a network partition between a
// client and the server, as the client sees it).
type Relay struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns []net.Conn
	cut   bool
}

// NewRelay listens on a free loopback port and relays every connection to target until t ends.
func NewRelay(t testing.TB, target string) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{ln: ln, target: target}
	go r.serve()
	t.Cleanup(func() { ln.Close(); r.Cut() })
	return r
}

// Addr is where clients connect.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

func (r *Relay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		if r.cut {
			r.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", r.target, 2*time.Second)
		if err != nil {
			r.mu.Unlock()
			c.Close()
			continue
		}
		r.conns = append(r.conns, c, up)
		r.mu.Unlock()
		go pipe(c, up)
		go pipe(up, c)
	}
}

func pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
}

// Cut closes every relayed connection and refuses new ones until Restore.
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cut = true
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
}

// Restore accepts connections again.
func (r *Relay) Restore() {
	r.mu.Lock()
	r.cut = false
	r.mu.Unlock()
}
