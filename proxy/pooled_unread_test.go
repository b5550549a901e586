package proxy_test

import (
	"testing"

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
	var buf []byte
	u := writeUnread(a.Conn(), func() []byte {
		for buf = buf[:0]; len(buf) <= 1<<16; {
			buf, _ = (&pgproto3.Bind{PreparedStatement: "big"}).Encode(buf)
			buf, _ = (&pgproto3.Execute{}).Encode(buf)
		}
		return buf
	})
	u.blockedOn(t, f, "unread_pipeline")
	u.leaveAndNextServed(t, f, adm, "unread_pipeline")
}
