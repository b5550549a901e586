package rewrite

import (
	"strings"
	"testing"
)

// Refused relations: each statement kind is refused exactly for the ops listed, by qualified and unqualified
// name (search_path is unknown), and the prefilter lets text naming them reach the analysis.
func TestRefusedRelations(t *testing.T) {
	r, err := New(Config{
		Tables: []Table{{Schema: "public", Name: "accounts", TokenColumn: "fence_token"}},
		Refused: []Refused{
			{Schema: "public", Name: "v_plain", Ops: OpsWrite, Table: "public.accounts", Reason: "is a view without the token column"},
			{Schema: "public", Name: "customers", Ops: OpDelete | OpMerge, Table: "public.accounts", Reason: "cascades"},
			{Schema: "public", Name: "customers", Ops: OpTruncateCascade, Table: "public.accounts", Reason: "truncates"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		sql    string
		refuse bool
	}{
		{"UPDATE v_plain SET a = 1", true},
		{"INSERT INTO public.v_plain (a) VALUES (1)", true},
		{"delete from V_PLAIN", true},
		{`DELETE FROM "v_plain"`, true},
		{"WITH x AS (DELETE FROM v_plain RETURNING 1) SELECT * FROM x", true},
		{"COPY v_plain FROM STDIN", true},
		{"DO $$BEGIN DELETE FROM v_plain; END$$", true},
		{"UPDATE other.v_plain SET a = 1", false}, // another schema's relation of that name
		{"SELECT * FROM v_plain", false},
		{"DELETE FROM customers WHERE id = 1", true},
		{"MERGE INTO customers c USING s ON c.id = s.id WHEN MATCHED THEN DELETE", true},
		{"UPDATE customers SET name = 'x'", false},
		{"INSERT INTO customers (id) VALUES (1)", false},
		{"INSERT INTO customers (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET id = 2", false},
		{"TRUNCATE customers", false},
		{"TRUNCATE customers CASCADE", true},
		{"TRUNCATE other, public.customers CASCADE", true},
		{"TRUNCATE other.customers CASCADE", false},
	}
	for _, c := range cases {
		if !r.MayTouch([]byte(c.sql)) && c.refuse {
			t.Errorf("%s: the prefilter skips it", c.sql)
			continue
		}
		p := r.plan(c.sql, false, false)
		if (p.Action == Refuse) != c.refuse {
			t.Errorf("%s: action %v (%s), want refused=%v", c.sql, p.Action, p.Message, c.refuse)
			continue
		}
		if c.refuse && (p.Code != CodeUnfenceable || p.Table != "public.accounts" || !strings.HasPrefix(p.Message, "unfenceable write: ")) {
			t.Errorf("%s: refusal %+v", c.sql, p)
		}
	}
	// A write to the protected table itself is still fenced, and a refusal elsewhere in the text wins.
	if p := r.plan("UPDATE accounts SET balance = 1", false, false); p.Action != Rewrite {
		t.Errorf("protected write: %v %s", p.Action, p.Message)
	}
	if p := r.plan("UPDATE accounts SET balance = 1; DELETE FROM customers", false, false); p.Action != Refuse {
		t.Errorf("protected write and a cascading delete: %v", p.Action)
	}
	if _, err := New(Config{Refused: []Refused{{Name: "x"}}}); err == nil {
		t.Error("a refusal without ops and reason was accepted")
	}
}

// The prefilter keeps the shortest of names that contain one another, and still finds every one of them.
func TestPrefilterCatalogNames(t *testing.T) {
	var tables []Table
	for _, n := range []string{"accounts_2024_01", "accounts", "accounts_2024_02", "ledger", "x_accounts_v"} {
		tables = append(tables, Table{Schema: "public", Name: n, TokenColumn: "fence_token"})
	}
	got := prefilterTables(tables, []Refused{{Schema: "public", Name: "ledger_parent", Ops: OpsWrite, Table: "ledger", Reason: "r"}})
	var names []string
	for _, g := range got {
		names = append(names, g.Name)
	}
	if strings.Join(names, ",") != "accounts_2024_01,accounts,accounts_2024_02,ledger,x_accounts_v,ledger_parent" {
		t.Fatalf("prefilter names %v, want every configured and catalog name (identifiers are compared whole)", names)
	}
	r, err := New(Config{Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{"UPDATE accounts_2024_02 SET a = 1", `DELETE FROM ACCOUNTS_2024_01`, `DELETE FROM "accounts_2024_01"`, "insert into X_ACCOUNTS_V (a) values (1)"} {
		if !r.MayTouch([]byte(sql)) {
			t.Errorf("%s: the prefilter skips it", sql)
		}
	}
}
