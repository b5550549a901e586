package proxy

import (
	"bufio"
	"io"
	"testing"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

// BenchmarkFencedQueryRound is the core's share of one fenced TPC-B UPDATE sent as a Query and answered
// (ReadyForQuery), the planner's cache hit included: what the positions map costs on the hot path.
func BenchmarkFencedQueryRound(b *testing.B) {
	cfg, err := config.Parse("test.yaml", []byte("listen: 127.0.0.1:0\nupstream:\n  address: 127.0.0.1:1\n"))
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(Options{Config: cfg, DisableEventLoop: true})
	if err != nil {
		b.Fatal(err)
	}
	ss := &session{srv: srv, prep: &prepState{}}
	r, err := rewrite.New(rewrite.Config{Tables: []rewrite.Table{{Name: "pgbench_accounts", TokenColumn: "fence_token"}}})
	if err != nil {
		b.Fatal(err)
	}
	p := rewrite.NewCache(r, 1024)
	body := append([]byte("UPDATE pgbench_accounts SET abalance = abalance + -4321 WHERE aid = 87654;"), 0)
	w := bufio.NewWriterSize(io.Discard, 1<<16)
	ss.state.ready.Store(true)
	round := func() {
		if err := ss.onClientMsg(msgQuery, body, p, w); err != nil {
			b.Fatal(err)
		}
		if _, err := ss.onServerMsg(msgReadyForQuery, []byte{'I'}, w); err != nil {
			b.Fatal(err)
		}
		w.Reset(io.Discard)
	}
	round()
	b.ReportAllocs()
	for b.Loop() {
		round()
	}
}
