package proxy_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A client that pipelines far more than it reads, then leaves: the server blocks writing answers nobody reads,
// the proxy's writer of the client's messages blocks writing to the server, and the client's reset fails the
// relay of the answers. The server connection must be closed (the batch's transaction with it) and the next
// client served. From a review on 2026-12-03: the relay, failing, waited for the lock the blocked writer held,
// which only closing the server connection would free, so the connection and its pool slot stayed held until
// the proxy stopped (the waiting client got 53300 after max_client_wait).
func TestPooledClientLeavesAnUnreadPipeline(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 30s\n  admin_users: [admin]\n")
	adm := adminConn(t, f)
	ctx := ctxT(t)
	a := pooledPgConn(t, f, "")
	fe := a.Frontend()
	fe.Send(&pgproto3.Parse{Name: "big", Query: "SELECT repeat('x', 8000) AS unread_pipeline"})
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	conn := a.Conn()
	wrote := make(chan error, 1)
	var written atomic.Int64
	go func() {
		var buf []byte
		for {
			buf, _ = (&pgproto3.Bind{PreparedStatement: "big"}).Encode(buf)
			buf, _ = (&pgproto3.Execute{}).Encode(buf)
			if len(buf) > 1<<16 {
				if _, err := conn.Write(buf); err != nil {
					wrote <- err
					return
				}
				written.Add(int64(len(buf)))
				buf = buf[:0]
			}
		}
	}()
	eventually(t, 20*time.Second, "the server blocked writing answers nobody reads", func() bool {
		var n int
		err := f.d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'ClientWrite' AND query LIKE '%unread_pipeline%'").Scan(&n)
		return err == nil && n == 1
	})
	// Then the proxy's writer blocks on the server, which reads no more, and stops reading the client: the
	// client's writes stop going out.
	last, since := written.Load(), time.Now()
	eventually(t, 20*time.Second, "the client's writes stalled for 500 ms", func() bool {
		if cur := written.Load(); cur != last {
			last, since = cur, time.Now()
		}
		return time.Since(since) > 500*time.Millisecond
	})
	b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	answered := make(chan error, 1)
	go func() {
		var v int
		answered <- b.QueryRow(context.Background(), "SELECT 42").Scan(&v)
	}()
	waitingClients(t, adm, 1)
	conn.(*net.TCPConn).SetLinger(0)
	conn.Close() // a reset, with the pipeline unread
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
		err := f.d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%unread_pipeline%' AND pid <> pg_backend_pid()").Scan(&n)
		return err == nil && n == 0
	})
}
