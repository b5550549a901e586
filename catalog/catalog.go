// Package catalog reads what PostgreSQL's catalog says about the relations around the protected tables
// (partitions and inheritance children, parents, views, foreign keys, the in-database guard) and derives from it
// an immutable Snapshot: more tables for the rewriter to fence, and relations some writes to which it must
// refuse. The rewriter stays a pure function of (text, settings, configuration, snapshot).
//
// Reading needs only a login: every query reads pg_catalog, which PostgreSQL lets every role read.
package catalog

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Relation is a table, partitioned table, foreign table or view.
type Relation struct {
	OID    uint32
	Schema string
	Name   string
	// Kind is pg_class.relkind: r table, p partitioned table, f foreign table, v view.
	Kind byte
	// Columns are the relation's live columns in attnum order. They are read for the relations in an
	// inheritance tree and for views, the only ones whose columns the derivation needs.
	Columns []string
}

// Label is schema.name.
func (r *Relation) Label() string { return r.Schema + "." + r.Name }

func (r *Relation) hasColumn(c string) bool {
	for _, x := range r.Columns {
		if x == c {
			return true
		}
	}
	return false
}

// Inherit is one pg_inherits row: Child is a partition or inheritance child of Parent.
type Inherit struct{ Child, Parent uint32 }

// ForeignKey is one foreign-key constraint: rows of Referencing point at rows of Referenced. OnDelete and
// OnUpdate are pg_constraint.confdeltype and confupdtype: a no action, r restrict, c cascade, n set null,
// d set default.
type ForeignKey struct {
	Name               string
	Referencing        uint32
	Referenced         uint32
	OnDelete, OnUpdate byte
}

// View is a view and what the derivation needs to tell whether writes through it reach a protected table.
type View struct {
	OID uint32
	// Definition is pg_get_viewdef: the view's SELECT, with the names qualified where search_path would not find them.
	Definition string
	// DependsOn are the relations the view's query reads.
	DependsOn []uint32
	// Redirected is true when the view has INSTEAD OF triggers or rules other than its own _RETURN: writes
	// through it run code the proxy cannot see.
	Redirected bool
}

// Guard is what the in-database guard covers on one table.
type Guard struct {
	// Rows: an enabled row-level BEFORE UPDATE and DELETE trigger of the guard (cascaded rows are checked).
	Rows bool
	// Truncate: an enabled statement-level BEFORE TRUNCATE trigger of the guard.
	Truncate bool
	// Outdated is set by a probe that knows the guard's versions when this table's guard is older than the
	// binary's; Detail says how (for `fenceproxy check`). TriggerGuardProbe cannot tell and leaves them empty.
	Outdated bool
	Detail   string
}

// Catalog is the raw facts read from one database, at one moment.
type Catalog struct {
	Relations   map[uint32]*Relation
	Inherits    []Inherit
	ForeignKeys []ForeignKey
	Views       []View
	Guards      map[uint32]Guard
	ReadAt      time.Time
}

// GuardProbe tells which tables carry the in-database guard. The guard is installed by `fenceproxy install`,
// which owns its definition; TriggerGuardProbe recognises it by its triggers' functions living in the
// fenceproxy schema. Replace it with install's own probe when that exists.
type GuardProbe interface {
	Guards(ctx context.Context, conn *pgx.Conn) (map[uint32]Guard, error)
}

// DefaultGuardProbe is the probe the proxy and `fenceproxy check` use when given none: the one place to switch
// to install's own probe once it exists.
func DefaultGuardProbe() GuardProbe { return TriggerGuardProbe{} }

// TriggerGuardProbe finds enabled triggers whose function is in the schema fenceproxy (fenceproxy install's
// guard) or is named fenceproxy_guard (a hand-written guard of earlier versions). Whether an installed guard
// is current is install's inspection (schema.Inspect), which `fenceproxy check` runs too.
type TriggerGuardProbe struct{}

// tgtype bits (pg_trigger.h).
const (
	tgRow      = 1 << 0
	tgBefore   = 1 << 1
	tgDelete   = 1 << 3
	tgUpdate   = 1 << 4
	tgTruncate = 1 << 5
)

// Guards implements GuardProbe.
func (TriggerGuardProbe) Guards(ctx context.Context, conn *pgx.Conn) (map[uint32]Guard, error) {
	rows, err := conn.Query(ctx, `
SELECT t.tgrelid, t.tgtype::int
FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE NOT t.tgisinternal AND t.tgenabled <> 'D'
  AND (n.nspname = 'fenceproxy' OR p.proname = 'fenceproxy_guard')`)
	if err != nil {
		return nil, fmt.Errorf("read guard triggers: %w", err)
	}
	out := map[uint32]Guard{}
	var oid uint32
	var tgtype int32
	_, err = pgx.ForEachRow(rows, []any{&oid, &tgtype}, func() error {
		g := out[oid]
		if tgtype&tgBefore != 0 {
			if tgtype&tgRow != 0 && tgtype&tgDelete != 0 && tgtype&tgUpdate != 0 {
				g.Rows = true
			}
			if tgtype&tgRow == 0 && tgtype&tgTruncate != 0 {
				g.Truncate = true
			}
		}
		out[oid] = g
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read guard triggers: %w", err)
	}
	return out, nil
}

// Read reads the facts in one REPEATABLE READ READ ONLY transaction, so that they are consistent.
func Read(ctx context.Context, conn *pgx.Conn, probe GuardProbe) (*Catalog, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("catalog: begin: %w", err)
	}
	defer tx.Rollback(context.Background())
	// With only pg_catalog on the path, pg_get_viewdef qualifies every relation a view names, so its base is
	// identified by schema and name, never by a guess between two relations of the same name.
	if _, err := tx.Exec(ctx, "SET LOCAL search_path = pg_catalog"); err != nil {
		return nil, fmt.Errorf("catalog: %w", err)
	}
	c := &Catalog{Relations: map[uint32]*Relation{}, ReadAt: time.Now()}
	if err := c.read(ctx, tx.Conn(), probe); err != nil {
		return nil, fmt.Errorf("catalog: %w", err)
	}
	return c, nil
}

func (c *Catalog) read(ctx context.Context, conn *pgx.Conn, probe GuardProbe) error {
	rows, err := conn.Query(ctx, `
SELECT c.oid, n.nspname, c.relname, c.relkind::text
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'f', 'v')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_toast%'`)
	if err != nil {
		return fmt.Errorf("read relations: %w", err)
	}
	var (
		oid, other   uint32
		schema, name string
		kind         string
	)
	if _, err := pgx.ForEachRow(rows, []any{&oid, &schema, &name, &kind}, func() error {
		c.Relations[oid] = &Relation{OID: oid, Schema: schema, Name: name, Kind: kind[0]}
		return nil
	}); err != nil {
		return fmt.Errorf("read relations: %w", err)
	}

	rows, err = conn.Query(ctx, `SELECT inhrelid, inhparent FROM pg_catalog.pg_inherits`)
	if err != nil {
		return fmt.Errorf("read pg_inherits: %w", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&oid, &other}, func() error {
		c.Inherits = append(c.Inherits, Inherit{Child: oid, Parent: other})
		return nil
	}); err != nil {
		return fmt.Errorf("read pg_inherits: %w", err)
	}

	rows, err = conn.Query(ctx, `
SELECT a.attrelid, a.attname
FROM pg_catalog.pg_attribute a
WHERE a.attnum > 0 AND NOT a.attisdropped
  AND a.attrelid IN (SELECT inhrelid FROM pg_catalog.pg_inherits UNION SELECT inhparent FROM pg_catalog.pg_inherits
                     UNION SELECT oid FROM pg_catalog.pg_class WHERE relkind = 'v')
ORDER BY a.attrelid, a.attnum`)
	if err != nil {
		return fmt.Errorf("read columns: %w", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&oid, &name}, func() error {
		if r := c.Relations[oid]; r != nil {
			r.Columns = append(r.Columns, name)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("read columns: %w", err)
	}

	rows, err = conn.Query(ctx, `
SELECT conname, conrelid, confrelid, confdeltype::text, confupdtype::text
FROM pg_catalog.pg_constraint WHERE contype = 'f'`)
	if err != nil {
		return fmt.Errorf("read foreign keys: %w", err)
	}
	var del, upd string
	if _, err := pgx.ForEachRow(rows, []any{&name, &oid, &other, &del, &upd}, func() error {
		c.ForeignKeys = append(c.ForeignKeys, ForeignKey{Name: name, Referencing: oid, Referenced: other, OnDelete: del[0], OnUpdate: upd[0]})
		return nil
	}); err != nil {
		return fmt.Errorf("read foreign keys: %w", err)
	}

	rows, err = conn.Query(ctx, `
SELECT v.oid, pg_catalog.pg_get_viewdef(v.oid),
       ARRAY(SELECT DISTINCT d.refobjid FROM pg_catalog.pg_rewrite r
             JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_rewrite'::regclass AND d.objid = r.oid
                  AND d.refclassid = 'pg_catalog.pg_class'::regclass AND d.refobjid <> v.oid
             WHERE r.ev_class = v.oid AND r.rulename = '_RETURN'),
       EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = v.oid AND NOT t.tgisinternal)
       OR EXISTS (SELECT FROM pg_catalog.pg_rewrite r WHERE r.ev_class = v.oid AND r.rulename <> '_RETURN')
FROM pg_catalog.pg_class v JOIN pg_catalog.pg_namespace n ON n.oid = v.relnamespace
WHERE v.relkind = 'v' AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_toast%'
ORDER BY v.oid`)
	if err != nil {
		return fmt.Errorf("read views: %w", err)
	}
	var v View
	if _, err := pgx.ForEachRow(rows, []any{&v.OID, &v.Definition, &v.DependsOn, &v.Redirected}, func() error {
		c.Views = append(c.Views, v)
		v = View{}
		return nil
	}); err != nil {
		return fmt.Errorf("read views: %w", err)
	}

	if probe == nil {
		probe = DefaultGuardProbe()
	}
	c.Guards, err = probe.Guards(ctx, conn)
	return err
}
