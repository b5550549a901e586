package userdocs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/freeport"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// The Quickstart's ```sh quickstart blocks, run as written, in order, in one bash (as a user pastes them into one
// terminal), against a throwaway PostgreSQL and nothing else (the lock service is PostgreSQL's own lock store).
// Only what the README itself leaves to the environment is set: PGHOST and PGPORT (the server) and PROXY_PORT (a
// free port); no lock-store variable is inherited. Every outcome the blocks' comments promise (the SQLSTATE of an
// error, a command tag, a line of output) must appear, in order.
func TestReadmeQuickstart(t *testing.T) {
	root := repoRoot(t)
	blocks := codeBlocks(t, readRepoFile(t, "README.md"), "sh quickstart")
	if len(blocks) < 3 {
		t.Fatalf("README has %d ```sh quickstart blocks, want the set-up, the story and the lock", len(blocks))
	}
	script := strings.Join(blocks, "\n")
	for _, v := range []string{"PGHOST", "PGPORT", "PGUSER", "PROXY_PORT"} {
		if !strings.Contains(script, "${"+v+":-") {
			t.Errorf("the Quickstart does not let %s come from the environment (${%s:-default})", v, v)
		}
	}

	pg := pgtest.MustStart(t, pgtest.Options{})

	// The blocks build ./fenceproxy and write fenceproxy.yaml in the current directory: run them in a directory
	// that looks like the checkout (the module and its packages, linked) so that nothing in it is overwritten.
	dir := t.TempDir()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != ".git" || e.Name() == "go.mod" || e.Name() == "go.sum" {
			if err := os.Symlink(filepath.Join(root, e.Name()), filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	scriptPath := filepath.Join(dir, "quickstart.sh")
	if err := os.WriteFile(scriptPath, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}

	proxyPort, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "PROXY_PORT=") && !strings.HasPrefix(kv, "FENCEPROXY_") && !strings.HasPrefix(kv, "ETCDCTL_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"PGHOST="+pg.Host(),
		"PGPORT="+strconv.Itoa(pg.Port()),
		"PROXY_PORT="+strconv.Itoa(proxyPort),
		"PATH="+pg.BinDir()+string(os.PathListSeparator)+os.Getenv("PATH"), // psql, pg_isready
	)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // the first go build can be slow
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-eu", "-o", "pipefail", scriptPath)
	cmd.Dir, cmd.Env = dir, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	t.Cleanup(func() {
		if cmd.Process != nil {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // a proxy left running by a failed block
		}
	})
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the Quickstart failed: %v\n--- script ---\n%s\n--- output ---\n%s", err, script, out)
	}
	t.Logf("output:\n%s", out)

	promises := quickstartPromises(script)
	if len(promises) < 8 {
		t.Fatalf("found %d promised outcomes in the Quickstart's comments: %+v", len(promises), promises)
	}
	lines := strings.Split(string(out), "\n")
	i := 0
	for _, p := range promises {
		for i < len(lines) && !p.match(normalize(lines[i])) {
			i++
		}
		if i == len(lines) {
			t.Fatalf("the Quickstart promises %q (in order), which its output lacks:\n%s", p.text, out)
		}
		i++
	}

	// What the story left in the table: B's write, never A's late one; and the second lock holder's write, with
	// a token above the first holder's.
	c, err := pgx.Connect(ctx, pg.DSN(pgtest.SuperUser, "", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, want := range []struct {
		id       int
		balance  string
		minToken int64
	}{{1, "50", 2}, {2, "20", 2}} {
		var balance string
		var token int64
		if err := c.QueryRow(ctx, "SELECT balance::text, fence_token FROM accounts WHERE id = $1", want.id).Scan(&balance, &token); err != nil {
			t.Fatal(err)
		}
		if balance != want.balance || token < want.minToken {
			t.Errorf("accounts row %d: balance %s, fence_token %d; want %s with a token of %d or more", want.id, balance, token, want.balance, want.minToken)
		}
	}
	// The tokens came from PostgreSQL's lock store, in the database the Quickstart uses.
	var leases int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM fenceproxy.lock_leases WHERE name = 'settlement'").Scan(&leases); err != nil || leases != 1 {
		t.Errorf("the lock store has %d leases named settlement (%v), want 1", leases, err)
	}
	// The proxy's log, which the README points at, has the connection lines.
	logs, err := os.ReadFile(filepath.Join(dir, "fenceproxy.log"))
	if err != nil || !strings.Contains(string(logs), `msg="connection ended"`) || !strings.Contains(string(logs), "tables=public.accounts") {
		t.Errorf("fenceproxy.log lacks the start and connection lines (%v):\n%s", err, logs)
	}
}

// promise is an outcome a Quickstart comment announces.
type promise struct {
	text  string
	match func(line string) bool
}

var (
	sqlComment   = regexp.MustCompile(`;\s+--\s+([^:]+)`)
	errorPromise = regexp.MustCompile(`^ERROR ([0-9A-Z]{5}) (.+)$`)
	tagPromise   = regexp.MustCompile(`^[A-Z]+( [0-9]+)*$`)
	shellComment = regexp.MustCompile(`\s#\s+(.+)$`)
	rowPromise   = regexp.MustCompile(`^[0-9]+( \| [^|]+)+$`)
)

// quickstartPromises reads the outcomes the comments announce: in SQL, `-- ERROR 55F01 stale fencing token: ...`
// (psql -v VERBOSITY=verbose prints `ERROR:  55F01: stale fencing token ...`) or a command tag (`-- UPDATE 1:
// ...`); after a shell command, `# ok    ...` (a line of fenceproxy check), a command tag, or a row
// (`# ...: 1 | 50 | 2`). Other comments explain and promise nothing.
func quickstartPromises(script string) []promise {
	var ps []promise
	for _, line := range strings.Split(script, "\n") {
		if m := sqlComment.FindStringSubmatch(line); m != nil {
			text := strings.TrimSpace(m[1])
			if e := errorPromise.FindStringSubmatch(text); e != nil {
				want := fmt.Sprintf("ERROR: %s: %s", e[1], e[2])
				ps = append(ps, promise{text, func(l string) bool { return strings.HasPrefix(l, want) }})
			} else if tagPromise.MatchString(text) {
				ps = append(ps, promise{text, func(l string) bool { return l == text }})
			}
			continue
		}
		m := shellComment.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		text := normalize(m[1])
		if i := strings.LastIndex(text, ": "); i >= 0 && rowPromise.MatchString(text[i+2:]) {
			text = text[i+2:]
		}
		switch {
		case strings.HasPrefix(text, "ok "), tagPromise.MatchString(text), rowPromise.MatchString(text):
			ps = append(ps, promise{text, func(l string) bool { return l == text }})
		}
	}
	return ps
}

var spaces = regexp.MustCompile(`\s+`)

// normalize collapses runs of white space, so that psql's aligned columns compare as "1 | 50 | 2".
func normalize(s string) string { return strings.TrimSpace(spaces.ReplaceAllString(s, " ")) }
