package proxy_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
	"github.com/fenceproxy/fenceproxy/rewrite"
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

// blockingPlanner plans like the proxy's own cache, except that planning one text (a cache miss by
// construction) waits until the test releases it. The text may be planned more than once (under other
// settings, when an answer relayed meanwhile changed them).
type blockingPlanner struct {
	inner   *rewrite.Cache
	blocked string
	entered chan struct{} // closed when the blocked text's planning first starts
	release chan struct{} // closed by the test to let it finish
	once    sync.Once
}

func (b *blockingPlanner) TryPlan(sql []byte, set rewrite.Settings) (rewrite.Plan, bool) {
	if string(sql) == b.blocked {
		return rewrite.Plan{}, false
	}
	return b.inner.TryPlan(sql, set)
}

func (b *blockingPlanner) Plan(sql []byte, set rewrite.Settings) rewrite.Plan {
	if string(sql) == b.blocked {
		b.once.Do(func() { close(b.entered) })
		<-b.release
	}
	return b.inner.Plan(sql, set)
}

// TestLoopPlansMissesOffTheLoop: a statement whose plan is not cached is planned off the event loop. With one
// loop relaying two sessions, one session's statement is held in planning while the other session runs
// queries and writes through the same loop; then the held statement and the statement the client pipelined
// after it complete, in order.
func TestLoopPlansMissesOffTheLoop(t *testing.T) {
	ctx := ctxT(t)
	p, bp, table := oneLoopWithHeldPlan(t, "loopmiss", "(1, 0, NULL), (2, 0, NULL)", "UPDATE %s SET n = n + 1 WHERE id = $1")
	d := direct(t)

	held := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	other := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	for _, c := range []*pgx.Conn{held, other} {
		if _, err := c.Exec(ctx, "SET fence.token = 7"); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "both sessions in the event loop", func() bool { return proxy.SessionsInLoop(p.Server) == 2 })

	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		b := &pgx.Batch{}
		b.Queue(bp.blocked, 1)
		b.Queue("SELECT n FROM " + table + " WHERE id = 1")
		br := held.SendBatch(ctx, b)
		var r result
		if _, r.err = br.Exec(); r.err == nil {
			r.err = br.QueryRow().Scan(&r.n)
		}
		if err := br.Close(); r.err == nil {
			r.err = err
		}
		done <- r
	}()
	select {
	case <-bp.entered:
	case <-ctx.Done():
		t.Fatal("the held statement was never planned")
	}
	// The loop serves the other session meanwhile: reads, and a fenced write whose plan is planned too (on
	// a worker, since it is a miss).
	for i := range 20 {
		var got int
		if err := other.QueryRow(ctx, "SELECT $1::int", i).Scan(&got); err != nil || got != i {
			t.Fatalf("other session's query %d while a plan was held: %d %v", i, got, err)
		}
	}
	if _, err := other.Exec(ctx, "UPDATE "+table+" SET n = 40 WHERE id = 2"); err != nil {
		t.Fatalf("other session's write while a plan was held: %v", err)
	}
	select {
	case r := <-done:
		t.Fatalf("the held statement completed before its plan was released: %+v", r)
	default:
	}
	close(bp.release)
	r := <-done
	if r.err != nil || r.n != 1 {
		t.Fatalf("held statement and the one pipelined after it: n = %d, %v; want 1", r.n, r.err)
	}
	var tok int64
	if err := d.QueryRow(ctx, "SELECT fence_token FROM "+table+" WHERE id = 1").Scan(&tok); err != nil || tok != 7 {
		t.Fatalf("the held write was not fenced: token %d, %v", tok, err)
	}
}

// TestLoopDrainWaitsForAHeldStatement: a drain closes a looped session only when nothing the client sent
// waits in the loop. The client commits and, in the same write, sends a write whose plan is held: the COMMIT's
// ReadyForQuery leaves the session idle as far as the server knows, but the held statement runs (and is
// answered) before the drain closes the session with 57P01.
func TestLoopDrainWaitsForAHeldStatement(t *testing.T) {
	ctx := ctxT(t)
	p, bp, table := oneLoopWithHeldPlan(t, "loopdrain", "(1, 0, NULL)", "UPDATE %s SET n = n + 1 WHERE id = 1")
	d := direct(t)

	_, fe, _ := rawStartup(t, p.Addr, pgproto3.ProtocolVersionNumber, map[string]string{"options": "-c fence.token=7"})
	eventually(t, 5*time.Second, "the session in the event loop", func() bool { return proxy.SessionsInLoop(p.Server) == 1 })
	query := func(sqls ...string) {
		t.Helper()
		for _, sql := range sqls {
			fe.Send(&pgproto3.Query{String: sql})
		}
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// receive reads up to the next ReadyForQuery and returns the command tags and error codes it saw.
	receive := func() []string {
		t.Helper()
		var got []string
		for {
			m, err := fe.Receive()
			if err != nil {
				t.Fatalf("after %v: %v", got, err)
			}
			switch m := m.(type) {
			case *pgproto3.CommandComplete:
				got = append(got, string(m.CommandTag))
			case *pgproto3.ErrorResponse:
				return append(got, m.Severity+" "+m.Code)
			case *pgproto3.ReadyForQuery:
				return got
			}
		}
	}
	query("BEGIN")
	if got := receive(); !slices.Equal(got, []string{"BEGIN"}) {
		t.Fatalf("BEGIN: %v", got)
	}
	shutdownDone := startDrain(t, p)
	query("COMMIT", bp.blocked)
	if got := receive(); !slices.Equal(got, []string{"COMMIT"}) {
		t.Fatalf("COMMIT: %v", got)
	}
	<-bp.entered
	close(bp.release)
	if got := receive(); !slices.Equal(got, []string{"UPDATE 1"}) {
		t.Fatalf("the held statement: %v, want it run and answered before the drain", got)
	}
	if got := receive(); !slices.Equal(got, []string{"FATAL 57P01"}) {
		t.Fatalf("after the held statement: %v, want the drain's FATAL 57P01", got)
	}
	if err := <-shutdownDone; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	var n int
	if err := d.QueryRow(ctx, "SELECT n FROM "+table+" WHERE id = 1").Scan(&n); err != nil || n != 1 {
		t.Fatalf("n = %d, %v; want the held UPDATE applied", n, err)
	}
}

// oneLoopWithHeldPlan creates a protected table (id, n, fence_token) holding rows, and a proxy with one event
// loop whose planner holds the statement blocked (a format with %s for the table) until the test releases it.
func oneLoopWithHeldPlan(t *testing.T, prefix, rows, blocked string) (*proxytest.Proxy, *blockingPlanner, string) {
	t.Helper()
	table := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	d := direct(t)
	if _, err := d.Exec(ctxT(t), "CREATE TABLE "+table+" (id int PRIMARY KEY, n int, fence_token bigint); INSERT INTO "+table+" VALUES "+rows); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Exec(context.Background(), "DROP TABLE "+table) })
	p := startProxy(t, proxytest.Options{YAML: fmt.Sprintf("relay:\n  event_loops: 1\ntables:\n  - name: public.%s\n    token_column: fence_token\n", table)})
	inner, err := proxy.NewPlanner(p.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	bp := &blockingPlanner{inner: inner, blocked: fmt.Sprintf(blocked, table),
		entered: make(chan struct{}), release: make(chan struct{})}
	p.Server.SetPlanner(bp)
	return p, bp, table
}

// TestLoopReplansAfterAPlannerChange: a statement held in planning on a worker while the table list is reloaded
// is planned again with the new planner before it is sent: a table protected by the reload is fenced even for a
// statement that arrived before it (the old planner, which did not protect it, had already planned it).
func TestLoopReplansAfterAPlannerChange(t *testing.T) {
	ctx := ctxT(t)
	table := fmt.Sprintf("loopreload_%d", time.Now().UnixNano())
	d := direct(t)
	if _, err := d.Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY, n int, fence_token bigint); INSERT INTO "+table+" VALUES (1, 0, NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Exec(context.Background(), "DROP TABLE "+table) })
	p := startProxy(t, proxytest.Options{YAML: "relay:\n  event_loops: 1\ntables:\n  - name: public." + table + "_other\n    token_column: fence_token\n"})
	before, err := proxy.NewPlanner(p.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	blocked := "UPDATE " + table + " SET n = n + 1 WHERE id = 1"
	bp := &blockingPlanner{inner: before, blocked: blocked, entered: make(chan struct{}), release: make(chan struct{})}
	p.Server.SetPlanner(bp)
	c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB)+"&default_query_exec_mode=simple_protocol")
	if _, err := c.Exec(ctx, "SET fence.token = 7"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the session in the event loop", func() bool { return proxy.SessionsInLoop(p.Server) == 1 })
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, blocked)
		done <- err
	}()
	select {
	case <-bp.entered:
	case <-ctx.Done():
		t.Fatal("the held statement was never planned")
	}
	cfg, err := config.Parse("reloaded.yaml", []byte("upstream:\n  address: 127.0.0.1:1\ntables:\n  - name: public."+table+"\n    token_column: fence_token\n"))
	if err != nil {
		t.Fatal(err)
	}
	after, err := proxy.NewPlanner(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Server.SetPlanner(after)
	close(bp.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var n int
	var tok *int64
	if err := d.QueryRow(ctx, "SELECT n, fence_token FROM "+table+" WHERE id = 1").Scan(&n, &tok); err != nil {
		t.Fatal(err)
	}
	if n != 1 || tok == nil || *tok != 7 {
		t.Fatalf("n = %d, fence_token = %v: want 1 and 7 (fenced by the reloaded table list)", n, tok)
	}
}
