package proxy_test

import (
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// A cancel that reaches the backend after its statement ended, while the client's transaction block is open
// (pinned by LISTEN or not): directly the idle backend drops it and the block goes on. Through the pool the
// round trip that takes a late cancel off a connection (absorbCancel) must not run inside the client's block,
// where its 57014 would abort the client's transaction; it runs once the block has ended, before the
// connection goes back to the pool. The block's next statement and its COMMIT must succeed.
func TestPooledLateCancelInsideABlockLeavesItWhole(t *testing.T) {
	for _, pinned := range []bool{false, true} {
		name := "unpinned"
		if pinned {
			name = "pinned by LISTEN"
		}
		t.Run(name, func(t *testing.T) {
			pgtest.Require(t, pg)
			relay := startCancelHoldingRelay(t, pg.Addr())
			d := direct(t)
			tn := fxName(t, "tp")
			fxCreateTable(t, d, "public."+tn)
			yaml := fxTables("public."+tn) + "pool:\n  mode: transaction\n  size: 1\n  max_client_wait: 20s\nauth:\n  type: trust\n"
			f := &fenced{p: proxytest.Start(t, relay.ln.Addr().String(), proxytest.Options{YAML: yaml}), d: d, name: tn, label: "public." + tn}
			a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
			ctx := ctxT(t)
			if pinned {
				fxExec(t, a, "LISTEN review56_block")
			}
			fxExec(t, a, "BEGIN")
			first := make(chan error, 1)
			go func() {
				var v int
				first <- a.QueryRow(ctx, "SELECT 1 FROM pg_sleep(0.3) AS block_subject").Scan(&v)
			}()
			awaitOneActive(t, f, "a's statement running", "block_subject")
			cancelled := make(chan error, 1)
			go func() { cancelled <- sendCancelRequest(f.p.Addr, a.PgConn().PID(), a.PgConn().SecretKey()) }()
			relay.awaitArrival(t, "a's cancel")
			if err := <-first; err != nil {
				t.Fatalf("a's statement, its cancel held: %v", err)
			}
			relay.Release() // the cancel reaches the backend, idle in a's block
			if err := <-cancelled; err != nil {
				t.Fatalf("a's CancelRequest: %v", err)
			}
			fxExec(t, a, "SELECT 2")
			fxExec(t, a, "COMMIT")
			fxExec(t, a, "SELECT 3")
		})
	}
}
