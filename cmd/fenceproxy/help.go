package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// command is one subcommand of fenceproxy. Every subcommand is listed in commands(), which the top-level usage
// and TestEverySubcommandHasHelp both read, so a new subcommand gets its --help tested by being added there.
type command struct {
	name    string
	summary string // for the top-level usage: the synopsis, then what it does, indented
	run     func(args []string, stdout, stderr io.Writer) int
}

// commandFlags is a subcommand's flag set with its help text: --help (or -h) prints the help and the flags to
// stdout and exits 0; a bad flag prints the flag package's message and the usage line to stderr.
type commandFlags struct {
	*flag.FlagSet
	help string // a "usage:" line, a blank line, then what the command does
}

func newCommandFlags(name, help string, stderr io.Writer) *commandFlags {
	fs := flag.NewFlagSet("fenceproxy "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {} // parse prints what fits: the full help for --help, the usage line after a mistake
	return &commandFlags{FlagSet: fs, help: help}
}

// parse parses a subcommand's arguments. It reports done, with the exit status, when the command must not go
// on: 0 after printing the help, usageStatus after a bad flag.
func (f *commandFlags) parse(args []string, usageStatus int, stdout, stderr io.Writer) (status int, done bool) {
	err := f.Parse(args)
	switch {
	case err == nil:
		return 0, false
	case errors.Is(err, flag.ErrHelp):
		f.printHelp(stdout)
		return 0, true
	default:
		f.usageError(stderr, "")
		return usageStatus, true
	}
}

// usageError prints a problem with the arguments (if any) and the usage line to stderr.
func (f *commandFlags) usageError(stderr io.Writer, problem string) {
	if problem != "" {
		fmt.Fprintf(stderr, "%s: %s\n", f.Name(), problem)
	}
	line, _, _ := strings.Cut(f.help, "\n")
	fmt.Fprintf(stderr, "%s  (%s --help for help)\n", line, f.Name())
}

// printHelp writes the help text and the flag list.
func (f *commandFlags) printHelp(w io.Writer) {
	fmt.Fprint(w, strings.TrimRight(f.help, "\n")+"\n")
	n := 0
	f.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprint(w, "\nFlags:\n")
	out := f.Output()
	f.SetOutput(w)
	f.PrintDefaults()
	f.SetOutput(out)
}
