// Command fencesql prints the statement fenceproxy sends PostgreSQL for one client statement (bench/fence-sql
// measures it). Usage: go run ./bench/fencesql [-inline TOKEN] TABLE TOKEN_COLUMN SQL. With -inline, the statement
// a transaction pool sends for a simple Query while it knows the token in force, TOKEN (rewrite/inline.go); SQL
// must then hold no '$'.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

func main() {
	inline := flag.String("inline", "", "the token in force: print the inline form with it")
	flag.Parse()
	if flag.NArg() != 3 {
		fmt.Fprintln(os.Stderr, "usage: fencesql [-inline TOKEN] TABLE TOKEN_COLUMN SQL")
		os.Exit(2)
	}
	args := flag.Args()
	r, err := rewrite.New(rewrite.Config{Tables: []rewrite.Table{{Name: args[0], TokenColumn: args[1]}}, Verify: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fencesql:", err)
		os.Exit(1)
	}
	set := rewrite.DefaultSettings
	set.InlineToken = *inline != ""
	p := r.PlanWith([]byte(args[2]), set)
	if p.Action != rewrite.Rewrite {
		fmt.Fprintf(os.Stderr, "fencesql: %s: %s\n", p.Action, p.Message)
		os.Exit(1)
	}
	if set.InlineToken && p.TokenSegs == nil {
		fmt.Fprintln(os.Stderr, "fencesql: not planned in the inline form (a '$' or a PREPARE in the text?)")
		os.Exit(1)
	}
	fmt.Println(p.WithToken(*inline))
}
