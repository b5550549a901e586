package proxy_test

import (
	"bytes"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A client that pipelines, in one extended-protocol batch, a statement that keeps the server busy, a COPY FROM
// STDIN with its data and CopyDone, a statement with far more output than the sockets hold, and more messages
// than the sockets hold, reads nothing, and leaves. While the server is busy the proxy's writer of the client's
// messages fills the sockets and blocks in a write to the server, holding the session's lock. The server then
// sends the CopyInResponse, reads the data and runs the big statement, whose output fills the sockets: it stops
// reading. Before the mend the lend's server side, at that CopyInResponse, waited for the lock (copyStarted) and
// read the server no more: neither side could move, the client's reset was never seen, and the connection and its
// pool slot stayed held until the proxy stopped. The next client must be served once the pipeliner left.
func TestPooledClientLeavesAPipelinedCopy(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 30s\n  admin_users: [admin]\n")
	plainTable(t, f, "pcu_copy")
	adm := adminConn(t, f)
	a := pooledPgConn(t, f, "")
	conn := a.Conn()
	// The server is busy, reading nothing, while the proxy forwards what follows and fills the sockets.
	batch := appendMsgs(t, nil, &pgproto3.Parse{Query: "SELECT pg_sleep(0.5)::text"}, &pgproto3.Bind{}, &pgproto3.Execute{})
	batch = appendMsgs(t, batch, &pgproto3.Parse{Query: "COPY pcu_copy FROM STDIN"}, &pgproto3.Bind{}, &pgproto3.Execute{},
		&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{})
	// 64 MB of output, far more than the sockets between the server and the client hold.
	batch = appendMsgs(t, batch, &pgproto3.Parse{Query: "SELECT repeat('x', 1000000) AS pipelined_copy_unread FROM generate_series(1, 64)"},
		&pgproto3.Bind{}, &pgproto3.Execute{})
	// Then messages the server has not read when it blocks writing that output, with little output of their own,
	// until the sockets are full and the proxy's writer blocks (endlessly).
	batch = appendMsgs(t, batch, &pgproto3.Parse{Query: "SELECT length($1::text)"})
	param := bytes.Repeat([]byte("y"), 1<<20)
	u := writeUnread(conn, endlessly(batch, appendMsgs(t, nil, &pgproto3.Bind{Parameters: [][]byte{param}}, &pgproto3.Execute{})))
	u.blockedOn(t, f, "pipelined_copy_unread")
	u.leaveAndNextServed(t, f, adm, "pipelined_copy_unread")
}
