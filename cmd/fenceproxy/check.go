package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/config"
)

// runCheck connects to the upstream PostgreSQL directly (credentials from the usual PG* environment variables
// or --dsn) and reports, per protected table, whether the table and its token column exist with type bigint,
// with the DDL that would fix what is missing.
func runCheck(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "path of the YAML configuration file (required)")
	dsn := fs.String("dsn", "", "connection string for the check (default: PG* environment variables, host and port from upstream.address)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *configPath == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: fenceproxy check --config FILE [--dsn DSN]")
		return 2
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy: %v\n", err)
		return 1
	}
	pcfg, err := pgx.ParseConfig(*dsn)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy check: %v\n", err)
		return 1
	}
	if *dsn == "" {
		host, port, _ := net.SplitHostPort(cfg.Upstream.Address)
		pcfg.Host = host
		fmt.Sscan(port, &pcfg.Port)
		pcfg.Fallbacks = nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, pcfg)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy check: connect upstream %s: %v\n", cfg.Upstream.Address, err)
		return 1
	}
	defer conn.Close(context.Background())

	problems := 0
	for _, t := range cfg.Tables {
		rows, err := findTables(ctx, conn, t)
		if err != nil {
			fmt.Fprintf(stderr, "fenceproxy check: %s: %v\n", t.Name, err)
			return 1
		}
		if len(rows) == 0 {
			problems++
			fmt.Fprintf(stdout, "FAIL  %s: no such table\n", t.Name)
			continue
		}
		for _, r := range rows {
			switch {
			case r.colType == "":
				problems++
				fmt.Fprintf(stdout, "FAIL  %s.%s: no column %s\n      fix: ALTER TABLE %s ADD COLUMN %s bigint;\n",
					r.schema, r.table, t.TokenColumn, pgx.Identifier{r.schema, r.table}.Sanitize(), pgx.Identifier{t.TokenColumn}.Sanitize())
			case r.colType != "bigint":
				problems++
				fmt.Fprintf(stdout, "FAIL  %s.%s: column %s is %s, not bigint\n      fix: ALTER TABLE %s ALTER COLUMN %s TYPE bigint;\n",
					r.schema, r.table, t.TokenColumn, r.colType, pgx.Identifier{r.schema, r.table}.Sanitize(), pgx.Identifier{t.TokenColumn}.Sanitize())
			default:
				fmt.Fprintf(stdout, "ok    %s.%s: token column %s bigint\n", r.schema, r.table, t.TokenColumn)
			}
		}
	}
	if problems > 0 {
		fmt.Fprintf(stdout, "%d problem(s)\n", problems)
		return 1
	}
	return 0
}

type tableCheck struct{ schema, table, colType string }

// findTables lists the tables a configured name protects (every schema for a bare name) and the type of the
// token column in each, "" when the column is missing.
func findTables(ctx context.Context, conn *pgx.Conn, t config.Table) ([]tableCheck, error) {
	rows, err := conn.Query(ctx, `
SELECT n.nspname, c.relname, coalesce(format_type(a.atttypid, a.atttypmod), '')
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = $3 AND NOT a.attisdropped AND a.attnum > 0
WHERE c.relname = $2 AND ($1 = '' OR n.nspname = $1) AND c.relkind IN ('r', 'p')
ORDER BY 1, 2`, t.Schema, t.Relation, t.TokenColumn)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (tableCheck, error) {
		var tc tableCheck
		err := r.Scan(&tc.schema, &tc.table, &tc.colType)
		return tc, err
	})
}
