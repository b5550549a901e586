package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/schema"
)

// installTimeout bounds install and uninstall (they wait for locks on the protected tables).
const installTimeout = 5 * time.Minute

// runInstall creates or upgrades the fenceproxy schema and the in-database guard (package schema), or with
// --print writes the SQL it would run.
const installHelp = `usage: fenceproxy install --config FILE [--dsn DSN] [--print] [--ddl-guard]

Creates the fenceproxy schema in the upstream database, or upgrades it in place (each migration step once, in
one transaction; re-running changes nothing): lock marks, the PostgreSQL lock store, and the guard, a
generated BEFORE INSERT/UPDATE/DELETE row trigger and a BEFORE TRUNCATE trigger on every protected table, its
partitions and inheritance children, which enforce the same rules and SQLSTATEs as the proxy for writes the
proxy never sees. --ddl-guard (superuser) adds event triggers that refuse DDL dropping, renaming or rewriting a
protected table or its token column. --print prints the SQL instead of running it (and, on stderr, what it
would do to which table). Credentials as for check.

In each database it guards the configured tables that database holds, and says, naming the database, which
tables it guarded, which configured tables it skipped (not in this database) and which it un-guarded (no
longer in the configuration); a database holding none of the configured tables is refused.
Exit status: 0, 1 on problems, 2 on a usage error.
`

func runInstall(args []string, stdout, stderr io.Writer) int {
	fs := newCommandFlags("install", installHelp, stderr)
	configPath := fs.String("config", "", "path of the YAML configuration file (required)")
	dsn := fs.String("dsn", "", "connection string (default: PG* environment variables, host and port from upstream.address)")
	printOnly := fs.Bool("print", false, "print the SQL instead of running it")
	ddlGuard := fs.Bool("ddl-guard", false, "also install the DDL guard (event triggers; needs a superuser)")
	if status, done := fs.parse(args, 2, stdout, stderr); done {
		return status
	}
	if *configPath == "" || fs.NArg() > 0 {
		fs.usageError(stderr, "")
		return 2
	}
	cfg, conn, code := connectUpstream("install", *configPath, *dsn, stderr)
	if conn == nil {
		return code
	}
	defer conn.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	scfg := schema.FromConfig(cfg)
	scfg.DDLGuard = *ddlGuard
	if *printOnly {
		p, err := schema.BuildPlan(ctx, conn, scfg)
		if err != nil {
			fmt.Fprintf(stderr, "fenceproxy install: %v\n", err)
			return 1
		}
		fmt.Fprint(stdout, p.SQL())
		// What the SQL does to which table goes to stderr, so that stdout stays a script to pipe into psql.
		printInstallPlan(stderr, p)
		return 0
	}
	plan, err := schema.InstallPlan(ctx, conn, scfg)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy install: %v\n", err)
		return 1
	}
	st, err := schema.Inspect(ctx, conn, scfg)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy install: inspect: %v\n", err)
		return 1
	}
	printInstallPlan(stdout, plan)
	for _, f := range st.Findings {
		fmt.Fprintf(stdout, "FAIL  %s: %s\n", f.Object, f.Problem)
	}
	if len(st.Findings) > 0 {
		return 1
	}
	ddl := ""
	if st.DDLGuard {
		ddl = ", DDL guard on"
	}
	fmt.Fprintf(stdout, "ok    database %s: fenceproxy schema at step %d, guard on %d of %d protected table(s)%s\n",
		plan.Database, st.Applied, len(cfg.Tables)-len(plan.Missing), len(cfg.Tables), ddl)
	return 0
}

// printInstallPlan says what install did to which table, in which database: every relation guarded, every
// configured table it skipped because this database does not hold it, and every relation whose guard it
// removed because the configuration no longer protects it. Nothing is left or dropped without a line.
func printInstallPlan(w io.Writer, p schema.Plan) {
	for _, g := range p.Guarded {
		fmt.Fprintf(w, "ok    database %s: guarded %s\n", p.Database, g)
	}
	for _, m := range p.Missing {
		fmt.Fprintf(w, "WARN  database %s: %s: no such table here, not guarded in this database "+
			"(install again after creating it; fenceproxy check reports it)\n", p.Database, m)
	}
	for _, u := range p.Unguarded {
		fmt.Fprintf(w, "WARN  database %s: un-guarded %s: the configuration no longer protects it "+
			"(writes inside the server are not fenced there any more)\n", p.Database, u)
	}
}

// runUninstall removes the fenceproxy schema, the guard and the DDL guard.
const uninstallHelp = `usage: fenceproxy uninstall --config FILE [--dsn DSN] [--print]

Removes the fenceproxy schema from the upstream database: the guard's triggers and functions, the DDL guard,
lock marks and the PostgreSQL lock store. --print prints the SQL instead of running it.
Exit status: 0, 1 on problems, 2 on a usage error.
`

func runUninstall(args []string, stdout, stderr io.Writer) int {
	fs := newCommandFlags("uninstall", uninstallHelp, stderr)
	configPath := fs.String("config", "", "path of the YAML configuration file (required)")
	dsn := fs.String("dsn", "", "connection string (default: PG* environment variables, host and port from upstream.address)")
	printOnly := fs.Bool("print", false, "print the SQL instead of running it")
	if status, done := fs.parse(args, 2, stdout, stderr); done {
		return status
	}
	if *configPath == "" || fs.NArg() > 0 {
		fs.usageError(stderr, "")
		return 2
	}
	if *printOnly {
		fmt.Fprintf(stdout, "BEGIN;\n%s\nCOMMIT;\n", schema.UninstallSQL)
		return 0
	}
	_, conn, code := connectUpstream("uninstall", *configPath, *dsn, stderr)
	if conn == nil {
		return code
	}
	defer conn.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	if err := schema.Uninstall(ctx, conn); err != nil {
		fmt.Fprintf(stderr, "fenceproxy uninstall: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, "ok    fenceproxy schema removed")
	return 0
}

// connectUpstream loads the configuration and connects as `fenceproxy check` does: --dsn, or the PG*
// environment variables with host and port from upstream.address. On failure conn is nil and code the exit
// status.
func connectUpstream(cmd, configPath, dsn string, stderr io.Writer) (cfg *config.Config, conn *pgx.Conn, code int) {
	cfg, err := config.Load(configPath)
	if err != nil {
		printConfigError(stderr, err)
		return nil, nil, 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if conn, err = connectDirect(ctx, cfg, dsn); err != nil {
		fmt.Fprintf(stderr, "fenceproxy %s: %v\n", cmd, err)
		return nil, nil, 1
	}
	return cfg, conn, 0
}
