package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"

	"github.com/fenceproxy/fenceproxy/tokens"
)

// runLocks implements `fenceproxy locks [--pg DSN | --etcd ENDPOINTS] [--json]`: the locks that are held or
// waited for, with holder, token, lease left and waiters. Exit 0, 1 when the lock service cannot be read,
// 2 on a usage error.
const locksHelp = `usage: fenceproxy locks [--etcd ENDPOINTS | --pg DSN | --zk SERVERS | --redis ADDR] [--prefix PREFIX] [--json]

Lists the locks that are held or waited for: holder, token, lease left, hold time and waiters ("?" where the
store cannot tell: Redis keeps no queue). The store is chosen as for fenceproxy lock. Exit status: 0, 1 when
the lock service cannot be read, 2 on a usage error.
`

func runLocks(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newCommandFlags("locks", locksHelp, stderr)
	sf := addStoreFlags(fs.FlagSet)
	asJSON := fs.Bool("json", false, "print a JSON array instead of a table")
	if status, done := fs.parse(args, 2, stdout, stderr); done {
		return status
	}
	if fs.NArg() > 0 {
		fs.usageError(stderr, fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
		return 2
	}
	if err := sf.validate(); err != nil {
		fmt.Fprintf(stderr, "fenceproxy locks: %v\n", err)
		return 2
	}
	store, err := sf.open(ctx, slog.New(slog.DiscardHandler))
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy locks: %s: %v\n", sf.where(), err)
		return 1
	}
	defer store.Close()
	listed, err := tokens.Listing{Stores: []tokens.Store{store}, Timeout: *sf.dialTimeout}.List(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy locks: %s: %v\n", sf.where(), err)
		return 1
	}
	if *asJSON {
		type lockJSON struct {
			Name             string   `json:"name"`
			Store            string   `json:"store"`
			Holder           string   `json:"holder"`
			Token            *int64   `json:"token"`              // null: unknown
			LeaseLeftSeconds *float64 `json:"lease_left_seconds"` // null: unknown
			HeldForSeconds   *float64 `json:"held_for_seconds"`   // null: unknown
			Waiters          int      `json:"waiters"`            // -1: unknown
		}
		out := make([]lockJSON, 0, len(listed))
		for _, l := range listed {
			k := l.Known()
			j := lockJSON{Name: l.Name, Store: l.Store, Holder: l.Holder, Token: k.Token, Waiters: l.Waiters}
			if k.LeaseLeft != nil {
				s := k.LeaseLeft.Seconds()
				j.LeaseLeftSeconds = &s
			}
			if k.HeldFor != nil {
				s := k.HeldFor.Seconds()
				j.HeldForSeconds = &s
			}
			out = append(out, j)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return 1
		}
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LOCK\tHOLDER\tTOKEN\tLEASE LEFT\tHELD FOR\tWAITERS")
	for _, l := range listed {
		c := l.Cells()
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", l.Name, c.Holder, c.Token, c.LeaseLeft, c.HeldFor, c.Waiters)
	}
	tw.Flush()
	return 0
}
