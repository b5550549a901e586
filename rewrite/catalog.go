package rewrite

import (
	"fmt"
	"slices"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Ops is a set of ways a statement can write a relation.
type Ops uint8

const (
	OpInsert Ops = 1 << iota
	// OpUpdate is UPDATE, and INSERT ... ON CONFLICT DO UPDATE.
	OpUpdate
	OpDelete
	// OpTruncate is any TRUNCATE of the relation.
	OpTruncate
	// OpTruncateCascade is TRUNCATE ... CASCADE of the relation.
	OpTruncateCascade
	// OpMerge is MERGE into the relation (which may insert, update and delete).
	OpMerge
	// OpCopy is COPY ... FROM into the relation.
	OpCopy

	// OpsWrite is every write.
	OpsWrite = OpInsert | OpUpdate | OpDelete | OpTruncate | OpTruncateCascade | OpMerge | OpCopy
)

// Refused is a relation that is not protected itself but that some writes to
// cannot be fenced, because of what the catalog says it is: a view over a
// protected table that does not expose the token column, a parent that
// routes rows into a protected partition but lacks the column, a table whose
// foreign-key actions reach a protected table. A statement that writes it in
// one of Ops is refused with 55F04 and Reason. The catalog package derives
// these; the rewriter only matches names, as it does for Table.
type Refused struct {
	// Schema and Name as for Table; Schema "" matches the name in every schema.
	Schema, Name string
	Ops          Ops
	// Table is the label of the protected table the refusal is about (errors and metrics name it).
	Table string
	// Reason completes "unfenceable write: <statement> of <relation>: it <Reason>", e.g.
	// "deletes rows of the protected public.accounts through foreign key ... (ON DELETE CASCADE), ...".
	Reason string
}

func (f Refused) label() string {
	if f.Schema == "" {
		return f.Name
	}
	return f.Schema + "." + f.Name
}

// prefilterTables is what the prefilter looks for: the protected tables' and the refused relations' names
// (the token column is irrelevant there). The prefilter compares whole identifier values (their lengths
// first), so the many names a catalog adds (a partition per month) cost little.
func prefilterTables(tables []Table, refused []Refused) []Table {
	all := slices.Clone(tables)
	for _, f := range refused {
		all = append(all, Table{Schema: f.Schema, Name: f.Name, TokenColumn: "-"})
	}
	return all
}

// lookupRefused finds the refusals for a RangeVar: an unqualified name may be
// any relation of that name (search_path is unknown), a qualified one only
// that relation or a refusal configured without a schema.
func (r *Rewriter) lookupRefused(rv *pg.RangeVar) []*Refused {
	if rv == nil {
		return nil
	}
	cands := r.refused[rv.Relname]
	if rv.Schemaname == "" {
		return cands
	}
	var out []*Refused
	for _, f := range cands {
		if f.Schema == "" || f.Schema == rv.Schemaname {
			out = append(out, f)
		}
	}
	return out
}

// refuseCatalog walks one statement for writes to refused relations. It runs
// after the protected-table analysis, whose refusal (if any) wins.
func (a *analysis) refuseCatalog(stmt *pg.Node) {
	if len(a.r.refused) == 0 || a.refusal != nil {
		return
	}
	check := func(rv *pg.RangeVar, op Ops, what string) {
		if a.refusal != nil {
			return
		}
		for _, f := range a.r.lookupRefused(rv) {
			if f.Ops&op != 0 {
				a.refuse(CodeUnfenceable, f.Table, fmt.Sprintf("unfenceable write: %s %s: it %s", what, f.label(), f.Reason))
				return
			}
		}
	}
	walkStatement(stmt, func(m protoreflect.Message) {
		switch x := m.Interface().(type) {
		case *pg.UpdateStmt:
			check(x.Relation, OpUpdate, "UPDATE of")
		case *pg.DeleteStmt:
			check(x.Relation, OpDelete, "DELETE from")
		case *pg.InsertStmt:
			check(x.Relation, OpInsert, "INSERT into")
			if oc := x.OnConflictClause; oc != nil && oc.Action == pg.OnConflictAction_ONCONFLICT_UPDATE {
				check(x.Relation, OpUpdate, "INSERT ... ON CONFLICT DO UPDATE of")
			}
		case *pg.MergeStmt:
			check(x.Relation, OpMerge, "MERGE into")
		case *pg.CopyStmt:
			if x.IsFrom {
				check(x.Relation, OpCopy, "COPY FROM into")
			}
		case *pg.TruncateStmt:
			for _, n := range x.Relations {
				check(n.GetRangeVar(), OpTruncate, "TRUNCATE of")
				if x.Behavior == pg.DropBehavior_DROP_CASCADE {
					check(n.GetRangeVar(), OpTruncateCascade, "TRUNCATE ... CASCADE of")
				}
			}
		case *pg.DoStmt:
			for _, arg := range x.Args {
				if d := arg.GetDefElem(); d != nil && d.Defname == "as" {
					body := d.Arg.GetString_().GetSval()
					for _, list := range a.r.refused {
						for _, f := range list {
							if containsFold(body, f.Name) {
								a.refuse(CodeUnfenceable, f.Table, fmt.Sprintf("unfenceable write: a DO block that names %s cannot be fenced (%s %s); run its statements through the proxy as plain SQL", f.label(), f.label(), f.Reason))
								return
							}
						}
					}
				}
			}
		}
	})
}

// addRefused validates and indexes the refusals.
func (r *Rewriter) addRefused(list []Refused) error {
	for i := range list {
		f := list[i]
		if f.Name == "" || f.Ops == 0 || f.Reason == "" {
			return fmt.Errorf("rewrite: refused relation %d: name, ops and reason are required", i+1)
		}
		if r.refused == nil {
			r.refused = make(map[string][]*Refused)
		}
		r.refused[f.Name] = append(r.refused[f.Name], &f)
	}
	return nil
}
