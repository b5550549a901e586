// Package pgtest runs a throwaway PostgreSQL cluster for integration tests.
//
// Each cluster lives in its own temporary directory (data directory, Unix
// socket, server log, TLS files) and listens on a free port on 127.0.0.1, so
// several test packages can run their clusters side by side. When the test
// process runs as root, the cluster is created and run as the "postgres" OS
// user, because initdb and postgres refuse to run as root.
//
// A test package normally starts one cluster in TestMain with RunMain and
// calls Require at the top of each test that needs it.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/freeport"
)

// Well-known roles and databases created in every cluster. Each login role
// is bound to one authentication method in pg_hba.conf so that tests can
// exercise every method a client (or the proxy) has to speak.
const (
	// SuperUser connects with trust authentication (no password).
	SuperUser = "postgres"
	// MD5User's password is stored as an MD5 hash and checked with "md5".
	MD5User     = "md5user"
	MD5Password = "md5pass"
	// ScramUser's password is stored as a SCRAM verifier and checked with
	// "scram-sha-256".
	ScramUser     = "scramuser"
	ScramPassword = "scrampass"
	// PasswordUser's password is checked with "password" (cleartext on the
	// wire).
	PasswordUser     = "pwuser"
	PasswordPassword = "pwpass"
	// TestDB is an extra database, owned by SuperUser, for tests to use
	// besides "postgres".
	TestDB = "fenceproxy_test"
)

// SkipEnv is the environment variable that, set to "1", turns "PostgreSQL
// binaries are missing" from a test failure into a skip. CI never sets it.
const SkipEnv = "FENCEPROXY_TEST_SKIP_PG"

// BinDirEnv names a directory holding initdb, pg_ctl and postgres; it takes
// precedence over PATH and /usr/lib/postgresql/*/bin.
const BinDirEnv = "FENCEPROXY_PG_BINDIR"

// ErrNoBinaries is wrapped by the error Start returns when the PostgreSQL
// server binaries cannot be found.
var ErrNoBinaries = errors.New("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found; " +
	"run scripts/setup as root (or apt-get install postgresql), or set " + BinDirEnv)

// Options configure a cluster. The zero value is a plain, non-TLS cluster.
type Options struct {
	// SSL turns on TLS with a freshly generated CA and server certificate
	// valid for 127.0.0.1, ::1 and localhost (see Cluster.CAFile).
	SSL bool
	// MaxConnections is max_connections; 0 means 300, enough for pool and
	// pgbench tests.
	MaxConnections int
	// ExtraConf holds postgresql.conf settings applied after (and so
	// overriding) the harness defaults. Values are quoted for you.
	ExtraConf map[string]string
	// ExtraHBA holds pg_hba.conf lines placed before the harness's own
	// lines, so they take precedence (pg_hba.conf is first match wins).
	ExtraHBA []string
}

// Cluster is a running (or stopped) throwaway PostgreSQL cluster.
type Cluster struct {
	// CAFile, CertFile and KeyFile are PEM files set when Options.SSL is
	// true: the CA that signed the server certificate (for
	// sslmode=verify-full) and the server's certificate and key.
	CAFile, CertFile, KeyFile string

	opts    Options
	binDir  string
	dir     string // temporary root: socket dir, log, TLS files
	dataDir string
	logFile string
	port    int
	cred    *syscall.Credential // non-nil when we are root and run as postgres

	mu       sync.Mutex
	reaper   *exec.Cmd
	lifePipe *os.File // write end; its closing tells the reaper to clean up
	removed  bool     // Stop has run
}

// armDataDir readies a data directory that holds a cluster (made by initdb, copied from the template, or by
// pg_basebackup) for its first start: it writes pg_hba.conf and starts the reaper that stops the server if the
// test process dies. On failure it removes the directory.
func (c *Cluster) armDataDir() error {
	if err := c.writeHBA(); err != nil {
		c.removeDir()
		return err
	}
	if err := c.startReaper(); err != nil {
		c.removeDir()
		return err
	}
	return nil
}

// Start creates and starts a new cluster. The caller must call Stop.
//
// The first start on a machine runs initdb and creates the roles and
// databases, then saves the data directory as a template (see
// templateDir); later starts copy the template, which is several times
// faster than initdb.
func Start(opts Options) (*Cluster, error) {
	binDir, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, binDir: binDir}
	if err := c.prepareDir(); err != nil {
		c.removeDir()
		return nil, err
	}
	tmpl := templateDir(binDir, c.cred)
	fromTemplate := c.copyTemplate(tmpl)
	if !fromTemplate {
		if err := c.initdb(); err != nil {
			c.removeDir()
			return nil, err
		}
	}
	if err := c.armDataDir(); err != nil {
		return nil, err
	}
	err = c.startFreshPort()
	if err != nil && fromTemplate {
		// A template that does not start (damaged, say) is discarded and
		// the cluster made from scratch.
		fmt.Fprintf(os.Stderr, "pgtest: discarding template %s: %v\n", tmpl, err)
		_ = c.stop("immediate")
		_ = os.RemoveAll(tmpl)
		_ = os.RemoveAll(c.dataDir)
		fromTemplate = false
		if err = c.initdb(); err == nil {
			if err = c.writeHBA(); err == nil {
				err = c.startFreshPort()
			}
		}
	}
	if err != nil {
		c.Stop()
		return nil, err
	}
	if fromTemplate {
		return c, nil
	}
	if err := c.bootstrap(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("pgtest: create roles and databases: %w", err)
	}
	if tmpl != "" {
		// The copy needs a cleanly shut down data directory.
		if err := c.stop("fast"); err != nil {
			c.Stop()
			return nil, err
		}
		c.saveTemplate(tmpl)
		if err := c.start(); err != nil {
			c.Stop()
			return nil, err
		}
	}
	return c, nil
}

// FindBinDir returns the directory holding initdb, pg_ctl and postgres: $FENCEPROXY_PG_BINDIR, else
// PATH (when all three are there, in one directory), else the newest /usr/lib/postgresql/N/bin (Debian
// keeps the server binaries off PATH). The error wraps ErrNoBinaries.
func FindBinDir() (string, error) {
	if dir := os.Getenv(BinDirEnv); dir != "" {
		if hasServerBinaries(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("pgtest: %s=%s lacks initdb/pg_ctl/postgres: %w", BinDirEnv, dir, ErrNoBinaries)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if dir := filepath.Dir(p); hasServerBinaries(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Sort by major version numerically so that 10 beats 9.6.
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, dir := range dirs {
		if hasServerBinaries(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("pgtest: %w", ErrNoBinaries)
}

func pgVersion(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// prepareDir creates the temporary directory and the TLS files.
func (c *Cluster) prepareDir() error {
	if os.Geteuid() == 0 {
		cred, err := postgresCredential()
		if err != nil {
			return err
		}
		c.cred = cred
	}
	base := os.TempDir()
	if c.cred != nil && !traversableByOthers(base) {
		// The postgres OS user could not reach a directory under, say,
		// TMPDIR=/root/tmp.
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "fenceproxy-pg-")
	if err != nil {
		return fmt.Errorf("pgtest: temp dir: %w", err)
	}
	c.dir = dir
	c.dataDir = filepath.Join(dir, "data")
	c.logFile = filepath.Join(dir, "server.log")
	if c.cred != nil {
		// initdb, running as postgres, creates the data directory here and
		// the server puts its socket here.
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgtest: chown %s to postgres: %w", dir, err)
		}
	}
	if c.opts.SSL {
		return c.writeTLSFiles()
	}
	return nil
}

// traversableByOthers reports whether every directory from dir up to the
// root lets other users through.
func traversableByOthers(dir string) bool {
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if p == filepath.Dir(p) {
			return true
		}
	}
}

// initdb creates the data directory.
func (c *Cluster) initdb() error {
	out, err := c.command(c.bin("initdb"), "-D", c.dataDir, "-U", SuperUser, "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync").CombinedOutput()
	if err != nil {
		hint := ""
		if c.cred != nil {
			hint = fmt.Sprintf(" (the postgres OS user must be able to reach %s; check TMPDIR)", c.dir)
		}
		return fmt.Errorf("pgtest: initdb%s: %w\n%s", hint, err, out)
	}
	// postgresql.conf includes our file so that the port can be rewritten
	// when a start attempt loses a race for its port.
	f, err := os.OpenFile(filepath.Join(c.dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	_, err = fmt.Fprintf(f, "\ninclude 'fenceproxy_pgtest.conf'\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgtest: write postgresql.conf: %w", err)
	}
	return nil
}

func (c *Cluster) writeHBA() error {
	var b strings.Builder
	b.WriteString("# written by internal/pgtest; first match wins\n")
	for _, line := range c.opts.ExtraHBA {
		b.WriteString(line + "\n")
	}
	b.WriteString("local all all trust\n")
	for _, addr := range []string{"127.0.0.1/32", "::1/128"} {
		fmt.Fprintf(&b, "host all %s %s md5\n", MD5User, addr)
		fmt.Fprintf(&b, "host all %s %s scram-sha-256\n", ScramUser, addr)
		fmt.Fprintf(&b, "host all %s %s password\n", PasswordUser, addr)
		fmt.Fprintf(&b, "host all all %s trust\n", addr)
	}
	// Streaming replication from this cluster (StartStandby) connects as SuperUser; "all" does not match
	// replication connections.
	fmt.Fprintf(&b, "host replication %s 127.0.0.1/32 trust\n", SuperUser)
	return c.writeFile(filepath.Join(c.dataDir, "pg_hba.conf"), []byte(b.String()), 0o600)
}

func (c *Cluster) writeConf() error {
	maxConn := c.opts.MaxConnections
	if maxConn <= 0 {
		maxConn = 300
	}
	settings := [][2]string{
		{"port", strconv.Itoa(c.port)},
		{"listen_addresses", "127.0.0.1"},
		{"unix_socket_directories", c.dir},
		{"max_connections", strconv.Itoa(maxConn)},
		{"shared_buffers", "32MB"},
		// Surviving an OS crash is worthless for a throwaway cluster and
		// costs time. synchronous_commit stays on: with fsync off it costs
		// little, and committed data must survive Kill (a process crash).
		{"fsync", "off"},
		{"full_page_writes", "off"},
		{"huge_pages", "off"},
		{"log_line_prefix", "%m [%p] %q%u@%d "},
		{"timezone", "UTC"},
	}
	if c.opts.SSL {
		settings = append(settings, [][2]string{
			{"ssl", "on"}, {"ssl_cert_file", c.CertFile}, {"ssl_key_file", c.KeyFile},
		}...)
	}
	extra := make([]string, 0, len(c.opts.ExtraConf))
	for k := range c.opts.ExtraConf {
		extra = append(extra, k)
	}
	sort.Strings(extra)
	for _, k := range extra {
		settings = append(settings, [2]string{k, c.opts.ExtraConf[k]})
	}
	var b strings.Builder
	b.WriteString("# written by internal/pgtest; later lines win\n")
	for _, kv := range settings {
		fmt.Fprintf(&b, "%s = '%s'\n", kv[0], strings.ReplaceAll(kv[1], "'", "''"))
	}
	return c.writeFile(filepath.Join(c.dataDir, "fenceproxy_pgtest.conf"), []byte(b.String()), 0o600)
}

// startFreshPort starts the server on a newly chosen port, retrying with
// another port when a parallel test process grabbed it first.
func (c *Cluster) startFreshPort() error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		c.port, err = freeport.Pick()
		if err != nil {
			return err
		}
		if err = c.writeConf(); err != nil {
			return err
		}
		if err = c.start(); err == nil {
			return nil
		}
		if !strings.Contains(c.logTail(20), "could not bind") {
			return err
		}
	}
	return err
}

// start runs pg_ctl start and waits until the server accepts connections.
func (c *Cluster) start() error {
	out, err := c.command(c.bin("pg_ctl"), "start", "-w", "-t", "60", "-D", c.dataDir, "-l", c.logFile).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: pg_ctl start on port %d: %w\n%s\n--- tail of %s ---\n%s",
			c.port, err, out, c.logFile, c.logTail(30))
	}
	return nil
}

// stop runs pg_ctl stop in the given mode ("fast" or "immediate").
func (c *Cluster) stop(mode string) error {
	if c.PID() != 0 {
		// A paused server would never act on the stop request.
		_ = c.Resume()
	}
	out, err := c.command(c.bin("pg_ctl"), "stop", "-w", "-t", "60", "-m", mode, "-D", c.dataDir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: pg_ctl stop -m %s: %w\n%s", mode, err, out)
	}
	return nil
}

// bootstrap creates the well-known roles and databases.
func (c *Cluster) bootstrap() error {
	// password_encryption decides how each password is stored, and that
	// decides which mechanism the server can use for the role.
	setup := fmt.Sprintf(`
SET password_encryption = 'md5';
CREATE ROLE %[1]s LOGIN PASSWORD '%[2]s';
SET password_encryption = 'scram-sha-256';
CREATE ROLE %[3]s LOGIN PASSWORD '%[4]s';
CREATE ROLE %[5]s LOGIN PASSWORD '%[6]s';
`, MD5User, MD5Password, ScramUser, ScramPassword, PasswordUser, PasswordPassword)
	if err := c.ExecIn("postgres", setup); err != nil {
		return err
	}
	// CREATE DATABASE cannot share a Query message (an implicit
	// transaction) with other statements.
	if err := c.ExecIn("postgres", fmt.Sprintf("CREATE DATABASE %s OWNER %s", TestDB, SuperUser)); err != nil {
		return err
	}
	// Since PostgreSQL 15 ordinary roles cannot create tables in public;
	// tests that connect as them through the proxy need to.
	grant := fmt.Sprintf("GRANT ALL ON SCHEMA public TO %s, %s, %s", MD5User, ScramUser, PasswordUser)
	for _, db := range []string{"postgres", TestDB} {
		if err := c.ExecIn(db, grant); err != nil {
			return err
		}
	}
	return nil
}

// Addr is the server's TCP address, "127.0.0.1:PORT".
func (c *Cluster) Addr() string { return net.JoinHostPort(c.Host(), strconv.Itoa(c.port)) }

// Host is the address the server listens on.
func (c *Cluster) Host() string { return "127.0.0.1" }

// Port is the server's TCP port; it stays the same across Restart and
// Kill/StartAgain.
func (c *Cluster) Port() int { return c.port }

// SocketDir is the directory holding the server's Unix socket.
func (c *Cluster) SocketDir() string { return c.dir }

// DataDir is the cluster's data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// LogFile is the server log.
func (c *Cluster) LogFile() string { return c.logFile }

// BinDir is the directory of the server binaries; psql, pgbench and
// friends are usually there too (see Bin).
func (c *Cluster) BinDir() string { return c.binDir }

// Bin returns the path of a PostgreSQL program: the one beside the server
// binaries if it exists, else the bare name for PATH lookup.
func (c *Cluster) Bin(name string) string {
	p := filepath.Join(c.binDir, name)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return name
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.binDir, name) }

// DSN returns a URL connection string for the TCP listener with
// sslmode=disable. An empty password is left out.
func (c *Cluster) DSN(user, password, dbname string) string {
	u := url.URL{Scheme: "postgres", Host: c.Addr(), Path: "/" + dbname, RawQuery: "sslmode=disable"}
	if password != "" {
		u.User = url.UserPassword(user, password)
	} else {
		u.User = url.User(user)
	}
	return u.String()
}

// SuperDSN is DSN(SuperUser, "", TestDB).
func (c *Cluster) SuperDSN() string { return c.DSN(SuperUser, "", TestDB) }

// Exec runs sql (one or more statements, simple protocol) in TestDB as
// SuperUser.
func (c *Cluster) Exec(sql string) error { return c.ExecIn(TestDB, sql) }

// ExecIn runs sql (one or more statements, simple protocol) in dbname as
// SuperUser.
func (c *Cluster) ExecIn(dbname, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.DSN(SuperUser, "", dbname))
	if err != nil {
		return fmt.Errorf("pgtest: connect to %s as %s: %w", dbname, SuperUser, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.PgConn().Exec(ctx, sql).ReadAll(); err != nil {
		return fmt.Errorf("pgtest: exec in %s: %w", dbname, err)
	}
	return nil
}

// Psql returns a command running psql against TestDB as SuperUser, with
// psqlrc ignored and ON_ERROR_STOP on; args are appended.
func (c *Cluster) Psql(args ...string) *exec.Cmd {
	base := []string{"-X", "-v", "ON_ERROR_STOP=1", "-h", c.Host(), "-p", strconv.Itoa(c.port), "-U", SuperUser, "-d", TestDB}
	cmd := exec.Command(c.Bin("psql"), append(base, args...)...)
	cmd.Env = cleanEnv(os.Environ())
	return cmd
}

// PID returns the postmaster's process id, or 0 when the server is not
// running.
func (c *Cluster) PID() int {
	pid := c.pidFromFile()
	if pid == 0 || !alive(pid) {
		return 0
	}
	return pid
}

func (c *Cluster) pidFromFile() int {
	b, err := os.ReadFile(filepath.Join(c.dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// Restart stops the server with a fast shutdown and starts it again on the
// same port. Client connections are closed.
func (c *Cluster) Restart() error {
	if err := c.stop("fast"); err != nil {
		return err
	}
	return c.start()
}

// Kill simulates a crash: it sends SIGKILL to the postmaster and to all its
// child processes, so every client connection drops at once, and returns
// when none of them is left. StartAgain brings the server back (with crash
// recovery) on the same port.
func (c *Cluster) Kill() error {
	pid := c.PID()
	if pid == 0 {
		return errors.New("pgtest: Kill: server is not running")
	}
	if err := KillServer(pid); err != nil {
		return fmt.Errorf("pgtest: Kill: %w", err)
	}
	// The dead postmaster lingers as a zombie until whatever adopted it
	// reaps it (here that can take a second or more), and meanwhile a new
	// postmaster would take the PID in the lock files for a live server.
	// Give the reaping a moment, then remove the lock files: every server
	// process is dead, so they are stale.
	for zombie := time.Now().Add(time.Second); syscall.Kill(pid, 0) == nil && time.Now().Before(zombie); {
		time.Sleep(10 * time.Millisecond)
	}
	for _, f := range []string{
		filepath.Join(c.dataDir, "postmaster.pid"),
		filepath.Join(c.dir, fmt.Sprintf(".s.PGSQL.%d.lock", c.port)),
	} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pgtest: Kill: %w", err)
		}
	}
	return nil
}

// StartAgain starts the server again after Kill, on the same port, and
// waits until it accepts connections (after crash recovery).
func (c *Cluster) StartAgain() error { return c.start() }

// Stop shuts the server down (fast mode) and removes its directory. It is
// safe to call more than once.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	if c.removed {
		c.mu.Unlock()
		return nil
	}
	c.removed = true
	c.mu.Unlock()
	var err error
	if c.PID() != 0 {
		err = c.stop("fast")
	}
	c.stopReaper()
	c.removeDir()
	return err
}

// Pause freezes the server: SIGSTOP to the postmaster and all its
// processes. Connections stay open and nothing answers, as with a hung
// host. Resume (or Stop, Restart, Kill) undoes it.
func (c *Cluster) Pause() error { return c.signalAll(syscall.SIGSTOP) }

// Resume continues a paused server.
func (c *Cluster) Resume() error { return c.signalAll(syscall.SIGCONT) }

func (c *Cluster) signalAll(sig syscall.Signal) error {
	pid := c.PID()
	if pid == 0 {
		return errors.New("pgtest: server is not running")
	}
	for _, p := range append([]int{pid}, childrenOf(pid)...) {
		if err := syscall.Kill(p, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("pgtest: signal %d: %w", p, err)
		}
	}
	return nil
}

func (c *Cluster) removeDir() {
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
}

// logTail returns the last n lines of the server log.
func (c *Cluster) logTail(n int) string {
	b, err := os.ReadFile(c.logFile)
	if err != nil {
		return fmt.Sprintf("(no server log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// LogTail returns the last n lines of the server log, for test diagnostics.
func (c *Cluster) LogTail(n int) string { return c.logTail(n) }
