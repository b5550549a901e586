package rewrite

import (
	"fmt"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// Statements checked by their result.
//
// Some DDL reaches a protected table without naming it: DROP ... CASCADE (an
// inheritance child, a table in the schema, the token column's type or
// domain, the guard's function), TRUNCATE ... CASCADE (through foreign keys),
// DROP OWNED, REASSIGN OWNED, a schema rename, and ALTER TABLE on an
// inheritance parent (which recurses into the protected child's token
// column). What such a statement reaches is PostgreSQL's to decide, at the
// moment it runs, under the session's search_path, from pg_depend,
// pg_inherits and pg_constraint as they are then; a catalog snapshot can
// only guess (it is older than the statement, and read under another
// search_path, possibly in another database).
//
// So the proxy does not guess: it sends such a statement as a DO block that
// notes what protects the configured tables, runs the client's statement
// unchanged (EXECUTE of its text), notes it again, and raises 55F04 when
// anything is gone or changed, which aborts the statement's transaction: the
// server rolls the statement back and the client sees a server-side error,
// as for every refusal. What is noted, from pg_catalog only (every operator
// and function schema-qualified, so no search_path or user object changes
// its meaning):
//
//   - every relation named like a configured table (a bare name: in every
//     schema) and, recursively, its partitions and inheritance children: its
//     schema and name, owner and data file (TRUNCATE gives a new one), its
//     token column (number and type), and its triggers and whether they are
//     enabled;
//   - the fenceproxy and fenceproxy_ddl schemas (the guard): the schemas,
//     their functions and tables (owner, data file), and the DDL guard's
//     event triggers.
//
// The same statement on unrelated objects runs exactly as sent, with one
// difference the client can see: its command tag is DO. The block is exact
// by construction (no list of object kinds or spellings), needs no catalog
// connection, and has no window between a check and the statement: the check
// is the statement's own result, in its own transaction.

// checked is a top-level statement to send as a checking DO block.
type checked struct {
	stmt *pg.Node
	what string // how the statement is named in the refusal: "DROP SCHEMA ... CASCADE"
}

// checkByResult marks a top-level statement to be sent as a checking DO block.
func (a *analysis) checkByResult(stmt *pg.Node, what string) {
	a.checked = append(a.checked, checked{stmt: stmt, what: what})
}

// guardSchemas are the schemas of the in-database guard (fenceproxy install; the DDL guard's own).
const guardSchemas = "'{fenceproxy,fenceproxy_ddl}'::pg_catalog.name[]"

// fingerprintSQL is the query of what protects the configured tables: rows (o, k, w) where k identifies one
// fact and w says, for the refusal, what a statement that changes it would do. It is a function of the
// tables only, built once per Rewriter; "" without tables (nothing is checked then).
func fingerprintSQL(tables []*tableEntry) string {
	if len(tables) == 0 {
		return ""
	}
	var vals strings.Builder
	for i, e := range tables {
		if i > 0 {
			vals.WriteString(", ")
		}
		fmt.Fprintf(&vals, "(%s::pg_catalog.name, %s::pg_catalog.name, %s::pg_catalog.name)",
			sqlLiteral(e.Schema), sqlLiteral(e.Name), sqlLiteral(e.TokenColumn))
	}
	const eq = " OPERATOR(pg_catalog.=) "
	const label = "pg_catalog.concat(pg_catalog.quote_ident(n.nspname), '.', pg_catalog.quote_ident(c.relname))"
	return `WITH RECURSIVE fenceproxy_prot(rel, col) AS (
		SELECT c.oid, t.col FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid` + eq + `c.relnamespace
		JOIN (VALUES ` + vals.String() + `) t(nsp, rel, col)
			ON c.relname` + eq + `t.rel AND (t.nsp` + eq + `''::pg_catalog.name OR n.nspname` + eq + `t.nsp)
		UNION
		SELECT i.inhrelid, p.col FROM pg_catalog.pg_inherits i JOIN fenceproxy_prot p ON i.inhparent` + eq + `p.rel
	), fenceproxy_rel AS (
		SELECT DISTINCT c.oid, c.relname, c.relowner, c.relfilenode, n.nspname, ` + label + ` AS label
		FROM fenceproxy_prot p JOIN pg_catalog.pg_class c ON c.oid` + eq + `p.rel
		JOIN pg_catalog.pg_namespace n ON n.oid` + eq + `c.relnamespace
	)
	SELECT 1, pg_catalog.concat('r', r.oid, '/', r.nspname, '/', r.relname),
		pg_catalog.concat('drop, rename or move the protected table ', r.label) FROM fenceproxy_rel r
	UNION ALL
	SELECT 2, pg_catalog.concat('c', a.attrelid, '/', a.attnum, '/', a.atttypid),
		pg_catalog.concat('drop or change the token column ', pg_catalog.quote_ident(a.attname), ' of the protected table ', r.label)
		FROM fenceproxy_prot p JOIN pg_catalog.pg_attribute a ON a.attrelid` + eq + `p.rel AND a.attname` + eq + `p.col AND NOT a.attisdropped
		JOIN fenceproxy_rel r ON r.oid` + eq + `p.rel
	UNION ALL
	SELECT 3, pg_catalog.concat('t', g.oid, '/', g.tgenabled),
		pg_catalog.concat('drop or disable the trigger ', pg_catalog.quote_ident(g.tgname), ' of the protected table ', r.label)
		FROM pg_catalog.pg_trigger g JOIN fenceproxy_rel r ON r.oid` + eq + `g.tgrelid WHERE NOT g.tgisinternal
	UNION ALL
	SELECT 4, pg_catalog.concat('f', r.oid, '/', r.relfilenode),
		pg_catalog.concat('empty (truncate) the protected table ', r.label) FROM fenceproxy_rel r
	UNION ALL
	SELECT 5, pg_catalog.concat('o', r.oid, '/', r.relowner),
		pg_catalog.concat('change the owner of the protected table ', r.label) FROM fenceproxy_rel r
	UNION ALL
	SELECT 6, pg_catalog.concat('n', n.oid, '/', n.nspname, '/', n.nspowner),
		pg_catalog.concat('drop, rename or hand over the schema ', pg_catalog.quote_ident(n.nspname), ', part of the fenceproxy guard')
		FROM pg_catalog.pg_namespace n WHERE n.nspname` + eq + `ANY (` + guardSchemas + `)
	UNION ALL
	SELECT 7, pg_catalog.concat('p', p.oid, '/', p.proowner),
		pg_catalog.concat('drop or hand over the function ', p.oid::pg_catalog.regprocedure::pg_catalog.text, ', part of the fenceproxy guard')
		FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid` + eq + `p.pronamespace
		WHERE n.nspname` + eq + `ANY (` + guardSchemas + `)
	UNION ALL
	SELECT 8, pg_catalog.concat('g', c.oid, '/', c.relowner, '/', c.relfilenode),
		pg_catalog.concat('drop, empty or hand over ', ` + label + `, ', part of the fenceproxy guard')
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid` + eq + `c.relnamespace
		WHERE n.nspname` + eq + `ANY (` + guardSchemas + `) AND c.relkind` + eq + `ANY ('{r,p,v,m,S,f}'::pg_catalog."char"[])
	UNION ALL
	SELECT 9, pg_catalog.concat('e', e.oid, '/', e.evtenabled, '/', e.evtowner),
		pg_catalog.concat('drop or disable the event trigger ', pg_catalog.quote_ident(e.evtname), ', part of the fenceproxy DDL guard')
		FROM pg_catalog.pg_event_trigger e WHERE pg_catalog.starts_with(e.evtname::pg_catalog.text, 'fenceproxy')`
}

// checkingBlock is the body of the DO block that runs stmt (the client's statement, as deparsed) and refuses
// its result when it changed what fingerprint notes.
func checkingBlock(fingerprint, stmt, what string) string {
	return `DECLARE
	fenceproxy_keys pg_catalog.text[];
	fenceproxy_whats pg_catalog.text[];
	fenceproxy_lost pg_catalog.text;
BEGIN
	-- fenceproxy: the client's statement, refused (55F04) if it drops or changes what protects a fenced table.
	SELECT pg_catalog.array_agg(f.k ORDER BY f.o, f.k), pg_catalog.array_agg(f.w ORDER BY f.o, f.k)
		INTO fenceproxy_keys, fenceproxy_whats FROM (` + fingerprint + `) f(o, k, w);
	EXECUTE ` + sqlLiteral(stmt) + `;
	SELECT b.w INTO fenceproxy_lost
		FROM ROWS FROM (pg_catalog.unnest(fenceproxy_keys), pg_catalog.unnest(fenceproxy_whats)) WITH ORDINALITY b(k, w, i)
		WHERE NOT EXISTS (SELECT FROM (` + fingerprint + `) f(o, k, w) WHERE f.k OPERATOR(pg_catalog.=) b.k)
		ORDER BY b.i LIMIT 1;
	IF fenceproxy_lost IS NOT NULL THEN
		RAISE EXCEPTION USING ERRCODE = '` + CodeUnfenceable + `',
			MESSAGE = pg_catalog.concat(` + sqlLiteral("unfenceable write: "+what+" would ") + `, fenceproxy_lost, ` + sqlLiteral(ddlAdvice) + `);
	END IF;
END`
}

// sqlLiteral is s as an E'...' string constant: the server reads it as s whatever standard_conforming_strings
// is. A $ is written \x24, so that the DO block's body holds no $ of the client's and the deparser's dollar
// quotes around it cannot be ended early (verifyChecked checks that they are not).
func sqlLiteral(s string) string {
	return "E'" + strings.NewReplacer(`\`, `\\`, `'`, `''`, `$`, `\x24`).Replace(s) + "'"
}

// wrapChecked replaces each statement of tree marked by checkByResult with its checking DO block. The
// client's statement goes into the block as deparsed; the block's body is read back from the deparsed text
// of the whole tree (out) by the caller's verifyChecked.
func (a *analysis) wrapChecked(tree *pg.ParseResult) error {
	for _, c := range a.checked {
		for _, raw := range tree.Stmts {
			if raw.Stmt != c.stmt {
				continue
			}
			text, err := deparse(&pg.ParseResult{Version: tree.Version, Stmts: []*pg.RawStmt{{Stmt: c.stmt}}})
			if err != nil {
				return fmt.Errorf("deparse %s: %w", c.what, err)
			}
			body := checkingBlock(a.r.fingerprint, text, c.what)
			raw.Stmt = &pg.Node{Node: &pg.Node_DoStmt{DoStmt: &pg.DoStmt{Args: []*pg.Node{{Node: &pg.Node_DefElem{
				DefElem: &pg.DefElem{Defname: "as", Arg: &pg.Node{Node: &pg.Node_String_{String_: &pg.String{Sval: body}}}},
			}}}}}}
			a.bodies = append(a.bodies, body)
		}
	}
	return nil
}

// verifyChecked checks that the deparsed text reads back with exactly the checking blocks' bodies, in order:
// the deparser chooses the body's dollar quotes, and a client statement that held them must not end the body
// early.
func (a *analysis) verifyChecked(out string) error {
	tree, err := pg.Parse(out)
	if err != nil {
		return fmt.Errorf("re-parse of the checking block: %w", err)
	}
	i := 0
	for _, raw := range tree.Stmts {
		d := raw.Stmt.GetDoStmt()
		if d == nil {
			continue
		}
		for _, arg := range d.Args {
			if de := arg.GetDefElem(); de != nil && de.Defname == "as" && i < len(a.bodies) && de.Arg.GetString_().GetSval() == a.bodies[i] {
				i++
			}
		}
	}
	if i != len(a.bodies) {
		return fmt.Errorf("the checking block does not read back as built")
	}
	return nil
}
