package rewrite

import (
	"fmt"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
)

const (
	benchUpdate = "UPDATE accounts SET balance = balance + 1 WHERE id = $1"
	benchRead   = "SELECT u.id, u.name, o.total FROM users u JOIN orders o ON o.user_id = u.id WHERE u.id = $1 AND o.created > now() - interval '1 day' ORDER BY o.created DESC LIMIT 20"
)

// BenchmarkPlanMiss is a cache miss on a protected UPDATE: prefilter, parse,
// fence, deparse, re-parse and verify.
func BenchmarkPlanMiss(b *testing.B) {
	r := testRewriter(b)
	b.ReportAllocs()
	for b.Loop() {
		if p := r.Plan(benchUpdate); p.Action != Rewrite {
			b.Fatal(p)
		}
	}
}

// BenchmarkPlanMissVerify is BenchmarkPlanMiss with Config.Verify.
func BenchmarkPlanMissVerify(b *testing.B) {
	cfg := testConfig()
	cfg.Verify = true
	r, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if p := r.Plan(benchUpdate); p.Action != Rewrite {
			b.Fatal(p)
		}
	}
}

// BenchmarkCacheHit is the steady state of the proxy for a protected write.
func BenchmarkCacheHit(b *testing.B) {
	c := NewCache(testRewriter(b), 1024)
	sql := []byte(benchUpdate)
	c.Plan(sql, DefaultSettings)
	b.ReportAllocs()
	for b.Loop() {
		if p := c.Plan(sql, DefaultSettings); p.Action != Rewrite {
			b.Fatal(p)
		}
	}
}

// BenchmarkCacheHitParallel measures contention on the sharded cache.
func BenchmarkCacheHitParallel(b *testing.B) {
	c := NewCache(testRewriter(b), 1024)
	sql := []byte(benchUpdate)
	c.Plan(sql, DefaultSettings)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if p := c.Plan(sql, DefaultSettings); p.Action != Rewrite {
				b.Error(p)
				return
			}
		}
	})
}

// BenchmarkMayTouch is the prefilter on a statement it rules out, which is
// what most traffic costs.
func BenchmarkMayTouch(b *testing.B) {
	r := testRewriter(b)
	sql := []byte(benchRead)
	b.SetBytes(int64(len(sql)))
	b.ReportAllocs()
	for b.Loop() {
		if r.MayTouch(sql) {
			b.Fatal("matched")
		}
	}
}

func TestZeroAllocs(t *testing.T) {
	r := testRewriter(t)
	c := NewCache(r, 1024)
	hit := []byte(benchUpdate)
	c.Plan(hit, DefaultSettings)
	read := []byte(benchRead)
	for name, fn := range map[string]func(){
		"cache hit":          func() { c.Plan(hit, DefaultSettings) },
		"MayTouch":           func() { r.MayTouch(read) },
		"Cache.Plan on read": func() { c.Plan(read, DefaultSettings) },
	} {
		if n := testing.AllocsPerRun(1000, fn); n != 0 {
			t.Errorf("%s: %v allocations, want 0", name, n)
		}
	}
}

// BenchmarkReadWrite is the reading of a protected UPDATE on a cache miss: the raw prefilter, decoding
// (none for UTF-8) and the lexer's token prefilter, before pg_query.
func BenchmarkReadWrite(b *testing.B) {
	r := testRewriter(b)
	sql := []byte(benchUpdate)
	b.SetBytes(int64(len(sql)))
	b.ReportAllocs()
	for b.Loop() {
		if rd := r.read(sql, DefaultSettings); !rd.touch {
			b.Fatal("not touched")
		}
	}
}

// BenchmarkReadSJIS is BenchmarkReadWrite for an SJIS client writing non-ASCII text (decoded and checked by
// a round trip).
func BenchmarkReadSJIS(b *testing.B) {
	r := testRewriter(b)
	sql := []byte("UPDATE accounts SET note = '\x83\x5c\x95\x5c' WHERE id = $1")
	set := Settings{ClientEncoding: "SJIS", ServerEncoding: "UTF8", StandardConformingStrings: true}
	b.SetBytes(int64(len(sql)))
	b.ReportAllocs()
	for b.Loop() {
		if rd := r.read(sql, set); !rd.touch {
			b.Fatal("not touched", rd.why)
		}
	}
}

// BenchmarkShapeHit is the steady state for code that inlines its values:
// every text is new, its shape is cached.
func BenchmarkShapeHit(b *testing.B) {
	c := NewCache(testRewriter(b), 1024)
	texts := make([][]byte, 1024)
	for i := range texts {
		texts[i] = []byte(fmt.Sprintf("UPDATE accounts SET balance = balance + %d WHERE id = %d", i-512, i*7919))
	}
	c.Plan(texts[0], DefaultSettings)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if p := c.Plan(texts[i%len(texts)], DefaultSettings); p.Action != Rewrite {
			b.Fatal(p)
		}
		i++
	}
}

// BenchmarkMissParts splits a miss of the TPC-B accounts UPDATE with
// literals into its parts: the reading (decode, lex, prefilter), pg_query's
// parse (cgo and protobuf), the fence on the tree, and the deparse.
func BenchmarkMissParts(b *testing.B) {
	r := testRewriter(b)
	sql := "UPDATE accounts SET balance = balance + -4211 WHERE id = 712345"
	b.Run("read", func(b *testing.B) {
		for b.Loop() {
			r.read([]byte(sql), DefaultSettings)
		}
	})
	b.Run("parse", func(b *testing.B) {
		for b.Loop() {
			if _, err := pg.Parse(sql); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parse+fence", func(b *testing.B) {
		for b.Loop() {
			tree, _ := pg.Parse(sql)
			a := &analysis{r: r}
			for _, raw := range tree.Stmts {
				a.statement(raw.Stmt)
			}
			for _, w := range a.writes {
				w.fence(a)
			}
		}
	})
	tree, _ := pg.Parse(sql)
	a := &analysis{r: r}
	for _, raw := range tree.Stmts {
		a.statement(raw.Stmt)
	}
	for _, w := range a.writes {
		w.fence(a)
	}
	b.Run("deparse", func(b *testing.B) {
		for b.Loop() {
			if _, err := pg.Deparse(tree); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("full", func(b *testing.B) {
		for b.Loop() {
			r.Plan(sql)
		}
	})
}

// tpcbTexts are the statements of pgbench's TPC-B-like transaction in simple-query mode (values inlined), n of
// each, with pgbench_accounts protected: one fenced UPDATE and six statements the prefilter or the cache must
// pass cheaply.
func tpcbTexts(n int) map[string][][]byte {
	texts := make(map[string][][]byte)
	for i := 0; i < n; i++ {
		aid, bid, tid, delta := 1+i*7919%1000000, 1+i%10, 1+i*31%100, i*2654435761%10001-5000
		add := func(name, format string, args ...any) {
			texts[name] = append(texts[name], []byte(fmt.Sprintf(format, args...)))
		}
		add("begin", "BEGIN;")
		add("accounts", "UPDATE pgbench_accounts SET abalance = abalance + %d WHERE aid = %d;", delta, aid)
		add("select", "SELECT abalance FROM pgbench_accounts WHERE aid = %d;", aid)
		add("tellers", "UPDATE pgbench_tellers SET tbalance = tbalance + %d WHERE tid = %d;", delta, tid)
		add("branches", "UPDATE pgbench_branches SET bbalance = bbalance + %d WHERE bid = %d;", delta, bid)
		add("history", "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (%d, %d, %d, %d, CURRENT_TIMESTAMP);", tid, bid, aid, delta)
		add("end", "END;")
	}
	return texts
}

// BenchmarkTPCBSimple is the proxy's rewrite work for pgbench's TPC-B in simple-query mode, per statement and
// per whole transaction (op = one transaction of seven statements), in the steady state (shapes cached).
func BenchmarkTPCBSimple(b *testing.B) {
	r, err := New(Config{Tables: []Table{{Name: "pgbench_accounts", TokenColumn: "fence_token"}}})
	if err != nil {
		b.Fatal(err)
	}
	c := NewCache(r, 1024)
	texts := tpcbTexts(1024)
	order := []string{"begin", "accounts", "select", "tellers", "branches", "history", "end"}
	for _, name := range order {
		for _, t := range texts[name][:4] {
			c.Plan(t, DefaultSettings)
		}
	}
	want := map[string]Action{"accounts": Rewrite}
	for _, name := range order {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if p := c.Plan(texts[name][i%1024], DefaultSettings); p.Action != want[name] {
					b.Fatal(p)
				}
				i++
			}
		})
	}
	b.Run("txn", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			for _, name := range order {
				c.Plan(texts[name][i%1024], DefaultSettings)
			}
			i++
		}
	})
}
