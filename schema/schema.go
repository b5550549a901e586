// Package schema creates, upgrades, inspects and removes what fenceproxy puts into a database: the fenceproxy
// schema with its version table and migration steps (Steps), the in-database guard (a generated trigger
// function per protected table, row-level BEFORE INSERT/UPDATE/DELETE and statement-level BEFORE TRUNCATE
// triggers on every protected table, its partitions and inheritance children), lock fences (lock_marks and
// lock_accept), and optionally the DDL guard (event triggers).
//
// The guard enforces the contract inside PostgreSQL with the proxy's SQLSTATEs and texts (generated from
// rewrite.Marker.Describe), so writes the proxy never sees (functions, procedures, triggers, rules, views,
// cascades, DO blocks, sessions that bypass the proxy) obey the same rules.
package schema

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/config"
)

// Config is what the schema depends on: the protected tables and the setting names.
type Config struct {
	Tables   []config.Table
	Settings Settings
	// DDLGuard adds the DDL guard (event triggers; superuser). Once installed it stays until Uninstall.
	DDLGuard bool
}

// FromConfig takes the protected tables and settings from a loaded configuration.
func FromConfig(c *config.Config) Config {
	verified := len(c.Token.Verify.Etcd.Endpoints) > 0 || len(c.Token.Verify.ZooKeeper.Servers) > 0
	return Config{Tables: c.Tables, Settings: Settings{Token: c.Token.Setting, Lock: c.Token.LockSetting, Ceiling: verified}}
}

// relation is one table the guard is put on.
type relation struct {
	oid         uint32
	schema      string
	name        string
	relkind     string
	parent      uint32 // the partitioned table this is a partition of, 0 if none
	colType     string // format_type of the token column, "" when missing
	spec        guardSpec
	ownRowGuard bool // false for a partition whose partitioned parent's row trigger is cloned onto it
}

func (r relation) qualified() string { return quoteQualified(r.schema, r.name) }

// resolve finds every relation each configured table protects: the table in its schema (every schema for a
// bare name), its partitions and inheritance children, recursively. A configured table with no relation in this
// database is returned in missing (one proxy often serves several databases, each holding some of the tables);
// a table that is there with a missing or mistyped token column is an error: the guard must cover every
// protected table present.
func resolve(ctx context.Context, conn *pgx.Conn, cfg Config) (rels []relation, missing []string, err error) {
	byOID := map[uint32]relation{}
	var order []uint32
	var problems []string
	for _, t := range cfg.Tables {
		spec := guardSpec{Label: t.Name, TokenColumn: t.TokenColumn, RequireLock: t.RequireLock}
		rows, err := conn.Query(ctx, `
WITH RECURSIVE tree(relid) AS (
	SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	WHERE c.relname = $2 AND ($1 = '' OR n.nspname = $1) AND c.relkind IN ('r', 'p')
		AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'fenceproxy') AND n.nspname NOT LIKE 'pg\_toast%'
	UNION
	SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree ON i.inhparent = tree.relid
)
SELECT c.oid, n.nspname, c.relname, c.relkind::text,
	coalesce((SELECT i.inhparent FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class p ON p.oid = i.inhparent
		WHERE c.relispartition AND i.inhrelid = c.oid AND p.relkind = 'p'), 0),
	coalesce(pg_catalog.format_type(a.atttypid, a.atttypmod), '')
FROM tree JOIN pg_catalog.pg_class c ON c.oid = tree.relid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = $3 AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY 2, 3`, t.Schema, t.Relation, t.TokenColumn)
		if err != nil {
			return nil, nil, fmt.Errorf("find %s: %w", t.Name, err)
		}
		found, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (relation, error) {
			var r relation
			err := row.Scan(&r.oid, &r.schema, &r.name, &r.relkind, &r.parent, &r.colType)
			return r, err
		})
		if err != nil {
			return nil, nil, fmt.Errorf("find %s: %w", t.Name, err)
		}
		if len(found) == 0 {
			missing = append(missing, t.Name)
			continue
		}
		for _, r := range found {
			r.spec = spec
			if prev, ok := byOID[r.oid]; ok {
				if prev.spec.TokenColumn != spec.TokenColumn {
					problems = append(problems, fmt.Sprintf("%s is protected as %s (token column %s) and as %s (token column %s)",
						r.qualified(), prev.spec.Label, prev.spec.TokenColumn, spec.Label, spec.TokenColumn))
				}
				continue
			}
			switch r.colType {
			case "bigint":
			case "":
				problems = append(problems, fmt.Sprintf("%s: no token column %s (fix: ALTER TABLE %s ADD COLUMN %s bigint)",
					r.qualified(), t.TokenColumn, r.qualified(), quoteIdent(t.TokenColumn)))
			default:
				problems = append(problems, fmt.Sprintf("%s: token column %s is %s, not bigint", r.qualified(), t.TokenColumn, r.colType))
			}
			byOID[r.oid] = r
			order = append(order, r.oid)
		}
	}
	if len(problems) > 0 {
		return nil, nil, fmt.Errorf("protected tables: %s (fenceproxy check shows the fixes)", strings.Join(problems, "; "))
	}
	rels = make([]relation, 0, len(order))
	for _, oid := range order {
		r := byOID[oid]
		// A partition gets its parent's row trigger as a clone (PostgreSQL clones row triggers of a partitioned
		// table onto every partition, present and future); its own would conflict with the clone.
		_, parentGuarded := byOID[r.parent]
		r.ownRowGuard = r.parent == 0 || !parentGuarded
		if parentGuarded {
			r.spec = byOID[r.parent].spec
		}
		rels = append(rels, r)
	}
	// Parents before partitions, so that a partition's clone exists when its TRUNCATE trigger is made.
	sort.SliceStable(rels, func(i, j int) bool { return depth(rels[i], byOID) < depth(rels[j], byOID) })
	return rels, missing, nil
}

func depth(r relation, byOID map[uint32]relation) int {
	d := 0
	for r.parent != 0 {
		p, ok := byOID[r.parent]
		if !ok {
			break
		}
		r, d = p, d+1
	}
	return d
}

// specs are the distinct guard functions the relations need, in a stable order.
func specs(rels []relation) []guardSpec {
	seen := map[string]guardSpec{}
	for _, r := range rels {
		seen[r.spec.functionName()] = r.spec
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]guardSpec, 0, len(names))
	for _, n := range names {
		out = append(out, seen[n])
	}
	return out
}

// functionSQL is CREATE OR REPLACE FUNCTION for a generated body, refusing a body that could end its own
// dollar quote.
func functionSQL(signature, returns, body, extra string) (string, error) {
	if strings.Contains(body, "$fenceproxy$") {
		return "", errors.New("generated function body contains $fenceproxy$")
	}
	return fmt.Sprintf("CREATE OR REPLACE FUNCTION %s.%s RETURNS %s LANGUAGE plpgsql%s AS $fenceproxy$%s$fenceproxy$;",
		Name, signature, returns, extra, body), nil
}

// definitions are the generated functions: name (as in pg_proc.proname) → (CREATE statement, body).
type definition struct {
	name, create, body string
}

func definitions(cfg Config, rels []relation) ([]definition, error) {
	var defs []definition
	lockBody, err := lockAcceptBody(cfg.Settings)
	if err != nil {
		return nil, err
	}
	// SECURITY DEFINER: it runs as the schema's owner, so it must not resolve anything through the caller's
	// search_path (PostgreSQL's advice for such functions); pg_temp last, so that no temporary object either.
	create, err := functionSQL("lock_accept(tbl pg_catalog.text)", "void", lockBody, " SECURITY DEFINER SET search_path = pg_catalog, pg_temp")
	if err != nil {
		return nil, err
	}
	defs = append(defs, definition{"lock_accept", create, lockBody})
	create, err = functionSQL("guard_truncate()", "trigger", truncateFunctionBody, "")
	if err != nil {
		return nil, err
	}
	defs = append(defs, definition{"guard_truncate", create, truncateFunctionBody})
	stmtBody := statementBody(cfg.Settings)
	create, err = functionSQL("guard_statement()", "trigger", stmtBody, "")
	if err != nil {
		return nil, err
	}
	defs = append(defs, definition{"guard_statement", create, stmtBody})
	// The relations each guard function was put on by this installation (its fast path: whole guard in place).
	onSpec := map[string][]uint32{}
	for _, r := range rels {
		onSpec[r.spec.functionName()] = append(onSpec[r.spec.functionName()], r.oid)
	}
	for _, g := range specs(rels) {
		oids := onSpec[g.functionName()]
		slices.Sort(oids)
		body, err := guardFunctionBody(g, cfg.Settings, oids)
		if err != nil {
			return nil, err
		}
		create, err := functionSQL(g.functionName()+"()", "trigger", body, "")
		if err != nil {
			return nil, err
		}
		defs = append(defs, definition{g.functionName(), create, body})
	}
	return defs, nil
}

// Installed reads which steps a database has applied (nil when the schema is not there).
func Installed(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.to_regclass('fenceproxy.version') IS NOT NULL").Scan(&exists); err != nil {
		return nil, fmt.Errorf("look for fenceproxy.version: %w", err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := conn.Query(ctx, "SELECT step, name FROM fenceproxy.version ORDER BY step")
	if err != nil {
		return nil, fmt.Errorf("read fenceproxy.version: %w", err)
	}
	applied := []string{}
	for rows.Next() {
		var step int
		var name string
		if err := rows.Scan(&step, &name); err != nil {
			return nil, err
		}
		if step != len(applied)+1 {
			rows.Close()
			return nil, fmt.Errorf("fenceproxy.version: step %d follows step %d", step, len(applied))
		}
		applied = append(applied, name)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read fenceproxy.version: %w", err)
	}
	return applied, nil
}

// pendingSteps checks the database's history against Steps and returns the SQL of the steps to apply.
func pendingSteps(applied []string) ([]string, error) {
	steps := Steps()
	if len(applied) > len(steps) {
		return nil, fmt.Errorf("the database's fenceproxy schema is at step %d (%s), newer than this binary's %d: upgrade fenceproxy",
			len(applied), applied[len(applied)-1], len(steps))
	}
	var out []string
	for i, s := range steps {
		if i < len(applied) {
			if applied[i] != s.Name {
				return nil, fmt.Errorf("fenceproxy.version step %d is %q, this binary's is %q", i+1, applied[i], s.Name)
			}
			continue
		}
		out = append(out, s.SQL, fmt.Sprintf("INSERT INTO fenceproxy.version (step, name) VALUES (%d, %s);", i+1, quoteLiteral(s.Name)))
	}
	return out, nil
}

// ddlGuardInstalled reports whether the DDL guard's event triggers exist.
func ddlGuardInstalled(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var n int
	err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_catalog.pg_event_trigger WHERE evtname IN ($1, $2, $3)",
		ddlGuardEnd, ddlGuardDrop, ddlGuardRewrite).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("look for the DDL guard: %w", err)
	}
	return n > 0, nil
}

// Plan is the SQL of an installation, to run in one transaction (Install) or print (install --print), and
// what it does to which tables, for the operator.
type Plan struct {
	Statements []string
	// Database is the database the plan is for (current_database()).
	Database string
	// Guarded are the relations that get (or keep) the guard, as "schema.name (protected as LABEL)".
	Guarded []string
	// Missing are configured tables with no relation in this database: not guarded here.
	Missing []string
	// Unguarded are relations whose guard triggers the plan drops: no longer protected by the configuration.
	Unguarded []string
}

// SQL is the plan as one script in a transaction.
func (p Plan) SQL() string {
	return "BEGIN;\n" + strings.Join(p.Statements, "\n") + "\nCOMMIT;\n"
}

// BuildPlan reads the database (the steps it has applied, the protected tables, the guard triggers in place)
// and returns the SQL that brings it to this binary's schema and guard for cfg.
func BuildPlan(ctx context.Context, conn *pgx.Conn, cfg Config) (Plan, error) {
	var p Plan
	add := func(s ...string) { p.Statements = append(p.Statements, s...) }
	applied, err := Installed(ctx, conn)
	if err != nil {
		return p, err
	}
	pending, err := pendingSteps(applied)
	if err != nil {
		return p, err
	}
	missingRels, err := missingRelations(ctx, conn, len(applied))
	if err != nil {
		return p, err
	}
	if len(missingRels) > 0 {
		return p, fmt.Errorf("the fenceproxy schema has applied steps whose tables are gone (dropped by hand?): %s; "+
			"the guard fails writes until they are back: restore them (from a backup, or as the step creates them), "+
			"or run fenceproxy uninstall and install again, which loses every lock mark and the PostgreSQL lock store's state",
			strings.Join(missingRels, ", "))
	}
	hadDDLGuard, err := ddlGuardInstalled(ctx, conn)
	if err != nil {
		return p, err
	}
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.current_database()").Scan(&p.Database); err != nil {
		return p, fmt.Errorf("current_database: %w", err)
	}
	foreign, err := foreignOwned(ctx, conn)
	if err != nil {
		return p, err
	}
	if len(foreign) > 0 {
		return p, fmt.Errorf("database %s: %s; their owner could change or remove the guard, so install puts none there: "+
			"drop them, or make the installing role own them (ALTER ... OWNER TO), then run install again", p.Database, strings.Join(foreign, ", "))
	}
	rels, missing, err := resolve(ctx, conn, cfg)
	if err != nil {
		return p, fmt.Errorf("database %s: %w", p.Database, err)
	}
	if len(rels) == 0 && len(missing) > 0 {
		// Most likely the wrong database (PGDATABASE, --dsn): installing would guard nothing and could un-guard
		// what another configuration guarded here.
		return p, fmt.Errorf("database %s holds none of the protected tables (%s): no such table; is it the database you meant?",
			p.Database, strings.Join(missing, ", "))
	}
	p.Missing = missing
	for _, r := range rels {
		p.Guarded = append(p.Guarded, fmt.Sprintf("%s (protected as %s)", quoteQualified(r.schema, r.name), r.spec.Label))
	}
	defs, err := definitions(cfg, rels)
	if err != nil {
		return p, err
	}

	// The DDL guard would refuse the changes below: it goes first and comes back last.
	add(dropDDLGuardSQL, bootstrapSQL)
	add(pending...)
	wanted := map[string]bool{}
	for _, d := range defs {
		add(d.create)
		wanted[d.name] = true
	}
	onRel := map[uint32]bool{}
	for _, r := range rels {
		onRel[r.oid] = true
		fn := Name + "." + r.spec.functionName() + "()"
		if r.ownRowGuard {
			add(fmt.Sprintf("CREATE OR REPLACE TRIGGER %s BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s;",
				quoteIdent(RowTrigger), r.qualified(), fn))
		}
		// ALWAYS: the guard fires under session_replication_role = replica too.
		add(fmt.Sprintf("ALTER TABLE %s ENABLE ALWAYS TRIGGER %s;", r.qualified(), quoteIdent(RowTrigger)))
		add(fmt.Sprintf("CREATE OR REPLACE TRIGGER %s BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s.guard_truncate(%s);",
			quoteIdent(TruncateTrigger), r.qualified(), Name, quoteLiteral(r.spec.Label)))
		add(fmt.Sprintf("ALTER TABLE %s ENABLE ALWAYS TRIGGER %s;", r.qualified(), quoteIdent(TruncateTrigger)))
		// Statement triggers are not cloned onto partitions: every relation gets its own pair (a write to a
		// partition fires the partition's, a write through the parent the parent's).
		for _, st := range []struct{ name, when string }{{StatementStartTrigger, "BEFORE"}, {StatementEndTrigger, "AFTER"}} {
			add(fmt.Sprintf("CREATE OR REPLACE TRIGGER %s %s INSERT OR UPDATE OR DELETE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s.guard_statement();",
				quoteIdent(st.name), st.when, r.qualified(), Name))
			add(fmt.Sprintf("ALTER TABLE %s ENABLE ALWAYS TRIGGER %s;", r.qualified(), quoteIdent(st.name)))
		}
	}

	// Guard triggers on tables no longer protected, and functions no longer used, go.
	stale, unguarded, err := staleTriggers(ctx, conn, onRel)
	if err != nil {
		return p, err
	}
	add(stale...)
	p.Unguarded = unguarded
	if applied != nil {
		rows, err := conn.Query(ctx, `SELECT p.proname FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'fenceproxy' AND p.proname LIKE 'guard\_%' ORDER BY 1`)
		if err != nil {
			return p, fmt.Errorf("list guard functions: %w", err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return p, fmt.Errorf("list guard functions: %w", err)
		}
		for _, n := range names {
			if !wanted[n] {
				add(fmt.Sprintf("DROP FUNCTION %s.%s();", Name, quoteIdent(n)))
			}
		}
	}

	// The registry of guarded relations, as they are now, for the DDL guard and check.
	add("DELETE FROM fenceproxy.guarded;")
	for _, r := range rels {
		rowTrigger := "NULL"
		if r.ownRowGuard {
			rowTrigger = fmt.Sprintf("(SELECT oid FROM pg_catalog.pg_trigger WHERE tgrelid = %s::pg_catalog.regclass AND tgname = %s)",
				quoteLiteral(r.qualified()), quoteLiteral(RowTrigger))
		}
		add(fmt.Sprintf(`INSERT INTO fenceproxy.guarded (relid, nspname, relname, attnum, token_column, label, row_trigger, truncate_trigger)
SELECT c.oid, %s, %s, a.attnum, a.attname, %s, %s,
	(SELECT oid FROM pg_catalog.pg_trigger WHERE tgrelid = c.oid AND tgname = %s)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = %s
WHERE c.oid = %s::pg_catalog.regclass;`,
			quoteLiteral(r.schema), quoteLiteral(r.name), quoteLiteral(r.spec.Label), rowTrigger,
			quoteLiteral(TruncateTrigger), quoteLiteral(r.spec.TokenColumn), quoteLiteral(r.qualified())))
	}
	if cfg.DDLGuard || hadDDLGuard {
		add(ddlGuardSQL)
	}
	return p, nil
}

// foreignOwned names the schema fenceproxy and every object in it that is owned by a role that is neither the
// current role (the one installing) nor a superuser, as "schema fenceproxy (owner r)". The owner of the schema
// may drop or alter anything in it, and the owner of an object may change it: a role that can create schemas in
// the database (its owner, often the application's role) could create the schema, or a table of it such as
// token_ceiling, before install ran, and CREATE ... IF NOT EXISTS and CREATE OR REPLACE keep the existing owner.
// Every kind of object is found the same way, through its owner dependency (pg_shdepend), which PostgreSQL
// records for every owned object whose owner is not the bootstrap superuser.
func foreignOwned(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT pg_catalog.concat('schema ', pg_catalog.quote_ident(n.nspname), ' (owner ', pg_catalog.quote_ident(r.rolname), ')')
FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
WHERE n.nspname OPERATOR(pg_catalog.=) $1 AND r.rolname OPERATOR(pg_catalog.<>) CURRENT_USER AND NOT r.rolsuper
UNION ALL
SELECT * FROM (SELECT pg_catalog.concat(pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid), ' (owner ', pg_catalog.quote_ident(r.rolname), ')')
FROM pg_catalog.pg_shdepend d JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) d.refobjid
WHERE d.deptype OPERATOR(pg_catalog.=) 'o' AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_authid'::pg_catalog.regclass
	AND d.dbid OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
	AND r.rolname OPERATOR(pg_catalog.<>) CURRENT_USER AND NOT r.rolsuper
	AND (pg_catalog.pg_identify_object(d.classid, d.objid, d.objsubid)).schema OPERATOR(pg_catalog.=) $1
ORDER BY 1) AS o`, Name)
	if err != nil {
		return nil, fmt.Errorf("look for objects in schema %s owned by other roles: %w", Name, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("look for objects in schema %s owned by other roles: %w", Name, err)
	}
	return names, nil
}

// staleTriggers drops guard triggers on relations that are no longer protected, and names those relations.
func staleTriggers(ctx context.Context, conn *pgx.Conn, keep map[uint32]bool) (drops, relations []string, err error) {
	rows, err := conn.Query(ctx, `SELECT t.tgrelid, n.nspname, c.relname, t.tgname FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE t.tgname IN ($1, $2, $3, $4) AND t.tgparentid = 0 ORDER BY 2, 3, 4`, RowTrigger, TruncateTrigger, StatementStartTrigger, StatementEndTrigger)
	if err != nil {
		return nil, nil, fmt.Errorf("list guard triggers: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var oid uint32
		var schema, rel, trig string
		if err := rows.Scan(&oid, &schema, &rel, &trig); err != nil {
			return nil, nil, err
		}
		if !keep[oid] {
			drops = append(drops, fmt.Sprintf("DROP TRIGGER %s ON %s;", quoteIdent(trig), quoteQualified(schema, rel)))
			if q := quoteQualified(schema, rel); !slices.Contains(relations, q) {
				relations = append(relations, q)
			}
		}
	}
	return drops, relations, rows.Err()
}

// Install brings the database to this binary's schema and guard for cfg, in one transaction; re-running it
// changes nothing. Concurrent installs serialize on the version table's lock.
func Install(ctx context.Context, conn *pgx.Conn, cfg Config) error {
	_, err := InstallPlan(ctx, conn, cfg)
	return err
}

// InstallPlan is Install, returning the plan it applied (which tables it guarded, skipped and un-guarded).
func InstallPlan(ctx context.Context, conn *pgx.Conn, cfg Config) (Plan, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return Plan{}, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.Background())
	// Serialize with a concurrent install before reading what is applied.
	if _, err := tx.Exec(ctx, "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('fenceproxy install'))"); err != nil {
		return Plan{}, fmt.Errorf("install lock: %w", err)
	}
	p, err := BuildPlan(ctx, conn, cfg)
	if err != nil {
		return p, err
	}
	for _, s := range p.Statements {
		if _, err := tx.Exec(ctx, s); err != nil {
			return p, fmt.Errorf("install: %w\nin: %s", err, firstLine(s))
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return p, fmt.Errorf("install: commit: %w", err)
	}
	return p, nil
}

// UninstallSQL removes the DDL guard, then the schema with everything in it; the guard triggers depend on the
// schema's functions and go with them.
const UninstallSQL = dropDDLGuardSQL + "\nDROP SCHEMA IF EXISTS fenceproxy CASCADE;"

// Uninstall removes everything Install put into the database, lock marks included.
func Uninstall(ctx context.Context, conn *pgx.Conn) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, UninstallSQL); err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("uninstall: commit: %w", err)
	}
	return nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " ..."
	}
	return s
}
