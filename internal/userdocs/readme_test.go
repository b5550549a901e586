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
