package schema

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Finding is one problem Inspect found, for `fenceproxy check`.
type Finding struct {
	Object  string // what it concerns: "fenceproxy schema", a function or a table
	Problem string
	Fix     string
}

// Status is what Inspect reports.
type Status struct {
	// Applied is the number of migration steps the database has applied; Latest is this binary's.
	Applied, Latest int
	// Installed is false when the fenceproxy schema is absent.
	Installed bool
	// DDLGuard is true when the DDL guard's event triggers exist.
	DDLGuard bool
	// Findings is empty when the schema and the guard are exactly what Install would make for the config.
	Findings []Finding
}

// Inspect compares the database with what Install would make for cfg: the schema's steps, every generated
// function's body, and each protected relation's guard triggers (present, calling the right function,
// enabled ALWAYS). It changes nothing.
func Inspect(ctx context.Context, conn *pgx.Conn, cfg Config) (Status, error) {
	st := Status{Latest: len(Steps())}
	install := "fenceproxy install --config FILE"
	applied, err := Installed(ctx, conn)
	if err != nil {
		return st, err
	}
	if applied == nil {
		st.Findings = append(st.Findings, Finding{Object: "fenceproxy schema", Problem: "not installed: writes inside the server (functions, triggers, cascades, sessions that bypass the proxy) are not fenced",
			Fix: install})
		return st, nil
	}
	st.Installed, st.Applied = true, len(applied)
	if _, err := pendingSteps(applied); err != nil {
		st.Findings = append(st.Findings, Finding{Object: "fenceproxy schema", Problem: err.Error(), Fix: "use the newest fenceproxy binary"})
	} else if len(applied) < st.Latest {
		st.Findings = append(st.Findings, Finding{Object: "fenceproxy schema",
			Problem: fmt.Sprintf("at step %d of %d", len(applied), st.Latest), Fix: install})
	}
	missing, err := missingRelations(ctx, conn, len(applied))
	if err != nil {
		return st, err
	}
	for _, m := range missing {
		st.Findings = append(st.Findings, Finding{Object: m,
			Problem: "missing though its step was applied (dropped by hand?): the guard fails writes that need it",
			Fix:     "restore it, or fenceproxy uninstall and install again (loses lock marks and the PostgreSQL lock store's state)"})
	}
	if st.DDLGuard, err = ddlGuardInstalled(ctx, conn); err != nil {
		return st, err
	}
	// A configured table absent from this database is check's own finding (table-missing, with its CREATE
	// TABLE); the guard is inspected on the tables that are here.
	rels, _, err := resolve(ctx, conn, cfg)
	if err != nil {
		st.Findings = append(st.Findings, Finding{Object: "protected tables", Problem: err.Error(), Fix: "fenceproxy check"})
		return st, nil
	}
	defs, err := definitions(cfg, rels)
	if err != nil {
		return st, err
	}
	for _, d := range defs {
		var body *string
		err := conn.QueryRow(ctx, `SELECT p.prosrc FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'fenceproxy' AND p.proname = $1`, d.name).Scan(&body)
		switch {
		case err == pgx.ErrNoRows:
			st.Findings = append(st.Findings, Finding{Object: "function fenceproxy." + d.name, Problem: "missing", Fix: install})
		case err != nil:
			return st, fmt.Errorf("read fenceproxy.%s: %w", d.name, err)
		case body == nil || *body != d.body:
			st.Findings = append(st.Findings, Finding{Object: "function fenceproxy." + d.name,
				Problem: "outdated (differs from what this binary and configuration generate)", Fix: install})
		}
	}
	for _, r := range rels {
		for _, tr := range []struct{ name, fn string }{{RowTrigger, r.spec.functionName()}, {TruncateTrigger, "guard_truncate"},
			{StatementStartTrigger, "guard_statement"}, {StatementEndTrigger, "guard_statement"}} {
			var fn, enabled string
			err := conn.QueryRow(ctx, `SELECT p.proname, t.tgenabled::text FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE t.tgrelid = $1 AND t.tgname = $2 AND n.nspname = 'fenceproxy'`, r.oid, tr.name).Scan(&fn, &enabled)
			obj := fmt.Sprintf("%s.%s (protected as %s)", r.schema, r.name, r.spec.Label)
			switch {
			case err == pgx.ErrNoRows:
				st.Findings = append(st.Findings, Finding{Object: obj, Problem: "no guard trigger " + tr.name + ": writes inside the server are not fenced", Fix: install})
			case err != nil:
				return st, fmt.Errorf("read the triggers of %s: %w", obj, err)
			case fn != tr.fn:
				st.Findings = append(st.Findings, Finding{Object: obj, Problem: "guard trigger " + tr.name + " calls fenceproxy." + fn + ", not " + tr.fn, Fix: install})
			case enabled != "A":
				st.Findings = append(st.Findings, Finding{Object: obj,
					Problem: fmt.Sprintf("guard trigger %s is not enabled ALWAYS (tgenabled %q): it can be skipped", tr.name, enabled), Fix: install})
			}
		}
	}
	return st, nil
}
