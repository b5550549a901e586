package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fenceproxy/fenceproxy/catalog"
	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// etcdCheckTimeout bounds reaching etcd and reading its revision in `fenceproxy check`.
const etcdCheckTimeout = 5 * time.Second

// runCheck connects to the upstream PostgreSQL directly (credentials from the usual PG* environment variables
// or --dsn, once per database) and reports, per protected table, whether the table and its token column exist
// with type bigint, with the DDL that would fix what is missing. With etcd endpoints (--etcd, else
// token.verify.etcd.endpoints) it also checks that no row holds a token above etcd's current revision plus
// token.offset, which is what an etcd restored from a snapshot with smaller revisions looks like.
const checkHelp = `usage: fenceproxy check --config FILE [--dsn DSN]... [--etcd ENDPOINTS] [--json] [--proxy-address IP]

Connects to the upstream PostgreSQL directly (not through a proxy) and reports, for each protected table,
whether it and its token column exist with type bigint, and prints the DDL that fixes what is missing
(CREATE TABLE for a missing table, ALTER TABLE for a missing or mistyped column), then audits the guard and
every in-server write path (docs/check.md). With etcd endpoints (--etcd, else token.verify.etcd.endpoints) it
also warns when rows hold tokens above etcd's current revision plus token.offset (an etcd restored from a
snapshot).

--dsn may be given once per database a proxy serves: each is checked and reported on its own, and a table
missing from one database but present in another is a warning there, not an error.

Credentials come from the usual libpq variables (PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE, ...) or --dsn;
host and port default to upstream.address. With upstream.hosts it reports each host's role (primary, standby,
read-only, down) and replication lag, and fails when no host, or more than one, is primary. Exit status: 0 when everything is usable, 1 on problems (or when
the check cannot run), 2 on a usage error.
`

// KindTableMissing is check's finding for a configured table that does not exist in a database checked.
const KindTableMissing = "table-missing"

// dsnList is a repeatable --dsn.
type dsnList []string

func (l *dsnList) String() string     { return strings.Join(*l, " ") }
func (l *dsnList) Set(s string) error { *l = append(*l, s); return nil }

// checkedDatabase is one database check connected to, and the configured tables it holds.
type checkedDatabase struct {
	name    string
	conn    *pgx.Conn
	present map[string][]tableCheck // configured name -> the tables it names here
}

func runCheck(args []string, stdout, stderr io.Writer) int {
	fs := newCommandFlags("check", checkHelp, stderr)
	configPath := fs.String("config", "", "path of the YAML configuration `FILE` (required)")
	var dsns dsnList
	fs.Var(&dsns, "dsn", "connection string for the check, once per database to check (default: PG* environment variables, host and port from upstream.address)")
	etcdFlag := fs.String("etcd", "", "comma-separated etcd `endpoints` for the token revision check (default: token.verify.etcd.endpoints; \"\" skips the check)")
	jsonOut := fs.Bool("json", false, "print the report as one JSON object (tables and findings) instead of text")
	proxyAddr := fs.String("proxy-address", "", "the `IP` PostgreSQL sees the proxy's connections come from, for the pg_hba.conf audit (default: this check's own client address)")
	if status, done := fs.parse(args, 2, stdout, stderr); done {
		return status
	}
	if *configPath == "" || fs.NArg() > 0 {
		fs.usageError(stderr, "")
		return 2
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		printConfigError(stderr, err)
		return 1
	}
	var proxyIP netip.Addr
	if *proxyAddr != "" {
		if proxyIP, err = netip.ParseAddr(*proxyAddr); err != nil {
			fmt.Fprintf(stderr, "fenceproxy check: --proxy-address: %v\n", err)
			return 2
		}
	}
	if len(dsns) == 0 {
		dsns = dsnList{""}
	}
	report := &checkReport{Tables: []tableResult{}}
	origStdout := stdout
	if *jsonOut {
		stdout = io.Discard
	}
	endpoints := cfg.Token.Verify.Etcd.Endpoints
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "etcd" {
			endpoints = splitEndpoints(*etcdFlag)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second*time.Duration(len(dsns)))
	defer cancel()

	// First which database holds which configured table, so that each database's report can tell a table
	// that lives in another database from one that is missing everywhere.
	var dbs []checkedDatabase
	for _, dsn := range dsns {
		conn, err := connectDirect(ctx, cfg, dsn)
		if err != nil {
			fmt.Fprintf(stderr, "fenceproxy check: %v\n", err)
			return 1
		}
		defer conn.Close(context.Background())
		db := checkedDatabase{conn: conn, present: map[string][]tableCheck{}}
		if err := conn.QueryRow(ctx, "SELECT pg_catalog.current_database()").Scan(&db.name); err != nil {
			fmt.Fprintf(stderr, "fenceproxy check: current_database: %v\n", err)
			return 1
		}
		for _, t := range cfg.Tables {
			rows, err := findTables(ctx, conn, t)
			if err != nil {
				fmt.Fprintf(stderr, "fenceproxy check: database %s: %s: %v\n", db.name, t.Name, err)
				return 1
			}
			db.present[t.Name] = rows
		}
		dbs = append(dbs, db)
	}

	problems := 0
	for _, db := range dbs {
		if len(dbs) > 1 {
			fmt.Fprintf(stdout, "== database %s\n", db.name)
			report.Databases = append(report.Databases, db.name)
		}
		n, err := checkDatabase(ctx, cfg, db, dbs, endpoints, proxyIP, report, stdout)
		if err != nil {
			fmt.Fprintf(stderr, "fenceproxy check: database %s: %v\n", db.name, err)
			return 1
		}
		problems += n
	}
	if cfg.Upstream.Routed() {
		hosts, n := checkHosts(ctx, cfg, dsns[0], stdout)
		report.Hosts = hosts
		problems += n
	}
	for _, f := range report.Findings {
		switch f.Severity {
		case catalog.SeverityError:
			report.Errors++
		case catalog.SeverityWarning:
			report.Warnings++
		}
	}
	report.Problems = problems
	if *jsonOut {
		enc := json.NewEncoder(origStdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(report); err != nil {
			fmt.Fprintf(stderr, "fenceproxy check: %v\n", err)
			return 1
		}
	}
	if problems > 0 {
		fmt.Fprintf(stdout, "%d problem(s)\n", problems)
		return 1
	}
	return 0
}

// checkDatabase checks one database (the token columns, etcd's revision, the audit), adds what it finds to
// report and prints it; it returns the number of problems (failed checks and error findings).
func checkDatabase(ctx context.Context, cfg *config.Config, db checkedDatabase, all []checkedDatabase, endpoints []string,
	proxyIP netip.Addr, report *checkReport, stdout io.Writer) (int, error) {
	problems := 0
	var findings []catalog.Finding
	var usable []tokenColumn // existing tables with a bigint token column, for the revision check
	for _, t := range cfg.Tables {
		rows := db.present[t.Name]
		if len(rows) == 0 {
			f := missingTable(t, db.name, all)
			findings = append(findings, f)
			report.Tables = append(report.Tables, tableResult{Database: db.name, Table: t.Name, OK: false, Message: f.Message, Fix: f.Fix})
			continue
		}
		for _, r := range rows {
			label := r.schema + "." + r.table
			switch {
			case r.colType == "":
				problems++
				fix := fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s bigint;", pgx.Identifier{r.schema, r.table}.Sanitize(), pgx.Identifier{t.TokenColumn}.Sanitize())
				fmt.Fprintf(stdout, "FAIL  %s.%s: no column %s\n      fix: %s\n", r.schema, r.table, t.TokenColumn, fix)
				report.Tables = append(report.Tables, tableResult{Database: db.name, Table: label, Message: "no column " + t.TokenColumn, Fix: fix})
			case r.colType != "bigint":
				problems++
				fix := fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE bigint;", pgx.Identifier{r.schema, r.table}.Sanitize(), pgx.Identifier{t.TokenColumn}.Sanitize())
				fmt.Fprintf(stdout, "FAIL  %s.%s: column %s is %s, not bigint\n      fix: %s\n", r.schema, r.table, t.TokenColumn, r.colType, fix)
				report.Tables = append(report.Tables, tableResult{Database: db.name, Table: label, Message: fmt.Sprintf("column %s is %s, not bigint", t.TokenColumn, r.colType), Fix: fix})
			default:
				fmt.Fprintf(stdout, "ok    %s.%s: token column %s bigint\n", r.schema, r.table, t.TokenColumn)
				report.Tables = append(report.Tables, tableResult{Database: db.name, Table: label, OK: true, Message: "token column " + t.TokenColumn + " bigint"})
				usable = append(usable, tokenColumn{schema: r.schema, table: r.table, column: t.TokenColumn})
			}
		}
	}
	if len(endpoints) > 0 {
		n, err := checkRevision(ctx, db.conn, endpoints, cfg.Token.Offset, usable, stdout)
		if err != nil {
			return 0, err
		}
		problems += n
		report.RevisionProblems += n
	}
	ok, audited, err := auditFindings(ctx, db.conn, cfg, proxyIP)
	if err != nil {
		return 0, err
	}
	for _, line := range ok {
		fmt.Fprintln(stdout, line)
	}
	findings = append(findings, audited...)
	sortFindings(findings)
	printFindings(stdout, findings)
	for i := range findings {
		if len(all) > 1 {
			findings[i].Database = db.name
		}
		if findings[i].Severity == catalog.SeverityError {
			problems++
		}
	}
	report.Findings = append(report.Findings, findings...)
	return problems, nil
}

// missingTable is the finding for a configured table that database does not hold: an error with the CREATE
// TABLE that makes it, or a warning when another database checked in the same run holds it (one proxy, several
// databases, each with some of the tables).
func missingTable(t config.Table, database string, all []checkedDatabase) catalog.Finding {
	f := catalog.Finding{Severity: catalog.SeverityError, Kind: KindTableMissing, Object: t.Name, Tables: []string{t.Name},
		Message: fmt.Sprintf("no such table in database %s", database), Fix: missingTableDDL(t)}
	var elsewhere []string
	for _, other := range all {
		if other.name != database && len(other.present[t.Name]) > 0 {
			elsewhere = append(elsewhere, other.name)
		}
	}
	if len(elsewhere) > 0 {
		f.Severity = catalog.SeverityWarning
		f.Message += fmt.Sprintf(" (it is in database %s); writes to it through the proxy in this database are still fenced", strings.Join(elsewhere, ", "))
		f.Fix = "nothing, if it belongs only in " + strings.Join(elsewhere, ", ") + "; else " + f.Fix
	}
	return f
}

// connectDirect connects straight to the upstream PostgreSQL, as check, install and uninstall do: with dsn, or
// with the usual PG* environment variables and the host and port of upstream.address.
func connectDirect(ctx context.Context, cfg *config.Config, dsn string) (*pgx.Conn, error) {
	addr := ""
	if dsn == "" {
		addr = cfg.Upstream.Address
	}
	return connectAt(ctx, dsn, addr)
}

// connectAt connects with dsn (or the PG* environment variables) to addr (host:port) when addr is not "", else
// where dsn says.
func connectAt(ctx context.Context, dsn, addr string) (*pgx.Conn, error) {
	pcfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if addr != "" {
		host, portText, _ := net.SplitHostPort(addr)
		var port uint16
		fmt.Sscan(portText, &port)
		pcfg.Host, pcfg.Port = host, port
		// The fallbacks are the plain-TCP retry of sslmode=prefer (libpq's default): point them at the upstream
		// too rather than dropping them, or a server without TLS could not be reached.
		for _, fb := range pcfg.Fallbacks {
			fb.Host, fb.Port = host, port
		}
	}
	conn, err := pgx.ConnectConfig(ctx, pcfg)
	if err != nil {
		err = fmt.Errorf("connect upstream %s: %w", net.JoinHostPort(pcfg.Host, strconv.Itoa(int(pcfg.Port))), err)
		if dsn == "" && os.Getenv("PGUSER") == "" && os.Getenv("PGPASSWORD") == "" {
			// Run by hand without them, it logged in as the OS user with no password, which says little.
			err = fmt.Errorf("%w (the credentials come from --dsn or the PG* environment variables: PGUSER, PGPASSWORD, PGDATABASE)", err)
		}
		return nil, err
	}
	return conn, nil
}

type tableCheck struct{ schema, table, colType string }

// missingTableDDL is the fix check gives for a protected table that does not exist: a CREATE TABLE with the
// token column (the other columns are the user's to choose; id is a placeholder). A bare name is created in the
// current schema, where the application will find it.
func missingTableDDL(t config.Table) string {
	name := pgx.Identifier{t.Relation}
	if t.Schema != "" {
		name = pgx.Identifier{t.Schema, t.Relation}
	}
	return fmt.Sprintf("CREATE TABLE %s (id bigint PRIMARY KEY, %s bigint);  -- your own columns, and the token column",
		name.Sanitize(), pgx.Identifier{t.TokenColumn}.Sanitize())
}

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

// tokenColumn is a protected table that exists with a bigint token column.
type tokenColumn struct{ schema, table, column string }

// checkRevision compares the highest token each table holds with etcd's current revision plus offset. A row
// token above that bound was never issued by this etcd's history: the usual cause is an etcd restored from a
// snapshot, whose revisions restarted below tokens already written. Then every new lock holder's token is
// smaller than the rows' tokens (all its writes fail with 55F01), and the proxy's verifier refuses the old,
// higher tokens (55F03). It prints one line per table and returns the number of problems; an unreachable etcd
// is one. The error is for a failed query.
func checkRevision(ctx context.Context, conn *pgx.Conn, endpoints []string, offset int64, cols []tokenColumn, stdout io.Writer) (int, error) {
	where := strings.Join(endpoints, ",")
	rev, err := etcdRevision(ctx, endpoints)
	if err != nil {
		fmt.Fprintf(stdout, "FAIL  etcd %s: %v\n      the token revision check needs etcd; the proxy's token verification would refuse new tokens too (unless fail_open)\n", where, err)
		return 1, nil
	}
	bound := int64(math.MaxInt64)
	if rev <= math.MaxInt64-offset {
		bound = rev + offset
	}
	problems := 0
	for _, c := range cols {
		qname := pgx.Identifier{c.schema, c.table}.Sanitize()
		var maxToken *int64
		if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT max(%s) FROM %s", pgx.Identifier{c.column}.Sanitize(), qname)).Scan(&maxToken); err != nil {
			return problems, fmt.Errorf("%s.%s: highest %s: %w", c.schema, c.table, c.column, err)
		}
		switch {
		case maxToken == nil:
			fmt.Fprintf(stdout, "ok    %s.%s: no tokens yet (etcd revision %d, token.offset %d)\n", c.schema, c.table, rev, offset)
		case *maxToken <= bound:
			fmt.Fprintf(stdout, "ok    %s.%s: highest %s %d is within etcd revision %d + token.offset %d\n", c.schema, c.table, c.column, *maxToken, rev, offset)
		default:
			problems++
			m := *maxToken
			fmt.Fprintf(stdout, "WARN  %s.%s: rows hold tokens up to %d, above etcd's current revision %d + token.offset %d = %d\n",
				c.schema, c.table, m, rev, offset, bound)
			fmt.Fprintf(stdout, "      etcd (%s) was probably restored from a snapshot with smaller revisions: new lock holders get\n", where)
			fmt.Fprintf(stdout, "      tokens below the rows' (their writes fail with 55F01), and the proxy refuses the old ones (55F03).\n")
			fmt.Fprintf(stdout, "      cure 1: set token.offset to at least %d (= %d - %d + 1) in the proxy's configuration and for every\n", m-rev+1, m, rev)
			fmt.Fprintf(stdout, "              writer (fenceproxy lock --token-offset %d), then restart them\n", m-rev+1)
			fmt.Fprintf(stdout, "      cure 2: restore etcd again with revisions moved past the rows' tokens:\n")
			fmt.Fprintf(stdout, "              etcdutl snapshot restore SNAPSHOT --bump-revision %d --mark-compacted ...\n", bumpFor(m, offset))
			fmt.Fprintf(stdout, "              (%d = %d - token.offset %d + 1 is enough whatever the snapshot's revision)\n", bumpFor(m, offset), m, offset)
		}
	}
	return problems, nil
}

// bumpFor is a --bump-revision that makes every revision after the restore, plus offset, exceed maxToken.
func bumpFor(maxToken, offset int64) int64 {
	if maxToken-offset < 0 {
		return 1
	}
	return maxToken - offset + 1
}

// etcdRevision reads etcd's current revision with a linearizable read of the lock prefix (count only), as the
// proxy's verifier does.
func etcdRevision(ctx context.Context, endpoints []string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, etcdCheckTimeout)
	defer cancel()
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: etcdCheckTimeout,
		Logger:      zap.NewNop(),
		Context:     ctx,
	})
	if err != nil {
		return 0, fmt.Errorf("etcd client: %w", err)
	}
	defer client.Close()
	resp, err := client.Get(ctx, tokens.DefaultPrefix, clientv3.WithCountOnly())
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			return 0, fmt.Errorf("unreachable (no answer within %v): %w", etcdCheckTimeout, err)
		}
		return 0, fmt.Errorf("read revision: %w", err)
	}
	return resp.Header.Revision, nil
}
