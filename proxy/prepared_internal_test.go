package proxy

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// pendingProbe is a msgSink that notes writes upstream made before the client's Query counted as pending.
type pendingProbe struct {
	st        *protoState
	uncounted int
}

func (p *pendingProbe) note() {
	if p.st.pending.Load() < 1 {
		p.uncounted++
	}
}
func (p *pendingProbe) Write(b []byte) (int, error)       { p.note(); return len(b), nil }
func (p *pendingProbe) WriteByte(byte) error              { p.note(); return nil }
func (p *pendingProbe) WriteString(s string) (int, error) { p.note(); return len(s), nil }

// TestPreparedCommandsSentWithTheQueryCounted: the proxy's PREPARE goes out at an idle point, just before the
// client's Query, and the Query must count as pending before any byte of the PREPARE is written: with the
// goroutine transport a full buffer flushes the PREPARE at once, and its answer, read by the server side before
// the client side counts the Query, leaves the session looking idle (nothing pending, nothing internal), so that a
// drain would close it, with the client's Query on its way.
func TestPreparedCommandsSentWithTheQueryCounted(t *testing.T) {
	srv := newTestServer(t, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	planner, err := NewPlanner(srv.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ss := &session{srv: srv, prep: &prepState{max: 64}}
	ss.state.ready.Store(true)
	ss.state.txStatus.Store(uint32(txIdle))
	ss.prep.queued = []prepCommand{{sql: "PREPARE fenceproxy_p1 AS SELECT 1", entry: &prepEntry{tmpl: &rewrite.Prepared{Body: "AS SELECT 1"}, name: "fenceproxy_p1"}}}
	probe := &pendingProbe{st: &ss.state}
	if err := ss.onClientMsg(msgQuery, []byte("SELECT 2\x00"), planner, probe); err != nil {
		t.Fatal(err)
	}
	if ss.state.internal.Load() != 1 || ss.state.pending.Load() != 1 {
		t.Fatalf("internal %d, pending %d: want the PREPARE and the Query both counted", ss.state.internal.Load(), ss.state.pending.Load())
	}
	if probe.uncounted > 0 {
		t.Fatalf("%d writes upstream before the client's Query counted as pending", probe.uncounted)
	}
}

// TestPreparedVerificationFollowsEntries: the verification is built once and kept, so every change to the
// entries (a new one, an eviction, forgetting them all) must build it again: a kept text that left out a new
// entry would never verify it, and one that kept an evicted entry would verify a name the proxy gave up.
func TestPreparedVerificationFollowsEntries(t *testing.T) {
	ps := &prepState{max: 2}
	names := func() []string {
		q, entries := ps.verification()
		var out []string
		for _, e := range entries {
			if !strings.Contains(q, `"`+e.name+" "+e.hash+`"`) {
				t.Fatalf("the verification does not name %s with its hash: %s", e.name, q)
			}
			out = append(out, e.name)
		}
		slices.Sort(out)
		return out
	}
	want := func(step string, want ...string) {
		t.Helper()
		if got := names(); !slices.Equal(got, want) {
			t.Fatalf("after %s: the verification names %v, want %v", step, got, want)
		}
	}
	tmpl := func(n int) *rewrite.Prepared { return &rewrite.Prepared{Body: fmt.Sprintf("AS SELECT %d", n)} }
	if q, _ := ps.verification(); q != "" {
		t.Fatalf("nothing to verify, but %q", q)
	}
	ps.add(tmpl(1))
	want("the first entry", "fenceproxy_p1")
	ps.add(tmpl(2))
	want("a second entry", "fenceproxy_p1", "fenceproxy_p2")
	ps.uses++
	ps.byTmpl[ps.verifyEntries[0].tmpl].lastUse = ps.uses // the other one is evicted
	evicted := "fenceproxy_p1"
	if ps.verifyEntries[0].name == evicted {
		evicted = "fenceproxy_p2"
	}
	ps.add(tmpl(3))
	kept := "fenceproxy_p1"
	if evicted == kept {
		kept = "fenceproxy_p2"
	}
	want("an eviction", kept, "fenceproxy_p3")
	ps.forget()
	if q, entries := ps.verification(); q != "" || len(entries) != 0 {
		t.Fatalf("after forget: %q for %d entries, want nothing to verify", q, len(entries))
	}
}

// TestPreparedBareBegin: the texts that keep the proxy's trust in its prepared statements (isBareBegin): one
// BEGIN or START TRANSACTION, with transaction modes or without, and nothing else that could run code.
func TestPreparedBareBegin(t *testing.T) {
	for text, want := range map[string]bool{
		"BEGIN":             true,
		" begin ;\x00":      true,
		"START TRANSACTION": true,
		"BEGIN WORK":        true,
		"BEGIN TRANSACTION ISOLATION LEVEL SERIALIZABLE":    true,
		"begin isolation level repeatable read;":            true,
		"START TRANSACTION READ ONLY, NOT DEFERRABLE":       true,
		"BEGIN\tREAD\nWRITE,ISOLATION LEVEL READ COMMITTED": true,
		"":                                   false,
		"START":                              false,
		"COMMIT":                             false,
		"END":                                false,
		"BEGIN; SELECT public.f()":           false,
		"BEGIN;;":                            false,
		"BEGIN READ ONLY; SELECT 1":          false,
		"BEGIN /* comment */":                false,
		"BEGIN ISOLATION LEVEL f()":          false,
		"BEGIN WOR\u212a":                    false, // a Kelvin sign, which strings.ToLower makes a k
		"START TRANSACTION; CALL public.p()": false,
		"BEGIN DEFERRABLE, x":                false,
		"SET transaction_isolation = 'serializable'": false,
	} {
		if got := isBareBegin([]byte(text)); got != want {
			t.Errorf("isBareBegin(%+q) = %v, want %v", text, got, want)
		}
	}
}
