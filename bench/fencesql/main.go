// Command fencesql prints the statement fenceproxy sends PostgreSQL for one client statement (bench/fence-sql
// measures it). Usage: go run ./bench/fencesql TABLE TOKEN_COLUMN SQL.
package main

import (
	"fmt"
	"os"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: fencesql TABLE TOKEN_COLUMN SQL")
		os.Exit(2)
	}
	r, err := rewrite.New(rewrite.Config{Tables: []rewrite.Table{{Name: os.Args[1], TokenColumn: os.Args[2]}}, Verify: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fencesql:", err)
		os.Exit(1)
	}
	p := r.Plan(os.Args[3])
	if p.Action != rewrite.Rewrite {
		fmt.Fprintf(os.Stderr, "fencesql: %s: %s\n", p.Action, p.Message)
		os.Exit(1)
	}
	fmt.Println(p.SQL)
}
