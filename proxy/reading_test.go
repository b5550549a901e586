package proxy_test

// The proxy reads SQL as the server does (docs/reading-sql.md): under the session's client_encoding and
// standard_conforming_strings. These tests drive raw bytes (any client encoding) through the proxy and check
// the protected rows from a direct connection, and compare the proxy's lexer with the server's own reading.

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgproto3"
	"golang.org/x/text/encoding"
	"golang.org/x/text/encoding/charmap"
	"golang.org/x/text/encoding/japanese"
	"golang.org/x/text/encoding/korean"
	"golang.org/x/text/encoding/simplifiedchinese"
	"golang.org/x/text/encoding/traditionalchinese"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// rawClient sends client-encoded bytes as Query messages, as a client in any encoding would.
type rawClient struct {
	conn net.Conn
	fe   *pgproto3.Frontend
}

// result is what the server answered to one Query.
type result struct {
	completes int      // CommandComplete messages
	values    []string // every column of every DataRow, in order, as the bytes the server sent
	err       *pgproto3.ErrorResponse
}

func (r result) String() string {
	if r.err != nil {
		return fmt.Sprintf("%d complete, %q, error %s %s", r.completes, r.values, r.err.Code, r.err.Message)
	}
	return fmt.Sprintf("%d complete, %q", r.completes, r.values)
}

// dialRaw starts a trust session as user on db at addr with extra startup parameters.
func dialRaw(t *testing.T, addr, user, db string, params map[string]string) *rawClient {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	fe := pgproto3.NewFrontend(conn, conn)
	p := map[string]string{"user": user, "database": db}
	for k, v := range params {
		p[k] = v
	}
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: p})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	c := &rawClient{conn: conn, fe: fe}
	if r := c.read(t); r.err != nil {
		t.Fatalf("startup %v: %s %s", params, r.err.Code, r.err.Message)
	}
	return c
}

// read reads one answer, up to ReadyForQuery.
func (c *rawClient) read(t *testing.T) result {
	t.Helper()
	var r result
	for {
		m, err := c.fe.Receive()
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		switch m := m.(type) {
		case *pgproto3.CommandComplete:
			r.completes++
		case *pgproto3.DataRow:
			for _, v := range m.Values {
				r.values = append(r.values, string(v))
			}
		case *pgproto3.ErrorResponse:
			if r.err == nil {
				e := *m
				r.err = &e
			}
		case *pgproto3.ReadyForQuery:
			return r
		}
	}
}

// query sends each text as a Query in one write (a pipeline when there are several) and reads the answers.
func (c *rawClient) query(t *testing.T, texts ...[]byte) []result {
	t.Helper()
	c.conn.SetDeadline(time.Now().Add(20 * time.Second))
	for _, q := range texts {
		c.fe.Send(&pgproto3.Query{String: string(q)})
	}
	if err := c.fe.Flush(); err != nil {
		t.Fatal(err)
	}
	out := make([]result, len(texts))
	for i := range texts {
		out[i] = c.read(t)
	}
	return out
}

// extended sends one statement with Parse/Bind/Execute/Sync.
func (c *rawClient) extended(t *testing.T, text []byte) result {
	t.Helper()
	c.fe.Send(&pgproto3.Parse{Query: string(text)})
	c.fe.Send(&pgproto3.Bind{})
	c.fe.Send(&pgproto3.Execute{})
	c.fe.Send(&pgproto3.Sync{})
	if err := c.fe.Flush(); err != nil {
		t.Fatal(err)
	}
	return c.read(t)
}

// extendedBatch sends each text with Parse/Bind/Execute and one Sync at the end, in one write, and reads the
// answer (the first error aborts the rest of the batch, as in PostgreSQL).
func (c *rawClient) extendedBatch(t *testing.T, texts ...[]byte) result {
	t.Helper()
	for _, q := range texts {
		c.fe.Send(&pgproto3.Parse{Query: string(q)})
		c.fe.Send(&pgproto3.Bind{})
		c.fe.Send(&pgproto3.Execute{})
	}
	c.fe.Send(&pgproto3.Sync{})
	if err := c.fe.Flush(); err != nil {
		t.Fatal(err)
	}
	return c.read(t)
}

// pgEncodings are the x/text encodings of client encodings the tests use.
var pgEncodings = map[string]encoding.Encoding{
	"LATIN1": charmap.ISO8859_1, "WIN1252": charmap.Windows1252, "KOI8R": charmap.KOI8R,
	"SJIS": japanese.ShiftJIS, "EUC_JP": japanese.EUCJP, "BIG5": traditionalchinese.Big5,
	"GBK": simplifiedchinese.GBK, "GB18030": simplifiedchinese.GB18030, "UHC": korean.EUCKR,
}

// enc encodes UTF-8 text to a client encoding, failing the test if it cannot.
func enc(t *testing.T, name, s string) []byte {
	t.Helper()
	if name == "UTF8" {
		return []byte(s)
	}
	b, err := pgEncodings[name].NewEncoder().Bytes([]byte(s))
	if err != nil {
		t.Fatalf("encode %q to %s: %v", s, name, err)
	}
	return b
}

// fiveC returns up to n characters whose encoding in name has a 0x5C byte (a backslash, read as ASCII) after
// a lead byte: the characters that make a byte-level reader misplace the end of a string.
func fiveC(name string, n int) []string {
	var out []string
	e := pgEncodings[name].NewEncoder()
	for r := rune(0x3000); r < 0xA000 && len(out) < n; r++ {
		b, err := e.Bytes([]byte(string(r)))
		if err == nil && len(b) >= 2 && b[0] >= 0x80 && strings.IndexByte(string(b[1:]), 0x5C) >= 0 {
			out = append(out, string(r))
		}
	}
	return out
}

// fiveCValidUTF8 returns two characters whose bytes in the client encoding name, up to the 0x5C, are valid
// UTF-8: a reader that takes the bytes for UTF-8 sees one character and then a backslash, so it parses the text
// without complaint and misplaces the end of the string ("" when the encoding has none).
func fiveCValidUTF8(name string) string {
	e := pgEncodings[name].NewEncoder()
	for _, c := range fiveC(name, 20) {
		b2, _ := e.Bytes([]byte(c))
		if b2[0] < 0x80 || b2[0] > 0xBF {
			continue
		}
		for r := rune(0x3000); r < 0xA000; r++ {
			b1, err := e.Bytes([]byte(string(r)))
			if err == nil && len(b1) == 2 && b1[0] >= 0xE1 && b1[0] <= 0xEC && b1[1] >= 0x80 && b1[1] <= 0xBF {
				if utf8.Valid(append(append([]byte(nil), b1...), b2[:len(b2)-1]...)) {
					return string(r) + c
				}
			}
		}
	}
	return ""
}

// hostileCase is one attempt to write the protected row, or one legitimate write that must land.
type hostileCase struct {
	name   string
	user   string            // "" is the superuser
	params map[string]string // startup parameters (client_encoding, options)
	token  string            // SET fence.token first ("" for none)
	setup  []string          // UTF-8 texts run (and waited for) before the attack; errors are ignored
	attack []string          // UTF-8 texts, encoded to the session's client_encoding, sent in one write
	raw    [][]byte          // texts sent as they are, after attack
	ext    string            // a text sent with the extended protocol, after the others
	batch  []string          // texts sent as one extended-protocol batch (one Sync), after the others
	// want is the row after the case (snapshot "id:balance:token"); note, if set, is the row's note.
	want string
	note string
}

// TestHostileReadingEventLoop: texts that the server reads differently from a byte-level, UTF-8, scs=on
// reader, sent through the proxy by a stale (token 10) or tokenless session, never change the protected row
// (token 50); legitimate writes from clients in other encodings, with a fresh token, land with the right value
// and token. Every case runs in the event loop.
func TestHostileReadingEventLoop(t *testing.T) { hostileReading(t, true) }

// TestHostileReadingGoroutines is TestHostileReadingEventLoop on the goroutine relay path (a verifier keeps
// sessions off the event loop).
func TestHostileReadingGoroutines(t *testing.T) { hostileReading(t, false) }

// acceptAll is a verifier that accepts every token.
type acceptAll struct{}

func (acceptAll) Check(context.Context, int64) error { return nil }

func hostileReading(t *testing.T, loop bool) {
	f := newFenced(t)
	if !loop {
		f.p = startProxy(t, proxytest.Options{YAML: fxTables(f.label), Verifier: acceptAll{}})
	}
	T := f.name
	d := f.d
	// U& spellings of the table name: its first letter escaped.
	uT := fmt.Sprintf(`U&"\%04x%s"`, T[0], T[1:])
	uescT := fmt.Sprintf(`U&"!%04x%s" UESCAPE '!'`, T[0], T[1:])
	role := fxName(t, "role")
	fxExec(t, d, fmt.Sprintf("CREATE ROLE %s LOGIN", role))
	t.Cleanup(func() { d.Exec(ctxT(t), "DROP OWNED BY "+role+"; DROP ROLE "+role) })
	fxExec(t, d, fmt.Sprintf("GRANT ALL ON public.%s TO %s", T, role))
	fxExec(t, d, fmt.Sprintf("ALTER ROLE %s SET standard_conforming_strings = off", role))

	scsOff := map[string]string{"options": "-c standard_conforming_strings=off"}
	withEnc := func(name string, extra map[string]string) map[string]string {
		m := map[string]string{"client_encoding": name}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	// The example: three statements with scs off, one SELECT with it on.
	scsAttack := fmt.Sprintf(`SELECT 'a\' AS x, ' AS y; UPDATE %s SET balance = 0 WHERE id = 1; SELECT ' --'`, T)
	scsDelete := fmt.Sprintf(`SELECT 'a\' AS x, ' AS y; DELETE FROM %s WHERE id = 1; SELECT ' --'`, T)
	scsInsert := fmt.Sprintf(`SELECT 'a\' AS x, ' AS y; INSERT INTO %s (id, balance) VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET balance = 0; SELECT ' --'`, T)
	// One statement (for the extended protocol): with scs on the UPDATE is inside a string.
	scsCTE := fmt.Sprintf(`WITH s AS (SELECT 'a\' AS x), u AS (SELECT ' AS y), v AS (UPDATE %s SET balance = 0 WHERE id = 1 RETURNING 1) SELECT 1 FROM v, s --') SELECT 1`, T)
	const untouched = "1:100:50"

	var cases []hostileCase
	for _, tok := range []string{"10", ""} {
		who := "stale"
		if tok == "" {
			who = "tokenless"
		}
		cases = append(cases,
			hostileCase{name: who + "/scs off by SET", token: tok, setup: []string{"SET standard_conforming_strings = off"}, attack: []string{scsAttack}, want: untouched},
			hostileCase{name: who + "/scs off by startup option", params: scsOff, token: tok, attack: []string{scsAttack}, want: untouched},
			hostileCase{name: who + "/scs off by ALTER ROLE SET", user: role, token: tok, attack: []string{scsAttack}, want: untouched},
			hostileCase{name: who + "/scs off by set_config", token: tok, setup: []string{"SELECT set_config('standard_conforming_strings', 'off', false)"}, attack: []string{scsAttack}, want: untouched},
			hostileCase{name: who + "/scs off by SET LOCAL in a transaction", token: tok, setup: []string{"BEGIN", "SET LOCAL standard_conforming_strings = off"}, attack: []string{scsAttack, "COMMIT"}, want: untouched},
			hostileCase{name: who + "/scs off pipelined before the attack", token: tok, attack: []string{"SET standard_conforming_strings = off", scsAttack}, want: untouched},
			hostileCase{name: who + "/scs off and the attack in one Query", token: tok, attack: []string{"SET standard_conforming_strings = off; " + scsAttack}, want: untouched},
			hostileCase{name: who + "/scs off DELETE", params: scsOff, token: tok, attack: []string{scsDelete}, want: untouched},
			hostileCase{name: who + "/scs off INSERT ON CONFLICT", params: scsOff, token: tok, attack: []string{scsInsert}, want: untouched},
			hostileCase{name: who + "/scs off CTE, extended protocol", params: scsOff, token: tok, ext: scsCTE, want: untouched},
			hostileCase{name: who + "/scs off set in the same extended batch", token: tok, batch: []string{"SET standard_conforming_strings = off", scsCTE}, want: untouched},
			hostileCase{name: who + "/scs off CTE, simple protocol", params: scsOff, token: tok, attack: []string{scsCTE}, want: untouched},
			hostileCase{name: who + "/scs off N string", params: scsOff, token: tok, attack: []string{fmt.Sprintf(`SELECT N'a\' AS x, ' AS y; UPDATE %s SET balance = 0 WHERE id = 1; SELECT ' --'`, T)}, want: untouched},
			hostileCase{name: who + "/scs off continuation", params: scsOff, token: tok, attack: []string{fmt.Sprintf("SELECT 'x'\n'a\\' AS x, ' AS y; UPDATE %s SET balance = 0 WHERE id = 1; SELECT ' --'", T)}, want: untouched},
			hostileCase{name: who + "/scs off DO body", params: scsOff, token: tok, attack: []string{fmt.Sprintf("DO $$BEGIN PERFORM 'a\\' || '; UPDATE %s SET balance = 0 WHERE id = 1; PERFORM 1 --'\n; END$$", T)}, want: untouched},
			hostileCase{name: who + "/scs off pipelined before a DO body", token: tok, attack: []string{"SET standard_conforming_strings = off", fmt.Sprintf("DO $$BEGIN PERFORM 'a\\' || '; UPDATE %s SET balance = 0 WHERE id = 1; PERFORM 1 --'\n; END$$", T)}, want: untouched},
			hostileCase{name: who + "/E string escapes the quote", token: tok, attack: []string{fmt.Sprintf(`SELECT E'a\' AS x, ' AS y; UPDATE %s SET balance = 0 WHERE id = 1; SELECT ' --'`, T)}, want: untouched},
			hostileCase{name: who + "/DO E-escaped body", token: tok, attack: []string{fmt.Sprintf(`DO E'BEGIN UPDATE %s\x%02x%s SET balance = 0 WHERE id = 1; END'`, T[:1], T[1], T[2:])}, want: untouched},
			hostileCase{name: who + "/DO E-escaped body, octal", token: tok, attack: []string{fmt.Sprintf(`DO E'BEGIN DELETE FROM %s\%03o%s WHERE id = 1; END'`, T[:1], T[1], T[2:])}, want: untouched},
			hostileCase{name: who + "/DO U& identifier", token: tok, attack: []string{fmt.Sprintf(`DO $$BEGIN UPDATE %s SET balance = 0 WHERE id = 1; END$$`, uT)}, want: untouched},
			hostileCase{name: who + "/DO UESCAPE identifier", token: tok, attack: []string{fmt.Sprintf(`DO $$BEGIN UPDATE %s SET balance = 0 WHERE id = 1; END$$`, uescT)}, want: untouched},
			hostileCase{name: who + "/DO U& string body", token: tok, attack: []string{fmt.Sprintf(`DO U&'BEGIN UPDATE %s\%04x%s SET balance = 0 WHERE id = 1; END'`, T[:1], T[1], T[2:])}, want: untouched},
			hostileCase{name: who + "/DO tagged dollar body", token: tok, attack: []string{fmt.Sprintf(`DO $x$BEGIN PERFORM $$ $x $$; UPDATE "%s" SET balance = 0 WHERE id = 1; END$x$`, T)}, want: untouched},
			hostileCase{name: who + "/DO nested", token: tok, attack: []string{fmt.Sprintf(`DO $a$BEGIN DO $b$BEGIN UPDATE %s SET balance = 0 WHERE id = 1; END$b$; END$a$`, T)}, want: untouched},
			hostileCase{name: who + "/DO quoted and commented", token: tok, attack: []string{fmt.Sprintf(`DO $$BEGIN UPDATE/* x */public . "%s"/**/SET balance = 0 WHERE id = 1; END$$`, T)}, want: untouched},
			hostileCase{name: who + "/DO write in a CTE in an assignment", token: tok, attack: []string{fmt.Sprintf(`DO $$DECLARE n int; BEGIN n := (WITH u AS (UPDATE %s SET balance = 0 WHERE id = 1 RETURNING 1) SELECT count(*) FROM u); END$$`, T)}, want: untouched},
			hostileCase{name: who + "/DO language sql-ish name", token: tok, attack: []string{fmt.Sprintf(`DO LANGUAGE plpgsql $$BEGIN DELETE FROM %s WHERE id = 1; END$$`, T)}, want: untouched},
			hostileCase{name: who + "/U& identifier", token: tok, attack: []string{fmt.Sprintf(`UPDATE %s SET balance = 0 WHERE id = 1`, uT)}, want: untouched},
			hostileCase{name: who + "/UESCAPE identifier", token: tok, attack: []string{fmt.Sprintf(`UPDATE %s SET balance = 0 WHERE id = 1`, uescT)}, want: untouched},
			hostileCase{name: who + "/UESCAPE after a comment", token: tok, attack: []string{fmt.Sprintf(`DELETE FROM U&"!%04x%s" /* c */ UESCAPE -- d`+"\n"+`'!' WHERE id = 1`, T[0], T[1:])}, want: untouched},
			hostileCase{name: who + "/quoted identifier", token: tok, attack: []string{fmt.Sprintf(`UPDATE public."%s" SET balance = 0 WHERE id = 1`, T)}, want: untouched},
			hostileCase{name: who + "/comments around every token", token: tok, attack: []string{fmt.Sprintf("/* a */UPDATE/* /* nested */ */%s--c\nSET balance=0 WHERE id=1", T)}, want: untouched},
			hostileCase{name: who + "/upper case", token: tok, attack: []string{fmt.Sprintf(`UPDATE %s SET BALANCE = 0 WHERE ID = 1`, strings.ToUpper(T))}, want: untouched},
			hostileCase{name: who + "/dollar quote hides nothing", token: tok, attack: []string{fmt.Sprintf(`SELECT $q$ $$ $q$; UPDATE %s SET balance = 0 WHERE id = 1; SELECT $$ $q$ $$`, T)}, want: untouched},
			hostileCase{name: who + "/string continuation", token: tok, attack: []string{fmt.Sprintf("SELECT 'a'\n'b'; UPDATE %s SET balance = 0 WHERE id = 1", T)}, want: untouched},
		)
		// Client encodings whose characters carry a 0x5C byte.
		for _, e := range []string{"SJIS", "BIG5", "GBK", "UHC", "GB18030"} {
			for i, c := range fiveC(e, 2) {
				cases = append(cases,
					hostileCase{name: fmt.Sprintf("%s/%s 0x5C in E string %d", who, e, i), params: withEnc(e, nil), token: tok,
						attack: []string{fmt.Sprintf(`SELECT E'%s' AS x; UPDATE %s SET balance = 0 WHERE id = 1; SELECT '--'`, c, T)}, want: untouched},
					hostileCase{name: fmt.Sprintf("%s/%s 0x5C in a scs=off string %d", who, e, i), params: withEnc(e, scsOff), token: tok,
						attack: []string{fmt.Sprintf(`SELECT '%s' AS x; DELETE FROM %s WHERE id = 1; SELECT '--'`, c, T)}, want: untouched},
				)
			}
		}
		// The same, where the bytes before the 0x5C are valid UTF-8 (a byte-level UTF-8 reader parses them).
		for _, e := range []string{"SJIS", "BIG5", "GBK", "GB18030"} {
			c := fiveCValidUTF8(e)
			if c == "" {
				t.Fatalf("no %s characters for the UTF-8 case", e)
			}
			cases = append(cases,
				hostileCase{name: fmt.Sprintf("%s/%s 0x5C after valid UTF-8 in E string", who, e), params: withEnc(e, nil), token: tok,
					attack: []string{fmt.Sprintf(`SELECT E'%s' AS x; UPDATE %s SET balance = 0 WHERE id = 1; SELECT '--'`, c, T)}, want: untouched},
				hostileCase{name: fmt.Sprintf("%s/%s 0x5C after valid UTF-8 in a scs=off string", who, e), params: withEnc(e, scsOff), token: tok,
					attack: []string{fmt.Sprintf(`SELECT '%s' AS x; DELETE FROM %s WHERE id = 1; SELECT '--'`, c, T)}, want: untouched},
			)
		}
		// client_encoding changed in the same write as the attack: the proxy cannot know it yet.
		sj := fiveC("SJIS", 1)[0]
		cases = append(cases, hostileCase{name: who + "/SJIS pipelined after SET client_encoding", token: tok,
			raw: [][]byte{[]byte("SET client_encoding = 'SJIS'"), enc(t, "SJIS", fmt.Sprintf(`SELECT E'%s' AS x; UPDATE %s SET balance = 0 WHERE id = 1; SELECT '--'`, sj, T))}, want: untouched})
		// An encoding the proxy cannot read (JOHAB): writes refused.
		cases = append(cases, hostileCase{name: who + "/JOHAB non-ASCII write", params: withEnc("JOHAB", nil), token: tok,
			raw: [][]byte{[]byte(fmt.Sprintf("UPDATE %s SET balance = 0, note = '\x88\x61' WHERE id = 1", T))}, want: untouched})
	}
	// Legitimate writes with a fresh token from clients in other encodings land, with the right value.
	for _, lw := range []struct{ enc, note string }{
		{"LATIN1", "café crème"}, {"WIN1252", "price €5"}, {"KOI8R", "Привет"}, {"SJIS", "ソ表十"}, {"EUC_JP", "ソ表十"},
		{"BIG5", "許功蓋"}, {"GBK", "乗中文"}, {"GB18030", "中文𠀀"}, {"UHC", "한국어"},
	} {
		cases = append(cases, hostileCase{name: "fresh/" + lw.enc + " non-ASCII write", params: withEnc(lw.enc, nil), token: "60",
			attack: []string{fmt.Sprintf("UPDATE %s SET balance = 7, note = '%s' WHERE id = 1", T, lw.note)}, want: "1:7:60", note: lw.note})
	}
	cases = append(cases,
		hostileCase{name: "fresh/SJIS scs off E string with a 0x5C character", params: withEnc("SJIS", scsOff), token: "60",
			attack: []string{fmt.Sprintf(`UPDATE %s SET balance = 8, note = 'a\\b %s' WHERE id = 1`, T, fiveC("SJIS", 1)[0])}, want: "1:8:60", note: `a\b ` + fiveC("SJIS", 1)[0]},
		hostileCase{name: "fresh/pipelined SET and ASCII write", attack: []string{"SET fence.token = 60", fmt.Sprintf("UPDATE %s SET balance = 3, note = 'plain' WHERE id = 1", T)}, want: "1:3:60", note: "plain"},
		hostileCase{name: "fresh/extended batch of ASCII writes", token: "60", batch: []string{fmt.Sprintf("UPDATE %s SET balance = 2 WHERE id = 1", T), fmt.Sprintf("UPDATE %s SET balance = balance + 1, note = 'b' WHERE id = 1", T)}, want: "1:3:60", note: "b"},
		hostileCase{name: "fresh/LATIN1 ASCII text with a U& escape", params: withEnc("LATIN1", nil), token: "60",
			attack: []string{fmt.Sprintf(`UPDATE %s SET balance = 4, note = U&'caf\00e9' WHERE id = 1`, T)}, want: "1:4:60", note: "café"},
		hostileCase{name: "fresh/LATIN1 extended protocol", params: withEnc("LATIN1", nil), token: "60",
			ext: fmt.Sprintf("UPDATE %s SET balance = 9, note = 'ñandú' WHERE id = 1", T), want: "1:9:60", note: "ñandú"},
		hostileCase{name: "fresh/scs off backslash value", params: scsOff, token: "60",
			attack: []string{fmt.Sprintf(`UPDATE %s SET balance = 6, note = 'it\'s \\ ok' WHERE id = 1`, T)}, want: "1:6:60", note: `it's \ ok`},
		hostileCase{name: "fresh/ALTER ROLE scs off write", user: role, token: "60",
			attack: []string{fmt.Sprintf(`UPDATE %s SET balance = 5, note = 'x\ny' WHERE id = 1`, T)}, want: "1:5:60", note: "x\ny"},
		hostileCase{name: "fresh/JOHAB read passes", params: withEnc("JOHAB", nil), token: "60",
			raw: [][]byte{[]byte(fmt.Sprintf("SELECT '\x88\x61', balance FROM %s", T))}, want: untouched},
		hostileCase{name: "fresh/DO that only reads", token: "60",
			attack: []string{fmt.Sprintf(`DO $$DECLARE n int; BEGIN SELECT count(*) INTO n FROM %s; END$$`, T)}, want: untouched},
	)

	if len(cases) < 50 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f.reset(t, "(1, 100, 50)")
			fxExec(t, d, fmt.Sprintf("UPDATE public.%s SET note = '' WHERE id = 1", T))
			user := c.user
			if user == "" {
				user = pgtest.SuperUser
			}
			if loop { // the previous case's session has ended
				eventually(t, 10*time.Second, "no session in the event loop", func() bool { return proxy.SessionsInLoop(f.p.Server) == 0 })
			}
			cl := dialRaw(t, f.p.Addr, user, pgtest.TestDB, c.params)
			if loop {
				eventually(t, 10*time.Second, "the session in the event loop", func() bool { return proxy.SessionsInLoop(f.p.Server) == 1 })
			} else if n := proxy.SessionsInLoop(f.p.Server); n != 0 {
				t.Fatalf("%d sessions in the event loop", n)
			}
			encName := "UTF8"
			if e := c.params["client_encoding"]; e != "" {
				encName = e
			}
			if c.token != "" {
				if r := cl.query(t, []byte("SET fence.token = "+c.token)); r[0].err != nil {
					t.Fatalf("SET token: %s", r[0].err.Message)
				}
			}
			for _, s := range c.setup {
				cl.query(t, []byte(s))
			}
			var texts [][]byte
			for _, s := range c.attack {
				if pgEncodings[encName] != nil {
					texts = append(texts, enc(t, encName, s))
				} else {
					texts = append(texts, []byte(s))
				}
			}
			texts = append(texts, c.raw...)
			var got []result
			if len(texts) > 0 {
				got = cl.query(t, texts...)
			}
			if c.ext != "" {
				text := []byte(c.ext)
				if pgEncodings[encName] != nil {
					text = enc(t, encName, c.ext)
				}
				got = append(got, cl.extended(t, text))
			}
			if len(c.batch) > 0 {
				var texts [][]byte
				for _, s := range c.batch {
					texts = append(texts, []byte(s))
				}
				got = append(got, cl.extendedBatch(t, texts...))
			}
			if snap := f.snapshot(t); snap != c.want {
				t.Errorf("row %s, want %s; answers: %v", snap, c.want, got)
			}
			if c.note != "" {
				var note string
				if err := d.QueryRow(ctxT(t), fmt.Sprintf("SELECT note FROM public.%s WHERE id = 1", T)).Scan(&note); err != nil || note != c.note {
					t.Errorf("note %q (%v), want %q; answers: %v", note, err, c.note, got)
				}
				for _, r := range got {
					if r.err != nil {
						t.Errorf("legitimate write refused: %v", r)
					}
				}
			}
		})
	}
}

func decodeFrom(t *testing.T, name, s string) string {
	t.Helper()
	if name == "UTF8" {
		return s
	}
	out, err := pgEncodings[name].NewDecoder().String(s)
	if err != nil {
		t.Fatalf("decode %q from %s: %v", s, name, err)
	}
	return out
}

// TestReadingServerEncodings: databases whose server_encoding is LATIN1 or SQL_ASCII. The server converts a
// LATIN1 database's text from the client encoding (or, for SQL_ASCII, stores the client's bytes as they are);
// the proxy reads the client's text either way: fresh writes with non-ASCII land, the scs=off attack does not.
func TestReadingServerEncodings(t *testing.T) {
	f := newFenced(t)
	for _, dbEnc := range []string{"LATIN1", "SQL_ASCII"} {
		t.Run(dbEnc, func(t *testing.T) {
			db := fxName(t, "db")
			fxExec(t, f.d, fmt.Sprintf("CREATE DATABASE %s ENCODING '%s' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'", db, dbEnc))
			t.Cleanup(func() { f.d.Exec(ctxT(t), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)") })
			dd := connect(t, pg.DSN(pgtest.SuperUser, "", db))
			fxExec(t, dd, fmt.Sprintf(fxTableDDL, "public."+f.name))
			row := func() (string, []byte) {
				var snap string
				var note []byte
				if err := dd.QueryRow(ctxT(t), fmt.Sprintf("SELECT id || ':' || balance || ':' || coalesce(fence_token::text, 'null'), convert_to(note, 'SQL_ASCII') FROM public.%s WHERE id = 1", f.name)).Scan(&snap, &note); err != nil {
					t.Fatal(err)
				}
				return snap, note
			}
			reset := func() {
				fxExec(t, dd, fmt.Sprintf("DELETE FROM public.%s", f.name))
				fxExec(t, dd, fmt.Sprintf("INSERT INTO public.%s (id, balance, note, fence_token) VALUES (1, 100, '', 50)", f.name))
			}
			for _, c := range []struct {
				name, clientEnc, token, text string
				scsOff                       bool
				want                         string
				note                         []byte // the note's bytes as the server stores them
			}{
				{"UTF8 client", "UTF8", "60", "UPDATE %s SET balance = 1, note = 'café' WHERE id = 1", false, "1:1:60", map[string][]byte{"LATIN1": []byte("caf\xe9"), "SQL_ASCII": []byte("café")}[dbEnc]},
				{"LATIN1 client", "LATIN1", "60", "UPDATE %s SET balance = 2, note = 'café' WHERE id = 1", false, "1:2:60", []byte("caf\xe9")},
				{"LATIN1 client, scs off", "LATIN1", "60", `UPDATE %s SET balance = 3, note = 'caf\é' WHERE id = 1`, true, "1:3:60", []byte("caf\xe9")},
				{"scs off attack", "UTF8", "10", `SELECT 'a\' AS x, ' AS y; UPDATE %s SET balance = 0 WHERE id = 1; SELECT ' --'`, true, "1:100:50", []byte("")},
				{"scs off attack, LATIN1", "LATIN1", "", `SELECT 'é\' AS x, ' AS y; DELETE FROM %s WHERE id = 1; SELECT ' --'`, true, "1:100:50", []byte("")},
			} {
				t.Run(c.name, func(t *testing.T) {
					reset()
					params := map[string]string{"client_encoding": c.clientEnc}
					if c.scsOff {
						params["options"] = "-c standard_conforming_strings=off"
					}
					cl := dialRaw(t, f.p.Addr, pgtest.SuperUser, db, params)
					if c.token != "" {
						cl.query(t, []byte("SET fence.token = "+c.token))
					}
					r := cl.query(t, enc(t, c.clientEnc, fmt.Sprintf(c.text, f.name)))
					snap, note := row()
					if snap != c.want || string(note) != string(c.note) {
						t.Errorf("row %s note %q, want %s %q; answer %v", snap, note, c.want, c.note, r)
					}
				})
			}
		})
	}
}
