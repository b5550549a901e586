package proxy_test

import (
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A pooled client between transactions is bound to no host: a transaction it starts while no primary is
// published (the old one withdrawn, read-only here, the standby not promoted yet) waits for the next primary
// and runs there, as a new read-write session does (docs/ha.md), not on a server connection left idle on the
// withdrawn host. From a review on 2026-12-05 (review56ha, attack: a pooled server connection to the old
// primary lent after the router stopped publishing it): the lend looked only for a change of primary
// published since the connection was dialled (router.superseded, which a withdrawal is not), so the
// transaction ran on the old primary, where its writes to unprotected tables commit (a READ WRITE
// transaction) and its fenced ones were refused 55F04 instead of waiting.
func TestPooledTransactionWaitsOutAWithdrawnPrimary(t *testing.T) {
	h, dsn := startPooledHAPair(t, "size: 2", "max_client_wait: 30s", poolAdmin)
	ctx := haCtx(t)
	c := h.connectOnPrimary(ctx, t, dsn, "the client")
	if err := h.standby.WaitReplayed(ctx, h.primary); err != nil {
		t.Fatal(err)
	}
	setReadOnly(ctx, t, connect(t, h.primary.SuperDSN()))
	eventually(t, 30*time.Second, "the proxy to withdraw the read-only primary", func() bool {
		got, _ := metricValue(t, h.proxy.Registry, "fenceproxy_upstream_primary")
		changes, _ := metricValue(t, h.proxy.Registry, "fenceproxy_upstream_primary_changes_total")
		return got == 0 && changes == 2
	})
	type answer struct {
		port int
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		port, err := serverPort(ctx, c)
		got <- answer{port, err}
	}()
	// Either the transaction is answered (it ran on a connection to the withdrawn host), or SHOW POOLS shows its
	// server connection being opened (sv_login: the dial waits for a primary to be published).
	adm := connect(t, h.simpleDSN("fenceproxy"))
	deadline := time.Now().Add(30 * time.Second)
	for dialling := false; !dialling; {
		select {
		case a := <-got:
			t.Fatalf("a pooled transaction started while no primary is published was answered on port %d (%v; the old primary is %d), want it to wait for the next primary",
				a.port, a.err, h.primary.Port())
		default:
		}
		for _, r := range adminRows(t, adm, "SHOW POOLS") {
			dialling = dialling || r["database"] == pgtest.TestDB && r["sv_login"] == "1"
		}
		if time.Now().After(deadline) {
			t.Fatal("the transaction was neither answered nor waiting for a server connection")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := h.standby.Promote(); err != nil {
		t.Fatal(err)
	}
	if a := <-got; a.err != nil || a.port != h.standby.Port() {
		t.Errorf("the transaction that waited reached port %d (%v), want the new primary's %d", a.port, a.err, h.standby.Port())
	}
}
