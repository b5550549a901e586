package proxy_test

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// rawStartup connects to addr and completes a trust-auth startup with pgproto3, returning the frontend.
func rawStartup(t *testing.T, addr string, version uint32, params map[string]string) (net.Conn, *pgproto3.Frontend, []pgproto3.BackendMessage) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fe := pgproto3.NewFrontend(conn, conn)
	if params == nil {
		params = map[string]string{}
	}
	params["user"] = pgtest.SuperUser
	params["database"] = pgtest.TestDB
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: version, Parameters: params})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var got []pgproto3.BackendMessage
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatalf("startup: %v (after %d messages)", err, len(got))
		}
		got = append(got, copyMsg(m))
		if e, ok := m.(*pgproto3.ErrorResponse); ok {
			t.Fatalf("startup error: %s %s", e.Code, e.Message)
		}
		if _, ok := m.(*pgproto3.ReadyForQuery); ok {
			return conn, fe, got
		}
	}
}

// rawBackendPID asks a raw session for its backend PID and reads up to the ReadyForQuery.
func rawBackendPID(t *testing.T, fe *pgproto3.Frontend) uint32 {
	t.Helper()
	fe.Send(&pgproto3.Query{String: "SELECT pg_backend_pid()"})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var pid uint32
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if dr, ok := m.(*pgproto3.DataRow); ok {
			fmt.Sscan(string(dr.Values[0]), &pid)
		}
		if _, ok := m.(*pgproto3.ReadyForQuery); ok {
			return pid
		}
	}
}

// copyMsg keeps a message past the next Receive for the few types the tests inspect.
func copyMsg(m pgproto3.BackendMessage) pgproto3.BackendMessage {
	switch v := m.(type) {
	case *pgproto3.NegotiateProtocolVersion:
		c := *v
		c.UnrecognizedOptions = append([]string(nil), v.UnrecognizedOptions...)
		return &c
	case *pgproto3.ErrorResponse:
		c := *v
		return &c
	}
	return m
}

// expectClosedWithError reads from conn until it closes and returns the ErrorResponse it got, if any.
func expectClosedWithError(t *testing.T, conn net.Conn, within time.Duration) *pgproto3.ErrorResponse {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(within))
	fe := pgproto3.NewFrontend(conn, conn)
	var last *pgproto3.ErrorResponse
	for {
		m, err := fe.Receive()
		if err != nil {
			if isTimeoutErr(err) {
				t.Fatalf("connection still open after %v", within)
			}
			return last
		}
		if e, ok := m.(*pgproto3.ErrorResponse); ok {
			c := *e
			last = &c
		}
	}
}

func isTimeoutErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// healthy asserts the proxy still serves a fresh session.
func healthy(t *testing.T, p *proxytest.Proxy) {
	t.Helper()
	c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	var one int
	if err := c.QueryRow(ctxT(t), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("proxy no longer serves: %v", err)
	}
}

func TestNegotiateProtocolVersionPassesThrough(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	// Protocol 3.2 and an unknown _pq_ option: PostgreSQL 15 answers NegotiateProtocolVersion, which must
	// reach the client from the server itself.
	_, _, msgs := rawStartup(t, p.Addr, 3<<16|2, map[string]string{"_pq_.fence_test": "1"})
	var npv *pgproto3.NegotiateProtocolVersion
	for _, m := range msgs {
		if v, ok := m.(*pgproto3.NegotiateProtocolVersion); ok {
			npv = v
		}
	}
	if npv == nil {
		t.Fatalf("no NegotiateProtocolVersion in %T", msgs)
	}
	if npv.NewestMinorProtocol != 3<<16 || len(npv.UnrecognizedOptions) != 1 || npv.UnrecognizedOptions[0] != "_pq_.fence_test" {
		t.Fatalf("NegotiateProtocolVersion %+v", npv)
	}
}

func TestFunctionCall(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	_, fe, _ := rawStartup(t, p.Addr, pgproto3.ProtocolVersionNumber, nil)
	// int4pl (OID 177) adds two int4 in binary format.
	fe.Send(&pgproto3.FunctionCall{Function: 177, ArgFormatCodes: []uint16{1}, Arguments: [][]byte{{0, 0, 0, 40}, {0, 0, 0, 2}}, ResultFormatCode: 1})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := fe.Receive()
	if err != nil {
		t.Fatal(err)
	}
	r, ok := m.(*pgproto3.FunctionCallResponse)
	if !ok || binary.BigEndian.Uint32(r.Result) != 42 {
		t.Fatalf("FunctionCallResponse: %#v", m)
	}
	if m, err := fe.Receive(); err != nil {
		t.Fatal(err)
	} else if _, ok := m.(*pgproto3.ReadyForQuery); !ok {
		t.Fatalf("after FunctionCallResponse: %T", m)
	}
}

func TestMaxClientConnections(t *testing.T) {
	p := startProxy(t, proxytest.Options{YAML: "limits:\n  max_client_connections: 3\n"})
	for range 3 {
		connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	}
	_, err := pgx.Connect(ctxT(t), p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "53300" {
		t.Fatalf("4th connection: want 53300, got %v", err)
	}
}

func TestStartupTimeout(t *testing.T) {
	// Transaction mode too: there the startup reads the socket with raw system calls (negotiate), which the
	// deadline must cut as it cuts a net.Conn's read.
	for _, mode := range []string{"", "pool:\n  mode: transaction\n  size: 1\nauth:\n  type: trust\n"} {
		p := startProxy(t, proxytest.Options{YAML: "limits:\n  startup_timeout: 300ms\n" + mode})
		for _, send := range [][]byte{nil, {0, 0, 0}, {0, 0, 0, 100, 0, 3, 0, 0}} {
			conn, err := net.Dial("tcp", p.Addr)
			if err != nil {
				t.Fatal(err)
			}
			conn.Write(send)
			expectClosedWithError(t, conn, 5*time.Second)
			conn.Close()
		}
		healthy(t, p)
	}
}

func TestGarbageAndAbsurdInput(t *testing.T) {
	p := startProxy(t, proxytest.Options{YAML: "limits:\n  max_message_size: 65536\n"})
	// A bystander's query runs (waiting for a lock) through all of the garbage below.
	bystander := holdQuery(t, connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB)))

	startupGarbage := [][]byte{
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		{0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4},          // negative length
		{0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0},          // absurd length
		{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f, 0xff},    // SSLRequest followed by bytes before the answer
		{0, 0, 0, 12, 0, 3, 0, 0, 'u', 's', 'e', 'r'}, // unterminated parameters
		{0, 0, 0, 8, 0, 2, 0, 0},                      // protocol 2.0
	}
	for i, g := range startupGarbage {
		conn, err := net.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(g)
		e := expectClosedWithError(t, conn, 5*time.Second)
		conn.Close()
		if e == nil {
			t.Errorf("startup garbage %d: closed without an ErrorResponse", i)
		}
	}

	afterStartup := map[string][]byte{
		"unknown type":    {'!', 0, 0, 0, 4},
		"length below 4":  {'Q', 0, 0, 0, 2},
		"absurd length":   {'Q', 0x7f, 0xff, 0xff, 0xff},
		"oversized query": append([]byte{'Q', 0, 2, 0, 0}, make([]byte, 100)...),
		"unterminated Q":  {'Q', 0, 0, 0, 6, 'x', 'y'},
		// PostgreSQL refuses it too (invalid message format); the proxy must not read on past the zero byte.
		"zero byte inside a Query": append([]byte{'Q', 0, 0, 0, 4 + 14}, "SELECT 1\x00i1\x00x\x00"...),
	}
	for name, g := range afterStartup {
		conn, _, _ := rawStartup(t, p.Addr, pgproto3.ProtocolVersionNumber, nil)
		conn.Write(g)
		if name == "unterminated Q" {
			conn.(*net.TCPConn).CloseWrite()
		}
		e := expectClosedWithError(t, conn, 5*time.Second)
		if name != "unterminated Q" && (e == nil || e.Code != "08P01") {
			t.Errorf("%s: want 08P01 then close, got %+v", name, e)
		}
	}
	bystander.stillRunning(t, "the garbage")
	if err := bystander.release(t); err != nil {
		t.Fatalf("bystander session disturbed: %v", err)
	}
	healthy(t, p)
}

func backendState(t *testing.T, d *pgx.Conn, pid uint32) string {
	var state string
	err := d.QueryRow(context.Background(), "SELECT coalesce(state, '') FROM pg_stat_activity WHERE pid = $1", pid).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return "gone"
	}
	if err != nil {
		t.Fatal(err)
	}
	return state
}

func TestClientVanishingCancelsItsQuery(t *testing.T) { clientVanishingCancelsItsQuery(t, "") }

// clientVanishingCancelsItsQuery: a client that goes away while its query runs, through a proxy configured by
// yaml, has the query cancelled (its backend goes away). It returns the proxy.
func clientVanishingCancelsItsQuery(t *testing.T, yaml string) *proxytest.Proxy {
	p := startProxy(t, proxytest.Options{YAML: yaml})
	d := direct(t)
	conn, fe, _ := rawStartup(t, p.Addr, pgproto3.ProtocolVersionNumber, nil)
	pid := rawBackendPID(t, fe)
	fe.Send(&pgproto3.Query{String: "SELECT pg_sleep(60)"})
	fe.Flush()
	eventually(t, 10*time.Second, "the query to run", func() bool { return backendState(t, d, pid) == "active" })
	conn.Close()
	eventually(t, 10*time.Second, "the backend to go away", func() bool { return backendState(t, d, pid) == "gone" })
	return p
}

func TestUpstreamDeathReachesTheClient(t *testing.T) { upstreamDeathReachesTheClient(t, "") }

// upstreamDeathReachesTheClient: the upstream backend of a session through a proxy configured by yaml is
// terminated; the client's next query fails, its connection closes, and the proxy stays healthy.
func upstreamDeathReachesTheClient(t *testing.T, yaml string) {
	p := startProxy(t, proxytest.Options{YAML: yaml})
	c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	d := direct(t)
	ctx := ctxT(t)
	if _, err := d.Exec(ctx, "SELECT pg_terminate_backend($1)", c.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	_, err := c.Exec(ctx, "SELECT 1")
	if err == nil {
		t.Fatal("query on a terminated session succeeded")
	}
	eventually(t, 5*time.Second, "the client connection to close", func() bool { return c.IsClosed() })
	healthy(t, p)
}

func TestDrainLetsTransactionsFinish(t *testing.T) { drainLetsTransactionsFinish(t, "") }

// drainLetsTransactionsFinish drains a proxy (configured by yaml) with one idle session and one inside a
// transaction: the idle one is closed with 57P01, new connections are refused, and the transaction goes on and
// commits before the drain ends.
func drainLetsTransactionsFinish(t *testing.T, yaml string) {
	p := startProxy(t, proxytest.Options{YAML: yaml})
	ctx := ctxT(t)
	idle := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	busy := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	tx, err := busy.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "CREATE TEMP TABLE drained(x int)"); err != nil {
		t.Fatal(err)
	}
	// New connections are refused.
	shutdownDone := startDrain(t, p)
	// The idle session is closed with 57P01.
	eventually(t, 5*time.Second, "the idle session to be closed", func() bool {
		_, err := idle.Exec(ctx, "SELECT 1")
		return err != nil
	})
	// The transaction goes on and commits; then the session is closed.
	if _, err := tx.Exec(ctx, "INSERT INTO drained VALUES (1)"); err != nil {
		t.Fatalf("transaction during drain: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit during drain: %v", err)
	}
	select {
	case err := <-shutdownDone:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Shutdown did not finish after the last transaction ended")
	}
}

func TestClientTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := writeTestCerts(t, dir)
	p := startProxy(t, proxytest.Options{YAML: fmt.Sprintf("tls:\n  cert_file: %s\n  key_file: %s\n", certFile, keyFile)})
	ctx := ctxT(t)
	dsn := strings.Replace(p.DSN(pgtest.ScramUser, pgtest.ScramPassword, pgtest.TestDB), "sslmode=disable", "sslmode=verify-full&sslrootcert="+caFile, 1)
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("TLS connect: %v", err)
	}
	defer c.Close(ctx)
	if _, ok := c.PgConn().Conn().(*tls.Conn); !ok {
		t.Fatalf("client connection is %T, not TLS", c.PgConn().Conn())
	}
	var who string
	if err := c.QueryRow(ctx, "SELECT current_user").Scan(&who); err != nil || who != pgtest.ScramUser {
		t.Fatalf("SCRAM over TLS: %q %v", who, err)
	}
	// A client that insists on TLS against a proxy without it is refused by the client itself.
	plain := startProxy(t, proxytest.Options{})
	_, err = pgx.Connect(ctx, strings.Replace(plain.DSN(pgtest.SuperUser, "", pgtest.TestDB), "sslmode=disable", "sslmode=require", 1))
	if err == nil {
		t.Fatal("sslmode=require succeeded against a proxy without TLS")
	}
}

// writeTestCerts writes a CA and a server certificate for 127.0.0.1 and localhost.
func writeTestCerts(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caFile, certFile, keyFile, _ = writeCertsFor(t, dir)
	return caFile, certFile, keyFile
}

// TestServerFatalClosesTheClient: when PostgreSQL ends a session with FATAL (pg_terminate_backend, an idle
// timeout, a shutdown), the client gets the FATAL and then EOF, as when connected directly, without having to
// write anything first.
func TestServerFatalClosesTheClient(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	d := direct(t)
	conn, fe, _ := rawStartup(t, p.Addr, pgproto3.ProtocolVersionNumber, map[string]string{"application_name": "fatal-close"})
	ctx := ctxT(t)
	if _, err := d.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'fatal-close'"); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var fatal *pgproto3.ErrorResponse
	for {
		m, err := fe.Receive()
		if err != nil {
			if isTimeoutErr(err) {
				t.Fatal("the client connection stayed open after the server's FATAL")
			}
			break
		}
		if e, ok := m.(*pgproto3.ErrorResponse); ok {
			c := *e
			fatal = &c
		}
	}
	if fatal == nil || fatal.Code != "57P01" || fatal.Severity != "FATAL" {
		t.Fatalf("want the server's FATAL 57P01 before EOF, got %+v", fatal)
	}
	if strings.Contains(p.Logs.String(), "upstream connection lost") {
		t.Errorf("a FATAL from the server was logged as a lost upstream:\n%s", p.Logs.String())
	}
}

// startDrain starts the proxy's graceful shutdown and waits until it refuses new connections (its listener is
// closed); it returns the shutdown's result.
func startDrain(t *testing.T, p *proxytest.Proxy) <-chan error {
	t.Helper()
	done := startShutdown(p)
	eventually(t, 5*time.Second, "the drain to close the listener", func() bool {
		c, err := net.DialTimeout("tcp", p.Addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	return done
}

// startShutdown starts the proxy's graceful shutdown (a drain, bounded at 20 s) and returns its result.
func startShutdown(p *proxytest.Proxy) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- p.Server.Shutdown(ctx)
	}()
	return done
}
