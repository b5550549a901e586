package proxy_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// In transaction mode the startup reads and writes the client's socket with raw system calls from its first
// byte (negotiate). Clients that abuse the startup (one byte per write, a stall in the middle, an SSLRequest or
// GSSENCRequest and then nothing or a close, a TLS handshake that fails, direct TLS, a CancelRequest sent a
// byte at a time, a half-close, absurd lengths, bytes after an SSLRequest, many stalled at once) are answered or
// closed as in session mode: no hang past the startup timeout, no panic, and the proxy's goroutines and file
// descriptors come back to what they were, while it goes on serving.
func TestPooledStartupAbuse(t *testing.T) {
	pgtest.Require(t, pg)
	caFile, certFile, keyFile := writeTestCerts(t, t.TempDir())
	p := startProxy(t, proxytest.Options{YAML: "pool:\n  mode: transaction\n  size: 1\nauth:\n  type: trust\nlimits:\n  startup_timeout: 500ms\n" +
		fmt.Sprintf("tls:\n  cert_file: %s\n  key_file: %s\n", certFile, keyFile)})
	healthy(t, p)
	// A proxy that authenticates with SCRAM, whose exchange the startup also reads and writes raw.
	d := direct(t)
	var secret string
	if err := d.QueryRow(ctxT(t), "SELECT rolpassword FROM pg_authid WHERE rolname = $1", pgtest.ScramUser).Scan(&secret); err != nil {
		t.Fatal(err)
	}
	userlist := t.TempDir() + "/userlist.txt"
	if err := os.WriteFile(userlist, []byte(fmt.Sprintf("%q %q\n", pgtest.ScramUser, secret)), 0o600); err != nil {
		t.Fatal(err)
	}
	ps := startProxy(t, proxytest.Options{YAML: fmt.Sprintf("pool:\n  mode: transaction\n  size: 1\nauth:\n  type: scram-sha-256\n  file: %s\n", userlist) +
		"limits:\n  startup_timeout: 500ms\n"})
	healthyAs(t, ps)
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	baseG, baseFD := runtime.NumGoroutine(), fds()

	startup := func() []byte {
		b, err := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
			Parameters: map[string]string{"user": pgtest.SuperUser, "database": pgtest.TestDB}}).Encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}()
	request := func(code uint32) []byte {
		b := binary.BigEndian.AppendUint32(nil, 8)
		return binary.BigEndian.AppendUint32(b, code)
	}
	const sslRequest, gssRequest, cancelRequest = 80877103, 80877104, 80877102
	scramStartup := func() []byte {
		b, err := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
			Parameters: map[string]string{"user": pgtest.ScramUser, "database": pgtest.TestDB}}).Encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}()
	dialTo := func(t *testing.T, addr string) net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c
	}
	dial := func(t *testing.T) net.Conn {
		c, err := net.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c
	}
	bytewise := func(t *testing.T, c net.Conn, b []byte) {
		for i := range b {
			if _, err := c.Write(b[i : i+1]); err != nil {
				t.Fatalf("write byte %d: %v", i, err)
			}
		}
	}
	// loggedIn reads up to the ReadyForQuery of a login, runs a query and says goodbye.
	loggedIn := func(t *testing.T, rw io.ReadWriter) {
		fe := pgproto3.NewFrontend(rw, rw)
		for {
			m, err := fe.Receive()
			if err != nil {
				t.Fatalf("login: %v", err)
			}
			if e, ok := m.(*pgproto3.ErrorResponse); ok {
				t.Fatalf("login: %s %s", e.Code, e.Message)
			}
			if _, ok := m.(*pgproto3.ReadyForQuery); ok {
				break
			}
		}
		fe.Send(&pgproto3.Query{String: "SELECT 41 + 1"})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var got string
		for {
			m, err := fe.Receive()
			if err != nil {
				t.Fatalf("query: %v", err)
			}
			if d, ok := m.(*pgproto3.DataRow); ok {
				got = string(d.Values[0])
			}
			if _, ok := m.(*pgproto3.ReadyForQuery); ok {
				break
			}
		}
		if got != "42" {
			t.Fatalf("query answered %q", got)
		}
		fe.Send(&pgproto3.Terminate{})
		fe.Flush()
	}
	readByte := func(t *testing.T, c net.Conn) byte {
		var b [1]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			t.Fatalf("answer to the request: %v", err)
		}
		return b[0]
	}
	roots := x509.NewCertPool()
	if pem, err := os.ReadFile(caFile); err != nil || !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("CA: %v", err)
	}
	tlsCfg := &tls.Config{RootCAs: roots, ServerName: "localhost"}

	t.Run("startup a byte at a time", func(t *testing.T) {
		c := dial(t)
		defer c.Close()
		bytewise(t, c, startup)
		loggedIn(t, c)
	})
	t.Run("startup and a Query in one write", func(t *testing.T) {
		c := dial(t)
		defer c.Close()
		q, err := (&pgproto3.Query{String: "SELECT 41 + 1"}).Encode(append([]byte(nil), startup...))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(q); err != nil {
			t.Fatal(err)
		}
		loggedIn(t, c) // the pipelined Query's answer, then its own
	})
	t.Run("GSSENCRequest a byte at a time, refused, then startup", func(t *testing.T) {
		c := dial(t)
		defer c.Close()
		bytewise(t, c, request(gssRequest))
		if b := readByte(t, c); b != 'N' {
			t.Fatalf("GSSENCRequest answered %q", b)
		}
		bytewise(t, c, startup)
		loggedIn(t, c)
	})
	t.Run("SSLRequest a byte at a time, then TLS", func(t *testing.T) {
		c := dial(t)
		defer c.Close()
		bytewise(t, c, request(sslRequest))
		if b := readByte(t, c); b != 'S' {
			t.Fatalf("SSLRequest answered %q", b)
		}
		tc := tls.Client(c, tlsCfg)
		if _, err := tc.Write(startup); err != nil {
			t.Fatal(err)
		}
		loggedIn(t, tc)
	})
	t.Run("direct TLS", func(t *testing.T) {
		c := dial(t)
		defer c.Close()
		cfg := tlsCfg.Clone()
		cfg.NextProtos = []string{"postgresql"}
		tc := tls.Client(c, cfg)
		if _, err := tc.Write(startup); err != nil {
			t.Fatal(err)
		}
		loggedIn(t, tc)
	})
	closedBy := func(t *testing.T, c net.Conn) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		r := bufio.NewReader(c)
		for {
			if _, err := r.ReadByte(); err != nil {
				if isTimeoutErr(err) {
					t.Fatalf("connection still open: %v", err)
				}
				return
			}
		}
	}
	for _, tc := range []struct {
		name string
		send func(t *testing.T, c net.Conn)
		gone bool // the client closes right after: only the proxy's own clean-up is looked at
	}{
		{"SSLRequest, then close", func(t *testing.T, c net.Conn) { c.Write(request(sslRequest)) }, true},
		{"GSSENCRequest, then close", func(t *testing.T, c net.Conn) { c.Write(request(gssRequest)) }, true},
		{"SSLRequest, then stall", func(t *testing.T, c net.Conn) { c.Write(request(sslRequest)) }, false},
		{"stall in the TLS handshake", func(t *testing.T, c net.Conn) {
			c.Write(request(sslRequest))
			readByte(t, c)
			c.Write([]byte{0x16, 0x03, 0x01})
		}, false},
		{"half of a startup, then close", func(t *testing.T, c net.Conn) { c.Write(startup[:len(startup)/2]) }, true},
		{"SSLRequest, then a TLS handshake of garbage", func(t *testing.T, c net.Conn) {
			c.Write(request(sslRequest))
			readByte(t, c)
			c.Write([]byte("\x16\x03\x01\x00\x05hello, not TLS"))
		}, false},
		{"SSLRequest with bytes after it", func(t *testing.T, c net.Conn) { c.Write(append(request(sslRequest), startup...)) }, false},
		{"direct TLS without ALPN", func(t *testing.T, c net.Conn) {
			tls.Client(c, tlsCfg).Handshake()
		}, false},
		{"CancelRequest a byte at a time", func(t *testing.T, c net.Conn) {
			b := binary.BigEndian.AppendUint32(nil, 16)
			b = binary.BigEndian.AppendUint32(b, cancelRequest)
			b = binary.BigEndian.AppendUint32(b, 12345)
			bytewise(t, c, binary.BigEndian.AppendUint32(b, 67890))
		}, false},
		{"stall in the length", func(t *testing.T, c net.Conn) { c.Write(startup[:3]) }, false},
		{"stall in the body", func(t *testing.T, c net.Conn) { c.Write(startup[:len(startup)-1]) }, false},
		{"stall after an SSLRequest", func(t *testing.T, c net.Conn) { c.Write(request(sslRequest)); readByte(t, c) }, false},
		{"stall after a refused GSSENCRequest", func(t *testing.T, c net.Conn) { c.Write(request(gssRequest)); readByte(t, c) }, false},
		{"half-close in the body", func(t *testing.T, c net.Conn) {
			c.Write(startup[:len(startup)-1])
			c.(*net.TCPConn).CloseWrite()
		}, false},
		{"half-close after the startup", func(t *testing.T, c net.Conn) {
			c.Write(startup)
			c.(*net.TCPConn).CloseWrite()
		}, false},
		{"absurd length", func(t *testing.T, c net.Conn) { c.Write([]byte{0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0}) }, false},
		{"negative length", func(t *testing.T, c net.Conn) { c.Write([]byte{0xff, 0xff, 0xff, 0xf0, 0, 3, 0, 0}) }, false},
		{"largest startup of garbage", func(t *testing.T, c net.Conn) {
			b := binary.BigEndian.AppendUint32(nil, 10000)
			b = binary.BigEndian.AppendUint32(b, 3<<16)
			c.Write(append(b, strings.Repeat("x", 10000-8)...))
		}, false},
		{"a startup too large", func(t *testing.T, c net.Conn) {
			b := binary.BigEndian.AppendUint32(nil, 1<<20)
			b = binary.BigEndian.AppendUint32(b, 3<<16)
			c.Write(append(b, strings.Repeat("x", 1<<16)...))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t)
			defer c.Close()
			tc.send(t, c)
			if !tc.gone {
				closedBy(t, c)
			}
		})
	}
	t.Run("SCRAM", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			send func(t *testing.T, c net.Conn)
			gone bool
		}{
			{"stall before the SASL response", func(t *testing.T, c net.Conn) { bytewise(t, c, scramStartup) }, false},
			{"close before the SASL response", func(t *testing.T, c net.Conn) { c.Write(scramStartup) }, true},
			{"a SASL response of garbage, a byte at a time", func(t *testing.T, c net.Conn) {
				c.Write(scramStartup)
				b := []byte{'p'}
				b = binary.BigEndian.AppendUint32(b, 4+13)
				bytewise(t, c, append(b, "SCRAM-SHA-256"...))
			}, false},
			{"a SASL response half sent, then stall", func(t *testing.T, c net.Conn) {
				c.Write(scramStartup)
				b := []byte{'p'}
				b = binary.BigEndian.AppendUint32(b, 100)
				c.Write(append(b, "SCRAM-SHA-256\x00"...))
			}, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				c := dialTo(t, ps.Addr)
				defer c.Close()
				tc.send(t, c)
				if !tc.gone {
					closedBy(t, c)
				}
			})
		}
	})
	t.Run("many stalled at once", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := 0; i < 40; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := net.Dial("tcp", p.Addr)
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				c.Write(startup[:i%len(startup)])
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.Copy(io.Discard, c); isTimeoutErr(err) {
					t.Errorf("stalled client %d still open", i)
				}
			}()
		}
		wg.Wait()
	})

	// The handler goroutines that served these end after their idle time (handlerIdle).
	eventually(t, 20*time.Second, "the proxy's goroutines and descriptors to come back", func() bool {
		return runtime.NumGoroutine() <= baseG && fds() <= baseFD
	})
	healthy(t, p)
	healthyAs(t, ps)
}

// healthyAs asserts that p, which authenticates the SCRAM user, still serves a fresh session.
func healthyAs(t *testing.T, p *proxytest.Proxy) {
	t.Helper()
	c := connect(t, p.DSN(pgtest.ScramUser, pgtest.ScramPassword, pgtest.TestDB))
	var one int
	if err := c.QueryRow(ctxT(t), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("proxy no longer serves: %v", err)
	}
}
