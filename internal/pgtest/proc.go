package pgtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// postgresCredential returns the credential of the "postgres" OS user,
// creating the user if it does not exist (a clean machine with only the
// binaries unpacked, or a container image without the postgresql package).
func postgresCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		var unknown user.UnknownUserError
		if !errors.As(err, &unknown) {
			return nil, fmt.Errorf("pgtest: look up OS user postgres: %w", err)
		}
		out, uerr := exec.Command("useradd", "--system", "--user-group", "--no-create-home",
			"--home-dir", "/var/lib/postgresql", "--shell", "/bin/sh", "postgres").CombinedOutput()
		// Another test process may have created it meanwhile; the lookup
		// below is what counts.
		if u, err = user.Lookup("postgres"); err != nil {
			return nil, fmt.Errorf("pgtest: running as root and cannot create OS user postgres: %v %s", uerr, out)
		}
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgtest: uid of postgres: %w", err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgtest: gid of postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// command prepares a server-side command (initdb, pg_ctl), run as the
// postgres OS user when we are root. Setting the credential directly
// instead of going through runuser or su avoids depending on PAM and on the
// user's login shell.
func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = cleanEnv(os.Environ())
	cmd.Dir = c.dir
	// A process group of its own keeps the server out of reach of signals
	// sent to the test's group (Ctrl-C); the reaper cleans up instead.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Setpgid: true}
	return cmd
}

// cleanEnv drops the libpq and locale variables of the caller's
// environment, which would otherwise leak into initdb, pg_ctl or psql
// (PGDATA, PGPORT, PGOPTIONS, LC_ALL...).
func cleanEnv(env []string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "LANG=C")
}

// writeFile writes a file that the server must own.
func (c *Cluster) writeFile(path string, data []byte, perm os.FileMode) error {
	if err := os.WriteFile(path, data, perm); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if c.cred != nil {
		if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
	}
	return nil
}

// reaperScript waits for EOF on stdin, which happens when the test process
// closes its end of the pipe (Stop) or dies in any way, including panics,
// test timeouts and SIGKILL, where no deferred function or signal handler
// runs. It then takes the server down and removes the directory, so no
// stray postmaster outlives the test binary.
const reaperScript = `read -r _
pid=$(head -n 1 "$2/postmaster.pid" 2>/dev/null)
# A server frozen by a fault test would never act on the stop signal.
[ -n "$pid" ] && kill -CONT "$pid" 2>/dev/null
"$1" stop -D "$2" -m immediate -w -t 20 >/dev/null 2>&1 || { [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; }
rm -rf "$3"
`

func (c *Cluster) startReaper() error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("pgtest: reaper pipe: %w", err)
	}
	cmd := c.command("/bin/sh", "-c", reaperScript, "pgtest-reaper", c.bin("pg_ctl"), c.dataDir, c.dir)
	// The reaper must run outside c.dir, which it deletes.
	cmd.Dir = "/"
	cmd.Stdin = r
	// Stdout and stderr stay /dev/null: a grandchild holding the test's
	// output pipe would make "go test" wait for it.
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("pgtest: start reaper: %w", err)
	}
	r.Close()
	c.mu.Lock()
	c.reaper, c.lifePipe = cmd, w
	c.mu.Unlock()
	return nil
}

// stopReaper closes the pipe and waits for the reaper to finish its
// (by now redundant) cleanup.
func (c *Cluster) stopReaper() {
	c.mu.Lock()
	cmd, w := c.reaper, c.lifePipe
	c.reaper, c.lifePipe = nil, nil
	c.mu.Unlock()
	if w == nil {
		return
	}
	w.Close()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
	}
}

// alive reports whether pid exists and is not a zombie (in a container
// whose PID 1 does not reap, a killed orphan stays a zombie forever).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || !strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The command name is in parentheses and may contain spaces; the
		// fields after the last ')' are state, ppid, ...
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			kids = append(kids, p)
		}
	}
	return kids
}

// ServerCredential is the credential server processes must run under: the postgres OS user's when the test
// runs as root (PostgreSQL refuses to run as root), nil otherwise. Harnesses that run PostgreSQL through another
// program (Patroni) use it.
func ServerCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	return postgresCredential()
}

// KillServer crashes the PostgreSQL server whose postmaster is pid (Cluster.Kill's, or one that some other
// program started: Patroni): SIGKILL to the postmaster and to all its child processes (each backend is a
// process group of its own), and returns once none of them is left. The children are collected first: once the
// postmaster is gone they are reparented and can no longer be told apart.
func KillServer(pid int) error {
	procs := append([]int{pid}, childrenOf(pid)...)
	for _, p := range procs {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range procs {
		for alive(p) {
			if time.Now().After(deadline) {
				return fmt.Errorf("pgtest: process %d still alive after SIGKILL", p)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}
