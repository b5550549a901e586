// Command fenceproxy is a PostgreSQL wire-protocol proxy that makes the database enforce fencing tokens.
//
//	fenceproxy serve --config FILE
//	fenceproxy check --config FILE
//	fenceproxy install --config FILE [--dsn DSN] [--print] [--ddl-guard]
//	fenceproxy uninstall --config FILE [--dsn DSN]
//	fenceproxy lock [flags] NAME -- CMD [ARGS...]
//	fenceproxy locks [--etcd ENDPOINTS | --pg DSN | --zk SERVERS | --redis ADDR]
//	fenceproxy version
//
// Every command answers --help.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
)

// version is set at build time with -ldflags "-X main.version=..."; otherwise the module version is used.
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// commands lists every subcommand, in the order the usage shows them.
func commands() []command {
	return []command{
		{"serve", "serve --config FILE\n      run the proxy (SIGTERM drains, SIGHUP reloads the table list)", runServe},
		{"check", "check --config FILE [--dsn DSN] [--etcd ENDPOINTS]\n      check the protected tables upstream (and row tokens against etcd); prints the DDL that fixes them", runCheck},
		{"install", "install --config FILE [--dsn DSN] [--print] [--ddl-guard]\n      create or upgrade the fenceproxy schema and the in-database guard", runInstall},
		{"uninstall", "uninstall --config FILE [--dsn DSN] [--print]\n      remove them", runUninstall},
		{"lock", "lock [--etcd ENDPOINTS | --pg DSN | --zk SERVERS | --redis ADDR] [flags] NAME -- CMD [ARGS...]\n      run CMD holding the lock NAME, with its fencing token and lock name set",
			func(args []string, stdout, stderr io.Writer) int {
				return runLock(context.Background(), args, stdout, stderr)
			}},
		{"locks", "locks [--etcd ENDPOINTS | --pg DSN | --zk SERVERS | --redis ADDR] [--json]\n      list held and waited-for locks: holder, token, lease left, waiters",
			func(args []string, stdout, stderr io.Writer) int {
				return runLocks(context.Background(), args, stdout, stderr)
			}},
		{"version", "version\n      print the version", runVersion},
	}
}

// usage is the top-level help.
func usage() string {
	var b strings.Builder
	b.WriteString("usage: fenceproxy COMMAND [ARGS...]   (fenceproxy COMMAND --help for a command's help)\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(&b, "  fenceproxy %s\n", c.summary)
	}
	return b.String()
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	switch args[0] {
	case "--version", "-v":
		return runVersion(nil, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage())
		return 0
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "fenceproxy: unknown command %q\n%s", args[0], usage())
	return 2
}

const versionHelp = `usage: fenceproxy version

Prints fenceproxy's version (the module version, or dev+COMMIT for a build from a checkout) and the Go
version it was built with.
`

func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := newCommandFlags("version", versionHelp, stderr)
	if status, done := fs.parse(args, 2, stdout, stderr); done {
		return status
	}
	if fs.NArg() > 0 {
		fs.usageError(stderr, "takes no arguments")
		return 2
	}
	fmt.Fprintf(stdout, "fenceproxy %s\n", versionString())
	return 0
}

func versionString() string {
	v := version
	bi, ok := debug.ReadBuildInfo()
	if v == "" && ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	if v == "" {
		v = "dev"
		if ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && len(s.Value) >= 12 {
					v += "+" + s.Value[:12]
				}
			}
		}
	}
	goVersion := "unknown"
	if ok {
		goVersion = bi.GoVersion
	}
	return fmt.Sprintf("%s (%s)", v, goVersion)
}

// printConfigError prints a configuration error, one problem a line (config.Parse reports all of them, each as
// FILE:LINE: KEY: PROBLEM), every line with the program's prefix.
func printConfigError(stderr io.Writer, err error) {
	for _, line := range strings.Split(err.Error(), "\n") {
		fmt.Fprintf(stderr, "fenceproxy: %s\n", line)
	}
}
