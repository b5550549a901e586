package userdocs

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// repoRoot is the checkout this package lives in.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the source file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func readRepoFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var fence = regexp.MustCompile("(?m)^```([^\\n]*)\\n")

// codeBlocks returns the bodies of the README's fenced code blocks whose info string is info ("sh quickstart").
func codeBlocks(t *testing.T, readme, info string) []string {
	t.Helper()
	var blocks []string
	rest := readme
	for {
		loc := fence.FindStringSubmatchIndex(rest)
		if loc == nil {
			return blocks
		}
		tag := strings.TrimSpace(rest[loc[2]:loc[3]])
		body := rest[loc[1]:]
		end := strings.Index(body, "\n```")
		if end < 0 {
			t.Fatalf("unterminated code block %q in the README", tag)
		}
		if tag == info {
			blocks = append(blocks, body[:end+1])
		}
		rest = body[end+4:]
	}
}

// A new user sees what fenceproxy is and the two commands (the demo, the tests) on the first screen, then short
// sections; the deep material lives in docs/, and every link resolves.
func TestReadmeShape(t *testing.T) {
	readme := readRepoFile(t, "README.md")
	lines := strings.Split(readme, "\n")
	firstScreen := strings.Join(lines[:min(len(lines), 45)], "\n")
	for _, want := range []string{"\ngo run ./examples/demo", "\nscripts/test\n", "fencing tokens"} {
		if !strings.Contains(firstScreen, want) {
			t.Errorf("the README's first 45 lines lack %q", strings.TrimSpace(want))
		}
	}
	for _, h := range []string{"## Quickstart", "## Configuration", "## Errors", "## Limits", "## Locks"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(h)).MatchString(readme) {
			t.Errorf("the README has no %q section", h)
		}
	}
	if len(readme) >= 20000 {
		t.Errorf("the README is %d bytes; deep material belongs in docs/", len(readme))
	}
	link := regexp.MustCompile(`\]\(([^)#]+)(#[^)]*)?\)`)
	files := []string{"README.md"}
	docs, _ := filepath.Glob(filepath.Join(repoRoot(t), "docs", "*.md"))
	unlinked := map[string]bool{}
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
		unlinked["docs/"+filepath.Base(d)] = true
	}
	if len(docs) < 4 {
		t.Errorf("docs/ has %d pages", len(docs))
	}
	for _, f := range files {
		for _, m := range link.FindAllStringSubmatch(readRepoFile(t, f), -1) {
			target := m[1]
			if strings.Contains(target, "://") {
				continue
			}
			if _, err := os.Stat(filepath.Join(repoRoot(t), filepath.Dir(f), target)); err != nil {
				t.Errorf("%s links to %s, which does not exist", f, target)
			}
			if f == "README.md" && strings.HasPrefix(target, "docs/") {
				delete(unlinked, target)
			}
		}
	}
	for page := range unlinked {
		t.Errorf("the README does not link %s", page)
	}
}
