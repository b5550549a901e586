package proxy_test

// Framing through every relay, against a real PostgreSQL: seeded sequences of client messages whose answers are
// messages of every kind the server sends (DataRow, RowDescription, NoticeResponse, ErrorResponse,
// ParameterStatus, NotificationResponse, CopyOutResponse and CopyData, and the empty ones: ParseComplete,
// BindComplete, NoData, CloseComplete, EmptyQueryResponse, PortalSuspended, CopyDone), their bodies of sizes 0,
// small, about the read buffer (8 KiB), about the body buffer a session keeps (64 KiB) and several MB,
// alternating; and client messages of the same range (a Parse of a megabyte, a Bind of many or large
// parameters, CopyData in large and tiny chunks, many small messages in one write, a message written a byte or a
// few at a time). Each sequence runs on a direct connection and through the proxy in each relay: session mode
// in the event loop and on goroutines, and transaction pooling (a second client takes the one server
// connection between the subject's transactions, so that its named statements are parsed again, hidden). Every
// answer must arrive whole and in order, as directly; a relay that lost a stream's framing fails the step's
// deadline rather than hanging the suite.
//
// Why: msgReader.body returned nil for an empty body after its buffer was dropped (a body over 64 KiB read
// before), and the pooled relay forwarded the next message's header as the empty one (ceaaf36). No test read a
// message over 64 KiB followed by an empty one on that path; this one reads every kind after every size, on
// every relay, both ways. The sequence ends with a Terminate behind statements not answered yet: the stream
// ends, after whole answers only. TestFramingAdminConsole does the client's side of the admin console.
//
//	FRAMING_SEED     the seed (default 1); printed when the test fails
//	FRAMING_STEPS    steps per sequence (default 45)
//	FRAMING_MAXMB    the largest message, in MiB (default 3)
//	FRAMING_TIMEOUT  how long one step may take (default 20s)
//	FRAMING_ONLY     run only this relay (direct, loop, goroutines, transaction)

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// frMsg is one client message of a step; gate: it goes only after the server asked for COPY data (the
// CopyInResponse of the step's COPY), as libpq sends it. Text holding {T} names the relay's own COPY table.
type frMsg struct {
	m    pgproto3.FrontendMessage
	gate bool
}

// frStep is what the client sends in one go, and how many ReadyForQuery answer it.
type frStep struct {
	desc    string
	msgs    []frMsg
	readies int
	split   int   // 0: one write; 1: chunks of random sizes, some of a few bytes; 2: one byte a write
	seed    int64 // of the chunk sizes
	pins    bool  // through the pool, the client keeps its server connection from this step on (LISTEN)
	// terminate: the step ends with a Terminate behind statements still to be answered; the stream then ends,
	// after their answers or some of them (the proxy reads and drops those not sent yet: docs/architecture.md).
	terminate bool
}

func frEnvInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

// frGen makes the steps of one sequence.
type frGen struct {
	r           *rand.Rand
	maxMB       int
	named       []frNamed // statements parsed by name and not closed
	sqlPrepared []string  // SQL PREPAREd and not deallocated
	prot        string    // the protected table: a write to it is fenced (prepared fences, the token statement)
	md5OID      uint32    // md5(text), for a FunctionCall
	seq         int
}

// size is a body size: 0, small, about 8 KiB (the read buffer), about 64 KiB (the body buffer kept), up to a
// few hundred KiB, or several MB.
func (g *frGen) size() int {
	jitter := func(at, d int) int { return max(0, at-d+g.r.Intn(2*d+1)) }
	switch x := g.r.Intn(100); {
	case x < 12:
		return 0
	case x < 32:
		return 1 + g.r.Intn(200)
	case x < 45:
		return jitter(8192, 6)
	case x < 70:
		return jitter(65536, 6)
	case x < 78:
		return jitter(131072, 6)
	case x < 92:
		return 200 + g.r.Intn(300000)
	default:
		return (1 << 20) + g.r.Intn(g.maxMB<<20-1<<20+1)
	}
}

// text is SQL for a text of n bytes (hex digits, so that a shifted or reordered chunk changes it).
func frText(n int) string {
	return fmt.Sprintf("left(repeat('0123456789abcdef', %d), %d)", n/16+1, n)
}

// frNamed is a statement the client parsed by name.
type frNamed struct {
	name   string
	params int
	rows   bool
}

// frStmt is one statement and what it makes the server send; params is its number of parameters; fails:
// it ends in an ERROR.
type frStmt struct {
	sql    string
	params int
	rows   bool // a SELECT: an Execute with a row limit may suspend it
	// syntax: a syntax error; fenced: a write to the protected table. The proxy refuses a text it cannot read
	// that names a protected table (55F04), rightly: a simple Query holds at most one of the two.
	syntax, fenced bool
}

// stmt is a statement whose answer holds a message of a size from size(). simple: for a simple Query (the
// extended protocol takes no empty statement).
func (g *frGen) stmt() frStmt {
	n := g.size()
	switch x := g.r.Intn(100); {
	case x < 30: // a DataRow's body: 2 + 4 + n
		return frStmt{sql: fmt.Sprintf("SELECT %s AS v", frText(max(0, n-6))), rows: true}
	case x < 40: // several rows, for Execute with a row limit (PortalSuspended)
		return frStmt{sql: fmt.Sprintf("SELECT %s || g AS v FROM generate_series(1, %d) g", frText(n/4), 2+g.r.Intn(4)), rows: true}
	case x < 50: // a RowDescription of many columns with long names, and their DataRow
		cols := []int{1, 20, 300, 900, 1600}[g.r.Intn(5)]
		name := strings.Repeat("c", g.r.Intn(56))
		var b strings.Builder
		b.WriteString("SELECT ")
		for i := range cols {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%d AS %s%05d", i, name, i)
		}
		return frStmt{sql: b.String(), rows: true}
	case x < 62: // a NoticeResponse: about 100 bytes of fields besides the message
		return frStmt{sql: fmt.Sprintf("DO $$BEGIN RAISE NOTICE '%%', %s; END$$", frText(max(0, n-100)))}
	case x < 70: // an ErrorResponse
		return frStmt{sql: fmt.Sprintf("DO $$BEGIN RAISE EXCEPTION '%%', %s; END$$", frText(max(0, n-100)))}
	case x < 78: // CopyOutResponse, CopyData, CopyDone (empty)
		return frStmt{sql: fmt.Sprintf("COPY (SELECT %s || g FROM generate_series(1, %d) g) TO STDOUT", frText(n), 1+g.r.Intn(3))}
	case x < 86: // a Parse of n bytes
		return frStmt{sql: fmt.Sprintf("SELECT 1 AS v /* %s */", strings.Repeat("p", n)), rows: true}
	case x < 88: // an ErrorResponse with a position at the end of a long text
		return frStmt{sql: fmt.Sprintf("SELECT 1 AS v /* %s */ +", strings.Repeat("s", n)), syntax: true}
	case x < 90: // a fenced write (through the proxy: rewritten, and prepared on the connection when seen again)
		return frStmt{sql: "UPDATE " + g.prot + " SET balance = balance + 1 WHERE id = 1", fenced: true}
	case x < 93: // one large parameter
		return frStmt{sql: "SELECT length($1::text) AS n, md5($1::text) AS h", params: 1, rows: true}
	default: // many parameters: a Bind of thousands of values
		k := 1 + g.r.Intn(3000)
		var b strings.Builder
		b.WriteString("VALUES ")
		for i := range k {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "($%d::text)", i+1)
		}
		return frStmt{sql: b.String(), params: k, rows: true}
	}
}

// values are the parameters of a statement of k of them: one large value for one, small ones for many.
func (g *frGen) values(k int) [][]byte {
	vs := make([][]byte, k)
	for i := range vs {
		n := 1 + g.r.Intn(20)
		if k == 1 {
			n = g.size()
		}
		vs[i] = []byte(strings.Repeat(strconv.Itoa(i%10), n))
	}
	return vs
}

func (g *frGen) name() string {
	g.seq++
	return fmt.Sprintf("fr_s%d", g.seq)
}

// simple is a Query of one to four statements, or an empty one (EmptyQueryResponse), or a SET of a reported
// setting (ParameterStatus).
func (g *frGen) simple() frStep {
	switch g.r.Intn(16) {
	case 10, 11: // SQL PREPARE: through the pool, prepared again, hidden, on a connection another client used
		s := g.stmt()
		if s.params > 0 || strings.HasPrefix(s.sql, "DO") || strings.HasPrefix(s.sql, "COPY") {
			break
		}
		g.seq++
		name := fmt.Sprintf("fr_q%d", g.seq)
		g.sqlPrepared = append(g.sqlPrepared, name)
		return frStep{desc: "PREPARE", msgs: []frMsg{{m: &pgproto3.Query{String: "PREPARE " + name + " AS " + s.sql}}}, readies: 1}
	case 12, 13:
		if len(g.sqlPrepared) == 0 {
			break
		}
		i := g.r.Intn(len(g.sqlPrepared))
		name := g.sqlPrepared[i]
		q := "EXECUTE " + name
		if g.r.Intn(4) == 0 {
			q += "; DEALLOCATE " + name
			g.sqlPrepared = append(g.sqlPrepared[:i], g.sqlPrepared[i+1:]...)
		}
		return frStep{desc: q, msgs: []frMsg{{m: &pgproto3.Query{String: q}}}, readies: 1}
	case 14: // the token statement goes after the BEGIN's answer, hidden, before the client's statement's
		s := g.stmt()
		if s.params > 0 {
			break
		}
		return frStep{desc: "BEGIN with modes", msgs: []frMsg{
			{m: &pgproto3.Query{String: "BEGIN ISOLATION LEVEL REPEATABLE READ; " + s.sql + "; COMMIT"}},
			{m: &pgproto3.Parse{Query: "BEGIN READ WRITE"}}, {m: &pgproto3.Bind{}}, {m: &pgproto3.Execute{}},
			{m: &pgproto3.Parse{Query: s.sql}}, {m: &pgproto3.Bind{}}, {m: &pgproto3.Execute{}},
			{m: &pgproto3.Parse{Query: "COMMIT"}}, {m: &pgproto3.Bind{}}, {m: &pgproto3.Execute{}}, {m: &pgproto3.Sync{}},
			{m: &pgproto3.Query{String: "ROLLBACK"}}, // the block a failed statement left open, if any
		}, readies: 3}
	case 15: // a FunctionCall of a large argument, and its FunctionCallResponse
		arg := []byte(strings.Repeat("f", g.size()))
		return frStep{desc: "FunctionCall", msgs: []frMsg{{m: &pgproto3.FunctionCall{Function: g.md5OID,
			ArgFormatCodes: []uint16{0}, Arguments: [][]byte{arg}}}}, readies: 1}
	}
	switch g.r.Intn(10) {
	case 0:
		return frStep{desc: "empty Query", msgs: []frMsg{{m: &pgproto3.Query{String: ""}}}, readies: 1}
	case 1:
		v := strings.Repeat("a", g.r.Intn(100))
		return frStep{desc: "SET application_name", msgs: []frMsg{{m: &pgproto3.Query{String: "SET application_name = 'fr" + v + "'"}}}, readies: 1}
	}
	var stmts []string
	var syntax, fenced bool
	for k := 1 + g.r.Intn(4); len(stmts) < k; {
		s := g.stmt()
		if s.params > 0 || s.syntax && fenced || s.fenced && syntax {
			continue
		}
		syntax, fenced = syntax || s.syntax, fenced || s.fenced
		stmts = append(stmts, s.sql)
	}
	return frStep{desc: "Query of " + strconv.Itoa(len(stmts)), msgs: []frMsg{{m: &pgproto3.Query{String: strings.Join(stmts, "; ")}}}, readies: 1}
}

// extended is a batch of one to four statements through Parse, Bind, Describe, Execute (with a row limit at
// times), Close and Flush, ended by a Sync; a named statement of an earlier step runs again at times.
func (g *frGen) extended() frStep {
	var msgs []frMsg
	add := func(m pgproto3.FrontendMessage) { msgs = append(msgs, frMsg{m: m}) }
	for k := 1 + g.r.Intn(4); k > 0; k-- {
		var st frNamed
		if len(g.named) > 0 && g.r.Intn(4) == 0 {
			st = g.named[g.r.Intn(len(g.named))] // an earlier step's, on a server connection that may have changed
		} else {
			s := g.stmt()
			st = frNamed{params: s.params, rows: s.rows}
			if g.r.Intn(3) == 0 {
				st.name = g.name()
				g.named = append(g.named, st)
			}
			add(&pgproto3.Parse{Name: st.name, Query: s.sql})
		}
		stmt := st.name
		if g.r.Intn(4) == 0 {
			add(&pgproto3.Describe{ObjectType: 'S', Name: stmt}) // ParameterDescription, RowDescription or NoData
		}
		add(&pgproto3.Bind{PreparedStatement: stmt, Parameters: g.values(st.params)})
		if g.r.Intn(3) == 0 {
			add(&pgproto3.Describe{ObjectType: 'P'})
		}
		if st.rows && g.r.Intn(3) == 0 {
			add(&pgproto3.Execute{MaxRows: 1}) // PortalSuspended when more rows remain
		}
		add(&pgproto3.Execute{})
		if stmt != "" && g.r.Intn(5) == 0 {
			add(&pgproto3.Close{ObjectType: 'S', Name: stmt})
			for i, n := range g.named {
				if n.name == stmt {
					g.named = append(g.named[:i], g.named[i+1:]...)
					break
				}
			}
		}
		if g.r.Intn(6) == 0 {
			add(&pgproto3.Flush{})
		}
	}
	add(&pgproto3.Sync{})
	return frStep{desc: fmt.Sprintf("batch of %d messages", len(msgs)), msgs: msgs, readies: 1}
}

// copyIn is a COPY FROM STDIN of rows of sizes from size(), sent in one CopyData, one a row, in chunks of one to
// three bytes, or in chunks of random sizes; then a statement that reads them back (and empties the table).
func (g *frGen) copyIn() frStep {
	var data []byte
	for k := 1 + g.r.Intn(3); k > 0; k-- {
		n := g.size()
		row := make([]byte, n)
		for i := range row {
			row[i] = 'a' + byte(g.r.Intn(26))
		}
		data = append(append(data, row...), '\n')
	}
	mode := g.r.Intn(4)
	if mode == 2 && len(data) > 64<<10 {
		mode = 3
	}
	var chunks [][]byte
	switch mode {
	case 0:
		chunks = [][]byte{data}
	case 1:
		for _, line := range strings.SplitAfter(string(data), "\n") {
			if line != "" {
				chunks = append(chunks, []byte(line))
			}
		}
	default:
		for rest := data; len(rest) > 0; {
			n := 1 + g.r.Intn(3)
			if mode == 3 {
				n = 1 + g.r.Intn(200<<10)
			}
			n = min(n, len(rest))
			chunks, rest = append(chunks, rest[:n]), rest[n:]
		}
	}
	gate := g.r.Intn(2) == 0 // else pipelined behind the COPY, before the server asked for it
	msgs := []frMsg{{m: &pgproto3.Query{String: "COPY {T} (t) FROM STDIN"}}}
	for i, c := range chunks {
		msgs = append(msgs, frMsg{m: &pgproto3.CopyData{Data: c}, gate: gate && i == 0})
	}
	fail := g.r.Intn(8) == 0
	if fail {
		msgs = append(msgs, frMsg{m: &pgproto3.CopyFail{Message: "fr " + strings.Repeat("f", g.r.Intn(3000))}, gate: gate && len(chunks) == 0})
	} else {
		msgs = append(msgs, frMsg{m: &pgproto3.CopyDone{}, gate: gate && len(chunks) == 0})
	}
	msgs = append(msgs, frMsg{m: &pgproto3.Query{String: "WITH d AS (DELETE FROM {T} RETURNING id, t) SELECT length(t), md5(t) FROM d ORDER BY id"}})
	return frStep{desc: fmt.Sprintf("COPY FROM STDIN of %d bytes in %d CopyData (fail %v, gate %v)", len(data), len(chunks), fail, gate), msgs: msgs, readies: 2}
}

// many is many small messages in one write: Queries, or Parse/Bind/Execute units and a Sync.
func (g *frGen) many() frStep {
	k := 20 + g.r.Intn(300)
	var msgs []frMsg
	if g.r.Intn(2) == 0 {
		for i := range k {
			msgs = append(msgs, frMsg{m: &pgproto3.Query{String: "SELECT " + strconv.Itoa(i)}})
		}
		return frStep{desc: fmt.Sprintf("%d Queries", k), msgs: msgs, readies: k}
	}
	for i := range k {
		msgs = append(msgs, frMsg{m: &pgproto3.Parse{Query: "SELECT " + strconv.Itoa(i)}}, frMsg{m: &pgproto3.Bind{}}, frMsg{m: &pgproto3.Execute{}})
	}
	msgs = append(msgs, frMsg{m: &pgproto3.Sync{}})
	return frStep{desc: fmt.Sprintf("%d units in one batch", k), msgs: msgs, readies: 1}
}

// steps makes n steps, and ends with a notification (which pins the pooled client: last).
func (g *frGen) steps(n int) []frStep {
	var out []frStep
	for len(out) < n {
		var s frStep
		switch x := g.r.Intn(100); {
		case x < 35:
			s = g.simple()
		case x < 75:
			s = g.extended()
		case x < 90:
			s = g.copyIn()
		default:
			s = g.many()
		}
		s.seed = g.r.Int63()
		switch x := g.r.Intn(10); {
		case x < 5:
		case x < 9:
			s.split = 1
		default:
			s.split = 2
		}
		out = append(out, s)
	}
	return append(out, g.fixed()...)
}

// fixed are the shapes each sequence holds whatever the seed: the boundaries of the body buffer kept (64 KiB)
// and of the read buffer, each followed by empty messages, client_min_messages = debug2 with a long statement,
// a notification of the largest payload, and a step written a byte at a time.
func (g *frGen) fixed() []frStep {
	var out []frStep
	for _, body := range []int{8191, 8192, 8193, 65535, 65536, 65537, 3 << 20} {
		row := fmt.Sprintf("SELECT %s AS v", frText(body-6))
		notice := fmt.Sprintf("DO $$BEGIN RAISE NOTICE '%%', %s; END$$", frText(body-100))
		out = append(out, frStep{desc: fmt.Sprintf("body %d then empty messages", body), msgs: []frMsg{
			{m: &pgproto3.Parse{Query: row}}, {m: &pgproto3.Bind{}}, {m: &pgproto3.Execute{}},
			{m: &pgproto3.Parse{Query: notice}}, {m: &pgproto3.Bind{}}, {m: &pgproto3.Describe{ObjectType: 'P'}}, {m: &pgproto3.Execute{}},
			{m: &pgproto3.Parse{Name: "fr_fixed", Query: "SELECT 1"}}, {m: &pgproto3.Bind{PreparedStatement: "fr_fixed"}},
			{m: &pgproto3.Close{ObjectType: 'S', Name: "fr_fixed"}},
			{m: &pgproto3.Parse{Query: fmt.Sprintf("SELECT 1 /* %s */", strings.Repeat("q", body))}}, {m: &pgproto3.Bind{}}, {m: &pgproto3.Execute{}},
			{m: &pgproto3.Sync{}},
			{m: &pgproto3.Query{String: ""}},
			{m: &pgproto3.Query{String: fmt.Sprintf("%s; COPY (SELECT %s) TO STDOUT; SELECT 1", notice, frText(body-1))}},
		}, readies: 3, split: 1, seed: int64(body)})
	}
	long := fmt.Sprintf("SELECT 2 AS v /* %s */", strings.Repeat("d", 100<<10))
	out = append(out,
		frStep{desc: "debug2 notices of a long statement", msgs: []frMsg{
			{m: &pgproto3.Query{String: "SET client_min_messages = debug2"}},
			{m: &pgproto3.Parse{Name: "fr_debug", Query: long}}, {m: &pgproto3.Bind{PreparedStatement: "fr_debug"}}, {m: &pgproto3.Execute{}},
			{m: &pgproto3.Parse{Query: "SELECT 3"}}, {m: &pgproto3.Bind{}}, {m: &pgproto3.Execute{}}, {m: &pgproto3.Sync{}},
			{m: &pgproto3.Query{String: long}},
		}, readies: 3},
		frStep{desc: "debug2 notices again, on the statement parsed before", msgs: []frMsg{
			{m: &pgproto3.Bind{PreparedStatement: "fr_debug"}}, {m: &pgproto3.Execute{}},
			{m: &pgproto3.Parse{Query: "SELECT 4"}}, {m: &pgproto3.Bind{}}, {m: &pgproto3.Execute{}}, {m: &pgproto3.Sync{}},
			{m: &pgproto3.Query{String: "RESET client_min_messages"}},
		}, readies: 2},
		frStep{desc: "a byte a write", msgs: []frMsg{
			{m: &pgproto3.Parse{Name: "fr_bytes", Query: "SELECT $1::text || $2::text"}},
			{m: &pgproto3.Bind{PreparedStatement: "fr_bytes", Parameters: [][]byte{[]byte("left"), []byte(strings.Repeat("r", 3000))}}},
			{m: &pgproto3.Describe{ObjectType: 'P'}}, {m: &pgproto3.Execute{}}, {m: &pgproto3.Close{ObjectType: 'S', Name: "fr_bytes"}},
			{m: &pgproto3.Sync{}}, {m: &pgproto3.Query{String: ""}}, {m: &pgproto3.Query{String: "SELECT 5"}},
		}, readies: 3, split: 2},
		frStep{desc: "LISTEN", msgs: []frMsg{{m: &pgproto3.Query{String: "LISTEN fr_channel"}}}, readies: 1, pins: true},
		frStep{desc: "a notification of 7999 bytes, and a notice after it", msgs: []frMsg{
			{m: &pgproto3.Query{String: fmt.Sprintf("NOTIFY fr_channel, '%s'", strings.Repeat("n", 7999))}},
			{m: &pgproto3.Query{String: fmt.Sprintf("SELECT pg_notify('fr_channel', ''); DO $$BEGIN RAISE NOTICE '%%', %s; END$$", frText(70000))}},
			{m: &pgproto3.Query{String: "UNLISTEN fr_channel"}},
		}, readies: 3, split: 1, seed: 7999},
		frStep{desc: "a Terminate behind statements not answered yet", msgs: []frMsg{
			{m: &pgproto3.Query{String: fmt.Sprintf("SELECT %s", frText(70000))}},
			{m: &pgproto3.Query{String: fmt.Sprintf("DO $$BEGIN RAISE NOTICE '%%', %s; END$$", frText(3<<20))}},
			{m: &pgproto3.Parse{Query: "SELECT 6"}}, {m: &pgproto3.Bind{}}, {m: &pgproto3.Execute{}}, {m: &pgproto3.Sync{}},
			{m: &pgproto3.Terminate{}},
		}, readies: 3, terminate: true},
	)
	return out
}

// frRelay is where a sequence runs: directly, or through one of the proxy's relays.
type frRelay struct {
	name   string
	addr   string
	table  string           // the COPY table of this relay (names of one length: positions in errors stay put)
	check  func(*testing.T) // after connecting: the session is where the relay says
	pooled bool
	noise  string // pooled: a second client's DSN, run between the subject's transactions
}

// TestFramingThroughEveryRelay: see the top of this file.
func TestFramingThroughEveryRelay(t *testing.T) {
	pgtest.Require(t, pg)
	seed := int64(frEnvInt(t, "FRAMING_SEED", 1))
	steps := frEnvInt(t, "FRAMING_STEPS", 45)
	maxMB := max(1, frEnvInt(t, "FRAMING_MAXMB", 3))
	timeout := 20 * time.Second
	if v := os.Getenv("FRAMING_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("FRAMING_TIMEOUT=%q: %v", v, err)
		}
		timeout = d
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FRAMING_SEED=%d FRAMING_STEPS=%d FRAMING_MAXMB=%d", seed, steps, maxMB)
		}
	})
	d := direct(t)
	prot := fxName(t, "fr")
	fxCreateTable(t, d, "public."+prot)
	fxExec(t, d, "INSERT INTO public."+prot+" (id) VALUES (1)")
	var md5OID uint32
	if err := d.QueryRow(ctxT(t), "SELECT 'md5(text)'::regprocedure::oid").Scan(&md5OID); err != nil {
		t.Fatal(err)
	}
	g := &frGen{r: rand.New(rand.NewSource(seed)), maxMB: maxMB, prot: "public." + prot, md5OID: md5OID}
	seq := g.steps(steps)
	tables := map[string]string{}
	for _, r := range []string{"direct", "loopev", "gorout", "txpool"} {
		tables[r] = "public." + prot + "_" + r
		fxExec(t, d, "CREATE TABLE "+tables[r]+" (id bigserial, t text)")
		tbl := tables[r]
		t.Cleanup(func() { d.Exec(context.Background(), "DROP TABLE IF EXISTS "+tbl) })
	}
	yaml := fxTables("public." + prot)
	loop := startProxy(t, proxytest.Options{YAML: yaml + "relay:\n  event_loops: 1\n"})
	gor := startProxy(t, proxytest.Options{YAML: yaml + goroutinesYAML})
	pool := startProxy(t, proxytest.Options{YAML: yaml + "pool:\n  mode: transaction\n  size: 1\nauth:\n  type: trust\n"})
	relays := []frRelay{
		{name: "direct", addr: pg.Addr(), table: tables["direct"]},
		{name: "loop", addr: loop.Addr, table: tables["loopev"], check: func(t *testing.T) {
			eventually(t, 10*time.Second, "the session in the event loop", func() bool { return proxy.SessionsInLoop(loop.Server) == 1 })
		}},
		{name: "goroutines", addr: gor.Addr, table: tables["gorout"], check: func(t *testing.T) {
			if n := proxy.SessionsInLoop(gor.Server); n != 0 {
				t.Fatalf("%d sessions in an event loop with relay.mode goroutines", n)
			}
		}},
		{name: "transaction", addr: pool.Addr, table: tables["txpool"], pooled: true,
			noise: pool.DSN(pgtest.SuperUser, "", pgtest.TestDB) + "&application_name=fr_noise"},
	}
	only := os.Getenv("FRAMING_ONLY")
	var want [][]string
	for _, rl := range relays {
		if only != "" && rl.name != "direct" && rl.name != only {
			continue
		}
		start := time.Now()
		got := frRun(t, rl, seq, timeout)
		t.Logf("%s: %d steps in %v", rl.name, len(seq), time.Since(start).Round(time.Millisecond))
		if rl.name == "direct" {
			want = got
			continue
		}
		for i := range seq {
			if i >= len(got) {
				break
			}
			w := want[i]
			if seq[i].terminate && len(got[i]) <= len(w) {
				w = w[:len(got[i])] // a prefix of the answers, whole
			}
			if d := frFirstDiff(w, got[i]); d != "" {
				t.Errorf("%s, step %d (%s): %s", rl.name, i, seq[i].desc, d)
				break
			}
		}
	}
}

// frRun runs seq on a new connection to rl and returns each step's answers in short form (frShort). A step that
// fails (a read or write error, its deadline) fails the test, after the answers read so far are logged.
func frRun(t *testing.T, rl frRelay, seq []frStep, timeout time.Duration) [][]string {
	t.Helper()
	conn := frStartup(t, rl.addr, pgtest.SuperUser, pgtest.TestDB, map[string]string{
		"application_name": "fr_subject", "options": "-c fence.token=5"})
	defer conn.Close()
	if rl.check != nil {
		rl.check(t)
	}
	var noise *pgconn.PgConn
	if rl.noise != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		pc, err := pgconn.Connect(ctx, rl.noise)
		cancel()
		if err != nil {
			t.Fatalf("%s: noise client: %v", rl.name, err)
		}
		defer pc.Close(context.Background())
		noise = pc
	}
	var out [][]string
	status, pinned := byte('I'), false
	for i, s := range seq {
		if noise != nil && status == 'I' && !pinned {
			// Another client's transaction on the one server connection: the subject's next transaction gets
			// it back with its statements parsed again by the proxy, hidden, and its settings replayed.
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			res, err := noise.Exec(ctx, "SELECT 'noise'").ReadAll()
			cancel()
			if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "noise" {
				t.Fatalf("%s, before step %d: the noise client's transaction: %v %v", rl.name, i, res, err)
			}
		}
		got, st, err := frStep1(conn, s, rl.table, timeout)
		out = append(out, got)
		if err != nil {
			t.Fatalf("%s, step %d (%s): %v\nanswers so far: %s", rl.name, i, s.desc, err, strings.Join(got, " "))
		}
		status = st
		pinned = pinned || s.pins && rl.pooled
	}
	return out
}

// frStep1 sends one step (from another goroutine: the server's answers may fill the socket buffers while the
// client still writes) and reads its answers up to its last ReadyForQuery, within timeout.
func frStep1(conn net.Conn, s frStep, table string, timeout time.Duration) (got []string, status byte, err error) {
	conn.SetDeadline(time.Now().Add(timeout))
	defer conn.SetDeadline(time.Time{})
	copyIn := make(chan struct{}, 16)
	wrote := make(chan error, 1)
	go func() { wrote <- frSend(conn, s, table, copyIn, timeout) }()
	defer func() {
		if err != nil {
			conn.Close() // a writer waiting for the server gives up
		}
		if werr := <-wrote; err == nil && werr != nil {
			err = werr
		}
	}()
	var hdr [5]byte
	for ready := 0; ready < s.readies; {
		if _, err := io.ReadFull(conn, hdr[:]); err != nil {
			if s.terminate && errors.Is(err, io.EOF) {
				return got, 0, nil // the proxy may drop the answers to what came before a Terminate (end.go)
			}
			return got, 0, fmt.Errorf("read a header: %w", err)
		}
		n := int(int32(binary.BigEndian.Uint32(hdr[1:]))) - 4
		if n < 0 || n > 64<<20 {
			return got, 0, fmt.Errorf("a message %q of %d bytes: the stream lost its framing", hdr[0], n)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(conn, body); err != nil {
			return got, 0, fmt.Errorf("read a body of %q (%d bytes): %w", hdr[0], n, err)
		}
		// The relay's COPY table is named in an error's context: it reads as the placeholder, as on every relay.
		if table != "" {
			body = bytes.ReplaceAll(body, []byte(strings.TrimPrefix(table, "public.")), []byte("{T}"))
		}
		if sh := frShort(hdr[0], body); sh != "" {
			got = append(got, sh)
		}
		switch hdr[0] {
		case 'G':
			copyIn <- struct{}{}
		case 'Z':
			ready++
			if len(body) != 1 {
				return got, 0, fmt.Errorf("ReadyForQuery of %d bytes", len(body))
			}
			status = body[0]
		}
	}
	if s.terminate {
		if _, err := io.ReadFull(conn, hdr[:]); !errors.Is(err, io.EOF) {
			return got, 0, fmt.Errorf("after the answers to what came before a Terminate: %q, %w, want the end of the stream", hdr[0], err)
		}
	}
	return got, status, nil
}

// frSend writes the step's messages, as the step splits them, waiting at a gate for the server's CopyInResponse.
func frSend(conn net.Conn, s frStep, table string, copyIn chan struct{}, timeout time.Duration) error {
	r := rand.New(rand.NewSource(s.seed))
	var buf []byte
	split := s.split
	flush := func() error {
		for len(buf) > 0 {
			n := len(buf)
			switch split {
			case 1:
				if r.Intn(3) == 0 {
					n = 1 + r.Intn(7) // a header in pieces
				} else {
					n = 1 + r.Intn(64<<10)
				}
			case 2:
				n = 1
			}
			n = min(n, len(buf))
			if _, err := conn.Write(buf[:n]); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			buf = buf[n:]
		}
		return nil
	}
	if split == 2 {
		total := 0
		for _, m := range s.msgs {
			b, _ := m.m.Encode(nil)
			total += len(b)
		}
		if total > 16<<10 {
			split = 1 // a byte a write is for small steps: megabytes of it would outlast the deadline
		}
	}
	for _, m := range s.msgs {
		if m.gate {
			if err := flush(); err != nil {
				return err
			}
			select {
			case <-copyIn:
			case <-time.After(timeout):
				return errors.New("no CopyInResponse")
			}
		}
		msg := m.m
		switch q := msg.(type) {
		case *pgproto3.Query:
			if strings.Contains(q.String, "{T}") {
				msg = &pgproto3.Query{String: strings.ReplaceAll(q.String, "{T}", table)}
			}
		}
		var err error
		if buf, err = msg.Encode(buf); err != nil {
			return fmt.Errorf("encode %T: %w", msg, err)
		}
	}
	return flush()
}

// frShort is the short form of a server message, compared with a direct connection's: the type, and the body
// itself when short, else its length and hash; a notice or error field by field; a notification without the
// sender's PID (the proxy's client may see another backend's); "" for what is not compared: DEBUG and LOG
// notices (the proxy's own statements send some, and the server names the pooled client's unnamed statement
// as its own).
func frShort(typ byte, body []byte) string {
	abbrev := func(b []byte) string {
		if len(b) <= 48 {
			return strconv.Quote(string(b))
		}
		h := sha256.Sum256(b)
		return fmt.Sprintf("%d:%x", len(b), h[:6])
	}
	switch typ {
	case 'N', 'E':
		var fs []string
		for rest := body; len(rest) > 1; {
			f := rest[0]
			i := strings.IndexByte(string(rest[1:]), 0)
			if i < 0 {
				return fmt.Sprintf("%c(malformed %s)", typ, abbrev(body))
			}
			v := rest[1 : 1+i]
			if f == 'V' && (strings.HasPrefix(string(v), "DEBUG") || string(v) == "LOG") {
				return ""
			}
			fs = append(fs, string(f)+abbrev(v))
			rest = rest[2+i:]
		}
		return string(typ) + "{" + strings.Join(fs, " ") + "}"
	case 'A':
		if len(body) < 4 {
			return "A(malformed)"
		}
		return "A" + abbrev(body[4:])
	}
	return string(typ) + abbrev(body)
}

// frFirstDiff describes the first difference between two steps' answers, or "".
func frFirstDiff(want, got []string) string {
	for i := 0; i < max(len(want), len(got)); i++ {
		w, g := "(none)", "(none)"
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			lo := max(0, i-3)
			return fmt.Sprintf("answer %d: got %s, want %s\n  got  ...%s\n  want ...%s", i, g, w,
				strings.Join(got[lo:min(len(got), i+4)], " "), strings.Join(want[lo:min(len(want), i+4)], " "))
		}
	}
	return ""
}

// frStartup connects to addr and logs in (trust), returning the connection after the first ReadyForQuery.
func frStartup(t *testing.T, addr, user, db string, params map[string]string) net.Conn {
	t.Helper()
	p := []string{"user", user, "database", db}
	for k, v := range params {
		p = append(p, k, v)
	}
	conn, _, _ := rawSession(t, addr, p...)
	return conn
}

// TestFramingAdminConsole: the admin console reads every message whole; a Query of a megabyte (answered with an
// error that quotes it), then commands in one write or a byte a write, are each answered whole and in order.
func TestFramingAdminConsole(t *testing.T) {
	f := newPooledFenced(t, 1, "  admin_users: [admin]\n")
	conn := frStartup(t, f.p.Addr, "admin", "fenceproxy", nil)
	q := func(text string) frMsg { return frMsg{m: &pgproto3.Query{String: text}} }
	huge := "SHOW " + strings.Repeat("x", 1<<20)
	many := make([]frMsg, 200)
	for i := range many {
		many[i] = q("SHOW POOLS")
	}
	for _, s := range []frStep{
		{desc: "a Query of a megabyte, then two commands", msgs: []frMsg{q(huge), q("SHOW POOLS"), q("SHOW CONFIG")}, readies: 3, split: 1, seed: 1},
		{desc: "a byte a write", msgs: []frMsg{q("SHOW POOLS"), q(""), q("SHOW STATS")}, readies: 3, split: 2},
		{desc: "200 commands in one write", msgs: many, readies: 200},
	} {
		got, _, err := frStep1(conn, s, "", 20*time.Second)
		if err != nil {
			t.Fatalf("%s: %v\nanswers so far: %s", s.desc, err, strings.Join(got, " "))
		}
		// Each command is answered by an ERROR, or rows and a tag, then ReadyForQuery.
		var shape []string
		cur := ""
		for _, m := range got {
			switch m[0] {
			case 'Z':
				shape, cur = append(shape, cur+"Z"), ""
			case 'D':
				if !strings.HasSuffix(cur, "D") {
					cur += "D"
				}
			default:
				cur += m[:1]
			}
		}
		for i, sh := range shape {
			if sh != "TDCZ" && sh != "TCZ" && sh != "EZ" && sh != "CZ" {
				t.Fatalf("%s: answer %d is %s: %s", s.desc, i, sh, strings.Join(got, " "))
			}
		}
		if s.msgs[0].m.(*pgproto3.Query).String == huge {
			if shape[0] != "EZ" || !strings.Contains(got[0], "M1048") {
				t.Fatalf("%s: the first answer is %s, want the error quoting the megabyte", s.desc, got[0])
			}
		}
	}
}
