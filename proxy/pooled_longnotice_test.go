package proxy_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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

// The same with the notice of the client's own Parse, which the client gets: the relay reads every notice's
// body (its position is moved into the client's text), and the ParseComplete right after it came back nil.
func TestPooledLongNoticeBeforeParseComplete(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	conn, fe, _ := rawStartup(t, f.p.Addr, pgproto3.ProtocolVersionNumber, map[string]string{"client_min_messages": "debug2"})
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	text := "SELECT 1 AS one /* " + strings.Repeat("x", 100<<10) + " */"
	fe.Send(&pgproto3.Parse{Query: text})
	fe.Send(&pgproto3.Sync{})
	fe.Send(&pgproto3.Query{String: "SELECT 2 AS two"})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for ready := 0; ready < 2; {
		m, err := fe.Receive()
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		switch m := m.(type) {
		case *pgproto3.NoticeResponse:
			// The server names the client's unnamed statement fenceproxy_u: the text is what counts here.
			if strings.HasPrefix(m.Message, "parse ") && strings.HasSuffix(m.Message, ": "+text) {
				got = append(got, "the Parse's notice")
			}
		case *pgproto3.ParseComplete:
			got = append(got, "ParseComplete")
		case *pgproto3.DataRow:
			got = append(got, "row "+string(m.Values[0]))
		case *pgproto3.ErrorResponse:
			t.Fatalf("after %v: %s %s", got, m.Code, m.Message)
		case *pgproto3.ReadyForQuery:
			ready++
		}
	}
	if want := "the Parse's notice, ParseComplete, row 2"; strings.Join(got, ", ") != want {
		t.Fatalf("got %s, want %s", strings.Join(got, ", "), want)
	}
}

// pgx's TestConnLargeResponseWhileWritingDoesNotDeadlock through the pooled proxy, as the pgx suite runs it: a
// statement of 65,535 parameters (a Parse of a megabyte, a Bind of half one) at client_min_messages = debug5,
// the server's notices coming back while the client still writes. It hung until the suite's timeout (the
// ParseComplete after the Parse's notice of the whole text, TestPooledLongNoticeBeforeParseComplete); the
// context's deadline makes that a failure here.
func TestPooledLargeBindWhileNoticesStream(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pc, err := pgconn.Connect(ctx, f.dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(context.Background())
	if _, err := pc.Exec(ctx, "SET client_min_messages = debug5").ReadAll(); err != nil {
		t.Fatal(err)
	}
	const n = math.MaxUint16
	params := make([]string, 0, n)
	args := make([][]byte, 0, n)
	for i := range n {
		params = append(params, fmt.Sprintf("($%d::text)", i+1))
		args = append(args, []byte(strconv.Itoa(i)))
	}
	res := pc.ExecParams(ctx, "VALUES "+strings.Join(params, ", "), args, nil, nil, nil).Read()
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if len(res.Rows) != n || string(res.Rows[n-1][0]) != strconv.Itoa(n-1) {
		t.Fatalf("%d rows, want %d", len(res.Rows), n)
	}
	if _, err := pc.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatalf("the connection after it: %v", err)
	}
}
