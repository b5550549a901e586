//go:build linux

package proxy_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"golang.org/x/sys/unix"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// TestFramingTerminateMidMessage: a client's Terminate that comes while a long message is being streamed to it
// (the client reads nothing, so the relay holds the message's first bytes and has not read its last ones) ends
// the stream at a message boundary, in each transport of session mode: the client never reads a message cut
// short.
func TestFramingTerminateMidMessage(t *testing.T) {
	for _, mode := range []string{"loop", "goroutines"} {
		t.Run(mode, func(t *testing.T) {
			p := startProxy(t, proxytest.Options{YAML: "relay:\n  mode: " + mode + "\n"})
			conn := frStartup(t, p.Addr, pgtest.SuperUser, pgtest.TestDB, nil)
			tc := conn.(*net.TCPConn)
			tc.SetReadBuffer(32 << 10)
			if mode == "loop" {
				eventually(t, 10*time.Second, "the session in the event loop", func() bool { return proxy.SessionsInLoop(p.Server) == 1 })
			}
			q, _ := (&pgproto3.Query{String: "SELECT " + frText(24<<20)}).Encode(nil)
			if _, err := conn.Write(q); err != nil {
				t.Fatal(err)
			}
			// The DataRow has begun to arrive: the relay streams it, and holds or waits for the rest.
			eventually(t, 20*time.Second, "the first bytes of the DataRow", func() bool { return frInq(t, tc) > 4096 })
			term, _ := (&pgproto3.Terminate{}).Encode(nil)
			if _, err := conn.Write(term); err != nil {
				t.Fatal(err)
			}
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			var hdr [5]byte
			var got []string
			for {
				if _, err := io.ReadFull(conn, hdr[:]); err != nil {
					if errors.Is(err, io.EOF) {
						break // the end of the stream, between two messages
					}
					t.Fatalf("after %v: read a header: %v", got, err)
				}
				n := int(binary.BigEndian.Uint32(hdr[1:])) - 4
				if _, err := io.CopyN(io.Discard, conn, int64(n)); err != nil {
					t.Fatalf("after %v: %q of %d bytes cut short: %v", got, hdr[0], n, err)
				}
				got = append(got, fmt.Sprintf("%c%d", hdr[0], n))
			}
			t.Logf("the client read %v, then the end of the stream", got)
		})
	}
}

// frInq is how many bytes wait unread in c's receive queue.
func frInq(t *testing.T, c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	rc.Control(func(fd uintptr) { n, err = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	if err != nil {
		t.Fatal(err)
	}
	return n
}
