package catalog

import (
	"strings"
	"testing"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

func rel(oid uint32, name string, kind byte, cols ...string) *Relation {
	return &Relation{OID: oid, Schema: "s", Name: name, Kind: kind, Columns: cols}
}

func refusedFor(s *Snapshot, name string) []rewrite.Refused {
	var out []rewrite.Refused
	for _, f := range s.Refused {
		if f.Name == name {
			out = append(out, f)
		}
	}
	return out
}

func protectedAs(s *Snapshot, name string) (string, bool) {
	for _, p := range s.Protected {
		if p.Table.Name == name {
			return p.Table.TokenColumn, true
		}
	}
	return "", false
}

// A child of two protected parents with different token columns cannot be fenced by either: refused.
func TestDeriveConflictingColumns(t *testing.T) {
	c := &Catalog{Relations: map[uint32]*Relation{
		1: rel(1, "a", 'r', "id", "ta"), 2: rel(2, "b", 'r', "id", "tb"), 3: rel(3, "ab", 'r', "id", "ta", "tb"),
	}, Inherits: []Inherit{{Child: 3, Parent: 1}, {Child: 3, Parent: 2}}}
	s := Derive(c, []rewrite.Table{{Schema: "s", Name: "a", TokenColumn: "ta"}, {Schema: "s", Name: "b", TokenColumn: "tb"}})
	if _, ok := protectedAs(s, "ab"); ok {
		t.Fatalf("ab protected with one column: %+v", s.Protected)
	}
	if f := refusedFor(s, "ab"); len(f) != 1 || f[0].Ops != rewrite.OpsWrite || !strings.Contains(f[0].Reason, "two token columns") {
		t.Fatalf("ab refusals: %+v", f)
	}
}

// Views over views follow the token column through renames; cascades stop at a guarded table but go on past
// an unprotected one.
func TestDeriveViewsAndCascades(t *testing.T) {
	c := &Catalog{
		Relations: map[uint32]*Relation{
			1: rel(1, "t", 'r', "id", "fence_token", "p"),
			2: rel(2, "v1", 'v', "id", "tok"),
			3: rel(3, "v2", 'v', "k", "tok2"),
			4: rel(4, "parent", 'r', "id"),
			5: rel(5, "mid", 'r', "id", "parent_id"),
			6: rel(6, "g", 'r', "id", "fence_token", "p"),
			7: rel(7, "gparent", 'r', "id"),
		},
		Views: []View{
			{OID: 3, Definition: "SELECT v1.id AS k, v1.tok AS tok2 FROM s.v1", DependsOn: []uint32{2}},
			{OID: 2, Definition: "SELECT t.id, t.fence_token AS tok FROM s.t WHERE t.id > 0", DependsOn: []uint32{1}},
		},
		ForeignKeys: []ForeignKey{
			{Name: "mid_parent", Referencing: 5, Referenced: 4, OnDelete: 'c', OnUpdate: 'a'},
			{Name: "t_mid", Referencing: 1, Referenced: 5, OnDelete: 'n', OnUpdate: 'a'},
			{Name: "g_gparent", Referencing: 6, Referenced: 7, OnDelete: 'c', OnUpdate: 'c'},
		},
		Guards: map[uint32]Guard{6: {Rows: true}},
	}
	s := Derive(c, []rewrite.Table{{Schema: "s", Name: "t", TokenColumn: "fence_token"}, {Schema: "s", Name: "g", TokenColumn: "fence_token"}})
	if col, ok := protectedAs(s, "v1"); !ok || col != "tok" {
		t.Fatalf("v1: %q %v", col, ok)
	}
	if col, ok := protectedAs(s, "v2"); !ok || col != "tok2" {
		t.Fatalf("v2: %q %v", col, ok)
	}
	f := refusedFor(s, "parent")
	if len(f) != 2 || f[0].Ops != rewrite.OpDelete|rewrite.OpMerge || !strings.Contains(f[0].Reason, "foreign key mid_parent of s.mid (ON DELETE CASCADE), foreign key t_mid of s.t (ON DELETE SET NULL)") ||
		f[1].Ops != rewrite.OpTruncateCascade {
		t.Fatalf("parent refusals: %+v", f)
	}
	if f := refusedFor(s, "gparent"); len(f) != 1 || f[0].Ops != rewrite.OpTruncateCascade {
		t.Fatalf("gparent: the row guard on g covers DELETE and UPDATE, not TRUNCATE CASCADE: %+v", f)
	}
}
