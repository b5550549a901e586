package proxy_test

// A differential fuzzer of the settings a transaction pool keeps per client (docs/pooling.md, "How settings
// move"): seeded random sequences of one subject client that sets, resets and rolls back its session settings
// (SET, SET SESSION, SET LOCAL, RESET, RESET ALL, DISCARD ALL, SET ... TO DEFAULT, set_config with literal and
// bound arguments, transaction-local or not, custom settings in several spellings, the token and lock, values
// with quotes, backslashes, commas and non-ASCII letters, standard_conforming_strings off before a literal whose
// reading depends on it, search_path over a schema whose table shadows public's) inside and around blocks,
// savepoints and failed statements, by simple Queries of one to three statements and by extended-protocol
// batches (unnamed and named statements, a named SET bound again later). The judge is a direct connection;
// the other side is the proxy in transaction mode with a pool of one server connection, which a noise client
// with settings of its own uses between every two of the subject's transactions, and now and then an attacker
// client whose function sets the token and lock at session level behind the proxy.
//
// After every unit (a Query, or a batch up to its Sync) both sides record the answers (woShort without
// ParameterStatus), then read the subject's state in a transaction of its own (SHOW of each setting in
// sfShown, current_setting of each custom one with missing_ok, which table setfz_which names under its
// search_path) and the ParameterStatus values the subject was told; the streams must be the same but for the
// differences docs/pooling.md lists (sfKnownDiff). Every noise transaction reads the noise client's own state
// and the ParameterStatus values it was told, which must never change: a leak to it is the worst finding.
//
//	SETFUZZ_SEED   the seed (default 1)
//	SETFUZZ_N      the number of sequences (default 150)
//	SETFUZZ_BUDGET the time budget (default 90s)
//	SETFUZZ_ONLY   run only this sequence number (with its seed) and print both streams
//	SETFUZZ_TRACE  1: log each sequence before it runs
//	SETFUZZ_STRICT 1: report the listed differences (sfKnownDiff) too

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// sfShown are the settings whose SHOW every state read compares.
var sfShown = []string{"search_path", "application_name", "TimeZone", "DateStyle", "IntervalStyle", "statement_timeout",
	"lock_timeout", "standard_conforming_strings", "extra_float_digits", "work_mem", "bytea_output",
	"default_transaction_isolation", "transaction_isolation", "client_encoding"}

// sfCustom are the custom settings every state read compares (current_setting with missing_ok: a setting
// never set and one another client set on the connection read the same, docs/pooling.md).
var sfCustom = []string{"myapp.tenant", "myapp.user", "myapp.mixed", "fence.token", "fence.lock"}

// sfReported are the ParameterStatus values compared: what the client was told.
var sfReported = []string{"application_name", "TimeZone", "DateStyle", "IntervalStyle", "standard_conforming_strings",
	"client_encoding", "integer_datetimes", "is_superuser", "session_authorization"}

// sfVal is one value of a setting: as SET spells it, and as set_config's string.
type sfVal struct{ set, cfg string }

// sfSetting is a setting the subject changes and the values it draws from.
type sfSetting struct {
	name   string
	custom bool
	vals   []sfVal
}

func sfLit(s string) sfVal { return sfVal{set: "'" + strings.ReplaceAll(s, "'", "''") + "'", cfg: s} }

var sfSettings = []sfSetting{
	{name: "search_path", vals: []sfVal{{"setfz_trap, public", "setfz_trap, public"}, {"public", "public"},
		{"pg_catalog, setfz_trap", "pg_catalog, setfz_trap"}, {`"$user", public`, `"$user", public`},
		{`"we""ird", setfz_trap`, `"we""ird", setfz_trap`}, {"''", ""}, {"'setfz_trap, public'", "setfz_noise, public"},
		{"setfz_noise", "setfz_noise"}}},
	{name: "application_name", vals: []sfVal{sfLit("app"), sfLit("it's"), sfLit(`back\slash`), sfLit("a, b, c"),
		sfLit("ünï 日本"), sfLit(""), {`E'tab\there'`, "tab\there"}, sfLit(`{"q"}`), sfLit("NULL"), sfLit("noise")}},
	{name: "TimeZone", vals: []sfVal{sfLit("UTC"), sfLit("Asia/Tokyo"), sfLit("Europe/Paris"), sfLit("-03:30"), sfLit("Pacific/Auckland")}},
	{name: "DateStyle", vals: []sfVal{sfLit("SQL, DMY"), {"German", "German"}, sfLit("ISO, MDY"), sfLit("Postgres, DMY")}},
	{name: "IntervalStyle", vals: []sfVal{{"iso_8601", "iso_8601"}, {"sql_standard", "sql_standard"}, {"postgres", "postgres"}}},
	{name: "statement_timeout", vals: []sfVal{sfLit("5s"), {"0", "0"}, {"123456", "123456"}, sfLit("1min")}},
	{name: "lock_timeout", vals: []sfVal{sfLit("3s"), {"0", "0"}}},
	{name: "standard_conforming_strings", vals: []sfVal{{"on", "on"}, {"off", "off"}, {"off", "off"}}},
	{name: "extra_float_digits", vals: []sfVal{{"0", "0"}, {"3", "3"}, {"-2", "-2"}}},
	{name: "work_mem", vals: []sfVal{sfLit("8MB"), sfLit("64kB")}},
	{name: "bytea_output", vals: []sfVal{{"escape", "escape"}, {"hex", "hex"}}},
	{name: "default_transaction_isolation", vals: []sfVal{sfLit("serializable"), sfLit("repeatable read"), sfLit("read committed")}},
	{name: "myapp.tenant", custom: true, vals: []sfVal{sfLit("t1"), sfLit("x'y"), sfLit(""), sfLit(`b\s`), sfLit("t,2"), sfLit("ténant"), sfLit("noise")}},
	{name: "myapp.user", custom: true, vals: []sfVal{sfLit("u1"), sfLit("NULL"), sfLit(""), sfLit("u 2")}},
	{name: "MyApp.Mixed", custom: true, vals: []sfVal{sfLit("m1"), sfLit("M2")}},
	{name: "fence.token", custom: true, vals: []sfVal{{"5", "5"}, {"7", "7"}, sfLit("12")}},
	{name: "fence.lock", custom: true, vals: []sfVal{sfLit("lockA"), sfLit("lockB")}},
}

// sfStmt is one statement of the subject: its text and, in an extended batch, its parameters (nil: none).
type sfStmt struct {
	sql    string
	params []string
}

// sfGenStmt draws one statement; ext allows bound parameters.
func sfGenStmt(r *rand.Rand, ext bool) sfStmt {
	s := woPick(r, sfSettings)
	v := woPick(r, s.vals)
	name := s.name
	if s.name == "MyApp.Mixed" && r.Intn(2) == 0 {
		name = "myapp.mixed"
	}
	loc := woPick(r, []string{"true", "false", "false"})
	quoted := "'" + strings.ReplaceAll(v.cfg, "'", "''") + "'"
	switch x := r.Intn(100); {
	case x < 16:
		return sfStmt{sql: "SET " + woPick(r, []string{"", "SESSION "}) + name + woPick(r, []string{" = ", " TO "}) + v.set}
	case x < 22:
		return sfStmt{sql: "SET LOCAL " + name + " = " + v.set}
	case x < 27:
		return sfStmt{sql: woPick(r, []string{"RESET " + name, "SET " + name + " TO DEFAULT"})}
	case x < 34:
		return sfStmt{sql: "SELECT set_config('" + s.name + "', " + quoted + ", " + loc + ")"}
	case x < 36:
		return sfStmt{sql: "SELECT set_config('" + s.name + "', NULL, " + loc + ")"}
	case x < 42 && ext:
		if s.custom {
			// A bound name of a custom setting is not followed (docs/pooling.md): only the value is bound.
			return sfStmt{sql: "SELECT set_config('" + s.name + "', $1, $2)", params: []string{v.cfg, loc}}
		}
		return sfStmt{sql: "SELECT set_config($1, $2, $3)", params: []string{s.name, v.cfg, loc}}
	case x < 44:
		return sfStmt{sql: woPick(r, []string{"RESET ALL", "DISCARD ALL"})}
	case x < 52:
		return sfStmt{sql: woPick(r, []string{"BEGIN", "BEGIN", "START TRANSACTION", "BEGIN ISOLATION LEVEL REPEATABLE READ"})}
	case x < 60:
		return sfStmt{sql: woPick(r, []string{"COMMIT", "COMMIT", "ROLLBACK", "END"})}
	case x < 66:
		return sfStmt{sql: woPick(r, []string{"SAVEPOINT a", "ROLLBACK TO a", "RELEASE a", "SAVEPOINT b", "ROLLBACK TO SAVEPOINT b"})}
	case x < 69:
		return sfStmt{sql: woPick(r, []string{"SELECT 1/0", "SELEC 1", "SELECT 1/0"})}
	case x < 71:
		return sfStmt{sql: woPick(r, []string{"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
			"SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ"})}
	case x < 76:
		return sfStmt{sql: woPick(r, []string{"SELECT v FROM setfz_which", "SELECT v FROM setfz_which", "TABLE setfz_which"})}
	case x < 80:
		// Texts whose reading depends on standard_conforming_strings: the second sets myapp.user only
		// when it is off, where the backslash ends nothing.
		return sfStmt{sql: woPick(r, []string{`SELECT 'a\'b'`, `SELECT 'x\' AS c, ' ; SET myapp.user = ' AS d --'`,
			`SELECT 'q\\', E'e\\'`, `SELECT 'k\' ; SET myapp.tenant = 'lexed' ; SELECT '`})}
	case x < 84:
		return sfStmt{sql: woPick(r, []string{"SET TIME ZONE " + woPick(r, []string{"'Asia/Tokyo'", "LOCAL", "DEFAULT", "INTERVAL '+02:00' HOUR TO MINUTE"}),
			"SET SCHEMA 'setfz_trap'", `SET search_path TO setfz_trap, "$user", public`,
			"SET myapp.tenant = U&'\\0041b'", `SET "MyApp".mixed = 'q'`, "SET myapp.tenant TO 'x', 'y'"})}
	case x < 86:
		return sfStmt{sql: woPick(r, []string{"SHOW search_path", "SHOW application_name", "SHOW TimeZone", "SHOW ALL"})}
	case x < 87:
		return sfStmt{sql: "SET client_encoding = 'LATIN1'"} // pins (docs/pooling.md)
	default:
		return sfStmt{sql: "SELECT set_config('" + s.name + "', " + quoted + ", " + loc + "), current_setting('" + s.name + "', true)"}
	}
}

// sfSeqOpts is what a sequence starts with.
type sfSeqOpts struct {
	app     string // startup application_name, or ""
	options string // startup options, or ""
	// mayTouchToken: a text of the sequence may set the token in a way the proxy cannot tell from a reset
	// (sfKnownDiff): a bound set_config, a backslash, or a text that is not ASCII.
	mayTouchToken bool
	// fluxScs: a Parse of a text with a backslash follows, in its batch, a statement that ran, in a sequence
	// that changes standard_conforming_strings (sfFluxScs): the proxy reads that Parse with the settings in flux
	// and prepares it again, on another server connection, under the settings in force there (docs/pooling.md).
	fluxScs bool
}

// sfFluxScs: seq holds a Parse of sfSeqOpts.fluxScs: a text with a backslash parsed after an Execute in its batch
// (the proxy reads it with the settings in flux: the statement that ran may have changed them, and it cannot know
// which the server used), in a sequence that changes standard_conforming_strings somewhere.
func sfFluxScs(seq []woMsg) bool {
	changes, flux := false, false
	ran := false // an Execute earlier in the batch
	for _, m := range seq {
		switch m := m.m.(type) {
		case *pgproto3.Sync:
			ran = false
		case *pgproto3.Execute:
			ran = true
		case *pgproto3.Query:
			changes = changes || strings.Contains(m.String, "standard_conforming_strings") || strings.Contains(m.String, "ALL")
		case *pgproto3.Parse:
			flux = flux || ran && strings.Contains(m.Query, "\\")
			changes = changes || strings.Contains(m.Query, "standard_conforming_strings") || strings.Contains(m.Query, "set_config($") || strings.Contains(m.Query, "ALL")
		}
	}
	return changes && flux
}

// sfMayTouchToken: seq holds a text of sfSeqOpts.mayTouchToken.
func sfMayTouchToken(seq []woMsg) bool {
	for _, m := range seq {
		var text string
		switch m := m.m.(type) {
		case *pgproto3.Query:
			text = m.String
		case *pgproto3.Parse:
			text = m.Query
		}
		if strings.Contains(text, "set_config($") || strings.Contains(text, "\\") || strings.IndexFunc(text, func(r rune) bool { return r > 127 }) >= 0 {
			return true
		}
	}
	return false
}

func (o sfSeqOpts) query() string {
	q := ""
	if o.app != "" {
		q += "&application_name=" + url.PathEscape(o.app)
	}
	if o.options != "" {
		q += "&options=" + strings.ReplaceAll(url.QueryEscape(o.options), "+", "%20")
	}
	return q
}

// sfGen makes one sequence of 3-12 units: Queries of one to three statements and extended batches of one to
// three statements up to a Sync, sometimes a named statement without parameters bound again in a later batch.
func sfGen(r *rand.Rand) (sfSeqOpts, []woMsg) {
	var o sfSeqOpts
	if r.Intn(4) == 0 {
		o.app = woPick(r, []string{"subj", "noise"})
	}
	if r.Intn(5) == 0 {
		o.options = "-c fence.token=" + woPick(r, []string{"3", "9"})
	}
	var out []woMsg
	var rebindable []string // named statements without parameters
	units := 3 + r.Intn(10)
	for u := 0; u < units; u++ {
		switch x := r.Intn(10); {
		case x < 5:
			k := 1
			if r.Intn(3) == 0 {
				k = 2 + r.Intn(2)
			}
			var qs []string
			for len(qs) < k {
				qs = append(qs, sfGenStmt(r, false).sql)
			}
			out = append(out, woQ(strings.Join(qs, "; ")))
		case x < 9 || len(rebindable) == 0:
			k := 1
			if r.Intn(3) == 0 {
				k = 2 + r.Intn(2)
			}
			for i := 0; i < k; i++ {
				st := sfGenStmt(r, true)
				name := ""
				if r.Intn(4) == 0 {
					name = woPick(r, []string{"s1", "s2"})
					out = append(out, woC('S', name))
					if len(st.params) == 0 {
						rebindable = append(rebindable, name)
					}
				}
				out = append(out, woP(name, st.sql), woB("", name, st.params...), woE("", 0))
			}
			out = append(out, woS)
		default:
			out = append(out, woB("", woPick(r, rebindable)), woE("", 0), woS)
		}
	}
	o.mayTouchToken = sfMayTouchToken(out)
	o.fluxScs = sfFluxScs(out)
	return o, out
}

// sfStateSQL reads a connection's state: sfStateNames, in order.
func sfStateSQL() string {
	var cols []string
	for _, n := range sfShown {
		cols = append(cols, "pg_catalog.current_setting('"+n+"')")
	}
	for _, n := range sfCustom {
		cols = append(cols, "coalesce(pg_catalog.current_setting('"+n+"', true), '')")
	}
	// The schema of the table an unqualified name finds, as a read of it would.
	cols = append(cols, "coalesce((SELECT n.nspname::text FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('setfz_which')), '-')")
	return "SELECT " + strings.Join(cols, ", ")
}

func sfStateNames() []string {
	return append(append(append([]string{}, sfShown...), sfCustom...), "which")
}

// sfConn is a connection of the fuzzer, with the ParameterStatus values it was told.
type sfConn struct {
	pc   *pgconn.PgConn
	told map[string]string
	rows [][]string // the rows of the last send
}

func sfConnect(dsn string) (*sfConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	pc, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	c := &sfConn{pc: pc, told: map[string]string{}}
	for _, n := range sfReported {
		c.told[n] = pc.ParameterStatus(n)
	}
	return c, nil
}

func (c *sfConn) close() { c.pc.Close(context.Background()) }

// send sends msgs and reads up to the ReadyForQuery: the answers in short form (no ParameterStatus: told keeps
// them) and the transaction status (0 when the connection failed, or hung).
func (c *sfConn) send(msgs []woMsg) (got []string, status byte) {
	fe := c.pc.Frontend()
	conn := c.pc.Conn()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	defer conn.SetDeadline(time.Time{})
	c.rows = nil
	for _, m := range msgs {
		fe.Send(m.m)
	}
	if err := fe.Flush(); err != nil {
		return []string{"SENDERR"}, 0
	}
	for {
		m, err := fe.Receive()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return append(got, "HANG"), 0
			}
			return append(got, "RECVERR"), 0
		}
		switch m := m.(type) {
		case *pgproto3.ParameterStatus:
			c.told[m.Name] = m.Value
			continue
		case *pgproto3.DataRow:
			var row []string
			for _, v := range m.Values {
				row = append(row, string(v))
			}
			c.rows = append(c.rows, row)
		case *pgproto3.ErrorResponse:
			if m.Severity == "FATAL" {
				return append(got, "FATAL:"+m.Code+":"+m.Message), 0
			}
		case *pgproto3.ReadyForQuery:
			return append(got, "Z:"+string(m.TxStatus)), m.TxStatus
		}
		if s := woShort(m); s != "" && !strings.HasPrefix(s, "S:") {
			got = append(got, s)
		}
	}
}

// state reads the connection's state by a Query or (ext) an extended batch: a record per column,
// "st<status before the read>:name=value", and one per reported value, "told<status>:name=value".
func (c *sfConn) state(ext bool, status byte) []string {
	sql := sfStateSQL()
	msgs := []woMsg{woQ(sql)}
	if ext {
		msgs = []woMsg{woP("", sql), woB("", ""), woE("", 0), woS}
	}
	got, _ := c.send(msgs)
	var out []string
	if len(c.rows) == 1 {
		for i, n := range sfStateNames() {
			out = append(out, fmt.Sprintf("st%c:%s=%s", status, n, c.rows[0][i]))
		}
	} else {
		out = append(out, "state:"+strings.Join(got, " "))
	}
	for _, n := range sfReported {
		out = append(out, fmt.Sprintf("told%c:%s=%s", status, n, c.told[n]))
	}
	return out
}

// sfRunner runs sequences directly and through the pool.
type sfRunner struct {
	t      *testing.T
	f      *fenced
	noise  *sfConn // the noise client: settings of its own, which must never change
	evil   *sfConn // the attacker: its function sets the token and lock at session level
	nrand  *rand.Rand
	want   []string // the noise client's state
	bad    []string // what the noise client saw of another client's
	noises int
	pins   float64
}

// sfNoiseSetup is what the noise client sets: a value of its own for every setting the subject may change
// (standard_conforming_strings off, so that a subject whose own is not put back lexes its text wrongly), but
// myapp.user, which it never has (a value of the subject's left there is a leak it sees).
var sfNoiseSetup = []string{
	"SET search_path = setfz_noise, public", "SET application_name = 'noise'", "SET TimeZone = 'Pacific/Auckland'",
	"SET DateStyle = 'Postgres, DMY'", "SET IntervalStyle = 'postgres_verbose'", "SET statement_timeout = '7s'",
	"SET lock_timeout = '9s'", "SET standard_conforming_strings = off", "SET extra_float_digits = 1", "SET work_mem = '5MB'",
	"SET bytea_output = 'escape'", "SET default_transaction_isolation = 'repeatable read'", "SET myapp.tenant = 'noise'",
	"SELECT set_config('myapp.mixed', 'noise-mixed', false)", "SET fence.token = 1000000", "SET fence.lock = 'noiselock'",
}

// connectNoise connects the noise client and sets its settings; false when the pool's connection did not come
// (53300: a subject pinned to it has not left yet).
func (w *sfRunner) connectNoise() bool {
	if w.noise != nil {
		w.noise.close()
		w.noise = nil
	}
	c, err := sfConnect(w.f.dsn())
	if err != nil {
		w.t.Fatalf("noise connect: %v", err)
	}
	for _, s := range sfNoiseSetup {
		if got, st := c.send([]woMsg{woQ(s)}); st != 'I' {
			if strings.Contains(strings.Join(got, " "), "53300") {
				c.close()
				return false
			}
			w.t.Fatalf("noise %s: %v", s, got)
		}
	}
	w.noise = c
	if w.want == nil {
		w.want = c.state(false, 'I')
		w.t.Logf("the noise client's state: %v", w.want)
	}
	return true
}

func (w *sfRunner) connectEvil() {
	if w.evil != nil {
		w.evil.close()
	}
	c, err := sfConnect(w.f.dsn() + "&application_name=evil")
	if err != nil {
		w.t.Fatalf("evil connect: %v", err)
	}
	w.evil = c
}

// runNoise runs one transaction of the noise client (or, now and then, of the attacker) and checks the noise
// client's state; false when the pool's connection did not come (53300).
func (w *sfRunner) runNoise(what string) bool {
	if w.noise == nil && !w.connectNoise() {
		return false
	}
	if w.nrand.Intn(6) == 0 {
		got, st := w.evil.send([]woMsg{woQ(woPick(w.nrand, []string{"SELECT public.setfz_evil()", "SELECT public.setfz_evil(); SELECT 1",
			"SET search_path = setfz_trap; SET myapp.tenant = 'evil'; SET application_name = 'evil'"}))})
		if st == 0 {
			if strings.Contains(strings.Join(got, " "), "53300") {
				w.connectEvil()
				return false
			}
			w.connectEvil()
		} else if st != 'I' {
			w.evil.send([]woMsg{woQ("ROLLBACK")})
		}
	}
	var got []string
	switch w.nrand.Intn(4) {
	case 0:
		got = w.noise.state(false, 'I')
	case 1:
		got = w.noise.state(true, 'I')
	case 2:
		if g, st := w.noise.send([]woMsg{woQ("BEGIN")}); st != 'T' {
			got = g
			break
		}
		got = w.noise.state(w.nrand.Intn(2) == 0, 'I')
		w.noise.send([]woMsg{woQ(woPick(w.nrand, []string{"COMMIT", "ROLLBACK"}))})
	default:
		// Its own SET again: the probe reads its settings back.
		w.noise.send([]woMsg{woQ("SET application_name = 'noise'; SET myapp.tenant = 'noise'")})
		got = w.noise.state(false, 'I')
	}
	if s := strings.Join(got, " "); strings.Contains(s, "53300") {
		w.noise.close()
		w.noise = nil // connected again at its next transaction
		return false
	}
	w.noises++
	if strings.Join(got, "\n") != strings.Join(w.want, "\n") {
		var diffs []string
		for i := range got {
			if i >= len(w.want) || got[i] != w.want[i] {
				diffs = append(diffs, got[i])
			}
		}
		w.bad = append(w.bad, fmt.Sprintf("%s: the noise client reads %v", what, diffs))
		w.noise.close()
		w.noise = nil
	}
	return true
}

// run runs seq on a new connection (through the pool when pooled) and returns the stream: per unit its
// answers, then the state read (by a Query or a batch, as stateExt draws).
func (w *sfRunner) run(o sfSeqOpts, seq []woMsg, pooled bool, seed int64) (got []string) {
	dsn := pg.SuperDSN()
	if pooled {
		dsn = w.f.dsn()
	}
	c, err := sfConnect(dsn + o.query())
	if err != nil {
		w.t.Fatalf("connect: %v", err)
	}
	defer c.close()
	stateRand := rand.New(rand.NewSource(seed))
	w.nrand = rand.New(rand.NewSource(seed + 1))
	pins := fxCounter(w.t, w.f.p.Registry, "fenceproxy_pool_pins_total", nil)
	pinned := false
	status := byte('I')
	got = append(got, c.state(false, status)...)
	var seg []woMsg
	for i, m := range seq {
		seg = append(seg, m)
		switch m.m.(type) {
		case *pgproto3.Sync, *pgproto3.Query:
		default:
			continue
		}
		ans, st := c.send(seg)
		seg = nil
		got = append(got, fmt.Sprintf("|%d", i))
		got = append(got, ans...)
		if st == 0 {
			return got
		}
		status = st
		// Read on the same server connection first: the probe of the unit has ended once this is answered,
		// so the pin counter says whether the noise client can have the connection.
		got = append(got, c.state(stateRand.Intn(2) == 0, status)...)
		if pooled && status == 'I' && !pinned {
			if fxCounter(w.t, w.f.p.Registry, "fenceproxy_pool_pins_total", nil) != pins {
				pinned = true // its connection is its own now: the noise client would wait
			} else if !w.runNoise(fmt.Sprintf("after message %d (%v)", i, m)) {
				pinned = true
			}
		}
		got = append(got, "after noise")
		got = append(got, c.state(stateRand.Intn(2) == 0, status)...)
	}
	return got
}

// both runs seq directly and pooled.
func (w *sfRunner) both(o sfSeqOpts, seq []woMsg, seed int64) (d, p []string) {
	return w.run(o, seq, false, seed), w.run(o, seq, true, seed)
}

// sfFirstDiff is the first difference of the two streams that docs/pooling.md does not list, and where it is.
func sfFirstDiff(o sfSeqOpts, d, p []string, strict bool) (sig string, at int) {
	for i := 0; i < len(d) || i < len(p); i++ {
		var x, y string
		if i < len(d) {
			x = d[i]
		}
		if i < len(p) {
			y = p[i]
		}
		if x == y {
			continue
		}
		if !strict && (sfKnownDiff(o, x, y) || sfKnownAt(o, d, p, i)) {
			if strings.HasPrefix(x, "st") || strings.HasPrefix(x, "told") {
				continue // one value of a state read: the rest still compare
			}
			return "", -1 // the streams part there, as listed
		}
		return x + " vs " + y, i
	}
	return "", -1
}

// sfKnownDiff: a difference docs/pooling.md lists (Known differences).
//   - Inside a transaction, a reset of the token or lock, and of a startup application_name, gives the pooled
//     connection's default, not the client's startup value (and the client is shown that); from its next
//     transaction on it has its startup value again.
//   - A statement that gets no token statement (a COMMIT or ROLLBACK first in its Query or batch, DISCARD ALL,
//     ...) and the others of its Query or batch, or a later transaction of a Query of several, see the
//     placeholder.
//   - A startup token that a RESET gave back reads as no token after a transaction whose texts may also have
//     set it, as the proxy cannot tell (a set_config with a bound value, parsed even if never run; a text it
//     cannot read in a batch whose settings are in flux): "After a transaction that may have changed the
//     token or lock". Only for sequences with such a text (mayTouchToken).
//   - A text the proxy cannot read exactly where it holds a word of a write, set_config or the token setting's
//     name is refused 55F04 (docs/reading-sql.md: a lexical error, which the server refuses too, and settings
//     in flux in a batch before its Sync); in an aborted block its refusal is 25P02 where the server's
//     syntax error comes first (42601), as woKnownDiff lists for a Parse.
//
// And the open findings of this fuzzer (sfOpen), which SETFUZZ_STRICT=1 reports.
func sfKnownDiff(o sfSeqOpts, d, p string) bool {
	if strings.Contains(p, "fenceproxy:pooled") && strings.HasPrefix(p, "D[") {
		return true
	}
	if p == "E:55F04" || p == "E:25P02" && (d == "E:42601" || d == "E:08P01") {
		return true
	}
	if strings.HasPrefix(p, "st") && strings.HasSuffix(p, "=fenceproxy:pooled") {
		return true
	}
	if strings.HasPrefix(d, "D[") {
		for _, v := range []string{o.app, strings.TrimPrefix(o.options, "-c fence.token=")} {
			if v != "" && strings.Replace(d, v, "", 1) == p {
				return true
			}
		}
	}
	if sfOpen(d, p) {
		return true
	}
	for _, k := range []string{"stT:", "stE:", "toldT:", "toldE:"} {
		if !strings.HasPrefix(d, k) || !strings.HasPrefix(p, k) {
			continue
		}
		if o.app != "" && (d == k+"application_name="+o.app) && p == k+"application_name=" {
			return true
		}
		if o.options != "" && strings.HasPrefix(d, k+"fence.token=") && p == k+"fence.token=" {
			return true
		}
	}
	if o.mayTouchToken && o.options != "" && strings.HasSuffix(d, ":fence.token="+strings.TrimPrefix(o.options, "-c fence.token=")) &&
		strings.HasPrefix(p, "stI:fence.token=") && strings.HasSuffix(p, ":fence.token=") {
		return true
	}
	return false
}

// sfKnownAt: a difference docs/pooling.md lists that shows only in its place in the streams (at i).
//   - In an aborted block, a text the proxy cannot read (a U& string under standard_conforming_strings off,
//     which PostgreSQL refuses while it lexes, 0A000, before it looks at the block) is refused by the proxy,
//     whose refusal the aborted block answers 25P02, as woKnownDiff lists for a syntax error (42601); both
//     leave the block aborted. Outside a block the refusal is 55F04 (sfKnownDiff).
//   - A named statement the proxy read with standard_conforming_strings in flux, prepared again under the
//     settings in force on another server connection, fails to parse there (42601) at its Bind where directly
//     it binds (docs/pooling.md: "A Parse read while the settings were in flux").
func sfKnownAt(o sfSeqOpts, d, p []string, i int) bool {
	if i+1 >= len(d) || i+1 >= len(p) {
		return false
	}
	x, y := d[i], p[i]
	if x == "E:0A000" && y == "E:25P02" && d[i+1] == "Z:E" && p[i+1] == "Z:E" {
		for j := i - 1; j >= 0; j-- {
			if strings.HasPrefix(d[j], "told") {
				return strings.HasPrefix(d[j], "toldE:") // the unit began in an aborted block
			}
		}
		return false
	}
	return o.fluxScs && x == "2" && y == "E:42601"
}

func TestPooledSettingsFuzz(t *testing.T) {
	seed, n, budget, only, trace := woSettingsFrom("SETFUZZ", 150, 90*time.Second)
	strict := os.Getenv("SETFUZZ_STRICT") == "1"
	t.Logf("seed %d, n %d", seed, n)
	f := newPooledFenced(t, 1, "  max_client_wait: 2s\n")
	for _, sql := range []string{
		"DROP SCHEMA IF EXISTS setfz_trap CASCADE", "DROP SCHEMA IF EXISTS setfz_noise CASCADE", `DROP SCHEMA IF EXISTS "we""ird" CASCADE`,
		"DROP TABLE IF EXISTS public.setfz_which", "CREATE SCHEMA setfz_trap", "CREATE SCHEMA setfz_noise", `CREATE SCHEMA "we""ird"`,
		"CREATE TABLE public.setfz_which (v text)", "INSERT INTO public.setfz_which VALUES ('public')",
		"CREATE TABLE setfz_trap.setfz_which (v text)", "INSERT INTO setfz_trap.setfz_which VALUES ('trap')",
		"CREATE TABLE setfz_noise.setfz_which (v text)", "INSERT INTO setfz_noise.setfz_which VALUES ('noise')",
		"CREATE OR REPLACE FUNCTION public.setfz_evil() RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config('fence.token', '666', false) || pg_catalog.set_config('fence.lock', 'evil', false) $$",
	} {
		fxExec(t, f.d, sql)
	}
	t.Cleanup(func() {
		for _, sql := range []string{"DROP SCHEMA IF EXISTS setfz_trap CASCADE", "DROP SCHEMA IF EXISTS setfz_noise CASCADE",
			`DROP SCHEMA IF EXISTS "we""ird" CASCADE`, "DROP TABLE IF EXISTS public.setfz_which", "DROP FUNCTION IF EXISTS public.setfz_evil()"} {
			f.d.Exec(context.Background(), sql)
		}
	})
	w := &sfRunner{t: t, f: f}
	w.connectNoise()
	w.connectEvil()
	defer func() { w.noise.close(); w.evil.close() }()
	r := rand.New(rand.NewSource(seed))
	start := time.Now()
	type diff struct {
		i    int
		o    sfSeqOpts
		seq  []woMsg
		d, p []string
	}
	bySig := map[string][]diff{}
	seqs, units := 0, 0
	for i := 0; i < n; i++ {
		o, seq := sfGen(r)
		if only >= 0 && i != only {
			continue
		}
		if time.Since(start) > budget {
			t.Logf("time budget reached after %d sequences", seqs)
			break
		}
		seqs++
		for _, m := range seq {
			switch m.m.(type) {
			case *pgproto3.Sync, *pgproto3.Query:
				units++
			}
		}
		sseed := seed*100003 + int64(i)
		if trace {
			t.Logf("sequence %d %+v: %v", i, o, seq)
		}
		d, p := w.both(o, seq, sseed)
		if only >= 0 {
			t.Logf("sequence %d %+v: %v\n direct: %v\n pooled: %v", i, o, seq, d, p)
		}
		if sig, _ := sfFirstDiff(o, d, p, strict); sig != "" {
			bySig[sig] = append(bySig[sig], diff{i, o, seq, d, p})
		}
	}
	t.Logf("ran %d sequences, %d units, in %v; %d noise transactions", seqs, units, time.Since(start).Round(time.Millisecond), w.noises)
	for _, b := range w.bad {
		t.Errorf("LEAK %s", b)
	}
	woWorstFirst(bySig, nil, func(d diff) int { return len(d.seq) }, func(s string, n int, best diff) {
		sseed := seed*100003 + int64(best.i)
		min := woMinimize(best.seq, func(cand []woMsg) bool {
			o := best.o
			o.mayTouchToken = sfMayTouchToken(cand)
			o.fluxScs = sfFluxScs(cand)
			d, p := w.both(o, cand, sseed)
			sig, _ := sfFirstDiff(o, d, p, strict)
			return sig == s
		})
		md, mp := w.both(best.o, min, sseed)
		_, at := sfFirstDiff(best.o, md, mp, strict)
		t.Errorf("DIFF %q: %d sequences (first #%d, seed %d, startup %+v)\n  minimal: %v\n  direct:  %v\n  pooled:  %v",
			s, n, best.i, seed, best.o, min, sfAround(md, at), sfAround(mp, at))
	})
}

// sfAround is the part of a stream around position at, from the unit it is in.
func sfAround(xs []string, at int) []string {
	if at < 0 {
		return xs
	}
	from := 0
	for i := 0; i < at && i < len(xs); i++ {
		if strings.HasPrefix(xs[i], "|") {
			from = i
		}
	}
	to := min(len(xs), at+3)
	if from > to {
		return nil
	}
	return xs[from:to]
}

// sfOpen: the divergences this fuzzer found that are not mended (docs/pooling.md lists them): none now. (By the
// extended protocol, outside a block, a SET TRANSACTION (directly a warning) in a batch with other statements
// failed 25001 through the pool, after the token statement took the snapshot, until 2026-12-05: mended, the
// token goes as SET LOCAL in front of such a batch, TestPooledSetTransactionBatchOracle; a batch of it alone
// answers as directly since 2026-12-04, TestPooledSetTransactionBatchOutsideABlock. A batch that starts with a
// Close, classified by that Close, failed 25001 before a BEGIN with modes or a DISCARD ALL until 2026-12-04:
// mended, batchLead. A named statement whose Close and Parse an error earlier in the batch made the server skip
// was taken for gone, its next Bind 26000, until 2026-12-05: mended,
// TestPooledSkippedCloseAndParseKeepTheName.)
func sfOpen(d, p string) bool {
	return false
}

// A RESET ALL (or RESET of the token) with standard_conforming_strings off gives the client its startup token and
// lock back from its next transaction on, as directly. Until 2026-12-04 the proxy read no text at all under
// standard_conforming_strings off (rewrite.SessionEffects: "may do anything"), so the empty token read back
// after the RESET was taken for a set to the empty string (no token: its writes refused 55F02) and the empty
// lock could not be told from a reset (FATAL 55F03); a backslash is the only thing that reads otherwise then.
// The settings fuzzer's finding (TestPooledSettingsFuzz seed 2).
func TestPooledResetWithStandardConformingStringsOff(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	opts := "&options=" + strings.ReplaceAll(url.QueryEscape("-c fence.token=9 -c fence.lock=lockL"), "+", "%20")
	for _, reset := range []string{"RESET ALL", "RESET fence.token; RESET fence.lock", "SET fence.token TO DEFAULT; SET fence.lock TO DEFAULT"} {
		for _, off := range []string{"SET standard_conforming_strings = off", "SELECT set_config('standard_conforming_strings', 'off', false)"} {
			var got [2]string
			for i, dsn := range []string{pg.SuperDSN(), f.dsn()} {
				c, err := sfConnect(dsn + opts)
				if err != nil {
					t.Fatal(err)
				}
				for _, q := range []string{off, reset, "SELECT current_setting('fence.token'), current_setting('fence.lock')"} {
					if ans, st := c.send([]woMsg{woQ(q)}); st != 'I' {
						t.Fatalf("%s: %v", q, ans)
					}
				}
				got[i] = fmt.Sprint(c.rows)
				c.close()
			}
			if got[0] != "[[9 lockL]]" || got[1] != got[0] {
				t.Errorf("%s, then %s: token and lock directly %s, pooled %s", off, reset, got[0], got[1])
			}
		}
	}
}

// A custom setting set by a text the proxy cannot read while settings are in flux (a non-ASCII text after
// another message of its batch, before the Sync), or spelled with escapes (a U& or E'...' string whose dot is
// an escape), is asked for by the probe all the same: the next client of the server connection, which has none,
// reads none, and the client keeps its value across another client's transaction. Until 2026-12-04 such a text
// named no setting (rewrite.CustomSettings gave up silently, and the dotless text passed the look for one), so
// the value stayed on the server connection for the next client (an RLS tenant). The settings fuzzer's finding
// (seeds 1, 6, 7).
func TestPooledCustomSettingInFluxFollowed(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	for _, c := range []struct {
		name, want string
		set        []woMsg
	}{
		{"in flux", "ténant", []woMsg{woP("", "SELECT 1"), woP("", "SET myapp.tenant = 'ténant'"), woB("", ""), woE("", 0), woS}},
		{"U& escape", "u", []woMsg{woQ(`SELECT set_config(U&'myapp\002etenant', 'u', false)`)}},
		{"E escape", "e", []woMsg{woQ(`SELECT set_config(E'myapp\x2etenant', 'e', false)`)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, err := sfConnect(f.dsn())
			if err != nil {
				t.Fatal(err)
			}
			defer a.close()
			if got, st := a.send(c.set); st != 'I' {
				t.Fatal(got)
			}
			read := []woMsg{woQ("SELECT coalesce(current_setting('myapp.tenant', true), '')")}
			b, err := sfConnect(f.dsn())
			if err != nil {
				t.Fatal(err)
			}
			defer b.close()
			b.send(read)
			if len(b.rows) != 1 || b.rows[0][0] != "" {
				t.Errorf("another client reads myapp.tenant %v", b.rows)
			}
			a.send(read)
			if len(a.rows) != 1 || a.rows[0][0] != c.want {
				t.Errorf("the client reads myapp.tenant %v after another client's transaction, want %q", a.rows, c.want)
			}
		})
	}
}
