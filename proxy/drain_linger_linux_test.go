package proxy_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// TestDrainDeliversTheLastAnswer: a drain ends a session at its next ReadyForQuery. A client that is still
// reading a long answer and has already sent its next statement must still get the whole answer and the
// FATAL 57P01, then an orderly end of file: closing a socket with unread input makes the kernel reset the
// connection, which throws away what is still on its way to the client (end.go, lingerTimeout).
func TestDrainDeliversTheLastAnswer(t *testing.T) {
	for _, mode := range []string{"loop", "goroutines"} {
		t.Run(mode, func(t *testing.T) {
			p := startProxy(t, proxytest.Options{YAML: "relay:\n  mode: " + mode + "\n"})
			conn, _, _ := rawStartup(t, p.Addr, pgproto3.ProtocolVersionNumber, nil)
			if mode == "loop" {
				eventually(t, 5*time.Second, "the session in the event loop", func() bool { return proxy.SessionsInLoop(p.Server) == 1 })
			}
			conn.SetDeadline(time.Now().Add(60 * time.Second))
			const answer = 16 << 20
			query := func(sql string) []byte {
				b, err := (&pgproto3.Query{String: sql}).Encode(nil)
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
			if _, err := conn.Write(query("SELECT repeat('x', 16777216)")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 8<<10)
			total := 0
			var readErr error
			read := func() int {
				n, err := conn.Read(buf)
				total += n
				readErr = err
				return n
			}
			for total < 64<<10 && readErr == nil {
				read() // the answer is flowing: the session is busy
			}
			done := startDrain(t, p)
			var tail []byte
			sent := false
			for readErr == nil {
				n := read()
				tail = append(tail, buf[:n]...)
				if len(tail) > 64<<10 {
					tail = tail[len(tail)-(32<<10):]
				}
				if !sent && total >= answer-(1<<20) {
					// The next statement, pipelined while a megabyte of the answer is still unread.
					if _, err := conn.Write(query("SELECT 2")); err != nil {
						t.Fatal(err)
					}
					sent = true
				}
				time.Sleep(100 * time.Microsecond) // read slowly, as a client processing rows does
			}
			if !errors.Is(readErr, io.EOF) {
				t.Fatalf("after %d bytes (answer %d): %v, want the whole answer, the FATAL and end of file", total, answer, readErr)
			}
			if total < answer {
				t.Fatalf("got %d bytes, less than the %d-byte answer", total, answer)
			}
			if !bytes.Contains(tail, []byte("57P01")) {
				t.Fatalf("no FATAL 57P01 at the end; tail %q", tail[max(0, len(tail)-200):])
			}
			if err := <-done; err != nil {
				t.Fatalf("shutdown: %v", err)
			}
		})
	}
}

// TestDrainWaitsForAMessageBeingRead: with the goroutine transport, a drain that finds the session idle while the
// client's next Query is half read (a large body arriving in pieces) lets that Query finish arriving, run and be
// answered before the session closes with FATAL 57P01. The drain is decided at the client side's message
// boundary; decided on the server side, it closed the session with the body half read, and the client never got
// an answer.
func TestDrainWaitsForAMessageBeingRead(t *testing.T) {
	p := startProxy(t, proxytest.Options{YAML: "relay:\n  mode: goroutines\n"})
	conn, _, _ := rawStartup(t, p.Addr, pgproto3.ProtocolVersionNumber, nil)
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	msg, err := (&pgproto3.Query{String: "SELECT length('" + strings.Repeat("x", 256<<10) + "')"}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	half := len(msg) / 2
	if _, err := conn.Write(msg[:half]); err != nil {
		t.Fatal(err)
	}
	done := startDrain(t, p)
	eventually(t, 5*time.Second, "the drain to reach the session's client side", func() bool { return proxy.DrainsAsked(p.Server) == 1 })
	if _, err := conn.Write(msg[half:]); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("read until the end: %v (got %q)", err, got)
	}
	conn.Close() // the proxy lingers for the client's close
	answer := bytes.Index(got, []byte("262144"))
	fatal := bytes.Index(got, []byte("57P01"))
	if answer < 0 || fatal < answer {
		t.Fatalf("want the Query's answer (262144) and then FATAL 57P01; got %q", got)
	}
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}
