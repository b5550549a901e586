package proxy_test

import (
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// goroutinesYAML keeps every session on the goroutine transport (relay.mode: goroutines), where the two
// directions stop each other through the interrupt instead of sharing one loop.
const goroutinesYAML = "relay:\n  mode: goroutines\n"

// TestGoroutineTransportEndings drives each way a session ends through the goroutine transport: a vanished
// client's query is cancelled, an upstream's death reaches the client, a Terminate at rest keeps the upstream for
// the next client, and a drain closes an idle session while a transaction finishes.
func TestGoroutineTransportEndings(t *testing.T) {
	t.Run("client vanishes", func(t *testing.T) {
		p := clientVanishingCancelsItsQuery(t, goroutinesYAML)
		if n := proxy.SessionsInLoop(p.Server); n != 0 {
			t.Fatalf("%d sessions in an event loop with relay.mode goroutines", n)
		}
	})
	t.Run("upstream dies", func(t *testing.T) { upstreamDeathReachesTheClient(t, goroutinesYAML) })
	t.Run("terminate keeps the upstream", func(t *testing.T) {
		p := startProxy(t, proxytest.Options{YAML: goroutinesYAML})
		dsn := reuseDSN(p, reuseApp(t))
		a := connect(t, dsn)
		pidA := pidOf(t, a)
		if err := a.Close(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		waitIdle(t, p, 1)
		b := connect(t, dsn)
		if pidB := pidOf(t, b); pidB != pidA {
			t.Fatalf("the next session got backend %d, not the kept %d", pidB, pidA)
		}
	})
	t.Run("drain", func(t *testing.T) { drainLetsTransactionsFinish(t, goroutinesYAML) })

}
