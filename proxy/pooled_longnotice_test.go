package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A notice longer than the body buffer a session keeps (64 KiB), then an empty message the relay reads: at
// client_min_messages = debug2 PostgreSQL sends, at each Parse, a notice with the statement's whole text. The
// proxy's own Parse of a client's long statement again, on a connection another client used, sends one, which
// the relay reads and drops (the client had it at its own Parse). The dropped buffer made the client's own
// ParseComplete after it, in the same batch, come back from msgReader.body nil, which the relay takes for a
// message not read: it forwarded the next message's header as the ParseComplete's, then waited for the body of
// a message some gigabyte long that the server never sent, and the client hung. Its deadline makes that a
// failure.
func TestPooledLongHiddenNoticeBeforeParseComplete(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	conn, fe, _ := rawStartup(t, f.p.Addr, pgproto3.ProtocolVersionNumber, map[string]string{"client_min_messages": "debug2"})
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	text := "SELECT 1 AS one /* " + strings.Repeat("x", 100<<10) + " */"
	exchange := func(msgs ...pgproto3.FrontendMessage) []string {
		for _, m := range msgs {
			fe.Send(m)
		}
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			m, err := fe.Receive()
			if err != nil {
				t.Fatalf("after %v: %v", got, err)
			}
			switch m := m.(type) {
			case *pgproto3.ParseComplete:
				got = append(got, "ParseComplete")
			case *pgproto3.RowDescription:
				got = append(got, "RowDescription")
			case *pgproto3.ErrorResponse:
				t.Fatalf("after %v: %s %s", got, m.Code, m.Message)
			case *pgproto3.ReadyForQuery:
				return got
			}
		}
	}
	exchange(&pgproto3.Parse{Name: "long", Query: text})
	// Another client on the one server connection: the first one's statements are parsed again when it uses them.
	b := pooledPgConn(t, f, "")
	if _, err := b.Exec(ctxT(t), "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	got := exchange(&pgproto3.Describe{ObjectType: 'S', Name: "long"}, &pgproto3.Parse{Name: "two", Query: "SELECT 2 AS two"})
	if want := "RowDescription, ParseComplete"; strings.Join(got, ", ") != want {
		t.Fatalf("got %s, want %s", strings.Join(got, ", "), want)
	}
}
