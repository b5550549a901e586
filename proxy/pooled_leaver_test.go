package proxy_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

// unreadPipeline is a client that pipelines far more than it reads, then leaves: the tests of the proxy's own
// deadlocks between the writer of a client's messages and the reader of the server's answers
// (TestPooledClientLeavesAnUnreadPipeline, ...APipelinedCopy, ...ACopyItFailed). written counts the bytes that
// went out; wrote gets the writer's end.
type unreadPipeline struct {
	conn    net.Conn
	written atomic.Int64
	wrote   chan error
}

// writeUnread writes the chunks next gives (nil: no more) to conn from a goroutine, reading nothing.
func writeUnread(conn net.Conn, next func() []byte) *unreadPipeline {
	u := &unreadPipeline{conn: conn, wrote: make(chan error, 1)}
	go func() {
		for chunk := next(); chunk != nil; chunk = next() {
			if _, err := conn.Write(chunk); err != nil {
				u.wrote <- err
				return
			}
			u.written.Add(int64(len(chunk)))
		}
		u.wrote <- nil
	}()
	return u
}

// endlessly gives batch 64 KiB at a time, then unit over and over, never ending (writeUnread): the client
// writes until the proxy stops reading it. A pipeline of a fixed size proves nothing when the sockets between
// the client and the proxy's writer hold all of it, and they may: the receive buffer of the proxy's client
// socket grows with Linux's autotuning up to net.ipv4.tcp_rmem's maximum (32 MB on some machines, with the
// proxy's end seen holding 15 MB unread), on top of the client's send buffer. A 32 MB tail then went out
// whole once, the proxy having read 4 MiB of it, though the proxy's writer was blocked.
func endlessly(batch, unit []byte) func() []byte {
	rest := batch
	return func() []byte {
		if len(rest) == 0 {
			rest = unit
		}
		n := min(len(rest), 1<<16)
		chunk := rest[:n]
		rest = rest[n:]
		return chunk
	}
}

// blockedOn waits until the server blocks writing the output of the statement whose text holds marker (nobody
// reads it), then until the client's writes made no progress for 500 ms: the server reads no more, the proxy's
// writer blocks on it and stops reading the client. The client's writes never end (endlessly), so they can
// only keep going if the proxy reads the client without forwarding what it reads.
func (u *unreadPipeline) blockedOn(t *testing.T, f *fenced, marker string) {
	t.Helper()
	eventually(t, 20*time.Second, "the server blocked writing output nobody reads", func() bool {
		var n int
		err := f.d.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'ClientWrite' AND query LIKE '%"+marker+"%'").Scan(&n)
		return err == nil && n == 1
	})
	last, since := u.written.Load(), time.Now()
	eventually(t, 20*time.Second, "the client's writes stalled for 500 ms (they went on: the proxy reads the client but does not forward it to the blocked server)", func() bool {
		if cur := u.written.Load(); cur != last {
			last, since = cur, time.Now()
		}
		return time.Since(since) > 500*time.Millisecond
	})
	select {
	case err := <-u.wrote:
		u.wrote <- err // for leaveAndNextServed
		if err == nil {
			t.Fatal("the whole pipeline went out: the proxy's writer never blocked, the test proves nothing")
		}
	default:
	}
}

// appendMsgs is batch with msgs encoded after it.
func appendMsgs(t *testing.T, batch []byte, msgs ...pgproto3.FrontendMessage) []byte {
	t.Helper()
	for _, m := range msgs {
		var err error
		if batch, err = m.Encode(batch); err != nil {
			t.Fatal(err)
		}
	}
	return batch
}

// leaveAndNextServed: another client waits for the pool of one (adm sees it), the pipeliner resets its
// connection with its answers unread, and the other client must be served within 20 s, the pipeliner's backend
// (its statement's text holds marker) gone within 10 s. Held, the connection and its pool slot stayed with the
// deadlocked session until the proxy stopped.
func (u *unreadPipeline) leaveAndNextServed(t *testing.T, f *fenced, adm *pgx.Conn, marker string) {
	t.Helper()
	b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	answered := make(chan error, 1)
	go func() {
		var v int
		answered <- b.QueryRow(context.Background(), "SELECT 42").Scan(&v)
	}()
	waitingClients(t, adm, 1)
	u.conn.(*net.TCPConn).SetLinger(0)
	u.conn.Close() // a reset, with the answers unread
	<-u.wrote
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("the next client after the pipeliner left: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the next client was not served within 20 s after the pipeliner left: its server connection is held")
	}
	eventually(t, 10*time.Second, "the pipeliner's backend gone", func() bool {
		var n int
		err := f.d.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%"+marker+"%' AND pid <> pg_backend_pid()").Scan(&n)
		return err == nil && n == 0
	})
}
