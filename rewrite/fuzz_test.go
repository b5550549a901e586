package rewrite

import (
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzPlan: no panic; Pass only for text that writes no protected table (or
// does not parse and does not mention one); every Rewrite re-parses and
// passes verifyFenced; Refuse carries a contract code and message; the cache
// agrees with Plan. The seed corpus (testdata/fuzz/FuzzPlan and the golden
// inputs) runs as part of go test.
func FuzzPlan(f *testing.F) {
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.sql"))
	if err != nil {
		f.Fatal(err)
	}
	for _, path := range files {
		f.Add(readGolden(f, path).input)
	}
	r := testRewriter(f)
	cache := NewCache(r, 64)
	f.Fuzz(func(t *testing.T, sql string) {
		if !utf8.ValidString(sql) || strings.ContainsRune(sql, 0) {
			t.Skip() // the proxy receives NUL-terminated, client-encoded text
		}
		p := r.Plan(sql)
		checkPlan(t, r, sql, p)
		c := cache.Plan([]byte(sql), DefaultSettings)
		if c.Action != p.Action || c.SQL != p.SQL && !(c.Action == Pass && c.SQL == "") && !sameRewrite(c, p) || c.Message != p.Message {
			t.Errorf("Cache.Plan = %+v, Plan = %+v", c, p)
		}
		if !r.MayTouch([]byte(sql)) && p.Action != Pass {
			t.Errorf("MayTouch false but %v", p.Action)
		}
	})
}

// sameRewrite: two rewrites that parse to the same tree (a plan from the
// shape cache is spelled differently from the full rewrite).
func sameRewrite(a, b Plan) bool {
	if a.Action != Rewrite || b.Action != Rewrite {
		return false
	}
	same, err := sameParse(a.SQL, b.SQL)
	return err == nil && same
}
