package userdocs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// benchRun runs bench/run with args (a context bound keeps a hung run from hanging the test) and returns its
// standard output, standard error and exit code.
func benchRun(t *testing.T, timeout time.Duration, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot(t), "bench", "run"), args...)
	cmd.Dir = repoRoot(t)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("bench/run %s did not finish within %v\n%s", strings.Join(args, " "), timeout, errOut.String())
	}
	code = 0
	if err != nil {
		exitErr, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("bench/run %s: %v", strings.Join(args, " "), err)
		}
		code = exitErr.ExitCode()
	}
	return out.String(), errOut.String(), code
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// markdownTable finds the first table in report whose header row starts with "| workload |" and has a cell
// ending in suffix, and returns its header cells and body rows, cells trimmed.
func markdownTable(t *testing.T, report, suffix string) (header []string, rows [][]string) {
	t.Helper()
	cells := func(line string) []string {
		parts := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		for i := range parts {
			parts[i] = strings.TrimSpace(parts[i])
		}
		return parts
	}
	lines := strings.Split(report, "\n")
	for i, line := range lines {
		if !strings.HasPrefix(line, "| workload |") {
			continue
		}
		h := cells(line)
		if !strings.HasSuffix(h[len(h)-1], suffix) && !strings.HasSuffix(h[1], suffix) {
			continue
		}
		for _, body := range lines[i+2:] {
			if !strings.HasPrefix(body, "|") {
				break
			}
			rows = append(rows, cells(body))
		}
		return h, rows
	}
	t.Fatalf("no table with a %q column in the report:\n%s", suffix, report)
	return nil, nil
}

// bench/run measures several fenceproxy relay configurations side by side in one interleaved run: each variant
// is its own process with its own TPS column, CPU-per-transaction column and rewrite-cache rows, and passes the
// fence sanity check. A structural check of a one-second run, never a timing one: every cell holds a number.
func TestBenchRunComparesFenceproxyVariants(t *testing.T) {
	targets := []string{"direct", "pgbouncer", "fenceproxy-loop", "fenceproxy-goroutines", "fenceproxy-loop-spin50us"}
	fenceproxies := targets[2:]
	workloads := []string{"select-simple", "tpcb-fenced"}
	output := filepath.Join(t.TempDir(), "latest.md")
	stdout, stderr, code := benchRun(t, 3*time.Minute, "--quick", "-T", "1", "-r", "1", "-s", "1",
		"--targets", strings.Join(targets, ","), "--workloads", strings.Join(workloads, ","), "-o", output)
	if code != 0 {
		t.Fatalf("bench/run exited with %d\n%s", code, stderr)
	}
	report := readFile(t, output)
	if !strings.Contains(stdout, report) {
		t.Errorf("bench/run did not print the report it wrote to %s", output)
	}

	// What each variant ran, as fenceproxy read its configuration.
	for _, want := range []string{
		"- fenceproxy-loop: relay mode=loop ",
		"- fenceproxy-goroutines: relay mode=goroutines ",
		"- fenceproxy-loop-spin50us: relay mode=loop spin=50µs ",
	} {
		if !strings.Contains(report, "\n  "+want) {
			t.Errorf("the report's header does not say %q:\n%s", want, report)
		}
	}
	if strings.Contains(report, "Warning:") || strings.Contains(stderr, "did not fence") {
		t.Errorf("a fenceproxy variant failed the fence sanity check:\n%s", report)
	}
	for _, fp := range fenceproxies {
		if !strings.Contains(stderr, fp+" fences pgbench_accounts (sanity check passed)") {
			t.Errorf("no fence sanity check passed for %s:\n%s", fp, stderr)
		}
	}

	number := regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)
	checkTable := func(name string, header []string, rows [][]string, columns []string) {
		t.Helper()
		if want := append([]string{"workload"}, columns...); len(header) < len(want) || strings.Join(header[:len(want)], "|") != strings.Join(want, "|") {
			t.Errorf("%s table header %q, want it to start with %q", name, header, want)
			return
		}
		if len(rows) != len(workloads) {
			t.Errorf("%s table has %d rows, want one per workload (%v)", name, len(rows), workloads)
		}
		for i, row := range rows {
			if i < len(workloads) && row[0] != workloads[i] {
				t.Errorf("%s table row %d is %q, want %q", name, i, row[0], workloads[i])
			}
			if len(row) != len(header) {
				t.Errorf("%s table row %q has %d cells, the header %d", name, row, len(row), len(header))
				continue
			}
			for j, cell := range row[1:] {
				if !number.MatchString(cell) {
					t.Errorf("%s table, %s, %s: %q is not a number", name, row[0], header[j+1], cell)
				}
			}
		}
	}
	var tpsColumns, cpuColumns, ratioColumns []string
	for _, tg := range targets {
		tpsColumns = append(tpsColumns, tg+" TPS")
		if tg != "direct" {
			cpuColumns = append(cpuColumns, tg+" µs/txn")
		}
	}
	for _, fp := range fenceproxies {
		ratioColumns = append(ratioColumns, fp+" / pgbouncer")
	}
	header, rows := markdownTable(t, report, " TPS")
	checkTable("TPS", header, rows, append(append(tpsColumns, "pgbouncer / direct"), ratioColumns...))
	header, rows = markdownTable(t, report, " µs/txn")
	checkTable("CPU", header, rows, append(cpuColumns, ratioColumns...))

	// Each variant planned the fenced UPDATE of tpcb-fenced itself: its own cache counted it.
	for _, fp := range fenceproxies {
		m := regexp.MustCompile(`(?m)^\| tpcb-fenced \| ` + regexp.QuoteMeta(fp) + ` \| ([0-9]+) \| ([0-9]+) \|`).FindStringSubmatch(report)
		if m == nil {
			t.Errorf("no rewrite-cache row for tpcb-fenced, %s:\n%s", fp, report)
			continue
		}
		hits, _ := strconv.Atoi(m[1])
		misses, _ := strconv.Atoi(m[2])
		if hits+misses == 0 {
			t.Errorf("%s's rewrite cache counted nothing in tpcb-fenced: the run did not go through it", fp)
		}
	}
}

// A plain bench/run answers "loop or goroutines?": beside fenceproxy with its defaults it runs the other relay
// mode, whichever is the default; --no-loop turns the plain target around. Bad variant names stop it before
// anything starts.
func TestBenchRunTargets(t *testing.T) {
	lines := func(args ...string) []string {
		t.Helper()
		stdout, stderr, code := benchRun(t, 2*time.Minute, append([]string{"--show-targets"}, args...)...)
		if code != 0 {
			t.Fatalf("bench/run --show-targets %v exited with %d\n%s", args, code, stderr)
		}
		return strings.Split(strings.TrimSpace(stdout), "\n")
	}
	modeOf := func(line string) string {
		m := regexp.MustCompile(` mode=([a-z]+) `).FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("no relay mode in %q", line)
		}
		return m[1]
	}
	other := map[string]string{"loop": "goroutines", "goroutines": "loop"}

	got := lines()
	if len(got) != 4 || got[0] != "direct" || got[1] != "pgbouncer" || !strings.HasPrefix(got[2], "fenceproxy mode=") {
		t.Fatalf("default targets %q, want direct, pgbouncer, fenceproxy and the other relay mode", got)
	}
	defaultMode := modeOf(got[2])
	if want := "fenceproxy-" + other[defaultMode] + " mode=" + other[defaultMode] + " "; !strings.HasPrefix(got[3], want) {
		t.Errorf("default fourth target %q, want %q...: the relay mode fenceproxy does not default to", got[3], want)
	}

	got = lines("--no-loop")
	if len(got) != 4 || modeOf(got[2]) != "goroutines" || !strings.HasPrefix(got[3], "fenceproxy-loop mode=loop ") {
		t.Errorf("with --no-loop, targets %q: want fenceproxy on goroutines and fenceproxy-loop beside it", got)
	}

	got = lines("--targets", "fenceproxy-goroutines-spin20us,fenceproxy")
	if len(got) != 2 || !strings.HasPrefix(got[0], "fenceproxy-goroutines-spin20us mode=goroutines spin=20µs ") ||
		modeOf(got[1]) != defaultMode {
		t.Errorf("explicit targets %q: want them as named, in that order, and nothing added", got)
	}

	for _, bad := range []string{"fenceproxy-fast", "fenceproxy-loop-goroutines", "fenceproxy-spin", "fenceproxy-", "direct,direct", "mysql"} {
		if _, stderr, code := benchRun(t, time.Minute, "--targets", bad); code != 2 || !strings.Contains(stderr, "bench/run: ") {
			t.Errorf("bench/run --targets %s: exit %d, want 2 with a message; stderr:\n%s", bad, code, stderr)
		}
	}
	// A variant fenceproxy itself refuses (relay.spin above its maximum) stops the run with fenceproxy's reason.
	if _, stderr, code := benchRun(t, 2*time.Minute, "--show-targets", "--targets", "fenceproxy-spin5s"); code == 0 || !strings.Contains(stderr, "relay.spin") {
		t.Errorf("bench/run --targets fenceproxy-spin5s: exit %d, want a failure naming relay.spin; stderr:\n%s", code, stderr)
	}
}
