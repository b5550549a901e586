package proxy_test

import (
	"testing"
	"time"
)

// The session ends while it still holds its server connection (a protocol violation: a message of a type no
// frontend sends) and while the lend's server side is stuck in a write of rows to a client that reads
// nothing. The session's end waits for that side before its farewell, so the write must be bounded there too:
// the session ends, and its pool slot comes back, within the farewell's and the linger's time, not when (if
// ever) the client reads. TestPooledEndWithAClientThatReadsNothing is the same with a refusal, which takes the
// connection from the lend before the end. Attack of probe57 on 2026-12-05.
func TestPooledProtocolEndWithAClientThatReadsNothing(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fe := rowsFlowing(t, f)
	// The backend waits to write: the relay reads it no more, for it is stuck in its write to the client.
	ctx := ctxT(t)
	eventually(t, 10*time.Second, "the backend to wait for the relay to read", func() bool {
		var n int
		err := f.d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'ClientWrite' AND query LIKE 'SELECT repeat(%'").Scan(&n)
		return err == nil && n == 1
	})
	fe.SendUnbufferedEncodedCopyData([]byte{'z', 0, 0, 0, 4})
	// The client reads nothing from here on, and keeps its socket open.
	eventually(t, 15*time.Second, "the session ended", func() bool { return f.p.Server.ActiveSessions() == 0 })
}
