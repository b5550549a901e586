// Command fenceproxy is a PostgreSQL wire-protocol proxy that makes the database enforce fencing tokens.
//
//	fenceproxy serve --config FILE
//	fenceproxy check --config FILE
//	fenceproxy install --config FILE [--dsn DSN] [--print] [--ddl-guard]
//	fenceproxy uninstall --config FILE [--dsn DSN]
//	fenceproxy lock [flags] NAME -- CMD [ARGS...]
//	fenceproxy version
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X main.version=..."; otherwise the module version is used.
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  fenceproxy serve --config FILE      run the proxy (SIGTERM drains, SIGHUP reloads the table list)
  fenceproxy check --config FILE [--dsn DSN] [--etcd ENDPOINTS]
                                      check the protected tables upstream (and row tokens against etcd);
                                      non-zero exit on problems
  fenceproxy install --config FILE [--dsn DSN] [--print] [--ddl-guard]
                                      create or upgrade the fenceproxy schema and the in-database guard
  fenceproxy uninstall --config FILE [--dsn DSN] [--print]
                                      remove them
  fenceproxy lock [flags] NAME -- CMD [ARGS...]
                                      run CMD holding the etcd lock NAME, with its fencing token set
  fenceproxy version                  print the version
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return runServe(args[1:], stdout, stderr)
	case "check":
		return runCheck(args[1:], stdout, stderr)
	case "install":
		return runInstall(args[1:], stdout, stderr)
	case "uninstall":
		return runUninstall(args[1:], stdout, stderr)
	case "lock":
		return runLock(context.Background(), args[1:], stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintf(stdout, "fenceproxy %s\n", versionString())
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "fenceproxy: unknown command %q\n%s", args[0], usage)
		return 2
	}
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
