package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every subcommand, present and future (commands() is the one list), answers --help and -h with real help on
// stdout and exit status 0: its usage line, a description, and its flags if it has any.
func TestEverySubcommandHasHelp(t *testing.T) {
	cmds := commands()
	if len(cmds) < 4 {
		t.Fatalf("commands() lists %d commands", len(cmds))
	}
	for _, c := range cmds {
		for _, flag := range []string{"--help", "-h"} {
			var stdout, stderr bytes.Buffer
			code := run([]string{c.name, flag}, &stdout, &stderr)
			out := stdout.String()
			if code != 0 {
				t.Errorf("fenceproxy %s %s: exit %d, want 0\nstdout: %s\nstderr: %s", c.name, flag, code, out, stderr.String())
				continue
			}
			if stderr.Len() != 0 {
				t.Errorf("fenceproxy %s %s wrote to stderr: %q", c.name, flag, stderr.String())
			}
			if !strings.HasPrefix(out, "usage: fenceproxy "+c.name) {
				t.Errorf("fenceproxy %s %s: help does not start with its usage line:\n%s", c.name, flag, out)
			}
			// A bare flag list ("Usage of serve:") is not help: there must be prose after the usage line.
			if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) < 3 || strings.Contains(out, "Usage of ") {
				t.Errorf("fenceproxy %s %s: no description:\n%s", c.name, flag, out)
			}
		}
		// The top-level usage names the command too.
		var stdout, stderr bytes.Buffer
		if code := run([]string{"--help"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "fenceproxy "+c.name) {
			t.Errorf("fenceproxy --help: exit %d, does not list %s:\n%s", code, c.name, stdout.String())
		}
	}
}

// A mistake on the command line gets the usage line on stderr and a non-zero status, not the full help.
func TestSubcommandUsageErrors(t *testing.T) {
	for _, c := range commands() {
		var stdout, stderr bytes.Buffer
		code := run([]string{c.name, "--no-such-flag"}, &stdout, &stderr)
		if code == 0 {
			t.Errorf("fenceproxy %s --no-such-flag: exit 0", c.name)
		}
		if !strings.Contains(stderr.String(), "usage: fenceproxy "+c.name) || !strings.Contains(stderr.String(), "no-such-flag") {
			t.Errorf("fenceproxy %s --no-such-flag: stderr %q", c.name, stderr.String())
		}
	}
}

// A configuration with several problems gets one line per problem on stderr, each FILE:LINE: KEY: PROBLEM
// behind the program's prefix (the second line used to lack both).
func TestConfigErrorsOneFormPerLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "two.yaml")
	if err := os.WriteFile(path, []byte("listen: nowhere\nupstream:\n  connect_timeout: 10s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"serve", "check"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{cmd, "--config", path}, &stdout, &stderr); code != 1 {
			t.Fatalf("%s with a bad config: exit %d", cmd, code)
		}
		lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
		want := []string{
			"fenceproxy: " + path + `:1: listen: "nowhere" is not host:port`,
			"fenceproxy: " + path + ":2: upstream.address: required (host:port of the PostgreSQL server)",
		}
		if strings.Join(lines, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: stderr:\n%s\nwant:\n%s", cmd, stderr.String(), strings.Join(want, "\n"))
		}
	}
}
