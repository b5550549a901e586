package catalog_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/catalog"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

// auditTable is the protected table every audit test plants paths around.
const auditTable = `CREATE TABLE %[1]s.t (id int PRIMARY KEY, balance int NOT NULL DEFAULT 0, fence_token bigint, parent_id int);
CREATE TABLE %[1]s.other (id int PRIMARY KEY, n int);`

// fakeGuard installs a stand-in for the guard (its function's name is what TriggerGuardProbe recognises) on
// the relations given.
func fakeGuard(rels ...string) string {
	s := `CREATE FUNCTION %[1]s.fenceproxy_guard() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN coalesce(NEW, OLD); END$$;`
	for i, r := range rels {
		s += "CREATE TRIGGER g" + string(rune('a'+i)) + " BEFORE INSERT OR UPDATE OR DELETE ON %[1]s." + r + " FOR EACH ROW EXECUTE FUNCTION %[1]s.fenceproxy_guard();"
	}
	return s
}

// audit runs the audit as conn's role for the schema's table t (and any others named).
func (e *env) audit(conn *pgx.Conn, o catalog.AuditOptions, tables ...string) []catalog.Finding {
	e.t.Helper()
	if len(tables) == 0 {
		tables = []string{"t"}
	}
	var cfg []rewrite.Table
	for _, n := range tables {
		cfg = append(cfg, rewrite.Table{Schema: e.schema, Name: n, TokenColumn: "fence_token"})
	}
	if conn == nil {
		conn = e.d
	}
	findings, _, err := catalog.Audit(ctxT(e.t), conn, cfg, o)
	if err != nil {
		e.t.Fatal(err)
	}
	return findings
}

// find returns the findings of kind about object (with the schema expanded; "" for any).
func (e *env) find(findings []catalog.Finding, kind, object string) []catalog.Finding {
	var out []catalog.Finding
	for _, f := range findings {
		if f.Kind == kind && (object == "" || f.Object == e.s(object)) {
			out = append(out, f)
		}
	}
	return out
}

// wantFinding checks that a finding of kind about object has the severity, a fix, table t, and each of
// contains in its message or fix.
func (e *env) wantFinding(findings []catalog.Finding, kind, object, severity string, contains ...string) catalog.Finding {
	e.t.Helper()
	got := e.find(findings, kind, object)
	for _, f := range got {
		ok := f.Severity == severity && f.Fix != "" && slices.Contains(f.Tables, e.s("%[1]s.t"))
		for _, c := range contains {
			ok = ok && strings.Contains(f.Message+" | "+f.Fix, e.s(c))
		}
		if ok {
			return f
		}
	}
	e.t.Fatalf("no %s finding for %s with severity %s, a fix, table t and %q; all findings:\n%s", kind, e.s(object), severity, contains, dump(findings))
	return catalog.Finding{}
}

func dump(fs []catalog.Finding) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString(f.Severity + " " + f.Kind + " " + f.Object + ": " + f.Message + "\n    fix: " + f.Fix + "\n")
	}
	return b.String()
}

// Functions and procedures whose bodies write the protected table: SQL, PL/pgSQL, BEGIN ATOMIC, dynamic SQL;
// one that only reads it is not reported. With the guard they are information, not errors.
func TestAuditFunctions(t *testing.T) {
	e := newSchema(t, auditTable+`
CREATE FUNCTION %[1]s.f_sql(i int) RETURNS void LANGUAGE sql AS $$UPDATE %[1]s.t SET balance = 0 WHERE id = i$$;
CREATE FUNCTION %[1]s.f_plpgsql() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF random() > 2 THEN RETURN; END IF;
  DELETE FROM %[1]s.t WHERE id = 1;
END$$;
CREATE FUNCTION %[1]s.f_atomic() RETURNS void LANGUAGE sql BEGIN ATOMIC INSERT INTO %[1]s.t (id) VALUES (1); END;
CREATE PROCEDURE %[1]s.p_dynamic() LANGUAGE plpgsql AS $$BEGIN EXECUTE 'UPDATE %[1]s.t SET balance = 1'; END$$;
CREATE FUNCTION %[1]s.f_reads() RETURNS bigint LANGUAGE sql AS $$SELECT count(*) FROM %[1]s.t$$;
CREATE FUNCTION %[1]s.f_other() RETURNS void LANGUAGE plpgsql AS $$BEGIN UPDATE %[1]s.other SET n = 1; END$$;`)
	fs := e.audit(nil, catalog.AuditOptions{})
	e.wantFinding(fs, catalog.KindFunction, "%[1]s.f_sql(integer)", catalog.SeverityError, "REVOKE EXECUTE ON FUNCTION %[1]s.f_sql(integer)", "fenceproxy install")
	e.wantFinding(fs, catalog.KindFunction, "%[1]s.f_plpgsql()", catalog.SeverityError)
	e.wantFinding(fs, catalog.KindFunction, "%[1]s.f_atomic()", catalog.SeverityError)
	e.wantFinding(fs, catalog.KindFunction, "%[1]s.p_dynamic()", catalog.SeverityError, "procedure", "dynamic SQL")
	for _, fn := range []string{"f_reads", "f_other"} {
		if got := e.find(fs, catalog.KindFunction, "%[1]s."+fn); len(got) != 0 {
			t.Fatalf("%s does not write t, reported: %+v", fn, got)
		}
	}
	e.exec(e.s(fakeGuard("t")))
	fs = e.audit(nil, catalog.AuditOptions{})
	e.wantFinding(fs, catalog.KindFunction, "%[1]s.f_sql(integer)", catalog.SeverityInfo, "the guard checks")
}

// A trigger on another table whose function writes the protected table.
func TestAuditTriggers(t *testing.T) {
	e := newSchema(t, auditTable+`
CREATE FUNCTION %[1]s.tg() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN UPDATE %[1]s.t SET balance = NEW.n WHERE id = NEW.id; RETURN NEW; END$$;
CREATE TRIGGER copy_n AFTER INSERT ON %[1]s.other FOR EACH ROW EXECUTE FUNCTION %[1]s.tg();`)
	e.wantFinding(e.audit(nil, catalog.AuditOptions{}), catalog.KindTrigger, "trigger copy_n on %[1]s.other", catalog.SeverityError, "DROP TRIGGER copy_n ON %[1]s.other")
}

// A rule on another table whose actions write the protected table.
func TestAuditRules(t *testing.T) {
	e := newSchema(t, auditTable+`
CREATE RULE bump AS ON INSERT TO %[1]s.other DO ALSO UPDATE %[1]s.t SET balance = balance + 1 WHERE id = NEW.id;
CREATE RULE harmless AS ON UPDATE TO %[1]s.other DO ALSO NOTIFY other_changed;`)
	fs := e.audit(nil, catalog.AuditOptions{})
	e.wantFinding(fs, catalog.KindRule, "rule bump on %[1]s.other", catalog.SeverityError, "DROP RULE bump ON %[1]s.other")
	if got := e.find(fs, catalog.KindRule, "harmless"); len(got) != 0 {
		t.Fatalf("a rule that writes nothing protected was reported: %+v", got)
	}
}

// Views over the protected table, with and without the token column.
func TestAuditViews(t *testing.T) {
	e := newSchema(t, auditTable+`
CREATE VIEW %[1]s.v_with AS SELECT id, fence_token FROM %[1]s.t;
CREATE VIEW %[1]s.v_without AS SELECT id, balance FROM %[1]s.t;`)
	fs := e.audit(nil, catalog.AuditOptions{})
	e.wantFinding(fs, catalog.KindView, "%[1]s.v_with", catalog.SeverityWarning, "fences writes through it")
	e.wantFinding(fs, catalog.KindView, "%[1]s.v_without", catalog.SeverityWarning, "does not show its token column", "add the token column to the view")
}

// Foreign-key cascades into the protected table.
func TestAuditForeignKeyCascades(t *testing.T) {
	e := newSchema(t, auditTable+`
CREATE TABLE %[1]s.parent (id int PRIMARY KEY);
ALTER TABLE %[1]s.t ADD FOREIGN KEY (parent_id) REFERENCES %[1]s.parent ON DELETE CASCADE;`)
	fs := e.audit(nil, catalog.AuditOptions{})
	e.wantFinding(fs, catalog.KindCascade, "%[1]s.parent", catalog.SeverityWarning, "ON DELETE CASCADE", "RESTRICT")
	e.wantFinding(fs, catalog.KindCascade, "%[1]s.parent", catalog.SeverityWarning, "TRUNCATE CASCADE")
}

// A parent without the token column that routes rows into the protected table.
func TestAuditParents(t *testing.T) {
	e := newSchema(t, `
CREATE TABLE %[1]s.base (id int);
CREATE TABLE %[1]s.t (fence_token bigint) INHERITS (%[1]s.base);`)
	e.wantFinding(e.audit(nil, catalog.AuditOptions{}), catalog.KindParent, "%[1]s.base", catalog.SeverityWarning, "ADD COLUMN")
}

// A missing guard, and a partition or child the guard does not cover.
func TestAuditGuardCoverage(t *testing.T) {
	e := newSchema(t, auditTable+`
CREATE TABLE %[1]s.t_kid () INHERITS (%[1]s.t);`)
	fs := e.audit(nil, catalog.AuditOptions{})
	e.wantFinding(fs, catalog.KindGuardMissing, "%[1]s.t", catalog.SeverityWarning, "fenceproxy install")
	if got := e.find(fs, catalog.KindUncovered, ""); len(got) != 0 {
		t.Fatalf("no guard anywhere, yet an uncovered child reported: %+v", got)
	}
	e.exec(e.s(fakeGuard("t")))
	fs = e.audit(nil, catalog.AuditOptions{})
	if got := e.find(fs, catalog.KindGuardMissing, ""); len(got) != 0 {
		t.Fatalf("guard installed, still reported missing: %+v", got)
	}
	e.wantFinding(fs, catalog.KindUncovered, "%[1]s.t_kid", catalog.SeverityError, "inheritance child of %[1]s.t", "fenceproxy install")
}

// outdatedProbe is a GuardProbe that knows the guard's versions (as install's will): every guard is old.
type outdatedProbe struct{}

func (outdatedProbe) Guards(ctx context.Context, conn *pgx.Conn) (map[uint32]catalog.Guard, error) {
	g, err := catalog.TriggerGuardProbe{}.Guards(ctx, conn)
	for oid, x := range g {
		x.Outdated, x.Detail = true, "version 1, this binary installs 2"
		g[oid] = x
	}
	return g, err
}

func TestAuditGuardOutdated(t *testing.T) {
	e := newSchema(t, auditTable+fakeGuard("t"))
	e.wantFinding(e.audit(nil, catalog.AuditOptions{Probe: outdatedProbe{}}), catalog.KindGuardOutdated, "%[1]s.t", catalog.SeverityError, "version 1", "upgrades it in place")
}

// Roles that may write the table and can connect around the proxy (pg_hba.conf read as the server does, first
// match wins); a role that pg_hba.conf confines to the proxy's address is not reported.
func TestAuditRoles(t *testing.T) {
	e := newSchema(t, auditTable)
	writer := e.schema + "_w"
	for _, r := range []string{writer, noBypassRole} {
		e.exec("DROP ROLE IF EXISTS " + r)
		e.exec("CREATE ROLE " + r + " LOGIN")
		e.exec(e.s("GRANT USAGE ON SCHEMA %[1]s TO " + r + "; GRANT UPDATE ON %[1]s.t TO " + r))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := e.d.Exec(ctx, "DROP OWNED BY "+r+"; DROP ROLE "+r); err != nil {
				t.Errorf("drop role %s: %v", r, err)
			}
		})
	}
	fs := e.audit(nil, catalog.AuditOptions{ProxyAddress: netip.MustParseAddr("127.0.0.1")})
	e.wantFinding(fs, catalog.KindRoleBypass, "role "+writer, catalog.SeverityWarning, "(local, trust)", "host from ::1/128", "REVOKE")
	if got := e.find(fs, catalog.KindRoleBypass, "role "+noBypassRole); len(got) != 0 {
		t.Fatalf("%s can connect only from the proxy's address, reported: %+v", noBypassRole, got)
	}
	// Seen from another proxy address, its 127.0.0.1 line is a way around the proxy too.
	fs = e.audit(nil, catalog.AuditOptions{ProxyAddress: netip.MustParseAddr("10.1.2.3")})
	e.wantFinding(fs, catalog.KindRoleBypass, "role "+noBypassRole, catalog.SeverityWarning, "host from 127.0.0.1/32")

	// A role that cannot read pg_hba_file_rules gets a finding saying so, naming the roles it could not judge.
	reader := connect(t, pg.DSN(writer, "", pgtest.TestDB))
	f := e.wantFindingNoTable(e.audit(reader, catalog.AuditOptions{}), catalog.KindHBAUnreadable, "pg_hba_file_rules")
	if !strings.Contains(f.Message, writer) || !strings.Contains(f.Fix, "GRANT SELECT") {
		t.Fatalf("hba-unreadable finding: %+v", f)
	}
}

func (e *env) wantFindingNoTable(fs []catalog.Finding, kind, object string) catalog.Finding {
	e.t.Helper()
	got := e.find(fs, kind, object)
	if len(got) != 1 || got[0].Severity != catalog.SeverityWarning || got[0].Fix == "" {
		e.t.Fatalf("want one %s warning with a fix, got %+v; all:\n%s", kind, got, dump(fs))
	}
	return got[0]
}
