package proxy_test

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A client that pipelines, in one extended-protocol batch, a statement that keeps the server busy, a COPY FROM
// STDIN with its data and CopyDone, a statement with far more output than the sockets hold, and megabytes more
// of messages, reads nothing, and leaves. While the server is busy the proxy's writer of the client's messages
// fills the sockets and blocks in a write to the server, holding the session's lock. The server then sends the
// CopyInResponse, reads the data and runs the big statement, whose output fills the sockets: it stops reading.
// Before the mend the lend's server side, at that CopyInResponse, waited for the lock (copyStarted) and read
// the server no more: neither side could move, the client's reset was never seen, and the connection and its
// pool slot stayed held until the proxy stopped. The next client must be served once the pipeliner left.
func TestPooledClientLeavesAPipelinedCopy(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 30s\n  admin_users: [admin]\n")
	plainTable(t, f, "pcu_copy")
	adm := adminConn(t, f)
	ctx := ctxT(t)
	a := pooledPgConn(t, f, "")
	conn := a.Conn()
	var batch []byte
	add := func(msgs ...pgproto3.FrontendMessage) {
		for _, m := range msgs {
			var err error
			if batch, err = m.Encode(batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The server is busy, reading nothing, while the proxy forwards what follows and fills the sockets.
	add(&pgproto3.Parse{Query: "SELECT pg_sleep(0.5)::text"}, &pgproto3.Bind{}, &pgproto3.Execute{})
	add(&pgproto3.Parse{Query: "COPY pcu_copy FROM STDIN"}, &pgproto3.Bind{}, &pgproto3.Execute{},
		&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{})
	// 64 MB of output, far more than the sockets between the server and the client hold.
	add(&pgproto3.Parse{Query: "SELECT repeat('x', 1000000) AS pipelined_copy_unread FROM generate_series(1, 64)"},
		&pgproto3.Bind{}, &pgproto3.Execute{})
	// 32 MB of messages the server has not read when it blocks writing that output, with little output of their own.
	add(&pgproto3.Parse{Query: "SELECT length($1::text)"})
	param := bytes.Repeat([]byte("y"), 1<<20)
	for range 32 {
		add(&pgproto3.Bind{Parameters: [][]byte{param}}, &pgproto3.Execute{})
	}
	add(&pgproto3.Sync{})
	var written atomic.Int64
	wrote := make(chan error, 1)
	go func() {
		for rest := batch; len(rest) > 0; {
			n := min(len(rest), 1<<16)
			if _, err := conn.Write(rest[:n]); err != nil {
				wrote <- err
				return
			}
			written.Add(int64(n))
			rest = rest[n:]
		}
		wrote <- nil
	}()
	eventually(t, 20*time.Second, "the server blocked writing the big statement's output", func() bool {
		var n int
		err := f.d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'ClientWrite' AND query LIKE '%pipelined_copy_unread%'").Scan(&n)
		return err == nil && n == 1
	})
	// The server reads no more: the proxy's writer blocks, and stops reading the client.
	last, since := written.Load(), time.Now()
	eventually(t, 20*time.Second, "the client's writes stalled for 500 ms", func() bool {
		if cur := written.Load(); cur != last {
			last, since = cur, time.Now()
		}
		return time.Since(since) > 500*time.Millisecond
	})
	if written.Load() == int64(len(batch)) {
		t.Fatal("the whole batch went out: the proxy's writer never blocked, the test proves nothing")
	}
	b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	answered := make(chan error, 1)
	go func() {
		var v int
		answered <- b.QueryRow(context.Background(), "SELECT 42").Scan(&v)
	}()
	waitingClients(t, adm, 1)
	conn.(*net.TCPConn).SetLinger(0)
	conn.Close() // a reset, with the batch's answers unread
	<-wrote
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
		err := f.d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pipelined_copy_unread%' AND pid <> pg_backend_pid()").Scan(&n)
		return err == nil && n == 0
	})
}
