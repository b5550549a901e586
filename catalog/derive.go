package catalog

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// Snapshot is what the proxy learned from one read of the catalog, for one list of configured tables. It is
// immutable: a refresh builds a new one.
type Snapshot struct {
	// Protected are the relations protected because of a configured table, beyond the configured names
	// themselves: partitions and inheritance children, parents that route rows into them and have the token
	// column, views that expose it.
	Protected []Protected
	// Refused are relations some writes to which are refused (55F04), with the reason.
	Refused []rewrite.Refused
	// Unresolved are configured tables the catalog has no relation for; they stay protected by name.
	Unresolved []string
	// Resolved maps each configured table's label to the relations it names.
	Resolved map[string][]uint32
	// Catalog is the facts the snapshot was derived from.
	Catalog *Catalog
	ReadAt  time.Time
}

// Protected is one relation protected because of the catalog.
type Protected struct {
	rewrite.Table
	OID uint32
	// Origin is the label of the configured table it derives from; Via says how ("partition of public.x").
	Origin, Via string
}

// Tables are the rewriter tables for Protected.
func (s *Snapshot) Tables() []rewrite.Table {
	if s == nil {
		return nil
	}
	out := make([]rewrite.Table, len(s.Protected))
	for i, p := range s.Protected {
		out[i] = p.Table
	}
	return out
}

// SameRules reports whether s and o make the rewriter behave alike (the same tables and refusals), so that a
// refresh that changed nothing keeps the current planner and its cache.
func (s *Snapshot) SameRules(o *Snapshot) bool {
	if s == nil || o == nil {
		return s == o
	}
	return reflect.DeepEqual(s.Tables(), o.Tables()) && reflect.DeepEqual(s.Refused, o.Refused)
}

// prot is a protected relation during the derivation.
type prot struct {
	base       rewrite.Table // the configured table it derives from: its other settings carry over
	column     string
	origin     string
	via        string
	configured bool
	conflict   string // non-empty: two token columns reach it
}

// Derive computes the snapshot for the configured tables. It is a pure function of its arguments.
func Derive(c *Catalog, configured []rewrite.Table) *Snapshot {
	d := &deriver{c: c, prot: map[uint32]*prot{}, refused: map[uint32][]rewrite.Refused{}, resolved: map[string][]uint32{}}
	d.configured(configured)
	d.children()
	d.parents()
	d.foreignKeys() // before views: a view over a table whose cascades are refused inherits the refusal
	d.views()
	return d.snapshot()
}

type deriver struct {
	c          *Catalog
	prot       map[uint32]*prot
	refused    map[uint32][]rewrite.Refused
	unresolved []string
	resolved   map[string][]uint32
	children_  map[uint32][]uint32 // parent -> partitions and inheritance children
}

func (d *deriver) rel(oid uint32) *Relation { return d.c.Relations[oid] }

func (d *deriver) label(oid uint32) string {
	if r := d.rel(oid); r != nil {
		return r.Label()
	}
	return fmt.Sprintf("relation %d", oid)
}

func (d *deriver) refuse(oid uint32, ops rewrite.Ops, table, reason string) {
	r := d.rel(oid)
	if r == nil {
		return
	}
	for _, f := range d.refused[oid] {
		if f.Ops == ops && f.Reason == reason {
			return
		}
	}
	d.refused[oid] = append(d.refused[oid], rewrite.Refused{Schema: r.Schema, Name: r.Name, Ops: ops, Table: table, Reason: reason})
}

// configured resolves the configured names: a bare name is every table of that name, a qualified one that
// table; the qualified one wins where both name a table.
func (d *deriver) configured(tables []rewrite.Table) {
	for _, qualified := range []bool{false, true} {
		for _, t := range tables {
			if (t.Schema != "") != qualified {
				continue
			}
			found := false
			for oid, r := range d.c.Relations {
				if r.Name != t.Name || (t.Schema != "" && r.Schema != t.Schema) || r.Kind == 'v' {
					continue
				}
				found = true
				d.resolved[t.Label()] = append(d.resolved[t.Label()], oid)
				d.prot[oid] = &prot{base: t, column: t.TokenColumn, origin: t.Label(), via: "configured", configured: true}
			}
			if !found {
				d.unresolved = append(d.unresolved, t.Label())
			}
		}
	}
	slices.Sort(d.unresolved)
}

// children protects every partition and inheritance child, recursively, with its protected ancestor's token
// column: a child has all of its parent's columns.
func (d *deriver) children() {
	d.children_ = map[uint32][]uint32{}
	for _, in := range d.c.Inherits {
		d.children_[in.Parent] = append(d.children_[in.Parent], in.Child)
	}
	queue := d.sortedProt()
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, child := range d.children_[p] {
			kind := "inheritance child"
			if d.rel(p) != nil && d.rel(p).Kind == 'p' {
				kind = "partition"
			}
			d.protect(child, d.prot[p], fmt.Sprintf("%s of %s", kind, d.label(p)))
			queue = append(queue, child)
		}
	}
}

// protect marks oid protected like from, or as a conflict when another token column already reaches it.
func (d *deriver) protect(oid uint32, from *prot, via string) bool {
	if cur := d.prot[oid]; cur != nil {
		if cur.column != from.column && !cur.configured && cur.conflict == "" {
			cur.conflict = fmt.Sprintf("is reached by two token columns, %s (from %s) and %s (from %s)", cur.column, cur.origin, from.column, from.origin)
		}
		return false
	}
	d.prot[oid] = &prot{base: from.base, column: from.column, origin: from.origin, via: via}
	return true
}

// parents: a write to a parent reaches its protected children (UPDATE and DELETE recurse, INSERT into a
// partitioned table routes). A parent that has the token column is protected with it (the rewrite through
// the parent checks and writes every child's rows); one that has not is refused.
func (d *deriver) parents() {
	parents := map[uint32][]uint32{}
	for _, in := range d.c.Inherits {
		parents[in.Child] = append(parents[in.Child], in.Parent)
	}
	seen := map[uint32]bool{}
	var up func(c uint32, from *prot, leaf uint32)
	up = func(c uint32, from *prot, leaf uint32) {
		for _, p := range parents[c] {
			if seen[p] {
				continue
			}
			seen[p] = true
			if d.prot[p] == nil {
				if r := d.rel(p); r != nil && r.hasColumn(from.column) {
					d.prot[p] = &prot{base: from.base, column: from.column, origin: from.origin, via: "parent of " + d.label(c)}
				} else {
					d.refuse(p, rewrite.OpsWrite, from.origin, fmt.Sprintf(
						"reaches the protected %s, its descendant, but has no token column %s to fence it by", d.label(leaf), from.column))
				}
			}
			up(p, from, leaf)
		}
	}
	for _, c := range d.sortedProt() {
		up(c, d.prot[c], c)
	}
}

// views: a write through an automatically updatable view writes its one base relation. Over a protected
// relation, the view is protected with the view's column that shows the token column, or refused when it
// shows none; a view whose writes run triggers or rules, or whose query the proxy cannot read, is refused.
// Views over views are followed to a fixed point.
func (d *deriver) views() {
	done := map[uint32]bool{}
	for changed := true; changed; {
		changed = false
		for _, v := range d.c.Views {
			if done[v.OID] {
				continue
			}
			var over []uint32
			for _, dep := range v.DependsOn {
				if d.prot[dep] != nil || len(d.refused[dep]) > 0 {
					over = append(over, dep)
				}
			}
			if len(over) == 0 {
				continue
			}
			done[v.OID] = true
			changed = true
			origin := d.originOf(over[0])
			if v.Redirected {
				d.refuse(v.OID, rewrite.OpsWrite, origin, fmt.Sprintf(
					"is a view over the protected %s with INSTEAD OF triggers or rules, whose writes the proxy cannot see", d.label(over[0])))
				continue
			}
			base, targets, ok := viewBase(v.Definition)
			if !ok {
				d.refuse(v.OID, rewrite.OpsWrite, origin, fmt.Sprintf(
					"is a view over the protected %s that the proxy cannot analyse", d.label(over[0])))
				continue
			}
			baseOID, found := d.resolveIn(v.DependsOn, base)
			if !found {
				d.refuse(v.OID, rewrite.OpsWrite, origin, fmt.Sprintf(
					"is a view over the protected %s whose base relation the proxy cannot identify", d.label(over[0])))
				continue
			}
			for _, f := range d.refused[baseOID] {
				// Writes through the view are writes to its base, refused for the same reason.
				d.refuse(v.OID, f.Ops, f.Table, fmt.Sprintf("is a view over %s, which %s", d.label(baseOID), f.Reason))
			}
			bp := d.prot[baseOID]
			if bp == nil {
				continue // it writes another relation, or one refused above
			}
			col := ""
			if vr := d.rel(v.OID); vr != nil {
				for i, t := range targets {
					if t == bp.column && i < len(vr.Columns) {
						col = vr.Columns[i]
						break
					}
				}
			}
			if col == "" {
				d.refuse(v.OID, rewrite.OpsWrite, bp.origin, fmt.Sprintf(
					"is a view over the protected %s that does not show its token column %s; add the column to the view or write %s",
					d.label(baseOID), bp.column, d.label(baseOID)))
				continue
			}
			d.prot[v.OID] = &prot{base: bp.base, column: col, origin: bp.origin, via: "view over " + d.label(baseOID)}
		}
	}
}

// originOf is the configured table a protected or refused relation is about.
func (d *deriver) originOf(oid uint32) string {
	if p := d.prot[oid]; p != nil {
		return p.origin
	}
	if fs := d.refused[oid]; len(fs) > 0 {
		return fs[0].Table
	}
	return ""
}

// resolveIn finds the relation a view's FROM names among the relations it depends on.
func (d *deriver) resolveIn(deps []uint32, rv *pg.RangeVar) (uint32, bool) {
	for _, oid := range deps {
		r := d.rel(oid)
		if r != nil && r.Name == rv.Relname && (rv.Schemaname == "" || rv.Schemaname == r.Schema) {
			return oid, true
		}
	}
	return 0, false
}

// viewBase parses a view's definition: its single FROM relation, and for each output column the base column
// it shows ("" for an expression).
func viewBase(def string) (*pg.RangeVar, []string, bool) {
	tree, err := pg.Parse(def)
	if err != nil || len(tree.Stmts) != 1 {
		return nil, nil, false
	}
	sel := tree.Stmts[0].Stmt.GetSelectStmt()
	if sel == nil || sel.Op != pg.SetOperation_SETOP_NONE || len(sel.FromClause) != 1 {
		return nil, nil, false
	}
	rv := sel.FromClause[0].GetRangeVar()
	if rv == nil {
		return nil, nil, false
	}
	targets := make([]string, len(sel.TargetList))
	for i, n := range sel.TargetList {
		rt := n.GetResTarget()
		if rt == nil {
			return nil, nil, false
		}
		cr := rt.Val.GetColumnRef()
		if cr == nil || len(cr.Fields) == 0 {
			continue
		}
		if s := cr.Fields[len(cr.Fields)-1].GetString_(); s != nil {
			targets[i] = s.Sval
		}
	}
	return rv, targets, true
}

// foreignKeys refuses DELETE and UPDATE of tables whose foreign-key actions reach a protected table without
// the guard (cascaded rows are changed by the server, unseen by the proxy), and TRUNCATE ... CASCADE of tables
// that reach one through any foreign key.
func (d *deriver) foreignKeys() {
	byReferenced := map[uint32][]ForeignKey{}
	for _, fk := range d.c.ForeignKeys {
		byReferenced[fk.Referenced] = append(byReferenced[fk.Referenced], fk)
	}
	bad := d.cascading(byReferenced)
	for _, x := range sortedKeys(byReferenced) {
		for _, op := range cascadeOps {
			if !bad[cascadeState{x, op}] {
				continue
			}
			hit, path := d.reach(x, op, byReferenced)
			if hit == 0 {
				continue
			}
			p := d.prot[hit]
			ops, what := op, ""
			switch op {
			case rewrite.OpDelete:
				ops, what = rewrite.OpDelete|rewrite.OpMerge, "deletes"
			case rewrite.OpUpdate:
				ops, what = rewrite.OpUpdate|rewrite.OpMerge, "updates"
			case rewrite.OpTruncateCascade:
				what = "truncates"
			}
			d.refuse(x, ops, p.origin, fmt.Sprintf("%s rows of the protected %s through %s, unfenced, and the guard is not installed there (fenceproxy install)",
				what, d.label(hit), path))
		}
	}
}

var cascadeOps = []rewrite.Ops{rewrite.OpDelete, rewrite.OpUpdate, rewrite.OpTruncateCascade}

// cascadeState is a write of one kind (delete, update, truncate cascade) to one relation.
type cascadeState struct {
	rel uint32
	op  rewrite.Ops
}

// cascadeNext is the write that a foreign-key action makes of the referencing table when the referenced one
// gets op; 0 when the action writes nothing (NO ACTION, RESTRICT fail instead).
func cascadeNext(op rewrite.Ops, fk ForeignKey) rewrite.Ops {
	action := fk.OnDelete
	if op == rewrite.OpUpdate {
		action = fk.OnUpdate
	}
	switch {
	case op == rewrite.OpTruncateCascade:
		return rewrite.OpTruncateCascade // every referencing table is truncated too
	case action == 'c' && op == rewrite.OpDelete:
		return rewrite.OpDelete
	case action == 'c' || action == 'n' || action == 'd':
		return rewrite.OpUpdate
	}
	return 0
}

// unguardedFor reports whether a write of kind next to the protected rel goes unchecked by the guard.
func (d *deriver) unguardedFor(rel uint32, next rewrite.Ops) bool {
	if d.prot[rel] == nil {
		return false
	}
	g := d.c.Guards[rel]
	if next == rewrite.OpTruncateCascade {
		return !g.Truncate
	}
	return !g.Rows
}

// cascading is every write state that reaches, through foreign-key actions and down inheritance trees, a
// protected table without the guard: found backwards from those tables, in time linear in the catalog.
func (d *deriver) cascading(byReferenced map[uint32][]ForeignKey) map[cascadeState]bool {
	reverse := map[cascadeState][]cascadeState{}
	bad := map[cascadeState]bool{}
	var queue []cascadeState
	mark := func(s cascadeState) {
		if !bad[s] {
			bad[s] = true
			queue = append(queue, s)
		}
	}
	for _, fks := range byReferenced {
		for _, fk := range fks {
			for _, op := range cascadeOps {
				next := cascadeNext(op, fk)
				if next == 0 {
					continue
				}
				from := cascadeState{fk.Referenced, op}
				if d.unguardedFor(fk.Referencing, next) {
					mark(from)
				}
				to := cascadeState{fk.Referencing, next}
				reverse[to] = append(reverse[to], from)
			}
		}
	}
	// A write to a parent writes its partitions and children.
	for _, in := range d.c.Inherits {
		for _, op := range cascadeOps {
			to := cascadeState{in.Child, op}
			reverse[to] = append(reverse[to], cascadeState{in.Parent, op})
		}
	}
	for i := 0; i < len(queue); i++ {
		for _, from := range reverse[queue[i]] {
			mark(from)
		}
	}
	return bad
}

// reach walks the actions op on x sets off (and on x's descendants, which DELETE, UPDATE and TRUNCATE of x
// also write) and returns the first protected table without the guard they change, with the path.
func (d *deriver) reach(x uint32, op rewrite.Ops, byReferenced map[uint32][]ForeignKey) (uint32, string) {
	type state struct {
		rel  uint32
		op   rewrite.Ops
		prev int // index of the state this one was reached from, -1 for a start
		via  string
	}
	var states []state // breadth-first queue; kept whole to rebuild the path of a hit
	seen := map[[2]uint32]bool{}
	push := func(rel uint32, op rewrite.Ops, prev int, via string) {
		for _, r := range d.descendants(rel) {
			if !seen[[2]uint32{r, uint32(op)}] {
				seen[[2]uint32{r, uint32(op)}] = true
				states = append(states, state{r, op, prev, via})
			}
		}
	}
	path := func(i int, last string) string {
		parts := []string{last}
		for ; i >= 0; i = states[i].prev {
			if states[i].via != "" {
				parts = append(parts, states[i].via)
			}
		}
		slices.Reverse(parts)
		return strings.Join(parts, ", ")
	}
	push(x, op, -1, "")
	for i := 0; i < len(states); i++ {
		s := states[i]
		for _, fk := range byReferenced[s.rel] {
			next := cascadeNext(s.op, fk)
			if next == 0 {
				continue
			}
			action := fk.OnDelete
			if s.op == rewrite.OpUpdate {
				action = fk.OnUpdate
			}
			via := fmt.Sprintf("foreign key %s of %s (%s)", fk.Name, d.label(fk.Referencing), actionText(s.op, action))
			if d.unguardedFor(fk.Referencing, next) {
				return fk.Referencing, path(i, via)
			}
			push(fk.Referencing, next, i, via)
		}
	}
	return 0, ""
}

func actionText(op rewrite.Ops, action byte) string {
	if op == rewrite.OpTruncateCascade {
		return "TRUNCATE CASCADE"
	}
	on := "ON DELETE"
	if op == rewrite.OpUpdate {
		on = "ON UPDATE"
	}
	switch action {
	case 'c':
		return on + " CASCADE"
	case 'n':
		return on + " SET NULL"
	case 'd':
		return on + " SET DEFAULT"
	}
	return on
}

// descendants is oid and its partitions and inheritance children, recursively.
func (d *deriver) descendants(oid uint32) []uint32 {
	out := []uint32{oid}
	for i := 0; i < len(out); i++ {
		for _, c := range d.children_[out[i]] {
			if !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	return out
}

func (d *deriver) sortedProt() []uint32 { return sortedKeys(d.prot) }

func sortedKeys[V any](m map[uint32]V) []uint32 {
	keys := make([]uint32, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func (d *deriver) snapshot() *Snapshot {
	s := &Snapshot{Unresolved: d.unresolved, Resolved: d.resolved, Catalog: d.c, ReadAt: d.c.ReadAt}
	for _, oids := range s.Resolved {
		slices.Sort(oids)
	}
	for _, oid := range d.sortedProt() {
		p, r := d.prot[oid], d.rel(oid)
		if p.conflict != "" {
			d.refuse(oid, rewrite.OpsWrite, p.origin, p.conflict)
			continue
		}
		if p.configured {
			continue
		}
		t := p.base // settings of the configured table (all but the names) apply to what derives from it
		t.Schema, t.Name, t.TokenColumn = r.Schema, r.Name, p.column
		s.Protected = append(s.Protected, Protected{
			Table: t,
			OID:   oid, Origin: p.origin, Via: p.via,
		})
	}
	for _, oid := range sortedKeys(d.refused) {
		s.Refused = append(s.Refused, d.refused[oid]...)
	}
	slices.SortStableFunc(s.Protected, func(a, b Protected) int {
		return strings.Compare(a.Table.Label(), b.Table.Label())
	})
	return s
}
