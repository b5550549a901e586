package userdocs

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// scripts/setup and scripts/test run on users' machines, as root: they may install packages, and must never stop,
// start, disable, restart or reconfigure a service already there (the first version stopped and disabled the
// user's own PostgreSQL). The tests run their own servers on their own ports and directories. A policy-rc.d
// that keeps newly installed packages from starting services is allowed (it is about the install, and keeps
// maintainer scripts from restarting anything).
func TestScriptsLeaveServicesAlone(t *testing.T) {
	serviceCommand := regexp.MustCompile(`\b(systemctl|service|update-rc\.d|invoke-rc\.d|rc-service|rc-update|pg_ctlcluster|pg_dropcluster|pg_createcluster|pkill|killall)\b`)
	for _, script := range []string{"scripts/setup", "scripts/test", ".ci/run"} {
		for i, line := range strings.Split(readRepoFile(t, script), "\n") {
			code, _, _ := strings.Cut(line, "#") // comments may talk about services
			if m := serviceCommand.FindString(code); m != "" {
				t.Errorf("%s:%d runs %s: %s", script, i+1, m, strings.TrimSpace(line))
			}
		}
	}
	// Both parse.
	for _, script := range []string{"scripts/setup", "scripts/test"} {
		if out, err := exec.Command("bash", "-n", filepath.Join(repoRoot(t), script)).CombinedOutput(); err != nil {
			t.Errorf("bash -n %s: %v\n%s", script, err, out)
		}
	}
}

// CI (.ci/run runs scripts/test) fails on gofmt and go mod tidy differences, before the slow part.
func TestScriptsTestChecksFormatAndTidy(t *testing.T) {
	if ci := readRepoFile(t, ".ci/run"); !strings.Contains(ci, "scripts/test") {
		t.Errorf(".ci/run does not run scripts/test:\n%s", ci)
	}
	if !strings.Contains(readRepoFile(t, "README.md"), "\nscripts/test\n") {
		t.Error("the README's test command is not scripts/test")
	}
	s := readRepoFile(t, "scripts/test")
	gofmt, tidy, vet := strings.Index(s, "gofmt -l"), strings.Index(s, "go mod tidy -diff"), strings.Index(s, "\ngo vet ./...")
	if gofmt < 0 || tidy < 0 {
		t.Fatalf("scripts/test does not check gofmt -l and go mod tidy -diff:\n%s", s)
	}
	if gofmt > vet || tidy > vet {
		t.Errorf("scripts/test checks formatting and tidiness after go vet; they are the fast checks and go first")
	}
	// And the checkout is clean by those checks now.
	if out, err := exec.Command("gofmt", "-l", repoRoot(t)).CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("gofmt -l: %v\n%s", err, out)
	}
	cmd := exec.Command("go", "mod", "tidy", "-diff")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("go mod tidy -diff: %v\n%s", err, out)
	}
}

// `go run ./examples/demo` builds silently for minutes the first time; make demo says so before it builds.
func TestMakeDemoSaysItIsBuilding(t *testing.T) {
	cmd := exec.Command("make", "-n", "demo")
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n demo: %v\n%s", err, out)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	if !strings.HasPrefix(first, "echo") || !strings.Contains(first, "first build") {
		t.Errorf("make demo does not start by saying it builds (first build takes minutes):\n%s", out)
	}
	// The README states the first build's time next to the command.
	readme := readRepoFile(t, "README.md")
	i := strings.Index(readme, "go run ./examples/demo")
	if i < 0 || !regexp.MustCompile(`first run builds for minutes`).MatchString(readme[i:min(len(readme), i+600)]) {
		t.Error("the README does not say, next to go run ./examples/demo, that the first run builds for minutes")
	}
}

// scripts/setup installs what the demo and the core tests need and nothing more; the other lock servers and the
// ORM matrix come with --all, which scripts/test (so CI, on a clean machine) asks for because it runs those
// tests. As root it needs no sudo and says so.
func TestSetupInstallsOnlyWhatIsAskedFor(t *testing.T) {
	list := func(args ...string) []string {
		t.Helper()
		out, err := exec.Command("bash", append([]string{filepath.Join(repoRoot(t), "scripts/setup"), "--list"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("scripts/setup --list %v: %v\n%s", args, err, out)
		}
		return strings.Fields(string(out))
	}
	core, all := list(), list("--all")
	for _, pkg := range []string{"postgresql", "postgresql-client", "pgbouncer", "etcd-client"} {
		if !slices.Contains(core, pkg) {
			t.Errorf("scripts/setup does not install %s, which the demo or the core tests need: %v", pkg, core)
		}
	}
	for _, pkg := range []string{"redis-server", "zookeeper", "ruby-activerecord", "python3-django", "default-jre-headless", "nodejs"} {
		if slices.Contains(core, pkg) {
			t.Errorf("scripts/setup installs %s without --all (the demo and the core tests do not need it)", pkg)
		}
		if !slices.Contains(all, pkg) {
			t.Errorf("scripts/setup --all does not install %s, which scripts/test's tests need: %v", pkg, all)
		}
	}
	if s := readRepoFile(t, "scripts/test"); !strings.Contains(s, "scripts/setup --all") {
		t.Error("scripts/test does not install what its lock-store and ORM tests need (scripts/setup --all)")
	}
	if s := readRepoFile(t, "scripts/setup"); !strings.Contains(s, "running as root: installing with apt-get directly (no sudo needed)") {
		t.Error("scripts/setup does not say that, as root, it needs no sudo")
	}
}
