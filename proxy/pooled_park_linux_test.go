package proxy_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// parkAfter is the parker's sweep period in these tests: a client idle through one sweep parks.
const parkAfter = 20 * time.Millisecond

// newParkingFenced is newPooledFenced with a parker that sweeps every parkAfter.
func newParkingFenced(t *testing.T, size int) *fenced {
	t.Helper()
	d := direct(t)
	name := fxName(t, "pk")
	fxCreateTable(t, d, "public."+name)
	yaml := fxTables("public."+name) + fmt.Sprintf("pool:\n  mode: transaction\n  size: %d\n", size) + "auth:\n  type: trust\n"
	p := startProxy(t, proxytest.Options{YAML: yaml, ParkIdleAfter: parkAfter})
	return &fenced{p: p, d: d, name: name, label: "public." + name}
}

// sweepsPass waits until the parker made n more sweeps than now: what a sweep could do, it did.
func sweepsPass(t *testing.T, s *proxy.Server, n int64) {
	t.Helper()
	from := proxy.Sweeps(s)
	eventually(t, 10*time.Second, fmt.Sprintf("%d sweeps", n), func() bool { return proxy.Sweeps(s) >= from+n })
}

// Idle clients of a transaction pool park (no goroutine, no buffers) and come back as they were: each its own
// token, settings and named statements, in the simple and the extended protocol, again and again; a parked
// client that goes away ends its session; a drain ends the parked ones.
func TestPooledIdleClientsPark(t *testing.T) {
	f := newParkingFenced(t, 2)
	srv := f.p.Server
	const n = 24
	clients := make([]*pgx.Conn, n)
	for i := range clients {
		q := ""
		if i%2 == 1 {
			q = "&default_query_exec_mode=simple_protocol"
		}
		c := pooledConn(t, f, q)
		fxExec(t, c, fmt.Sprintf("SET fence.token = %d", 100+i))
		fxExec(t, c, fmt.Sprintf("SET application_name = 'client%d'", i))
		clients[i] = c
	}
	check := func(round int) {
		t.Helper()
		for i, c := range clients {
			var tok, app string
			var two int
			// A statement with a parameter: a named statement pgx prepared in the first round, on whichever
			// server connection, bound again now (extended clients).
			if err := c.QueryRow(ctxT(t), "SELECT current_setting('fence.token'), current_setting('application_name'), $1::int + 1", 1).Scan(&tok, &app, &two); err != nil {
				t.Fatalf("round %d, client %d: %v", round, i, err)
			}
			if tok != fmt.Sprint(100+i) || app != fmt.Sprintf("client%d", i) || two != 2 {
				t.Fatalf("round %d, client %d: token %s, application_name %s, %d; want %d, client%d, 2", round, i, tok, app, two, 100+i, i)
			}
			fxExec(t, c, f.sql(fmt.Sprintf("INSERT INTO %%[1]s (balance) VALUES (%d)", round)))
		}
	}
	check(0)
	for round := 1; round <= 3; round++ {
		eventually(t, 10*time.Second, fmt.Sprintf("round %d: %d parked clients", round, n), func() bool { return proxy.ParkedClients(srv) == n })
		check(round)
	}
	var rows, tokens int
	if err := f.d.QueryRow(ctxT(t), f.sql("SELECT count(*), count(DISTINCT fence_token) FROM %[1]s")).Scan(&rows, &tokens); err != nil {
		t.Fatal(err)
	}
	if rows != 4*n || tokens != n {
		t.Fatalf("%d rows with %d tokens; want %d with %d", rows, tokens, 4*n, n)
	}

	// Clients that go away while parked end their sessions (and give their places back).
	eventually(t, 10*time.Second, "parked again", func() bool { return proxy.ParkedClients(srv) == n })
	before := srv.ActiveSessions()
	for _, c := range clients[:4] {
		c.Close(context.Background())
	}
	eventually(t, 10*time.Second, "4 sessions fewer", func() bool { return srv.ActiveSessions() == before-4 && proxy.ParkedClients(srv) == n-4 })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown with parked clients: %v", err)
	}
	if got := srv.ActiveSessions(); got != 0 {
		t.Fatalf("%d sessions after the drain", got)
	}
	if _, err := clients[5].Exec(ctxT(t), "SELECT 1"); err == nil {
		t.Fatal("a drained parked client's session goes on")
	}
}

// A client never parks with a transaction open, nor in the middle of a message it is sending slowly (header or
// body), and what it sends after is answered.
func TestPooledParkWaitsForBoundaries(t *testing.T) {
	f := newParkingFenced(t, 1)
	srv := f.p.Server

	c := pooledConn(t, f, "")
	fxExec(t, c, "SET fence.token = 7")
	tx, err := c.Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	fxExec(t, c, f.sql("INSERT INTO %[1]s (balance) VALUES (1)"))
	sweepsPass(t, srv, 3)
	if got := proxy.ParkedClients(srv); got != 0 {
		t.Fatalf("%d parked with a transaction open", got)
	}
	if err := tx.Commit(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the client parked after its commit", func() bool { return proxy.ParkedClients(srv) == 1 })

	// A raw client: a Query whose bytes come in three pieces, a few sweeps apart.
	raw, fe, _ := rawStartup(t, f.p.Addr, pgproto3.ProtocolVersionNumber, nil)
	query, err := (&pgproto3.Query{String: "SELECT 'whole'"}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the raw client parked", func() bool { return proxy.ParkedClients(srv) == 2 })
	for _, piece := range [][]byte{query[:3], query[3:8]} {
		if _, err := raw.Write(piece); err != nil {
			t.Fatal(err)
		}
		sweepsPass(t, srv, 3)
		if got := proxy.ParkedClients(srv); got != 1 { // the pgx client only
			t.Fatalf("%d parked with a message half sent", got)
		}
	}
	if _, err := raw.Write(query[8:]); err != nil {
		t.Fatal(err)
	}
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []string
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		got = append(got, fmt.Sprintf("%T", m))
		if d, ok := m.(*pgproto3.DataRow); ok && string(d.Values[0]) != "whole" {
			t.Fatalf("row %q", d.Values[0])
		}
		if _, ok := m.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	if len(got) != 4 {
		t.Fatalf("answer %v; want RowDescription, DataRow, CommandComplete, ReadyForQuery", got)
	}
	eventually(t, 10*time.Second, "both parked", func() bool { return proxy.ParkedClients(srv) == 2 })
}
