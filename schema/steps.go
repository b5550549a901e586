package schema

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/fenceproxy/fenceproxy/tokens"
)

// Step is one migration of the fenceproxy schema. Install applies each step once, in order, in the same
// transaction as the rest of the installation, and records it in fenceproxy.version (step number = position
// in Steps, starting at 1, and the step's name). Steps are never edited or reordered once released: a change
// is a new step at the end.
type Step struct {
	Name string
	SQL  string
}

// Steps is the schema's history, oldest first. To add one, append it here.
func Steps() []Step {
	return []Step{
		{Name: "lock marks", SQL: stepLockMarks},
		{Name: "guarded relations", SQL: stepGuarded},
		// The PostgreSQL lock store's leases and token sequence (tokens.PGStoreSchemaSQL, idempotent: a store
		// that created them before install ran keeps them).
		{Name: "lock store", SQL: strings.Join(tokens.PGStoreSchemaSQL, ";\n") + ";"},
		{Name: "token ceiling", SQL: stepTokenCeiling},
	}
}

// bootstrapSQL creates the schema and the version table itself; it is not a step, because reading which steps
// were applied needs the table.
const bootstrapSQL = `CREATE SCHEMA IF NOT EXISTS fenceproxy;
GRANT USAGE ON SCHEMA fenceproxy TO PUBLIC;
CREATE TABLE IF NOT EXISTS fenceproxy.version (
	step int PRIMARY KEY,
	name text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
GRANT SELECT ON fenceproxy.version TO PUBLIC;
LOCK TABLE fenceproxy.version IN SHARE ROW EXCLUSIVE MODE;`

// stepLockMarks: each lock's high-water mark, the newest token a write under it was accepted with (lock
// fences). Writers change it only through fenceproxy.lock_accept, which runs as its owner.
const stepLockMarks = `CREATE TABLE fenceproxy.lock_marks (
	name text PRIMARY KEY,
	mark bigint NOT NULL CHECK (mark > 0),
	id int GENERATED ALWAYS AS IDENTITY UNIQUE -- the key of the lock's advisory locks (lock_accept)
);
REVOKE ALL ON fenceproxy.lock_marks FROM PUBLIC;
GRANT SELECT ON fenceproxy.lock_marks TO PUBLIC;`

// stepGuarded: the relations the guard protects, as install left them, for the DDL guard (which refuses any
// DDL that changes them) and for check.
const stepGuarded = `CREATE TABLE fenceproxy.guarded (
	relid oid PRIMARY KEY,
	nspname name NOT NULL,
	relname name NOT NULL,
	attnum int2 NOT NULL,
	token_column name NOT NULL,
	label text NOT NULL,
	row_trigger oid,
	truncate_trigger oid NOT NULL
);
REVOKE ALL ON fenceproxy.guarded FROM PUBLIC;
GRANT SELECT ON fenceproxy.guarded TO PUBLIC;`

// stepTokenCeiling: the highest token the proxy's verifier has accepted as issued, per lock service
// (docs/verification.md). The guard refuses (55F03) a token above any ceiling here, whatever set it; with no
// row (verification off) it checks none. Only the table's owner, and the roles it grants INSERT and UPDATE
// (the proxy's own: RaiseCeiling), may change it.
const stepTokenCeiling = `CREATE TABLE IF NOT EXISTS fenceproxy.token_ceiling (
	store text PRIMARY KEY,
	ceiling bigint NOT NULL CHECK (ceiling > 0)
);
REVOKE ALL ON fenceproxy.token_ceiling FROM PUBLIC;
GRANT SELECT ON fenceproxy.token_ceiling TO PUBLIC;`

// relations are the relations (tables and sequences, schema-qualified as written) that the step's SQL
// creates, read from the SQL itself, so that no list can forget one: a database that has applied the step
// must still hold each (missingRelations).
func (s Step) relations() ([]string, error) {
	tree, err := pg.Parse(s.SQL)
	if err != nil {
		return nil, fmt.Errorf("step %q: %w", s.Name, err)
	}
	var out []string
	for _, raw := range tree.Stmts {
		var rv *pg.RangeVar
		switch x := raw.Stmt.Node.(type) {
		case *pg.Node_CreateStmt:
			rv = x.CreateStmt.Relation
		case *pg.Node_CreateSeqStmt:
			rv = x.CreateSeqStmt.Sequence
		}
		if rv != nil {
			out = append(out, quoteQualified(rv.Schemaname, rv.Relname))
		}
	}
	return out, nil
}

// missingRelations names the relations of the applied steps (the first applied of Steps) that the database
// no longer holds, as "fenceproxy.lock_marks (step 1, lock marks)": dropped by hand, they make the guard fail
// writes with errors that are not the contract's, and install would not create them again. One query looks
// for all of them; the names come in step order.
func missingRelations(ctx context.Context, conn *pgx.Conn, applied int) ([]string, error) {
	steps := Steps()
	var rels, labels []string // the relations to look for, and each one's name in the answer
	for i, s := range steps[:min(applied, len(steps))] {
		stepRels, err := s.relations()
		if err != nil {
			return nil, err
		}
		for _, r := range stepRels {
			rels = append(rels, r)
			labels = append(labels, fmt.Sprintf("%s (step %d, %s)", strings.ReplaceAll(r, `"`, ""), i+1, s.Name))
		}
	}
	if len(rels) == 0 {
		return nil, nil
	}
	rows, err := conn.Query(ctx, `SELECT u.i FROM pg_catalog.unnest($1::text[]) WITH ORDINALITY AS u(r, i)
WHERE pg_catalog.to_regclass(u.r) IS NULL ORDER BY u.i`, rels)
	if err != nil {
		return nil, fmt.Errorf("look for the relations of the applied steps (%s): %w", strings.Join(rels, ", "), err)
	}
	gone, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("look for the relations of the applied steps (%s): %w", strings.Join(rels, ", "), err)
	}
	var missing []string
	for _, i := range gone {
		if i < 1 || int(i) > len(labels) {
			return nil, fmt.Errorf("look for the relations of the applied steps: position %d of %d", i, len(labels))
		}
		missing = append(missing, labels[i-1])
	}
	return missing, nil
}
