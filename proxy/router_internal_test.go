package proxy

import (
	"log/slog"
	"testing"

	"github.com/fenceproxy/fenceproxy/config"
)

// A session's ParameterStatus moves the primary only for what a client cannot set: in_hot_standby on the
// primary. default_transaction_read_only is a client's to SET in its own session (a hostile client must not be
// able to end everyone's sessions by making the router withdraw the primary), and a standby's in_hot_standby
// changes nothing.
func TestObserveTrustsOnlyServerState(t *testing.T) {
	cfg, err := config.Parse("c.yaml", []byte("upstream:\n  hosts: [a:1, b:2]\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{cfg: cfg}
	r, err := newRouter(cfg, s.upstreamTLSFor, nil, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.roles["a:1"], r.roles["b:2"], r.primary = rolePrimary, roleStandby, "a:1"
	r.observe("a:1", "default_transaction_read_only", "on")
	r.observe("b:2", "in_hot_standby", "on")
	r.observe("a:1", "in_hot_standby", "off")
	if r.roles["a:1"] != rolePrimary || r.roles["b:2"] != roleStandby || len(r.kick) != 0 {
		t.Errorf("after what clients can cause: roles %v, %d wake-ups; want a:1 primary and none", r.roles, len(r.kick))
	}
	r.observe("a:1", "in_hot_standby", "on")
	if r.roles["a:1"] != roleStandby || len(r.kick) != 1 {
		t.Errorf("the primary reporting in_hot_standby on: role %v, %d wake-ups; want standby and one", r.roles["a:1"], len(r.kick))
	}
}
