package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/catalog"
	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/proxy"
	"github.com/fenceproxy/fenceproxy/schema"
)

// checkReport is `fenceproxy check --json`.
type checkReport struct {
	// Tables is the token-column check of each configured table.
	Tables []tableResult `json:"tables"`
	// RevisionProblems counts tables whose tokens are above etcd's revision (details in the text output).
	RevisionProblems int `json:"revision_problems"`
	// Hosts is each of upstream.hosts' role and replication lag (absent with one upstream.address).
	Hosts    []hostResult      `json:"hosts,omitempty"`
	Findings []catalog.Finding `json:"findings"`
	Errors   int               `json:"errors"`
	Warnings int               `json:"warnings"`
	// Problems is what the exit status reflects: failed table checks, revision problems and error findings.
	Problems int `json:"problems"`
}

type tableResult struct {
	Table   string `json:"table"`
	OK      bool   `json:"ok"`
	Message string `json:"message"`
	Fix     string `json:"fix,omitempty"`
}

// auditFindings runs the in-server write-path audit (docs/check.md) and prints each finding.
func auditFindings(ctx context.Context, conn *pgx.Conn, cfg *config.Config, proxyIP netip.Addr, out io.Writer) ([]catalog.Finding, error) {
	findings, snap, err := catalog.Audit(ctx, conn, proxy.ConfiguredTables(cfg), catalog.AuditOptions{ProxyAddress: proxyIP})
	if err != nil {
		return nil, err
	}
	// An installed guard older than this binary, or changed by hand (install's own inspection; a guard that
	// is not installed at all is the audit's missing-guard finding).
	st, err := schema.Inspect(ctx, conn, schema.FromConfig(cfg))
	if err != nil {
		return nil, err
	}
	if st.Installed {
		for _, f := range st.Findings {
			findings = append(findings, catalog.Finding{Severity: catalog.SeverityError, Kind: "guard-outdated",
				Object: f.Object, Message: f.Problem, Fix: f.Fix})
		}
	}
	for _, p := range snap.Protected {
		fmt.Fprintf(out, "ok    %s: protected with %s (%s)\n", p.Table.Label(), p.Table.TokenColumn, p.Via)
	}
	for _, f := range findings {
		fmt.Fprintf(out, "%-7s %s [%s]: %s\n      fix: %s\n", f.Severity, f.Object, f.Kind, f.Message, strings.ReplaceAll(f.Fix, "\n", "\n           "))
	}
	return findings, nil
}
