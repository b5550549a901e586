package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// Attacks on idle clients parking (park_linux.go): races at the park and the resume, the ends of a parked
// client, the proxy's own lifecycle, and the descriptors the parker keys its sessions by.

// newParkingFencedEvery is newParkingFenced with a sweep every every and extra YAML lines under pool: (then
// top-level lines after them).
func newParkingFencedEvery(t *testing.T, size int, every time.Duration, extra string) *fenced {
	t.Helper()
	d := direct(t)
	name := fxName(t, "pa")
	fxCreateTable(t, d, "public."+name)
	yaml := fxTables("public."+name) + fmt.Sprintf("pool:\n  mode: transaction\n  size: %d\n", size) + extra + "auth:\n  type: trust\n"
	p := startProxy(t, proxytest.Options{YAML: yaml, ParkIdleAfter: every})
	return &fenced{p: p, d: d, name: name, label: "public." + name}
}

// tokenOf is the client's token as the server sees it in a transaction of the client's, within 10 s.
func tokenOf(c *pgx.Conn) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var tok string
	err := c.QueryRow(ctx, "SELECT current_setting('fence.token')").Scan(&tok)
	return tok, err
}

// parkSampler records the most clients parked at once while it runs.
func parkSampler(s *proxy.Server) (stop func() int) {
	var most atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if n := int64(proxy.ParkedClients(s)); n > most.Load() {
				most.Store(n)
			}
			select {
			case <-done:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	return func() int { close(done); wg.Wait(); return int(most.Load()) }
}

// Clients that speak as the session parks, again and again, with a sweep every millisecond: each answer comes,
// within 10 s, and is the client's own (its token), in the simple and the extended protocol, pipelined (pgx
// sends Parse, Bind, Execute and Sync at once, right after the last ReadyForQuery).
func TestParkAttackSpeakingWhileParking(t *testing.T) {
	f := newParkingFencedEvery(t, 2, time.Millisecond, "")
	srv := f.p.Server
	const n, rounds = 10, 120
	clients := make([]*pgx.Conn, n)
	for i := range clients {
		q := ""
		if i%2 == 1 {
			q = "&default_query_exec_mode=simple_protocol"
		}
		clients[i] = pooledConn(t, f, q)
		fxExec(t, clients[i], fmt.Sprintf("SET fence.token = %d", 500+i))
	}
	stop := parkSampler(srv)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for r := range rounds {
				tok, err := tokenOf(c)
				if err != nil {
					errs <- fmt.Errorf("client %d, round %d: %w", i, r, err)
					return
				}
				if tok != fmt.Sprint(500+i) {
					errs <- fmt.Errorf("client %d, round %d: token %s", i, r, tok)
					return
				}
				// Idle for 0 to 3 sweeps: some rounds park, some speak as the sweep fires.
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	most := stop()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if most == 0 {
		t.Fatal("no client parked: the attack did not run")
	}
	t.Logf("at most %d clients parked at once", most)
}

// A CancelRequest for a parked client does nothing: the client stays parked, and its next statement runs with
// its token; a cancel racing with the resume cancels that client's statement or nothing, and the session goes on.
func TestParkAttackCancelParked(t *testing.T) {
	f := newParkingFencedEvery(t, 1, 5*time.Millisecond, "")
	srv := f.p.Server
	a := pooledConn(t, f, "")
	b := pooledConn(t, f, "")
	fxExec(t, a, "SET fence.token = 11")
	fxExec(t, b, "SET fence.token = 22")
	eventually(t, 10*time.Second, "both parked", func() bool { return proxy.ParkedClients(srv) == 2 })
	if err := a.PgConn().CancelRequest(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	sweepsPass(t, srv, 3)
	if got := proxy.ParkedClients(srv); got != 2 {
		t.Fatalf("%d parked after a cancel of a parked client; want 2", got)
	}
	for round := range 40 {
		eventually(t, 10*time.Second, "a parked", func() bool { return proxy.ParkedClients(srv) == 2 })
		done := make(chan error, 1)
		go func() { done <- a.PgConn().CancelRequest(context.Background()) }()
		tok, err := tokenOf(a)
		var pge *pgconn.PgError
		switch {
		case err == nil && tok != "11":
			t.Fatalf("round %d: token %s", round, tok)
		case err != nil && !(errors.As(err, &pge) && pge.Code == "57014"):
			t.Fatalf("round %d: %v", round, err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if tok, err := tokenOf(a); err != nil || tok != "11" {
			t.Fatalf("round %d, after the cancel: %s, %v", round, tok, err)
		}
	}
	if tok, err := tokenOf(b); err != nil || tok != "22" {
		t.Fatalf("the other client: %s, %v", tok, err)
	}
}

// parkRawClient is a started client of the proxy at addr, speaking the protocol itself.
func parkRawClient(t *testing.T, addr string) (net.Conn, *pgproto3.Frontend) {
	t.Helper()
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	raw.SetDeadline(time.Now().Add(20 * time.Second))
	fe := pgproto3.NewFrontend(raw, raw)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: map[string]string{"user": pgtest.SuperUser, "database": pgtest.TestDB}})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m.(*pgproto3.ReadyForQuery); ok {
			return raw, fe
		}
	}
}

// A parked client that ends in any way ends its session, and gives its place back: a Terminate and a close, a
// Terminate alone (the socket left open, bytes unread: the proxy closes it), a close alone, a half-close, a reset.
func TestParkAttackParkedClientEnds(t *testing.T) {
	f := newParkingFencedEvery(t, 1, 5*time.Millisecond, "")
	srv := f.p.Server
	keep := pooledConn(t, f, "") // parked all along, and still served at the end
	fxExec(t, keep, "SET fence.token = 3")
	eventually(t, 10*time.Second, "the first client parked", func() bool { return proxy.ParkedClients(srv) == 1 })
	base := srv.ActiveSessions()
	terminate, err := (&pgproto3.Terminate{}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		end  func(net.Conn) error
		// closedByProxy: the client keeps its socket open and waits for the proxy to close it.
		closedByProxy bool
	}{
		{"terminate and close", func(c net.Conn) error { c.Write(terminate); return c.Close() }, false},
		{"terminate alone", func(c net.Conn) error { _, err := c.Write(terminate); return err }, true},
		{"close", func(c net.Conn) error { return c.Close() }, false},
		{"half-close", func(c net.Conn) error { return c.(*net.TCPConn).CloseWrite() }, true},
		{"reset", func(c net.Conn) error { c.(*net.TCPConn).SetLinger(0); return c.Close() }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, _ := parkRawClient(t, f.p.Addr)
			eventually(t, 10*time.Second, "two parked", func() bool { return proxy.ParkedClients(srv) == 2 })
			if err := tc.end(raw); err != nil {
				t.Fatal(err)
			}
			if tc.closedByProxy {
				if _, err := io.Copy(io.Discard, raw); err != nil {
					t.Fatalf("the proxy did not close the connection of a parked client that ended: %v", err)
				}
			}
			eventually(t, 10*time.Second, "the session ended", func() bool { return srv.ActiveSessions() == base && proxy.ParkedClients(srv) == 1 })
		})
	}
	if tok, err := tokenOf(keep); err != nil || tok != "3" {
		t.Fatalf("the client parked all along: %s, %v", tok, err)
	}
}

// A parked client that wakes with several messages in one write (two Queries; a Query and a Terminate) gets
// every answer, in order, and then its end.
func TestParkAttackPipelinedWake(t *testing.T) {
	f := newParkingFencedEvery(t, 1, 5*time.Millisecond, "")
	srv := f.p.Server
	var both []byte
	for _, q := range []string{"SELECT 'one'", "SELECT 'two'"} {
		var err error
		if both, err = (&pgproto3.Query{String: q}).Encode(both); err != nil {
			t.Fatal(err)
		}
	}
	bye, err := (&pgproto3.Terminate{}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, fe := parkRawClient(t, f.p.Addr)
	for round, tail := range [][]byte{nil, bye} {
		eventually(t, 10*time.Second, "the raw client parked", func() bool { return proxy.ParkedClients(srv) == 1 })
		if _, err := raw.Write(append(append([]byte(nil), both...), tail...)); err != nil {
			t.Fatal(err)
		}
		var rows []string
		for readies := 0; readies < 2; {
			m, err := fe.Receive()
			if err != nil {
				t.Fatalf("round %d, after rows %v: %v", round, rows, err)
			}
			switch m := m.(type) {
			case *pgproto3.DataRow:
				rows = append(rows, string(m.Values[0]))
			case *pgproto3.ReadyForQuery:
				readies++
			case *pgproto3.ErrorResponse:
				t.Fatalf("round %d: %s", round, m.Message)
			}
		}
		if strings.Join(rows, ",") != "one,two" {
			t.Fatalf("round %d: rows %v", round, rows)
		}
	}
	if _, err := fe.Receive(); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("after the Terminate: %v; want the connection closed", err)
	}
}

// waitGoroutines waits, up to 10 s, until no more goroutines run than want, and fails with their stacks.
func waitGoroutines(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > want {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%d goroutines after the proxy's end, %d before it began:\n%s", runtime.NumGoroutine(), want, buf)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Shutdown with clients parked while others resume and run statements at the same moment: it returns, no session
// is left counted, and the proxy's goroutines are gone; and when the drain's time runs out (forceClose) with a
// client in a transaction and others parked, the same.
func TestParkAttackShutdown(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		openTx  bool
	}{
		{"drain", 10 * time.Second, false},
		{"timeout", 300 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pgtest.Require(t, pg)
			d := direct(t)
			before := runtime.NumGoroutine()
			f := newParkingFencedEvery(t, 2, 2*time.Millisecond, "")
			srv := f.p.Server
			const parked, busy = 12, 4
			var conns []*pgx.Conn
			for i := range parked + busy {
				c, err := pgx.Connect(ctxT(t), f.dsn())
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
				fxExec(t, c, fmt.Sprintf("SET fence.token = %d", 40+i))
			}
			var inTx pgx.Tx
			if tc.openTx {
				var err error
				if inTx, err = conns[parked].Begin(ctxT(t)); err != nil {
					t.Fatal(err)
				}
				fxExec(t, conns[parked], "SELECT 1")
			}
			eventually(t, 10*time.Second, "the idle clients parked", func() bool { return proxy.ParkedClients(srv) >= parked })
			stopBusy := make(chan struct{})
			var wg sync.WaitGroup
			for i, c := range conns[parked:] {
				if tc.openTx && i == 0 {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stopBusy:
							return
						default:
						}
						if _, err := tokenOf(c); err != nil {
							return // the drain ended it
						}
						time.Sleep(time.Duration(rand.IntN(4000)) * time.Microsecond)
					}
				}()
			}
			// A few parked clients speak as the drain begins.
			for _, c := range conns[:3] {
				wg.Add(1)
				go func() { defer wg.Done(); tokenOf(c) }()
			}
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			err := srv.Shutdown(ctx)
			switch {
			case tc.openTx && err == nil:
				t.Fatal("Shutdown returned nil with a transaction open past its timeout")
			case !tc.openTx && err != nil:
				t.Fatalf("Shutdown: %v", err)
			}
			close(stopBusy)
			wg.Wait()
			if got := srv.ActiveSessions(); got != 0 {
				t.Fatalf("%d sessions after Shutdown", got)
			}
			if got := proxy.ParkedClients(srv); got != 0 {
				t.Fatalf("%d parked after Shutdown", got)
			}
			_ = inTx
			for _, c := range conns {
				c.Close(context.Background())
			}
			d.Close(context.Background())
			waitGoroutines(t, before)
		})
	}
}

// Many clients connect, run a statement and leave while others park and resume: descriptors are reused at once,
// and the parker keys its sessions by them. No client ever gets another's answer: each statement's token is the
// client's own.
func TestParkAttackDescriptorReuse(t *testing.T) {
	f := newParkingFencedEvery(t, 3, time.Millisecond, "")
	srv := f.p.Server
	const stayers, churners, rounds = 8, 4, 60
	errs := make(chan error, stayers+churners)
	stop := parkSampler(srv)
	var wg sync.WaitGroup
	for i := range stayers {
		c := pooledConn(t, f, "")
		fxExec(t, c, fmt.Sprintf("SET fence.token = %d", 1000+i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				if tok, err := tokenOf(c); err != nil || tok != fmt.Sprint(1000+i) {
					errs <- fmt.Errorf("stayer %d, round %d: %s, %v", i, r, tok, err)
					return
				}
				time.Sleep(time.Duration(rand.IntN(4000)) * time.Microsecond)
			}
		}()
	}
	for i := range churners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				tok := fmt.Sprint(2000 + i*rounds + r)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				c, err := pgx.Connect(ctx, f.dsn()+"&options=-c%20fence.token%3D"+tok)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("churner %d, round %d: %v", i, r, err)
					return
				}
				got, err := tokenOf(c)
				if err == nil && r%2 == 0 {
					time.Sleep(3 * time.Millisecond) // parks, sometimes, before it leaves
					got, err = tokenOf(c)
				}
				c.Close(context.Background())
				if err != nil || got != tok {
					errs <- fmt.Errorf("churner %d, round %d: %s, %v; want %s", i, r, got, err, tok)
					return
				}
			}
		}()
	}
	wg.Wait()
	most := stop()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if most == 0 {
		t.Fatal("no client parked: the attack did not run")
	}
	eventually(t, 10*time.Second, "only the stayers left", func() bool { return srv.ActiveSessions() == stayers })
	t.Logf("at most %d parked at once", most)
}

// wantSQLState fails unless err is a server error with SQLSTATE code.
func wantSQLState(t *testing.T, what string, err error, code string) {
	t.Helper()
	var pge *pgconn.PgError
	if !errors.As(err, &pge) || pge.Code != code {
		t.Fatalf("%s: %v; want SQLSTATE %s", what, err, code)
	}
}

// currentOf is current_setting(name, true) in a transaction of the client's ("" for NULL).
func currentOf(t *testing.T, c *pgx.Conn, name string) string {
	t.Helper()
	var v *string
	if err := c.QueryRow(ctxT(t), "SELECT current_setting($1, true)", name).Scan(&v); err != nil {
		t.Fatalf("current_setting(%s): %v", name, err)
	}
	if v == nil {
		return ""
	}
	return *v
}

// A parked client resumes with its whole session: token and lock, other settings, statements it prepared (by
// the protocol, and by SQL PREPARE), and what a refusal before it parked left (the refused SET changed nothing;
// a refused write left the session usable). A client whose server connection is pinned (LISTEN, a temporary
// table, a session advisory lock, a WITH HOLD cursor) never parks, and its state outlives its idle time.
func TestParkAttackStateAfterResume(t *testing.T) {
	f := newParkingFencedEvery(t, 6, 5*time.Millisecond, "")
	srv := f.p.Server
	plain := pooledConn(t, f, "")
	fxExec(t, plain, "SET fence.token = 70")
	fxExec(t, plain, "SET fence.lock = 'parklock'")
	fxExec(t, plain, "SET search_path = pg_catalog, public")
	fxExec(t, plain, "SET application_name = 'parked'")
	// SQL PREPARE and EXECUTE as simple Queries: an EXECUTE of a mapped name by the extended protocol gets 26000
	// (docs/pooling.md), parking or not.
	fxExec(t, plain, "PREPARE sqlp(int) AS SELECT current_setting('fence.token') || ':' || $1", pgx.QueryExecModeSimpleProtocol)
	var first string
	if err := plain.QueryRow(ctxT(t), "SELECT $1::text || current_setting('fence.lock')", "p:").Scan(&first); err != nil || first != "p:parklock" {
		t.Fatalf("named statement: %s, %v", first, err)
	}
	_, err := plain.Exec(ctxT(t), "SET fence.token = 'not a number'")
	wantSQLState(t, "an invalid token", err, "55F03")
	_, err = plain.Exec(ctxT(t), f.sql("TRUNCATE %[1]s"))
	wantSQLState(t, "TRUNCATE of the protected table", err, "55F04")

	pins := map[string]*pgx.Conn{}
	for name, sql := range map[string]string{
		"listen":    "LISTEN parkattack",
		"temp":      "CREATE TEMP TABLE parkattack_tmp AS SELECT 7 AS v",
		"advisory":  "SELECT pg_advisory_lock(424242)",
		"with hold": "DECLARE parkattack_cur CURSOR WITH HOLD FOR SELECT generate_series(1, 3)",
	} {
		c := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
		fxExec(t, c, "SET fence.token = 71")
		fxExec(t, c, sql)
		pins[name] = c
	}
	eventually(t, 10*time.Second, "the plain client parked", func() bool { return proxy.ParkedClients(srv) == 1 })
	sweepsPass(t, srv, 5)
	if got := proxy.ParkedClients(srv); got != 1 {
		t.Fatalf("%d parked; want the plain client only (the pinned never park)", got)
	}

	for name, want := range map[string]string{"fence.token": "70", "fence.lock": "parklock", "search_path": "pg_catalog, public", "application_name": "parked"} {
		if got := currentOf(t, plain, name); got != want {
			t.Fatalf("after resuming, %s is %q; want %q", name, got, want)
		}
		eventually(t, 10*time.Second, "parked again", func() bool { return proxy.ParkedClients(srv) == 1 })
	}
	var got string
	if err := plain.QueryRow(ctxT(t), "SELECT $1::text || current_setting('fence.lock')", "p:").Scan(&got); err != nil || got != "p:parklock" {
		t.Fatalf("named statement after resuming: %s, %v", got, err)
	}
	eventually(t, 10*time.Second, "parked again", func() bool { return proxy.ParkedClients(srv) == 1 })
	if err := plain.QueryRow(ctxT(t), "EXECUTE sqlp(3)", pgx.QueryExecModeSimpleProtocol).Scan(&got); err != nil || got != "70:3" {
		t.Fatalf("SQL PREPARE after resuming: %s, %v", got, err)
	}
	eventually(t, 10*time.Second, "parked again", func() bool { return proxy.ParkedClients(srv) == 1 })
	fxExec(t, plain, f.sql("INSERT INTO %[1]s (id, balance) VALUES (7, 0)"))
	if tok := f.token(t, 7); tok != 70 {
		t.Fatalf("a write after resuming wrote token %d; want 70", tok)
	}

	var v int
	if err := pins["temp"].QueryRow(ctxT(t), "SELECT v FROM parkattack_tmp").Scan(&v); err != nil || v != 7 {
		t.Fatalf("temporary table after idling: %d, %v", v, err)
	}
	if err := pins["with hold"].QueryRow(ctxT(t), "FETCH 1 FROM parkattack_cur").Scan(&v); err != nil || v != 1 {
		t.Fatalf("WITH HOLD cursor after idling: %d, %v", v, err)
	}
	var held int
	if err := f.d.QueryRow(ctxT(t), "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 424242 AND granted").Scan(&held); err != nil || held != 1 {
		t.Fatalf("advisory lock after idling: %d held, %v", held, err)
	}
	fxExec(t, f.d, "NOTIFY parkattack, 'hello'")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := pins["listen"].WaitForNotification(ctx)
	if err != nil || n.Payload != "hello" {
		t.Fatalf("LISTEN after idling: %v, %v", n, err)
	}
	for name, c := range pins {
		if tok := currentOf(t, c, "fence.token"); tok != "71" {
			t.Fatalf("pinned client %s: token %q", name, tok)
		}
	}
}

// A TLS client never parks (its TLS layer may hold bytes the socket no longer shows) and keeps working after
// idling through sweeps; a plain client beside it parks.
func TestParkAttackTLSNeverParks(t *testing.T) {
	pgtest.Require(t, pg)
	caFile, certFile, keyFile := writeTestCerts(t, t.TempDir())
	yaml := "pool:\n  mode: transaction\n  size: 1\nauth:\n  type: trust\n" + fmt.Sprintf("tls:\n  cert_file: %s\n  key_file: %s\n", certFile, keyFile)
	p := startProxy(t, proxytest.Options{YAML: yaml, ParkIdleAfter: 5 * time.Millisecond})
	dsn := p.DSN(pgtest.SuperUser, "", pgtest.TestDB)
	secure := connect(t, strings.Replace(dsn, "sslmode=disable", "sslmode=verify-full&sslrootcert="+caFile, 1))
	plain := connect(t, dsn)
	fxExec(t, secure, "SET fence.token = 81")
	fxExec(t, plain, "SET fence.token = 82")
	for round := range 3 {
		eventually(t, 10*time.Second, "the plain client parked", func() bool { return proxy.ParkedClients(p.Server) == 1 })
		sweepsPass(t, p.Server, 3)
		if got := proxy.ParkedClients(p.Server); got != 1 {
			t.Fatalf("round %d: %d parked; want the plain client only", round, got)
		}
		if tok := currentOf(t, secure, "fence.token"); tok != "81" {
			t.Fatalf("round %d: TLS client's token %q", round, tok)
		}
		if tok := currentOf(t, plain, "fence.token"); tok != "82" {
			t.Fatalf("round %d: plain client's token %q", round, tok)
		}
	}
}

// Parked clients count as clients (pool.max_clients, limits.max_client_connections) and are listed (SHOW
// CLIENTS); after PAUSE a parked client's next transaction waits as an unparked one's does, and runs after
// RESUME with its token; a reload while clients are parked applies to their statements prepared before it.
func TestParkAttackAdminLimitsReload(t *testing.T) {
	t.Run("max_clients", func(t *testing.T) {
		f := newParkingFencedEvery(t, 1, 5*time.Millisecond, "  admin_users: [admin]\n  max_clients: 2\n  max_client_wait: 20s\n")
		srv := f.p.Server
		a := pooledConn(t, f, "")
		b := pooledConn(t, f, "")
		fxExec(t, a, "SET fence.token = 91")
		fxExec(t, b, "SET fence.token = 92")
		eventually(t, 10*time.Second, "both parked", func() bool { return proxy.ParkedClients(srv) == 2 })
		_, err := pgx.Connect(ctxT(t), f.dsn())
		wantPgErr(t, err, "53300", "sorry, too many clients already")
		adm := adminConn(t, f)
		if rows := adminRows(t, adm, "SHOW CLIENTS"); len(rows) != 2 {
			t.Fatalf("SHOW CLIENTS with two parked: %v", rows)
		}
		if _, err := adm.Exec(ctxT(t), "PAUSE"); err != nil {
			t.Fatal(err)
		}
		type answer struct {
			tok string
			err error
		}
		got := make(chan answer, 1)
		go func() { tok, err := tokenOf(a); got <- answer{tok, err} }()
		eventually(t, 10*time.Second, "the resumed client waits for the paused pool", func() bool {
			p := adminRows(t, adm, "SHOW POOLS")
			return len(p) == 1 && p[0]["cl_waiting"] == "1"
		})
		select {
		case r := <-got:
			t.Fatalf("a parked client's transaction ran during PAUSE: %v", r)
		default:
		}
		if _, err := adm.Exec(ctxT(t), "RESUME"); err != nil {
			t.Fatal(err)
		}
		if r := <-got; r.err != nil || r.tok != "91" {
			t.Fatalf("after RESUME: %s, %v", r.tok, r.err)
		}
		b.Close(context.Background())
		eventuallyLetIn(t, f)
	})
	t.Run("max_client_connections", func(t *testing.T) {
		f := newParkingFencedEvery(t, 1, 5*time.Millisecond, "limits:\n  max_client_connections: 2\n")
		srv := f.p.Server
		a := pooledConn(t, f, "")
		pooledConn(t, f, "")
		eventually(t, 10*time.Second, "both parked", func() bool { return proxy.ParkedClients(srv) == 2 })
		_, err := pgx.Connect(ctxT(t), f.dsn())
		wantPgErr(t, err, "53300", "sorry, too many clients already")
		a.Close(context.Background())
		eventuallyLetIn(t, f)
	})
	t.Run("reload", func(t *testing.T) {
		d := direct(t)
		name := fxName(t, "pr")
		fxCreateTable(t, d, "public."+name)
		fxExec(t, d, fmt.Sprintf("INSERT INTO public.%s (id, balance, fence_token) VALUES (1, 0, 9)", name))
		yaml := fxTables("public."+name+"_other") + "pool:\n  mode: transaction\n  size: 2\nauth:\n  type: trust\n"
		p := startProxy(t, proxytest.Options{YAML: yaml, ParkIdleAfter: 5 * time.Millisecond})
		f := &fenced{p: p, d: d, name: name, label: "public." + name}
		a := pooledPgConn(t, f, "")
		if err := a.Exec(ctxT(t), "SET fence.token = 5").Close(); err != nil {
			t.Fatal(err)
		}
		upd := fmt.Sprintf("UPDATE public.%s SET balance = balance + 1 WHERE id = $1", name)
		if _, err := a.Prepare(ctxT(t), "upd", upd, nil); err != nil {
			t.Fatal(err)
		}
		if err := execPrepared(a, "upd", 1); err != nil {
			t.Fatalf("before the reload: %v", err)
		}
		eventually(t, 10*time.Second, "parked", func() bool { return proxy.ParkedClients(p.Server) == 1 })
		reloadTables(t, f, "public."+name+"_other", "public."+name)
		sweepsPass(t, p.Server, 2)
		wantReloadStale(t, f, "a parked client's statement prepared before the reload", execPrepared(a, "upd", 1))
	})
}

// eventuallyLetIn waits until a new client gets in through f's proxy (after a parked one left its place).
func eventuallyLetIn(t *testing.T, f *fenced) {
	t.Helper()
	eventually(t, 10*time.Second, "a new client let in after a parked one left", func() bool {
		c, err := pgx.Connect(ctxT(t), f.dsn())
		if err != nil {
			return false
		}
		c.Close(context.Background())
		return true
	})
}
