package proxy_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// TestSessionsSpreadOverEventLoops: with relay.event_loops: 3, six sessions are relayed three loops by two, each
// loop counts its sessions inside a transaction block (what lets it poll before sleeping), and the count goes
// back to zero when such a session commits, rolls back, or vanishes in the middle of its transaction.
func TestSessionsSpreadOverEventLoops(t *testing.T) {
	p := startProxy(t, proxytest.Options{YAML: "relay:\n  event_loops: 3\n  spin: 50us\n"})
	ctx := ctxT(t)
	conns := make([]*pgx.Conn, 6)
	for i := range conns {
		conns[i] = connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
		var one int
		if err := conns[i].QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "six sessions in the event loops", func() bool { return proxy.SessionsInLoop(p.Server) == 6 })
	if sess, _ := proxy.LoopSessions(p.Server); !slices.Equal(sess, []int{2, 2, 2}) {
		t.Fatalf("sessions per loop %v, want [2 2 2]", sess)
	}

	inTx := func() int {
		_, tx := proxy.LoopSessions(p.Server)
		n := 0
		for _, x := range tx {
			n += x
		}
		return n
	}
	for _, c := range conns[:3] {
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conns[3].Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if got := inTx(); got != 3 {
		t.Fatalf("sessions in a transaction: %d, want 3", got)
	}
	if _, err := conns[0].Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	// A failed transaction is still a transaction block until ROLLBACK.
	if _, err := conns[1].Exec(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("1/0 succeeded")
	}
	if got := inTx(); got != 2 {
		t.Fatalf("after one COMMIT, sessions in a transaction: %d, want 2", got)
	}
	if _, err := conns[1].Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	// The third vanishes inside its transaction.
	closeCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conns[2].PgConn().Conn().Close()
	_ = conns[2].Close(closeCtx)
	eventually(t, 5*time.Second, "the vanished session to leave its loop", func() bool { return proxy.SessionsInLoop(p.Server) == 5 })
	if got := inTx(); got != 0 {
		t.Fatalf("after COMMIT, ROLLBACK and a vanished client, sessions in a transaction: %d, want 0", got)
	}
	// Every loop still relays.
	for i, c := range conns {
		if i == 2 {
			continue
		}
		var s string
		if err := c.QueryRow(ctx, "SELECT $1::text", fmt.Sprint(i)).Scan(&s); err != nil || s != fmt.Sprint(i) {
			t.Fatalf("session %d after the others changed: %q %v", i, s, err)
		}
	}
}

func TestRunnableThreadsParsesLoadavg(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"0.52 0.58 0.59 3/185 12345\n", 3, true},
		{"10.00 9.00 8.00 17/2048 99\n", 17, true},
		{"0.00 0.00 0.00 1/1 1", 1, true},
		{"", 0, false},
		{"0.52 0.58 0.59", 0, false},
		{"0.52 0.58 0.59 x/185 1\n", 0, false},
		{"0.52 0.58 0.59 3185 1\n", 0, false},
		{"0.52 0.58 0.59 99999999999999999/1 1\n", 0, false},
	} {
		got, ok := proxy.RunnableThreads([]byte(c.in))
		if got != c.want || ok != c.ok {
			t.Errorf("runnableThreads(%q) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}
