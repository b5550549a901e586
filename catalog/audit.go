package catalog

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// Severities of audit findings. Only errors make `fenceproxy check` exit non-zero.
const (
	SeverityError   = "error"
	SeverityWarning = "warning"
	SeverityInfo    = "info"
)

// Kinds of audit findings.
const (
	KindFunction      = "function"        // a function or procedure whose body writes a protected table
	KindTrigger       = "trigger"         // a trigger whose function writes a protected table
	KindRule          = "rule"            // a rule whose actions write a protected table
	KindView          = "view"            // a view over a protected table
	KindParent        = "parent"          // a parent that routes rows into a protected partition or child
	KindCascade       = "fk-cascade"      // foreign-key actions (or TRUNCATE CASCADE) that reach a protected table
	KindUncovered     = "guard-uncovered" // a partition or child of a guarded table without the guard
	KindGuardMissing  = "guard-missing"
	KindGuardOutdated = "guard-outdated"
	KindRoleBypass    = "role-bypass" // a role that may write a protected table and can connect around the proxy
	KindHBAUnreadable = "hba-unreadable"
)

// Finding is one in-server write path to a protected table, or a gap in its protection.
type Finding struct {
	Severity string `json:"severity"`
	Kind     string `json:"kind"`
	// Object is what the finding is about: a function's signature, "trigger t on s.x", a relation, a role.
	Object string `json:"object"`
	// Tables are the labels of the protected tables concerned.
	Tables  []string `json:"tables"`
	Message string   `json:"message"`
	Fix     string   `json:"fix"`
	// Database is the database the finding is in, set when one run checks several.
	Database string `json:"database,omitempty"`
}

// AuditOptions tune the audit.
type AuditOptions struct {
	// ProxyAddress is the address PostgreSQL sees the proxy's connections come from; invalid means the
	// audit connection's own client address (the audit runs on the proxy's host).
	ProxyAddress netip.Addr
	// Probe finds the guard; nil means DefaultGuardProbe.
	Probe GuardProbe
}

// Audit reads the catalog through conn and reports every in-server write path to the configured tables and
// the relations derived from them. It needs only pg_catalog, except pg_hba_file_rules (superuser, or a GRANT
// of SELECT on it), without which it says that it could not compare the roles' access with the proxy's.
func Audit(ctx context.Context, conn *pgx.Conn, configured []rewrite.Table, o AuditOptions) ([]Finding, *Snapshot, error) {
	if o.Probe == nil {
		o.Probe = DefaultGuardProbe()
	}
	cat, err := Read(ctx, conn, o.Probe)
	if err != nil {
		return nil, nil, err
	}
	snap := Derive(cat, configured)
	r, err := rewrite.New(rewrite.Config{Tables: append(slices.Clone(configured), snap.Tables()...), Refused: snap.Refused})
	if err != nil {
		return nil, nil, fmt.Errorf("audit: %w", err)
	}
	a := &auditor{snap: snap, r: r, configured: configured, derived: map[string]Protected{}}
	if t, err := pg.Parse("SELECT"); err == nil {
		a.version = t.Version // Deparse wants the parser's version in the tree it is given
	}
	for _, p := range snap.Protected {
		a.derived[p.Table.Label()] = p
	}
	a.guards()
	a.relations()
	if err := a.bodies(ctx, conn); err != nil {
		return nil, nil, err
	}
	if err := a.roles(ctx, conn, o.ProxyAddress); err != nil {
		return nil, nil, err
	}
	rank := map[string]int{SeverityError: 0, SeverityWarning: 1, SeverityInfo: 2}
	slices.SortStableFunc(a.findings, func(x, y Finding) int {
		if d := rank[x.Severity] - rank[y.Severity]; d != 0 {
			return d
		}
		if c := strings.Compare(x.Kind, y.Kind); c != 0 {
			return c
		}
		return strings.Compare(x.Object, y.Object)
	})
	return a.findings, snap, nil
}

type auditor struct {
	snap       *Snapshot
	r          *rewrite.Rewriter
	configured []rewrite.Table
	derived    map[string]Protected
	findings   []Finding
	version    int32
}

func (a *auditor) add(f Finding) { a.findings = append(a.findings, f) }

const installFix = "fenceproxy install --config FILE (puts the guard on every protected table and its partitions, so PostgreSQL checks these writes itself)"

// guarded reports whether the guard checks the rows of the protected table label (a configured label, a
// derived relation, or a view, whose writes land in the table it derives from).
func (a *auditor) guarded(label string) bool {
	if oids, ok := a.snap.Resolved[label]; ok {
		for _, oid := range oids {
			if !a.snap.Catalog.Guards[oid].Rows {
				return false
			}
		}
		return len(oids) > 0
	}
	if p, ok := a.derived[label]; ok {
		if r := a.snap.Catalog.Relations[p.OID]; r != nil && r.Kind == 'v' {
			return a.guarded(p.Origin)
		}
		return a.snap.Catalog.Guards[p.OID].Rows
	}
	return false
}

func (a *auditor) allGuarded(labels []string) bool {
	for _, l := range labels {
		if !a.guarded(l) {
			return false
		}
	}
	return len(labels) > 0
}

// guards: a missing or outdated guard on a configured table, and partitions or children of a guarded table
// that lack it.
func (a *auditor) guards() {
	guardedOrigin := map[string]bool{}
	for _, t := range a.configured {
		oids := a.snap.Resolved[t.Label()]
		for _, oid := range oids {
			rel := a.snap.Catalog.Relations[oid]
			g := a.snap.Catalog.Guards[oid]
			switch {
			case !g.Rows:
				a.add(Finding{Severity: SeverityWarning, Kind: KindGuardMissing, Object: rel.Label(), Tables: []string{t.Label()},
					Message: "no in-database guard: writes by functions, triggers, rules, cascades and sessions that bypass the proxy are not checked",
					Fix:     installFix})
			case g.Outdated:
				guardedOrigin[t.Label()] = true
				a.add(Finding{Severity: SeverityError, Kind: KindGuardOutdated, Object: rel.Label(), Tables: []string{t.Label()},
					Message: "the guard is older than this fenceproxy: " + g.Detail,
					Fix:     "fenceproxy install --config FILE (upgrades it in place)"})
			default:
				guardedOrigin[t.Label()] = true
			}
		}
	}
	for _, p := range a.snap.Protected {
		rel := a.snap.Catalog.Relations[p.OID]
		if rel.Kind == 'v' || !guardedOrigin[p.Origin] || a.snap.Catalog.Guards[p.OID].Rows {
			continue
		}
		a.add(Finding{Severity: SeverityError, Kind: KindUncovered, Object: rel.Label(), Tables: []string{p.Origin},
			Message: fmt.Sprintf("%s (%s) has no guard, although %s has: writes to it by name from inside the server or around the proxy are not checked", rel.Label(), p.Via, p.Origin),
			Fix:     "fenceproxy install --config FILE again (it guards every partition and child that exists; run it after creating new ones)"})
	}
}

// relations: views over protected tables, parents and foreign-key cascades, from the snapshot.
func (a *auditor) relations() {
	for _, p := range a.snap.Protected {
		rel := a.snap.Catalog.Relations[p.OID]
		if rel.Kind != 'v' {
			continue
		}
		sev := SeverityWarning
		if a.guarded(p.Origin) {
			sev = SeverityInfo
		}
		a.add(Finding{Severity: sev, Kind: KindView, Object: rel.Label(), Tables: []string{p.Origin},
			Message: fmt.Sprintf("%s; the proxy fences writes through it by its column %s, but writes through it from inside the server or around the proxy are checked only by the guard", p.Via, p.Table.TokenColumn),
			Fix:     installFix + "; or REVOKE INSERT, UPDATE, DELETE on the view from the roles that do not need them"})
	}
	for _, f := range a.snap.Refused {
		label := f.Schema + "." + f.Name
		var rel *Relation
		for _, r := range a.snap.Catalog.Relations {
			if r.Schema == f.Schema && r.Name == f.Name {
				rel = r
			}
		}
		sev := SeverityWarning
		if a.guarded(f.Table) {
			sev = SeverityInfo
		}
		switch {
		case f.Ops&rewrite.OpInsert == 0:
			a.add(Finding{Severity: sev, Kind: KindCascade, Object: label, Tables: []string{f.Table},
				Message: fmt.Sprintf("%s %s; the proxy refuses these statements (55F04), a function, trigger or direct session does not", label, f.Reason),
				Fix:     installFix + "; or make the foreign key ON DELETE/ON UPDATE RESTRICT or NO ACTION and delete the protected rows through the proxy first"})
		case rel != nil && rel.Kind == 'v':
			a.add(Finding{Severity: sev, Kind: KindView, Object: label, Tables: []string{f.Table},
				Message: fmt.Sprintf("%s %s; the proxy refuses writes through it (55F04), writes from inside the server or around the proxy are checked only by the guard", label, f.Reason),
				Fix:     "add the token column to the view (then the proxy fences writes through it), or drop its INSTEAD OF triggers and rules; and " + installFix})
		default:
			a.add(Finding{Severity: sev, Kind: KindParent, Object: label, Tables: []string{f.Table},
				Message: fmt.Sprintf("%s %s; the proxy refuses writes to it (55F04)", label, f.Reason),
				Fix:     "add the token column to the parent (ALTER TABLE ... ADD COLUMN <token column> bigint), then the proxy fences writes through it; and " + installFix})
		}
	}
}

// writes returns the protected tables the SQL text writes, as the proxy's own analysis sees them ("" text
// that does not parse as SQL is not a statement: PL/pgSQL assignments, conditions).
func (a *auditor) writes(sql string) []string {
	if _, err := pg.Parse(sql); err != nil {
		return nil
	}
	p := a.r.Plan(sql)
	switch {
	case p.Action == rewrite.Refuse && p.Code == rewrite.CodeUnfenceable && p.Table != "":
		return []string{p.Table}
	case p.Action == rewrite.Rewrite:
		return p.Tables
	}
	return nil
}

// bodies: functions and procedures (SQL, BEGIN ATOMIC and PL/pgSQL bodies) that write protected tables, the
// triggers that run them, and rules whose actions write them.
func (a *auditor) bodies(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, `
SELECT p.oid, p.oid::regprocedure::text, p.prokind::text, l.lanname, p.prosrc, (pg_catalog.to_jsonb(p.*) ->> 'prosqlbody') IS NOT NULL, -- prosqlbody exists from PostgreSQL 14 on
       CASE WHEN p.prokind IN ('f', 'p') THEN pg_catalog.pg_get_functiondef(p.oid) ELSE '' END
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
JOIN pg_catalog.pg_language l ON l.oid = p.prolang
WHERE l.lanname IN ('sql', 'plpgsql') AND p.prokind IN ('f', 'p')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'fenceproxy') AND n.nspname NOT LIKE 'pg\_%'
  AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_proc'::regclass
                  AND d.objid = p.oid AND d.deptype = 'e')
ORDER BY 2`)
	if err != nil {
		return fmt.Errorf("audit: read functions: %w", err)
	}
	type fn struct {
		oid             uint32
		sig, kind, lang string
		src, def        string
		atomic          bool
	}
	var fns []fn
	var f fn
	if _, err := pgx.ForEachRow(rows, []any{&f.oid, &f.sig, &f.kind, &f.lang, &f.src, &f.atomic, &f.def}, func() error {
		fns = append(fns, f)
		return nil
	}); err != nil {
		return fmt.Errorf("audit: read functions: %w", err)
	}
	writers := map[uint32][]string{} // function -> protected tables it writes
	for _, f := range fns {
		var tables []string
		dynamic := false
		switch {
		case f.lang == "plpgsql":
			tables, dynamic = a.plpgsqlWrites(f.def)
		case f.atomic:
			tables = a.atomicWrites(f.def)
		default:
			tables = a.writes(f.src)
		}
		if dynamic {
			if label := a.mentions(f.src); label != "" && !slices.Contains(tables, label) {
				tables = append(tables, label)
			}
		}
		if len(tables) == 0 {
			continue
		}
		writers[f.oid] = tables
		what := "function"
		if f.kind == "p" {
			what = "procedure"
		}
		msg := fmt.Sprintf("%s %s writes %s; the proxy sees only the call", what, f.sig, strings.Join(tables, ", "))
		if dynamic {
			msg += " (dynamic SQL that names it counts as a write)"
		}
		a.add(a.pathFinding(KindFunction, f.sig, tables, msg,
			"REVOKE EXECUTE ON "+strings.ToUpper(what)+" "+f.sig+" FROM PUBLIC (and from the writers' roles), or do its writes as plain SQL through the proxy"))
	}

	rows, err = conn.Query(ctx, `
SELECT t.tgname, t.tgrelid::regclass::text, t.tgfoid
FROM pg_catalog.pg_trigger t WHERE NOT t.tgisinternal ORDER BY 2, 1`)
	if err != nil {
		return fmt.Errorf("audit: read triggers: %w", err)
	}
	var tgname, rel string
	var foid uint32
	if _, err := pgx.ForEachRow(rows, []any{&tgname, &rel, &foid}, func() error {
		if tables := writers[foid]; len(tables) > 0 {
			obj := fmt.Sprintf("trigger %s on %s", tgname, rel)
			a.add(a.pathFinding(KindTrigger, obj, tables, obj+" runs a function that writes "+strings.Join(tables, ", ")+"; a write to "+rel+" changes protected rows unfenced",
				fmt.Sprintf("DROP TRIGGER %s ON %s, or move its writes to SQL sent through the proxy", ident(tgname), rel)))
		}
		return nil
	}); err != nil {
		return fmt.Errorf("audit: read triggers: %w", err)
	}

	rows, err = conn.Query(ctx, `
SELECT r.rulename, r.ev_class::regclass::text, pg_catalog.pg_get_ruledef(r.oid)
FROM pg_catalog.pg_rewrite r
JOIN pg_catalog.pg_class c ON c.oid = r.ev_class
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE r.rulename <> '_RETURN' AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
ORDER BY 2, 1`)
	if err != nil {
		return fmt.Errorf("audit: read rules: %w", err)
	}
	var rulename, def string
	if _, err := pgx.ForEachRow(rows, []any{&rulename, &rel, &def}, func() error {
		if tables := a.ruleWrites(def); len(tables) > 0 {
			obj := fmt.Sprintf("rule %s on %s", rulename, rel)
			a.add(a.pathFinding(KindRule, obj, tables, obj+" writes "+strings.Join(tables, ", ")+" whenever "+rel+" is written",
				fmt.Sprintf("DROP RULE %s ON %s", ident(rulename), rel)))
		}
		return nil
	}); err != nil {
		return fmt.Errorf("audit: read rules: %w", err)
	}
	return nil
}

// pathFinding is an error while the guard does not check every table the path writes, else information.
func (a *auditor) pathFinding(kind, object string, tables []string, msg, fix string) Finding {
	if a.allGuarded(tables) {
		return Finding{Severity: SeverityInfo, Kind: kind, Object: object, Tables: tables,
			Message: msg + "; the guard checks these writes", Fix: "none needed while the guard is installed"}
	}
	return Finding{Severity: SeverityError, Kind: kind, Object: object, Tables: tables, Message: msg, Fix: fix + "; or " + installFix}
}

func (a *auditor) mentions(text string) string {
	for _, t := range append(slices.Clone(a.configured), a.snap.Tables()...) {
		if strings.Contains(strings.ToLower(text), t.Name) {
			return t.Label()
		}
	}
	return ""
}

func addAll(dst []string, src ...string) []string {
	for _, s := range src {
		if !slices.Contains(dst, s) {
			dst = append(dst, s)
		}
	}
	return dst
}

// plpgsqlWrites analyses every SQL statement of a PL/pgSQL function with the proxy's own reading of PL/pgSQL
// (the one that judges DO blocks) and reports whether it runs dynamic SQL (EXECUTE), whose text the audit cannot
// know.
func (a *auditor) plpgsqlWrites(def string) ([]string, bool) {
	tables, dynamic, err := a.r.PLpgSQLWrites(def)
	if err != nil {
		return nil, false
	}
	return tables, dynamic
}

// atomicWrites analyses a BEGIN ATOMIC body, from pg_get_functiondef.
func (a *auditor) atomicWrites(def string) []string {
	tree, err := pg.Parse(def)
	if err != nil || len(tree.Stmts) != 1 {
		return nil
	}
	cf := tree.Stmts[0].Stmt.GetCreateFunctionStmt()
	if cf == nil {
		return nil
	}
	return a.nodeWrites(cf.SqlBody)
}

// nodeWrites deparses each statement under n (lists are entered) and analyses it.
func (a *auditor) nodeWrites(n *pg.Node) []string {
	if n == nil {
		return nil
	}
	if l := n.GetList(); l != nil {
		var out []string
		for _, c := range l.Items {
			out = addAll(out, a.nodeWrites(c)...)
		}
		return out
	}
	sql, err := pg.Deparse(&pg.ParseResult{Version: a.version, Stmts: []*pg.RawStmt{{Stmt: n}}})
	if err != nil {
		return nil
	}
	return a.writes(sql)
}

// ruleWrites analyses a rule's actions, from pg_get_ruledef.
func (a *auditor) ruleWrites(def string) []string {
	tree, err := pg.Parse(def)
	if err != nil || len(tree.Stmts) != 1 {
		return nil
	}
	rs := tree.Stmts[0].Stmt.GetRuleStmt()
	if rs == nil {
		return nil
	}
	var out []string
	for _, act := range rs.Actions {
		out = addAll(out, a.nodeWrites(act)...)
	}
	return out
}

// hbaRule is one line of pg_hba_file_rules.
type hbaRule struct {
	line             int32
	typ              string
	databases, users []string
	address, netmask *string
	method           string
	err              *string
}

// roles: login roles that may write a protected relation and that pg_hba.conf lets connect from somewhere
// other than the proxy's address (or over the Unix socket).
func (a *auditor) roles(ctx context.Context, conn *pgx.Conn, proxy netip.Addr) error {
	// Relations are matched by OID, and each is judged by the label the guard check knows it under (the
	// configured or derived one): a name printed by regclass depends on the search_path and would not match.
	var oids []uint32
	labelOf := map[uint32]string{}
	for label, oidsOf := range a.snap.Resolved {
		for _, oid := range oidsOf {
			oids, labelOf[oid] = append(oids, oid), label
		}
	}
	for _, p := range a.snap.Protected {
		if _, ok := labelOf[p.OID]; !ok {
			oids, labelOf[p.OID] = append(oids, p.OID), p.Table.Label()
		}
	}
	if len(oids) == 0 {
		return nil
	}
	rows, err := conn.Query(ctx, `
SELECT r.rolname, array_agg(DISTINCT c.oid ORDER BY c.oid)
FROM pg_catalog.pg_roles r CROSS JOIN unnest($1::oid[]) AS c(oid)
WHERE r.rolcanlogin AND pg_catalog.has_table_privilege(r.oid, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')
GROUP BY 1 ORDER BY 1`, oids)
	if err != nil {
		return fmt.Errorf("audit: read role privileges: %w", err)
	}
	type writer struct {
		role   string
		tables []string // qualified names, for the message
		labels []string // what guarded() judges
	}
	ws, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (writer, error) {
		var w writer
		var relids []uint32
		if err := r.Scan(&w.role, &relids); err != nil {
			return w, err
		}
		for _, oid := range relids {
			name := labelOf[oid]
			if rel := a.snap.Catalog.Relations[oid]; rel != nil {
				name = rel.Label()
			}
			w.tables = append(w.tables, name)
			if !slices.Contains(w.labels, labelOf[oid]) {
				w.labels = append(w.labels, labelOf[oid])
			}
		}
		slices.Sort(w.tables)
		return w, nil
	})
	if err != nil {
		return fmt.Errorf("audit: read role privileges: %w", err)
	}
	if len(ws) == 0 {
		return nil
	}
	if !proxy.IsValid() {
		var addr *netip.Prefix
		if err := conn.QueryRow(ctx, "SELECT pg_catalog.inet_client_addr()").Scan(&addr); err != nil {
			return fmt.Errorf("audit: inet_client_addr: %w", err)
		}
		if addr != nil {
			proxy = addr.Addr()
		}
	}
	var db string
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.current_database()").Scan(&db); err != nil {
		return fmt.Errorf("audit: current_database: %w", err)
	}
	rows, err = conn.Query(ctx, `
SELECT line_number, type, database, user_name, address, netmask, auth_method, error
FROM pg_catalog.pg_hba_file_rules ORDER BY line_number`)
	if err == nil {
		var rules []hbaRule
		rules, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (hbaRule, error) {
			var h hbaRule
			return h, r.Scan(&h.line, &h.typ, &h.databases, &h.users, &h.address, &h.netmask, &h.method, &h.err)
		})
		if err == nil {
			for _, w := range ws {
				paths, err := bypassPaths(ctx, conn, rules, w.role, db, proxy)
				if err != nil {
					return err
				}
				if len(paths) == 0 {
					continue
				}
				sev := SeverityWarning
				if a.allGuarded(w.labels) {
					sev = SeverityInfo
				}
				a.add(Finding{Severity: sev, Kind: KindRoleBypass, Object: "role " + w.role, Tables: w.tables,
					Message: fmt.Sprintf("role %s may write %s and pg_hba.conf lets it connect around the proxy (%s address %s): %s",
						w.role, strings.Join(w.tables, ", "), "the proxy's", addrText(proxy), strings.Join(paths, "; ")),
					Fix: fmt.Sprintf("restrict pg_hba.conf so %s connects only from the proxy's address, or REVOKE INSERT, UPDATE, DELETE, TRUNCATE on the tables from it; and %s", w.role, installFix)})
			}
			return nil
		}
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		return fmt.Errorf("audit: read pg_hba_file_rules: %w", err)
	}
	var roles []string
	for _, w := range ws {
		roles = append(roles, w.role)
	}
	a.add(Finding{Severity: SeverityWarning, Kind: KindHBAUnreadable, Object: "pg_hba_file_rules",
		Message: fmt.Sprintf("cannot read pg_hba_file_rules (%s), so the audit cannot tell which of the roles that may write protected tables (%s) can connect around the proxy",
			pe.Message, strings.Join(roles, ", ")),
		Fix: "run check as a superuser, or GRANT SELECT ON pg_catalog.pg_hba_file_rules TO the check's role (and GRANT EXECUTE ON FUNCTION pg_catalog.pg_hba_file_rules() to it)"})
	return nil
}

func addrText(a netip.Addr) string {
	if !a.IsValid() {
		return "unknown: the check connected over a Unix socket; pass --proxy-address"
	}
	return a.String()
}

// bypassPaths evaluates pg_hba.conf's first-match rule for role, as PostgreSQL would, for a connection over
// the Unix socket and for one over TCP from an address other than the proxy's, and describes the rules that
// let such a connection in.
func bypassPaths(ctx context.Context, conn *pgx.Conn, rules []hbaRule, role, db string, proxy netip.Addr) ([]string, error) {
	member := func(group string) (bool, error) {
		var ok bool
		err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = $2) AND pg_catalog.pg_has_role($1, $2, 'MEMBER')", role, group).Scan(&ok)
		return ok, err
	}
	matchUser := func(users []string) (bool, error) {
		for _, u := range users {
			switch {
			case u == "all" || u == role:
				return true, nil
			case strings.HasPrefix(u, "+"):
				ok, err := member(u[1:])
				if err != nil || ok {
					return ok, err
				}
			}
		}
		return false, nil
	}
	matchDB := func(dbs []string) bool {
		for _, d := range dbs {
			if d == "all" || d == db || d == "sameuser" || d == "samerole" {
				return true
			}
		}
		return false
	}
	var paths []string
	// The Unix socket: the first line for it that matches the role decides.
	for _, h := range rules {
		if h.err != nil || h.typ != "local" {
			continue
		}
		ok, err := matchUser(h.users)
		if err != nil {
			return nil, fmt.Errorf("audit: role membership: %w", err)
		}
		if !ok || !matchDB(h.databases) {
			continue
		}
		if h.method != "reject" {
			paths = append(paths, fmt.Sprintf("pg_hba.conf line %d (local, %s)", h.line, h.method))
		}
		break
	}
	// TCP: a line that matches the role admits it from its network, except from the parts of it that earlier
	// matching lines decide; a line whose network earlier ones cover entirely decides nothing.
	var earlier []netip.Prefix
	for _, h := range rules {
		if h.err != nil || h.typ == "local" {
			continue
		}
		ok, err := matchUser(h.users)
		if err != nil {
			return nil, fmt.Errorf("audit: role membership: %w", err)
		}
		if !ok || !matchDB(h.databases) {
			continue
		}
		nets := hbaNetworks(h)
		shadowed := true
		for _, n := range nets {
			if !coveredBy(n, earlier) {
				shadowed = false
			}
		}
		earlier = append(earlier, nets...)
		if shadowed || h.method == "reject" || !otherThan(nets, proxy) {
			continue
		}
		var where []string
		for _, n := range nets {
			where = append(where, n.String())
		}
		paths = append(paths, fmt.Sprintf("pg_hba.conf line %d (%s from %s, %s)", h.line, h.typ, strings.Join(where, " and "), h.method))
	}
	return paths, nil
}

// hbaNetworks is the networks a host line admits; all, samehost, samenet and host names count as everywhere.
func hbaNetworks(h hbaRule) []netip.Prefix {
	everywhere := []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
	ip, err := netip.ParseAddr(deref(h.address))
	if err != nil {
		return everywhere
	}
	bits := ip.BitLen()
	if m := deref(h.netmask); m != "" {
		if mask, err := netip.ParseAddr(m); err == nil {
			bits = maskBits(mask)
		}
	}
	p, err := ip.Prefix(bits)
	if err != nil {
		return everywhere
	}
	return []netip.Prefix{p}
}

func coveredBy(n netip.Prefix, earlier []netip.Prefix) bool {
	for _, e := range earlier {
		if e.Bits() <= n.Bits() && e.Contains(n.Addr()) {
			return true
		}
	}
	return false
}

// otherThan reports whether the networks admit some address other than the proxy's.
func otherThan(nets []netip.Prefix, proxy netip.Addr) bool {
	for _, n := range nets {
		if !proxy.IsValid() || !n.IsSingleIP() || n.Addr().Unmap() != proxy.Unmap() {
			return true
		}
	}
	return false
}

// ident quotes a name only when PostgreSQL needs it quoted.
func ident(s string) string {
	plain := s != ""
	for i, r := range s {
		if !(r >= 'a' && r <= 'z' || r == '_' || i > 0 && (r >= '0' && r <= '9' || r == '$')) {
			plain = false
		}
	}
	if plain {
		return s
	}
	return pgx.Identifier{s}.Sanitize()
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func maskBits(m netip.Addr) int {
	n := 0
	for _, b := range m.AsSlice() {
		for i := 7; i >= 0; i-- {
			if b&(1<<i) == 0 {
				return n
			}
			n++
		}
	}
	return n
}
