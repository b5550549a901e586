package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/catalog"
	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/proxy"
	"github.com/fenceproxy/fenceproxy/schema"
)

// checkReport is `fenceproxy check --json`.
type checkReport struct {
	// Databases are the databases checked, when --dsn named more than one.
	Databases []string `json:"databases,omitempty"`
	// Tables is the token-column check of each configured table.
	Tables []tableResult `json:"tables"`
	// RevisionProblems counts tables whose tokens are above etcd's revision (details in the text output).
	RevisionProblems int               `json:"revision_problems"`
	Findings         []catalog.Finding `json:"findings"`
	Errors           int               `json:"errors"`
	Warnings         int               `json:"warnings"`
	// Problems is what the exit status reflects: failed table checks, revision problems and error findings.
	Problems int `json:"problems"`
}

type tableResult struct {
	// Database is the database the table was checked in.
	Database string `json:"database"`
	Table    string `json:"table"`
	OK       bool   `json:"ok"`
	Message  string `json:"message"`
	Fix      string `json:"fix,omitempty"`
}

// auditFindings runs the in-server write-path audit (docs/check.md) and adds install's own inspection of an
// installed guard. ok are the lines that say which derived relations (partitions, children, views) are
// protected.
func auditFindings(ctx context.Context, conn *pgx.Conn, cfg *config.Config, proxyIP netip.Addr) (ok []string, findings []catalog.Finding, err error) {
	findings, snap, err := catalog.Audit(ctx, conn, proxy.ConfiguredTables(cfg), catalog.AuditOptions{ProxyAddress: proxyIP})
	if err != nil {
		return nil, nil, err
	}
	// An installed guard older than this binary, or changed by hand (install's own inspection; a guard that
	// is not installed at all is the audit's missing-guard finding).
	st, err := schema.Inspect(ctx, conn, schema.FromConfig(cfg))
	if err != nil {
		return nil, nil, err
	}
	if st.Installed {
		for _, f := range st.Findings {
			findings = append(findings, catalog.Finding{Severity: catalog.SeverityError, Kind: catalog.KindGuardOutdated,
				Object: f.Object, Message: f.Problem, Fix: f.Fix})
		}
	}
	for _, p := range snap.Protected {
		ok = append(ok, fmt.Sprintf("ok    %s: protected with %s (%s)", p.Table.Label(), p.Table.TokenColumn, p.Via))
	}
	return ok, findings, nil
}

// sortFindings orders findings as the audit does: errors, warnings, then information, each by kind and object.
func sortFindings(fs []catalog.Finding) {
	rank := map[string]int{catalog.SeverityError: 0, catalog.SeverityWarning: 1, catalog.SeverityInfo: 2}
	slices.SortStableFunc(fs, func(x, y catalog.Finding) int {
		if d := rank[x.Severity] - rank[y.Severity]; d != 0 {
			return d
		}
		if c := strings.Compare(x.Kind, y.Kind); c != 0 {
			return c
		}
		return strings.Compare(x.Object, y.Object)
	})
}

// printFindings prints each finding with its fix.
func printFindings(out io.Writer, fs []catalog.Finding) {
	for _, f := range fs {
		fmt.Fprintf(out, "%-7s %s [%s]: %s\n      fix: %s\n", f.Severity, f.Object, f.Kind, f.Message, strings.ReplaceAll(f.Fix, "\n", "\n           "))
	}
}
