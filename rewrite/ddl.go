package rewrite

import (
	"fmt"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// DDL through the proxy.
//
// The rule, by construction: a statement that is not a query or DML (those
// are fenced by the rest of the analysis) and that names a protected table
// anywhere in its tree (a relation, or any name part equal to a protected
// table's name, whatever schema it is qualified with) is refused with 55F04
// unless its form is on an explicit allowlist of additive changes: new
// columns and indexes, comments, grants, statistics, maintenance, and
// ALTER TABLE subcommands that cannot change the token column or the table's
// identity. Every other DDL kind, including kinds added by future PostgreSQL
// versions, is refused when it names a protected table. A few statements
// reach a protected table without naming it: DROP ... CASCADE, TRUNCATE ...
// CASCADE, DROP OWNED, REASSIGN OWNED, ALTER SCHEMA ... RENAME, ALTER TABLE
// of another table that changes a column named like a token column or
// cascades (an inheritance parent's ALTER recurses into its children), and
// CREATE TRIGGER ... FOR EACH ROW (cloned onto a partitioned table's
// partitions). They
// are sent as DO blocks that run them and refuse their result when it drops
// or changes what protects a protected table (bycheck.go).
//
// Such migrations are run directly against PostgreSQL (docs/ddl.md).

// ddlAdvice ends every DDL refusal.
const ddlAdvice = "; run such a migration directly against PostgreSQL, not through fenceproxy (see docs/ddl.md)"

// checkDDL applies the DDL rule to one top-level statement (or an element of
// CREATE SCHEMA).
func (a *analysis) checkDDL(n *pg.Node) {
	if n == nil || len(a.r.tables) == 0 {
		return
	}
	switch n.Node.(type) {
	case *pg.Node_SelectStmt, *pg.Node_InsertStmt, *pg.Node_UpdateStmt, *pg.Node_DeleteStmt, *pg.Node_MergeStmt,
		*pg.Node_ExplainStmt, *pg.Node_CopyStmt, *pg.Node_PrepareStmt, *pg.Node_ExecuteStmt, *pg.Node_DeallocateStmt,
		*pg.Node_DeclareCursorStmt, *pg.Node_FetchStmt, *pg.Node_ClosePortalStmt, *pg.Node_CreateTableAsStmt,
		*pg.Node_VariableSetStmt, *pg.Node_VariableShowStmt, *pg.Node_TransactionStmt, *pg.Node_DoStmt,
		*pg.Node_CallStmt, *pg.Node_ListenStmt, *pg.Node_NotifyStmt, *pg.Node_UnlistenStmt, *pg.Node_DiscardStmt,
		*pg.Node_ConstraintsSetStmt, *pg.Node_CheckPointStmt, *pg.Node_RefreshMatViewStmt:
		// Queries and DML: fenced or refused by the write analysis (DO by its own rule).
		return
	case *pg.Node_LockStmt, *pg.Node_VacuumStmt, *pg.Node_ClusterStmt, *pg.Node_ReindexStmt, *pg.Node_IndexStmt,
		*pg.Node_CommentStmt, *pg.Node_GrantStmt, *pg.Node_GrantRoleStmt, *pg.Node_CreateStatsStmt,
		*pg.Node_AlterStatsStmt, *pg.Node_CreateSeqStmt, *pg.Node_AlterSeqStmt:
		// The allowlist of statements that cannot change a row's token or a table's identity.
		return
	}
	// The in-database guard (fenceproxy install) is treated as a protected table: DDL naming its schemas could
	// replace the function its triggers run, hand it over or put a rule on its tables, and so undo the guard as
	// surely as disabling its trigger on a protected table.
	if namesGuard(n) {
		a.refuse(CodeUnfenceable, "", fmt.Sprintf("unfenceable write: %s naming the schema of the fenceproxy guard would change the guard%s",
			stmtKind(n), ddlAdvice))
		return
	}
	switch x := n.Node.(type) {
	case *pg.Node_TruncateStmt:
		if x.TruncateStmt.Behavior == pg.DropBehavior_DROP_CASCADE && a.r.named(n) == nil {
			a.checkByResult(n, "TRUNCATE ... CASCADE")
		}
		return // TRUNCATE naming a protected table is refused by the write analysis, more precisely
	case *pg.Node_DropOwnedStmt:
		a.checkByResult(n, "DROP OWNED")
		return
	case *pg.Node_ReassignOwnedStmt:
		a.checkByResult(n, "REASSIGN OWNED")
		return
	case *pg.Node_CreateSchemaStmt:
		for _, elt := range x.CreateSchemaStmt.SchemaElts {
			a.checkDDL(elt)
		}
		return
	case *pg.Node_DropStmt:
		// DROP INDEX CONCURRENTLY cannot run in a block, and takes no CASCADE.
		if x.DropStmt.Behavior == pg.DropBehavior_DROP_CASCADE && !x.DropStmt.Concurrent {
			a.checkByResult(n, "DROP "+objectTypeName(x.DropStmt.RemoveType)+" ... CASCADE") // and refused below if it names one
		}
	case *pg.Node_RenameStmt:
		switch s := x.RenameStmt; {
		case s.RenameType == pg.ObjectType_OBJECT_SCHEMA:
			a.checkByResult(n, "ALTER SCHEMA ... RENAME")
			return
		case s.RenameType == pg.ObjectType_OBJECT_COLUMN && a.r.named(n) == nil && a.r.isTokenColumnName(s.Subname, s.Newname):
			// A column rename recurses into inheritance children and partitions.
			a.checkByResult(n, "ALTER TABLE ... RENAME COLUMN")
			return
		}
		if why := a.renameInto(x.RenameStmt); why != "" {
			a.refuse(CodeUnfenceable, "", "unfenceable write: "+why+ddlAdvice)
			return
		}
	case *pg.Node_AlterTableStmt:
		if a.r.named(n) == nil && a.r.reachesChildren(x.AlterTableStmt) {
			a.checkByResult(n, "ALTER TABLE")
			return
		}
	case *pg.Node_CreateTrigStmt:
		// A row trigger on a partitioned table is cloned onto its partitions, a protected one among them.
		if x.CreateTrigStmt.Row && a.r.named(n) == nil {
			a.checkByResult(n, "CREATE TRIGGER ... FOR EACH ROW")
			return
		}
	}
	scope := n
	if f := n.GetCreateFunctionStmt(); f != nil {
		// A function's argument and result types may be a protected table's
		// row type; only a SQL-standard body (BEGIN ATOMIC, RETURN) can write.
		if scope = f.SqlBody; scope == nil {
			return
		}
	}
	e := a.r.named(scope)
	if e == nil {
		return
	}
	if why := a.r.ddlRisk(n, e); why != "" {
		a.refuse(CodeUnfenceable, e.label, "unfenceable write: "+why+ddlAdvice)
	}
}

// isGuardSchema reports whether name (an identifier's value) is one of the in-database guard's schemas,
// fenceproxy and fenceproxy_ddl (schema.Name; the DDL guard's own), ASCII case-insensitively: it errs toward
// naming.
func isGuardSchema(name string) bool {
	return strings.EqualFold(name, "fenceproxy") || strings.EqualFold(name, "fenceproxy_ddl")
}

// named returns the first protected table a statement names anywhere: a
// relation whose name is a protected table's (in any schema), or a name part
// (a String node: DROP objects, COMMENT targets, column and type names) equal
// to one. It errs toward naming.
func (r *Rewriter) named(n *pg.Node) *tableEntry {
	var found *tableEntry
	eachMessage(n.ProtoReflect(), func(m protoreflect.Message) {
		if found != nil {
			return
		}
		switch x := m.Interface().(type) {
		case *pg.RangeVar:
			if c := r.byName[x.Relname]; len(c) > 0 {
				found = c[0]
			}
		case *pg.String:
			if c := r.byName[x.Sval]; len(c) > 0 {
				found = c[0]
			}
		}
	})
	return found
}

// isProtected reports whether a relation may be the protected table e (same
// name; same schema when both are known).
func isProtected(rv *pg.RangeVar, e *tableEntry) bool {
	return rv != nil && rv.Relname == e.Name && (rv.Schemaname == "" || e.Schema == "" || rv.Schemaname == e.Schema)
}

// ddlRisk returns why a statement that names the protected table e is
// refused, or "" when its form is on the allowlist.
func (r *Rewriter) ddlRisk(n *pg.Node, e *tableEntry) string {
	switch x := n.Node.(type) {
	case *pg.Node_AlterTableStmt:
		s := x.AlterTableStmt
		var target *tableEntry // the protected table being altered, nil when e is only mentioned
		if isProtected(s.Relation, e) {
			target = e
		}
		for _, c := range s.Cmds {
			if why := alterTableCmdRisk(c.GetAlterTableCmd(), target); why != "" {
				return fmt.Sprintf("ALTER TABLE %s %s", s.Relation.GetRelname(), why)
			}
		}
		return ""
	case *pg.Node_RenameStmt:
		s := x.RenameStmt
		if s.RenameType == pg.ObjectType_OBJECT_COLUMN && isProtected(s.Relation, e) {
			if s.Subname == e.TokenColumn || s.Newname == e.TokenColumn {
				return fmt.Sprintf("renaming the token column %s of %s would let writes bypass the fence", e.TokenColumn, e.label)
			}
			return ""
		}
		if s.RenameType == pg.ObjectType_OBJECT_TABCONSTRAINT {
			return ""
		}
		return fmt.Sprintf("renaming %s (or an object on it) would change what the fence protects", e.label)
	case *pg.Node_CreateStmt:
		s := x.CreateStmt
		for _, inh := range s.InhRelations {
			if isProtected(inh.GetRangeVar(), e) {
				return fmt.Sprintf("a partition or inheritance child of %s would hold rows the fence does not see", e.label)
			}
		}
		if isProtected(s.Relation, e) {
			if len(s.InhRelations) > 0 {
				return fmt.Sprintf("making %s a partition or inheritance child routes writes to it around the fence", e.label)
			}
			if why := cascadingForeignKey(s.TableElts, s.Constraints); why != "" {
				return fmt.Sprintf("CREATE TABLE %s: %s", e.label, why)
			}
		}
		return ""
	case *pg.Node_DropStmt:
		return fmt.Sprintf("DROP %s naming %s would remove the table, its rows' tokens or its triggers", objectTypeName(x.DropStmt.RemoveType), e.label)
	case *pg.Node_AlterObjectSchemaStmt:
		return fmt.Sprintf("SET SCHEMA on %s would change what the fence protects", e.label)
	case *pg.Node_CreateTrigStmt:
		return fmt.Sprintf("a trigger on %s could change rows and tokens outside the fence", e.label)
	case *pg.Node_RuleStmt:
		return fmt.Sprintf("a rule on or writing %s could redirect or add writes outside the fence", e.label)
	case *pg.Node_ViewStmt:
		return fmt.Sprintf("a view over %s would be a write path around the fence", e.label)
	}
	return fmt.Sprintf("%s naming %s is not among the DDL forms fenceproxy lets through", stmtKind(n), e.label)
}

// alterTableCmdRisk is the ALTER TABLE allowlist. target is the protected
// table being altered, or nil when the protected table is only mentioned
// (ALTER TABLE other ADD FOREIGN KEY ... REFERENCES T, ATTACH PARTITION T).
func alterTableCmdRisk(c *pg.AlterTableCmd, target *tableEntry) string {
	if c == nil {
		return "with a subcommand fenceproxy cannot read"
	}
	onToken := target != nil && c.Name == target.TokenColumn
	kind := strings.TrimPrefix(c.Subtype.String(), "AT_")
	switch c.Subtype {
	case pg.AlterTableType_AT_AddColumn:
		d := c.Def.GetColumnDef()
		if d == nil {
			return "ADD COLUMN that fenceproxy cannot read"
		}
		if target != nil && d.Colname == target.TokenColumn && !plainColumn(d) {
			// Adding the token column as fenceproxy check suggests (a plain
			// column, NULL in every row) is how a table is set up; with a
			// default, an expression or constraints it would set tokens.
			return fmt.Sprintf("ADD COLUMN %s with a default, expression or constraint: the token column's values are the proxy's", d.Colname)
		}
		if target != nil {
			if why := cascadingForeignKey([]*pg.Node{c.Def}, nil); why != "" {
				return why
			}
		}
		return ""
	case pg.AlterTableType_AT_AlterColumnType:
		if onToken {
			return fmt.Sprintf("ALTER COLUMN %s TYPE: changing the token column could change every row's token", c.Name)
		}
		if d := c.Def.GetColumnDef(); d != nil && d.RawDefault != nil && target != nil && !isColumnCast(d.RawDefault, c.Name) {
			return fmt.Sprintf("ALTER COLUMN %s TYPE ... USING: a rewrite with USING runs arbitrary expressions over every row", c.Name)
		}
		return ""
	case pg.AlterTableType_AT_DropColumn:
		if onToken {
			return fmt.Sprintf("DROP COLUMN %s: dropping the token column loses every row's token", c.Name)
		}
		if c.Behavior == pg.DropBehavior_DROP_CASCADE {
			return fmt.Sprintf("DROP COLUMN %s CASCADE may drop the table's triggers", c.Name)
		}
		return ""
	case pg.AlterTableType_AT_ColumnDefault, pg.AlterTableType_AT_DropNotNull, pg.AlterTableType_AT_SetNotNull,
		pg.AlterTableType_AT_SetStatistics, pg.AlterTableType_AT_SetOptions, pg.AlterTableType_AT_ResetOptions,
		pg.AlterTableType_AT_SetStorage, pg.AlterTableType_AT_SetCompression, pg.AlterTableType_AT_SetExpression,
		pg.AlterTableType_AT_DropExpression, pg.AlterTableType_AT_AddIdentity, pg.AlterTableType_AT_SetIdentity,
		pg.AlterTableType_AT_DropIdentity:
		if onToken {
			return fmt.Sprintf("%s on the token column %s: only the proxy changes it", kind, c.Name)
		}
		return ""
	case pg.AlterTableType_AT_AddConstraint:
		if target != nil {
			return cascadingForeignKey(nil, []*pg.Node{c.Def})
		}
		return ""
	case pg.AlterTableType_AT_AddIndex, pg.AlterTableType_AT_AddIndexConstraint, pg.AlterTableType_AT_AlterConstraint,
		pg.AlterTableType_AT_ValidateConstraint, pg.AlterTableType_AT_DropConstraint, pg.AlterTableType_AT_ClusterOn,
		pg.AlterTableType_AT_DropCluster, pg.AlterTableType_AT_SetTableSpace, pg.AlterTableType_AT_SetRelOptions,
		pg.AlterTableType_AT_ResetRelOptions, pg.AlterTableType_AT_ReplicaIdentity:
		return ""
	}
	return kind + " is not among the ALTER TABLE forms fenceproxy lets through"
}

// plainColumn reports whether a column definition is a type only: no
// default, generated expression, identity or constraint.
func plainColumn(d *pg.ColumnDef) bool {
	return d.RawDefault == nil && d.CookedDefault == nil && d.Identity == "" && d.Generated == "" && len(d.Constraints) == 0
}

// isColumnCast reports whether a USING expression is the column itself,
// possibly cast (USING "c"::integer, which Django writes for every type
// change): the conversion ALTER TYPE does anyway, not a rewrite of the values.
func isColumnCast(n *pg.Node, col string) bool {
	ref := unwrapCast(n).GetColumnRef()
	if ref == nil || len(ref.Fields) != 1 {
		return false
	}
	return ref.Fields[0].GetString_().GetSval() == col
}

// cascadingForeignKey returns why a foreign key among a table's column
// definitions and constraints would write the table when its referenced
// table changes (ON DELETE/UPDATE CASCADE, SET NULL, SET DEFAULT), or "".
func cascadingForeignKey(elts, constraints []*pg.Node) string {
	all := append([]*pg.Node(nil), constraints...)
	for _, n := range elts {
		if d := n.GetColumnDef(); d != nil {
			all = append(all, d.Constraints...)
		}
		if n.GetConstraint() != nil {
			all = append(all, n)
		}
	}
	for _, n := range all {
		c := n.GetConstraint()
		if c == nil || c.Contype != pg.ConstrType_CONSTR_FOREIGN {
			continue
		}
		for _, act := range []string{c.FkDelAction, c.FkUpdAction} {
			switch act {
			case "c", "n", "d": // CASCADE, SET NULL, SET DEFAULT
				return "a foreign key with ON DELETE/UPDATE CASCADE, SET NULL or SET DEFAULT writes the table from another one, unfenced"
			}
		}
	}
	return ""
}

// renameInto returns why a RENAME gives some relation a protected table's
// name, or "". (A schema rename is checked by its result.)
func (a *analysis) renameInto(s *pg.RenameStmt) string {
	switch s.RenameType {
	case pg.ObjectType_OBJECT_TABLE, pg.ObjectType_OBJECT_VIEW, pg.ObjectType_OBJECT_MATVIEW,
		pg.ObjectType_OBJECT_FOREIGN_TABLE:
		if c := a.r.byName[s.Newname]; len(c) > 0 {
			return fmt.Sprintf("renaming a relation to %s would change what the fence protects", c[0].label)
		}
	}
	return ""
}

// reachesChildren reports whether an ALTER TABLE of a relation that is not
// protected by name may still change a protected table: PostgreSQL applies
// most subcommands to the inheritance children and partitions too, so one
// that changes a column named like a token column (drop, retype, default,
// rename) reaches a protected child's token column, ENABLE/DISABLE TRIGGER
// of a partitioned table reaches its partitions' triggers (the guard's), one
// with CASCADE reaches what depends on the column or constraint it drops, and
// ALTER COLUMN ... TYPE ... USING an expression rewrites every row of a
// protected child with it (refused on a protected table by name:
// alterTableCmdRisk; checked by its result here, which refuses the child's
// new data file).
func (r *Rewriter) reachesChildren(s *pg.AlterTableStmt) bool {
	for _, n := range s.Cmds {
		c := n.GetAlterTableCmd()
		if c == nil || c.Behavior == pg.DropBehavior_DROP_CASCADE {
			return true
		}
		if d := c.Def.GetColumnDef(); c.Subtype == pg.AlterTableType_AT_AlterColumnType && d != nil && d.RawDefault != nil && !isColumnCast(d.RawDefault, c.Name) {
			return true
		}
		switch c.Subtype {
		case pg.AlterTableType_AT_EnableTrig, pg.AlterTableType_AT_EnableAlwaysTrig, pg.AlterTableType_AT_EnableReplicaTrig,
			pg.AlterTableType_AT_DisableTrig, pg.AlterTableType_AT_EnableTrigAll, pg.AlterTableType_AT_DisableTrigAll,
			pg.AlterTableType_AT_EnableTrigUser, pg.AlterTableType_AT_DisableTrigUser:
			return true
		}
		if r.isTokenColumnName(c.Name) {
			return true
		}
	}
	return false
}

// isTokenColumnName reports whether one of names is a protected table's token column's name.
func (r *Rewriter) isTokenColumnName(names ...string) bool {
	for _, e := range r.tables {
		for _, n := range names {
			if n == e.TokenColumn {
				return true
			}
		}
	}
	return false
}

// stmtKind names a statement's node type for messages (CreatePolicyStmt).
func stmtKind(n *pg.Node) string {
	if fd := n.ProtoReflect().WhichOneof(nodeOneof); fd != nil {
		return string(fd.Message().Name())
	}
	return "a statement"
}

// objectTypeName is OBJECT_TABLE as TABLE.
func objectTypeName(t pg.ObjectType) string {
	return strings.ReplaceAll(strings.TrimPrefix(t.String(), "OBJECT_"), "_", " ")
}
