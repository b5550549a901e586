package proxy

import (
	"testing"

	"github.com/fenceproxy/fenceproxy/config"
)

// The rule of reloadkept.go costs nothing in steady state: with no change of planner, a session-mode client's
// Bind is read once after its first Parse (to judge what it holds) and never again, whatever it prepares,
// closes, binds or runs; after a change of planner it is read again.
func TestKeptBindBodyNotReadInSteadyState(t *testing.T) {
	cfg, err := config.Parse("test.yaml", []byte("listen: 127.0.0.1:0\nupstream:\n  address: 127.0.0.1:1\ntables:\n  - name: public.accounts\n    token_column: fence_token\n"))
	if err != nil {
		t.Fatal(err)
	}
	planner := func() Planner {
		p, err := NewPlannerWithCatalog(cfg, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	srv := newTestServer(t, Options{DisableEventLoop: true, Planner: planner()})
	ss := &session{srv: srv, prep: &prepState{}}
	var out outBuf
	if _, err := ss.onServerMsg(msgReadyForQuery, []byte{txIdle}, &out); err != nil {
		t.Fatal(err)
	}
	client := func(typ byte, body string) {
		t.Helper()
		box := srv.plannerNow()
		ss.planGen = box.gen
		var b []byte
		if ss.clientNeedsBody(typ, box.p) {
			b = []byte(body)
		}
		if err := ss.onClientMsg(typ, b, box.p, &out); err != nil {
			t.Fatalf("onClientMsg(%q): %v", typ, err)
		}
	}
	parse := func(name, sql string) string { return name + "\x00" + sql + "\x00\x00\x00" }
	bind := func(portal, name string) string { return portal + "\x00" + name + "\x00\x00\x00\x00\x00\x00\x00" }
	reads := func() bool { return ss.clientNeedsBody(msgBind, srv.currentPlanner()) }
	client(msgParse, parse("w", "UPDATE accounts SET balance = 1 WHERE id = $1"))
	if !reads() {
		t.Fatal("the first Bind after a Parse is not read: nothing judges what the session holds")
	}
	client(msgBind, bind("", "w"))
	for i := 0; i < 3; i++ {
		for _, m := range []struct {
			typ  byte
			body string
		}{
			{msgParse, parse("", "SELECT 1")},
			{msgParse, parse("w", "UPDATE accounts SET balance = 2 WHERE id = $1")},
			{msgQuery, "PREPARE sp(int) AS UPDATE accounts SET balance = $1\x00"},
			{msgClose, "Sw\x00"},
			{msgParse, parse("w", "INSERT INTO other VALUES ($1)")},
			{msgBind, bind("p", "w")},
			{msgExecute, "p\x00\x00\x00\x00\x00"},
		} {
			client(m.typ, m.body)
			if reads() {
				t.Fatalf("round %d: a Bind after %q is read with no change of planner", i, m.typ)
			}
		}
	}
	srv.SetPlanner(planner())
	if !reads() {
		t.Fatal("after a change of planner a Bind is not read")
	}
}
