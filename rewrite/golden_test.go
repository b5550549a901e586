package rewrite

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/rewrite with the current output")

// goldenDir holds the golden files, at the repository root.
const goldenDir = "../testdata/rewrite"

// testConfig is the configuration all golden files are written against.
func testConfig() Config {
	return Config{Tables: []Table{
		{Name: "accounts", TokenColumn: "fence_token"},                              // bare: any schema
		{Schema: "public", Name: "ledger", TokenColumn: "fence"},                    // qualified
		{Name: "Audit", TokenColumn: "fence_token"},                                 // quoted, mixed case
		{Schema: "a", Name: "dup", TokenColumn: "t1"},                               // same name, two schemas,
		{Schema: "b", Name: "dup", TokenColumn: "t2"},                               // different token columns
		{Name: "strict", TokenColumn: "fence_token", RefuseTokenColumnWrites: true}, // token_column_writes: refuse
	}}
}

func testRewriter(t testing.TB) *Rewriter {
	t.Helper()
	r, err := New(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A golden file is:
//
//	-- free description lines
//	-- input:
//	<SQL>
//	-- output:
//	<formatPlan of the plan>
type golden struct {
	path, head, input, output string
}

func readGolden(t testing.TB, path string) golden {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	head, rest, ok1 := strings.Cut(s, "-- input:\n")
	input, output, ok2 := strings.Cut(rest, "\n-- output:\n")
	if !ok1 || !ok2 {
		t.Fatalf("%s: want '-- input:' and '-- output:' lines", path)
	}
	return golden{path: path, head: head, input: input, output: output}
}

func goldenFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.sql"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files in %s (%v)", goldenDir, err)
	}
	return files
}

// fragmentTexts maps the deparsed text of each table's token expression k and
// light token to a short name, so golden files stay readable. The replacement
// is exact: if the fragments deparse differently, every golden file differs.
// fragments.txt holds their full text.
func fragmentTexts(t testing.TB, r *Rewriter) *strings.Replacer {
	t.Helper()
	var pairs []string
	for _, e := range r.tables {
		for _, f := range []struct {
			name string
			node *pg.Node
		}{{"k", e.token}, {"light", e.light}} {
			pairs = append(pairs, deparseExpr(t, f.node), fmt.Sprintf("{{%s %s}}", f.name, e.label))
		}
	}
	// The statement's token reads the same for every table.
	pairs = append(pairs, deparseExpr(t, r.tables[0].ref), "{{t}}")
	return strings.NewReplacer(pairs...)
}

func deparseExpr(t testing.TB, n *pg.Node) string {
	t.Helper()
	base, err := pg.Parse("SELECT 1")
	if err != nil {
		t.Fatal(err)
	}
	tree := &pg.ParseResult{Version: base.Version, Stmts: []*pg.RawStmt{{Stmt: &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: &pg.SelectStmt{
		TargetList:  []*pg.Node{pg.MakeResTargetNodeWithVal(n, 0)},
		LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT,
		Op:          pg.SetOperation_SETOP_NONE,
	}}}}}}
	s, err := pg.Deparse(tree)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(s, "SELECT ")
}

// formatPlan renders a plan for a golden file.
func formatPlan(p Plan, abbrev *strings.Replacer) string {
	var b strings.Builder
	fmt.Fprintf(&b, "-- action: %s\n", p.Action)
	if p.Action == Refuse {
		fmt.Fprintf(&b, "-- code: %s\n", p.Code)
		if p.Table != "" {
			fmt.Fprintf(&b, "-- table: %s\n", p.Table)
		}
		fmt.Fprintf(&b, "-- message: %s\n", p.Message)
		return b.String()
	}
	if len(p.Tables) > 0 {
		fmt.Fprintf(&b, "-- tables: %s\n", strings.Join(p.Tables, ", "))
	}
	if p.TokenSet {
		fmt.Fprintf(&b, "-- token: %d\n", p.Token)
	}
	if p.TokenDynamic {
		b.WriteString("-- token: dynamic\n")
	}
	if p.Action == Rewrite {
		sql := p.SQL
		if abbrev != nil {
			sql = abbrev.Replace(sql)
		}
		b.WriteString(sql + "\n")
	}
	return b.String()
}

func TestGolden(t *testing.T) {
	r := testRewriter(t)
	cache := NewCache(r, 16)
	abbrev := fragmentTexts(t, r)
	checkFragmentsFile(t, r)
	for _, path := range goldenFiles(t) {
		g := readGolden(t, path)
		t.Run(strings.TrimSuffix(filepath.Base(path), ".sql"), func(t *testing.T) {
			p := r.Plan(g.input)
			got := formatPlan(p, abbrev)
			if *update {
				if err := os.WriteFile(path, []byte(g.head+"-- input:\n"+g.input+"\n-- output:\n"+got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if got != g.output {
				t.Errorf("input:\n%s\ngot:\n%s\nwant:\n%s", g.input, got, g.output)
			}
			checkPlan(t, r, g.input, p)
			if c := cache.Plan([]byte(g.input), DefaultSettings); formatPlan(c, abbrev) != got {
				t.Errorf("Cache.Plan differs from Plan:\n%s", formatPlan(c, abbrev))
			}
		})
	}
}

// checkFragmentsFile compares fragments.txt, the full text of the abbreviated
// fragments, with their deparsed text.
func checkFragmentsFile(t *testing.T, r *Rewriter) {
	var b strings.Builder
	b.WriteString("-- The fragments abbreviated in the golden files, as deparsed (one per line).\n")
	fmt.Fprintf(&b, "{{t}} = %s\n", deparseExpr(t, r.tables[0].ref))
	for _, e := range r.tables {
		fmt.Fprintf(&b, "{{k %s}} = %s\n", e.label, deparseExpr(t, e.token))
		fmt.Fprintf(&b, "{{light %s}} = %s\n", e.label, deparseExpr(t, e.light))
	}
	path := filepath.Join(goldenDir, "fragments.txt")
	if *update {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != b.String() {
		t.Errorf("%s is out of date; got:\n%s", path, b.String())
	}
}

// checkPlan asserts the invariants every plan must satisfy.
func checkPlan(t testing.TB, r *Rewriter, input string, p Plan) {
	t.Helper()
	switch p.Action {
	case Pass:
		if p.SQL != input {
			t.Errorf("Pass must return the original text, got %q", p.SQL)
		}
		// Nothing protected may be written by what passes: the parse tree
		// (when there is one) has no protected write at all, fenced or not.
		if tree, err := pg.Parse(input); err == nil {
			if w := protectedWrites(r, tree); len(w) > 0 {
				t.Errorf("Pass of a statement that writes %v", w)
			}
		} else if r.MayTouch([]byte(input)) && r.mentions(input) != "" {
			// Unparsable text that may write (a write keyword and a protected
			// name) must be refused; without a write keyword it cannot write.
			t.Errorf("Pass of unparsable text mentioning a protected table: %v", err)
		}
	case Rewrite:
		tree, err := pg.Parse(p.SQL)
		if err != nil {
			t.Fatalf("rewritten SQL does not parse: %v\n%s", err, p.SQL)
		}
		if err := verifyFenced(r, tree, false); err != nil {
			t.Errorf("rewritten SQL is not fenced: %v\n%s", err, p.SQL)
		}
		if len(protectedWrites(r, tree)) == 0 {
			t.Errorf("Rewrite without a protected write:\n%s", p.SQL)
		}
		if len(p.Tables) == 0 {
			t.Errorf("Rewrite without Tables")
		}
	case Refuse:
		if p.Code != CodeUnfenceable && p.Code != CodeInvalid {
			t.Errorf("refusal code %q", p.Code)
		}
		want := map[string]string{CodeUnfenceable: "unfenceable write", CodeInvalid: "invalid fencing token"}[p.Code]
		if !strings.HasPrefix(p.Message, want) {
			t.Errorf("message %q does not start with %q", p.Message, want)
		}
		if p.Code == CodeUnfenceable && p.Table == "" && !strings.Contains(p.Message, "unicode") {
			t.Errorf("55F04 without a table: %q", p.Message)
		}
	default:
		t.Errorf("unknown action %v", p.Action)
	}
	if p.TokenSet {
		if p.Token < 1 {
			t.Errorf("TokenSet with invalid token %d", p.Token)
		}
	}
}

// protectedWrites lists the labels of protected tables that the tree writes
// with INSERT, UPDATE, DELETE, MERGE, TRUNCATE or COPY FROM.
func protectedWrites(r *Rewriter, tree *pg.ParseResult) []string {
	var out []string
	add := func(rv *pg.RangeVar) {
		if e, p := r.lookup(rv); e != nil {
			out = append(out, e.label)
		} else if p != nil {
			out = append(out, rv.Relname)
		}
	}
	for _, raw := range tree.Stmts {
		nodesOutsideBodies(raw.Stmt.ProtoReflect(), func(n *pg.Node) {
			switch {
			case n.GetUpdateStmt() != nil:
				add(n.GetUpdateStmt().Relation)
			case n.GetDeleteStmt() != nil:
				add(n.GetDeleteStmt().Relation)
			case n.GetInsertStmt() != nil:
				add(n.GetInsertStmt().Relation)
			case n.GetMergeStmt() != nil:
				add(n.GetMergeStmt().Relation)
			case n.GetTruncateStmt() != nil:
				for _, rv := range n.GetTruncateStmt().Relations {
					add(rv.GetRangeVar())
				}
			case n.GetCopyStmt() != nil && n.GetCopyStmt().IsFrom:
				add(n.GetCopyStmt().Relation)
			}
		})
	}
	return out
}

// nodesOutsideBodies calls fn for every Node under m except inside CREATE
// RULE actions and CREATE FUNCTION bodies (a documented limit). It is written
// independently of walkStatement, on purpose. So the oracle lets such a
// statement pass although its body writes a protected table: that write runs
// later, inside the server, and is the in-database guard's to fence
// (fenceproxy install; a rule ON a protected table is refused as DDL).
func nodesOutsideBodies(m protoreflect.Message, fn func(*pg.Node)) {
	switch x := m.Interface().(type) {
	case *pg.Node:
		fn(x)
	case *pg.RuleStmt:
		return
	case *pg.CreateFunctionStmt:
		m = (&pg.CreateFunctionStmt{Options: x.Options}).ProtoReflect()
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Kind() != protoreflect.MessageKind || fd.IsMap():
		case fd.IsList():
			for i := 0; i < v.List().Len(); i++ {
				nodesOutsideBodies(v.List().Get(i).Message(), fn)
			}
		default:
			nodesOutsideBodies(v.Message(), fn)
		}
		return true
	})
}
