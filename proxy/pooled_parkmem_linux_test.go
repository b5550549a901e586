package proxy_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/proxy"
)

// parkedBudget is what a parked client may keep on the proxy's heap, in bytes, beside what it shares with the
// other clients of its pool (proxy.ParkedRetained's estimate): pgbouncer keeps about 1 KiB per idle client.
const parkedBudget = 6 << 10

// A parked client keeps only what must survive to its next transaction: its token, settings, statement names and
// place, not the caches, scratch and copies a busy client uses (the texts it sent, the token statement's
// messages, the server's parameters, its startup parameters), nor what is the same for every client of its pool.
// Clients alike, each with a token of its own, a fenced write in the extended protocol and a Query.
func TestPooledParkedClientKeepsLittle(t *testing.T) {
	f := newParkingFenced(t, 2)
	srv := f.p.Server
	const n = 16
	for i := range n {
		c := pooledConn(t, f, "")
		fxExec(t, c, fmt.Sprintf("SET fence.token = %d", 100+i))
		fxExec(t, c, f.sql("INSERT INTO %[1]s (balance) VALUES ($1)"), i)
		fxExec(t, c, "SELECT 1")
	}
	eventually(t, 10*time.Second, fmt.Sprintf("%d parked clients", n), func() bool { return proxy.ParkedClients(srv) == n })
	total, parked, byField := proxy.ParkedRetained(srv)
	if parked != n {
		t.Fatalf("%d parked clients walked, want %d", parked, n)
	}
	per := total / parked
	sessionSize, pooledSize := proxy.SessionSizes()
	t.Logf("a parked client keeps %d bytes (a session of %d, its pooledState of %d); by field, all %d clients: %s", per, sessionSize, pooledSize, n, strings.Join(byField[:min(len(byField), 30)], ", "))
	if per > parkedBudget {
		t.Errorf("a parked client keeps %d bytes, more than %d", per, parkedBudget)
	}
}

// Clients alike share one list of the server's parameters as they were shown them (and one map of startup
// parameters): a client that changes one (SET application_name) must change its own copy, never the shared
// list, or the pool's next client would be shown the value at its startup (another client's setting reaching
// it), and a client that sets the same value after it would not be told (the proxy shows a ParameterStatus
// only when it differs from what the client was shown). For clients that gave no application_name (the
// pool's list itself) and for clients that gave the same one.
func TestPooledSharedParamsCopiedOnChange(t *testing.T) {
	f := newParkingFenced(t, 2)
	open := 0 // clients open
	for _, app := range []string{"", "shared_app"} {
		q := ""
		if app != "" {
			q = "&application_name=" + app
		}
		a, b := pooledPgConn(t, f, q), pooledPgConn(t, f, q)
		open += 2
		for _, c := range []*pgconn.PgConn{a, b} {
			if got := c.ParameterStatus("application_name"); got != app {
				t.Fatalf("application_name %q at startup, want %q", got, app)
			}
		}
		if _, err := a.Exec(ctxT(t), "SET application_name = 'a_only'").ReadAll(); err != nil {
			t.Fatal(err)
		}
		if got := a.ParameterStatus("application_name"); got != "a_only" {
			t.Fatalf("the client that set application_name is shown %q, want a_only", got)
		}
		eventually(t, 10*time.Second, "every client parked", func() bool { return proxy.ParkedClients(f.p.Server) == open })
		open++
		if c := pooledPgConn(t, f, q); c.ParameterStatus("application_name") != app {
			t.Errorf("a new client is shown application_name %q at startup, want %q (another client's value)", c.ParameterStatus("application_name"), app)
		}
		if _, err := b.Exec(ctxT(t), "SET application_name = 'a_only'").ReadAll(); err != nil {
			t.Fatal(err)
		}
		if got := b.ParameterStatus("application_name"); got != "a_only" {
			t.Errorf("a client that set application_name after another is shown %q, want a_only", got)
		}
	}
}

// A client that parks gives its goroutine back (docs/pooling.md, "Idle clients"), but a handler goroutine whose
// session parked waited handlerIdle for another connection, with the stack the session grew: a wave of clients
// that parked together kept a goroutine each for five seconds. At most maxIdleHandlers (128) wait now.
func TestPooledParkedWaveLeavesFewGoroutines(t *testing.T) {
	f := newParkingFenced(t, 2)
	const n = 300
	// The clients connect and speak all at once, as a burst of work does: a goroutine each, then parked.
	errs := make(chan error, n)
	for range n {
		go func() {
			c, err := pgconn.Connect(ctxT(t), f.dsn())
			if err == nil {
				t.Cleanup(func() { c.Close(context.Background()) })
				_, err = c.Exec(ctxT(t), "SELECT 1").ReadAll()
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, fmt.Sprintf("%d parked clients", n), func() bool { return proxy.ParkedClients(f.p.Server) == n })
	buf := make([]byte, 64<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	if waiting := strings.Count(stacks, "proxy.(*Server).handlerLoop("); waiting > 128 {
		t.Errorf("%d handler goroutines left for %d parked clients, want at most 128", waiting, n)
	}
}
