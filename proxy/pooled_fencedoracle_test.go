package proxy_test

// A differential fuzzer of fencing under transaction pooling: seeded random sequences of one subject client
// that sets, resets and rolls back its fencing token (SET, SET LOCAL, RESET, RESET ALL, set_config literal or
// bound, transaction-local or not, startup options) around writes to a protected table (INSERT, UPDATE,
// DELETE, ON CONFLICT, CTE, a write naming the token column), in the simple and the extended protocol
// (multi-statement Queries, several Syncs, named and unnamed statements and portals, failing statements,
// blocks, savepoints). The judge is a direct connection to a database where `fenceproxy install`'s guard
// protects the table; the other side is the proxy in transaction mode (pool of one) in front of an identical
// database, whose one server connection a noise client with its own, much higher token uses between every two
// of the subject's transactions (and writes rows of its own with it). Both sides must give the same answers
// (woShort, with the message of the contract's errors) and commit the same rows (compared after each sequence).
// The noise client checks that each of its transactions sees and writes its own token.
//
// It reuses the wire oracle's runner (woRunner.run, with its noiseFn and short hooks), message builders and
// comparison.
//
//	FENCEDORACLE_SEED   the seed (default 1)
//	FENCEDORACLE_N      the number of sequences (default 300)
//	FENCEDORACLE_BUDGET the time budget (default 90s)
//	FENCEDORACLE_ONLY   run only this sequence number (with its seed) and print both streams
//	FENCEDORACLE_TRACE  1: log each sequence before it runs
//	FENCEDORACLE_STRICT 1: report the listed differences (fmKnownDiff) too
//	FENCEDORACLE_AVOID  1: generate none of the shapes of the listed differences K1 and K2 (so that a
//	                    difference in committed rows is never hidden behind one)

import (
	"context"
	"fmt"
	"math/rand"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/schema"
)

// fmText is one statement the subject may send; param makes its $1 when it has one.
type fmText struct {
	sql   string
	param func(r *rand.Rand) string
	query bool // may go in a simple Query (no $1)
}

// The subject's tokens are small; the rows start with 2, 5 and 8; the noise client's is fmNoiseToken.
const fmNoiseToken = "1000000"

var fmTokens = []string{"1", "2", "3", "4", "5", "5", "6", "7", "8", "9", "12"}
var fmBadTokens = []string{"0", "abc", "-3", "99999999999999999999"}

func fmTok(r *rand.Rand, avoid bool) string {
	if !avoid && r.Intn(25) == 0 {
		return woPick(r, fmBadTokens)
	}
	return woPick(r, fmTokens)
}

func fmID(r *rand.Rand) string { return strconv.Itoa(1 + r.Intn(6)) }

// fmTexts makes the statement catalogue: each call draws fresh constants.
func fmTexts(r *rand.Rand, avoid bool) []fmText {
	tok := fmTok(r, avoid)
	id := fmID(r)
	loc := woPick(r, []string{"true", "false"})
	tokP := func(r *rand.Rand) string { return fmTok(r, avoid) }
	idP := func(r *rand.Rand) string { return fmID(r) }
	return []fmText{
		// the token
		{sql: "SET fence.token = " + tok, query: true},
		{sql: "SET fence.token = " + tok, query: true},
		{sql: "SET fence.token TO '" + tok + "'", query: true},
		{sql: "SET LOCAL fence.token = " + tok, query: true},
		{sql: "SET LOCAL fence.token = " + tok, query: true},
		{sql: "RESET fence.token", query: true},
		{sql: "RESET ALL", query: true},
		{sql: "SET fence.token TO DEFAULT", query: true},
		{sql: "SELECT set_config('fence.token', '" + tok + "', " + loc + ")", query: true},
		{sql: "SELECT set_config('fence.token', '" + tok + "', " + loc + ")", query: true},
		{sql: "SELECT set_config('fence.token', $1, " + loc + ")", param: tokP},
		{sql: "SELECT set_config('fence.token', $1, " + loc + ")", param: tokP},
		{sql: "SELECT coalesce(nullif(current_setting('fence.token', true), ''), '-') AS tok", query: true},
		// blocks
		{sql: "BEGIN", query: true},
		{sql: "BEGIN", query: true},
		{sql: "COMMIT", query: true},
		{sql: "COMMIT", query: true},
		{sql: "ROLLBACK", query: true},
		{sql: "SAVEPOINT a", query: true},
		{sql: "ROLLBACK TO a", query: true},
		{sql: "RELEASE a", query: true},
		// writes
		{sql: "UPDATE ft SET v = v + 1 WHERE id = " + id, query: true},
		{sql: "UPDATE ft SET v = v + 1 WHERE id = " + id, query: true},
		{sql: "UPDATE ft SET v = v + 1 WHERE id = $1", param: idP},
		{sql: "UPDATE ft SET v = v + 2 WHERE id < 900", query: true},
		{sql: "UPDATE ft SET v = v + 1 WHERE id = " + id + " RETURNING id, fence_token", query: true},
		{sql: "UPDATE ft SET v = v + 1, fence_token = 1 WHERE id = " + id, query: true},
		{sql: "DELETE FROM ft WHERE id = " + id, query: true},
		{sql: "DELETE FROM ft WHERE id = $1", param: idP},
		{sql: "INSERT INTO ft (id, v) VALUES (" + id + ", 0)", query: true},
		{sql: "INSERT INTO ft (id, v) VALUES ($1, 0)", param: idP},
		{sql: "INSERT INTO ft (id, v) VALUES (" + id + ", 0) ON CONFLICT (id) DO UPDATE SET v = ft.v + 10", query: true},
		{sql: "INSERT INTO ft (id, v) VALUES (" + id + ", 0) ON CONFLICT DO NOTHING", query: true},
		{sql: "WITH u AS (UPDATE ft SET v = v + 3 WHERE id = " + id + " RETURNING id) SELECT count(*) FROM u", query: true},
		// reads and failures
		{sql: "SELECT id, v, fence_token FROM ft WHERE id < 900 ORDER BY id", query: true},
		{sql: "SELECT 1/0", query: true},
		{sql: "SELEC 1", query: true},
	}
}

// fmIsReset: the text resets the token.
func fmIsReset(q string) bool {
	return strings.Contains(q, "RESET") || strings.Contains(q, "TO DEFAULT")
}

// fmPickText picks a text; with avoid, never an invalid token (K4), and with a startup token never a reset
// (K2).
func fmPickText(r *rand.Rand, avoid, startup bool) fmText {
	for {
		t := woPick(r, fmTexts(r, avoid))
		if avoid && startup && fmIsReset(t.sql) {
			continue
		}
		return t
	}
}

// fmGen makes one sequence of 4-16 messages (plus a final Sync when needed).
func fmGen(r *rand.Rand, avoid bool, startup bool) []woMsg {
	stmts := []string{"", "", "s1", "s2"}
	portals := []string{"", "", "p1"}
	parsed := map[string]fmText{}
	var out []woMsg
	n := 4 + r.Intn(13)
	atBoundary := true
	add := func(m woMsg) {
		out = append(out, m)
		switch m.m.(type) {
		case *pgproto3.Sync, *pgproto3.Query:
			atBoundary = true
		case *pgproto3.Flush:
		default:
			atBoundary = false
		}
	}
	bind := func(portal, name string) {
		t, ok := parsed[name]
		var ps []string
		if ok && t.param != nil {
			ps = append(ps, t.param(r))
		}
		add(woB(portal, name, ps...))
	}
	lastPortal := ""
	for len(out) < n {
		x := r.Intn(100)
		switch {
		case x < 30: // Parse, usually with Bind and Execute
			name := woPick(r, stmts)
			t := fmPickText(r, avoid, startup)
			if avoid && (t.sql == "COMMIT" || t.sql == "ROLLBACK") {
				continue
			}
			parsed[name] = t
			add(woP(name, t.sql))
			if r.Intn(4) > 0 {
				portal := woPick(r, portals)
				bind(portal, name)
				lastPortal = portal
				if r.Intn(4) > 0 {
					add(woE(portal, 0))
				}
			}
		case x < 38: // Bind of an earlier statement
			name := woPick(r, stmts)
			portal := woPick(r, portals)
			bind(portal, name)
			lastPortal = portal
		case x < 50:
			add(woE(lastPortal, 0))
		case x < 52:
			add(woD('P', lastPortal))
		case x < 54:
			add(woC('S', woPick(r, stmts)))
		case x < 56:
			add(woH)
		case x < 68:
			add(woS)
		default: // a Query of one to four statements
			if !atBoundary {
				add(woS)
			}
			var qs []string
			k := 1 + r.Intn(4)
			if r.Intn(2) == 0 {
				k = 1
			}
			for len(qs) < k {
				t := fmPickText(r, avoid, startup)
				if !t.query {
					continue
				}
				if avoid && (t.sql == "COMMIT" || t.sql == "ROLLBACK") && len(qs) < k-1 {
					continue // a Query of several transactions (a listed difference)
				}
				qs = append(qs, t.sql)
			}
			add(woQ(strings.Join(qs, "; ")))
		}
	}
	if !atBoundary {
		add(woS)
	}
	if _, ok := out[len(out)-1].m.(*pgproto3.Flush); ok {
		add(woS)
	}
	return out
}

// fmShort is woShort with the message of the contract's errors (55F0x), which the guard and the proxy must
// word alike.
func fmShort(m pgproto3.BackendMessage) string {
	if e, ok := m.(*pgproto3.ErrorResponse); ok && strings.HasPrefix(e.Code, "55F") {
		return "E:" + e.Code + "(" + e.Message + ")"
	}
	if ps, ok := m.(*pgproto3.ParameterStatus); ok && ps.Name == "application_name" {
		// RESET ALL gives the pooled connection's '' for the rest of the transaction (a listed difference)
		return ""
	}
	return woShort(m)
}

type fmEnv struct {
	t          *testing.T
	dbD, dbP   string
	suD, suP   *pgx.Conn // superuser connections straight to each database
	p          *proxytest.Proxy
	w          *woRunner
	noiseWrote int
	user       string          // the subject's login (both); the superuser when ""
	cluster    *pgtest.Cluster // the cluster of both databases; pg when nil
}

const fmTables = "tables:\n  - name: public.ft\n    token_column: fence_token\n"

func fmFreshDB(t *testing.T, prefix string) (string, *pgx.Conn) {
	t.Helper()
	pgtest.Require(t, pg)
	db := fxName(t, prefix)
	pg.Exec("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)")
	if err := pg.Exec("CREATE DATABASE " + db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Exec("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)") })
	su := connect(t, pg.DSN(pgtest.SuperUser, "", db))
	fxExec(t, su, "CREATE TABLE ft (id int PRIMARY KEY, v int NOT NULL DEFAULT 0, fence_token bigint)")
	cfg, err := config.Parse("t.yaml", []byte("upstream:\n  address: a:1\n"+fmTables))
	if err != nil {
		t.Fatal(err)
	}
	if err := schema.Install(ctxT(t), su, schema.FromConfig(cfg)); err != nil {
		t.Fatalf("fenceproxy install: %v", err)
	}
	return db, su
}

func newFmEnv(t *testing.T) *fmEnv {
	e := &fmEnv{t: t}
	e.dbD, e.suD = fmFreshDB(t, "fzd")
	e.dbP, e.suP = fmFreshDB(t, "fzp")
	// the noise client's rows, only on the pooled side (the snapshots compare ids below 900)
	fxExec(t, e.suP, "BEGIN; SET LOCAL fence.token = "+fmNoiseToken+"; INSERT INTO ft VALUES (900, 0), (901, 0), (902, 0); COMMIT")
	e.p = startProxy(t, proxytest.Options{YAML: fmTables + "pool:\n  mode: transaction\n  size: 1\n  max_client_wait: 1s\nauth:\n  type: trust\n"})
	e.w = &woRunner{t: t, short: fmShort}
	e.w.noiseFn = e.noise
	e.connectNoise()
	return e
}

func (e *fmEnv) connectNoise() {
	if e.w.noise != nil {
		e.w.noise.Close(context.Background())
	}
	e.w.noise = woConnect(e.t, e.p.DSN(pgtest.SuperUser, "", e.dbP)+"&application_name=noise&options=-c%20fence.token%3D"+fmNoiseToken)
}

// noise runs one transaction of the noise client: reads and writes of its own rows, each of which must see
// and stamp its own token; false when it could not get the server connection.
func (e *fmEnv) noise() bool {
	w := e.w
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var rows [][][]byte
	var err error
	what, want := "", fmNoiseToken
	last := func(res []*pgconn.Result, err0 error) {
		err = err0
		if err == nil && len(res) > 0 {
			for _, r := range res {
				if len(r.Rows) > 0 {
					rows = r.Rows
				}
			}
		}
	}
	id := strconv.Itoa(900 + w.nrand.Intn(3))
	switch w.nrand.Intn(6) {
	case 0:
		what = "read"
		last(w.noise.Exec(ctx, "SELECT current_setting('fence.token')").ReadAll())
	case 1:
		what = "update extended"
		res := w.noise.ExecParams(ctx, "UPDATE ft SET v = v + 1 WHERE id = $1 RETURNING fence_token", [][]byte{[]byte(id)}, nil, nil, nil).Read()
		rows, err = res.Rows, res.Err
	case 2:
		what = "block"
		last(w.noise.Exec(ctx, "BEGIN; UPDATE ft SET v = v + 1 WHERE id = "+id+" RETURNING fence_token; COMMIT").ReadAll())
	case 3:
		what = "session SET"
		last(w.noise.Exec(ctx, "SET fence.token = "+fmNoiseToken+"; SELECT current_setting('fence.token')").ReadAll())
	case 4:
		what = "upsert"
		last(w.noise.Exec(ctx, "INSERT INTO ft (id, v) VALUES ("+id+", 0) ON CONFLICT (id) DO UPDATE SET v = ft.v + 1 RETURNING fence_token").ReadAll())
	default:
		what = "begin extended"
		res := w.noise.ExecParams(ctx, "BEGIN", nil, nil, nil, nil).Read()
		err = res.Err
		if err == nil {
			res = w.noise.ExecParams(ctx, "UPDATE ft SET v = v + 1 WHERE id = $1 RETURNING fence_token", [][]byte{[]byte(id)}, nil, nil, nil).Read()
			rows, err = res.Rows, res.Err
			if _, err2 := w.noise.Exec(ctx, "COMMIT").ReadAll(); err == nil {
				err = err2
			}
		}
	}
	return w.noiseAnswer(what, rows, err, want, e.connectNoise)
}

// fmInitial are the subject's rows before every sequence: (id, token).
var fmInitial = [][2]string{{"1", "2"}, {"2", "5"}, {"3", "8"}, {"4", "5"}}

// reset puts the subject's rows (ids below 900) back on one side, the guard's row trigger off for the
// transaction so the rows get the tokens they start with.
func (e *fmEnv) reset(su *pgx.Conn) {
	var b strings.Builder
	b.WriteString(`BEGIN; ALTER TABLE ft DISABLE TRIGGER "~fenceproxy_guard"; DELETE FROM ft WHERE id < 900; INSERT INTO ft VALUES `)
	for i, r := range fmInitial {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(%s, 0, %s)", r[0], r[1])
	}
	b.WriteString(`; ALTER TABLE ft ENABLE ALWAYS TRIGGER "~fenceproxy_guard"; COMMIT`)
	fxExec(e.t, su, b.String())
}

func (e *fmEnv) rows(su *pgx.Conn) string {
	var s string
	err := su.QueryRow(ctxT(e.t), `SELECT coalesce(string_agg(id || ':' || v || ':' || coalesce(fence_token::text, 'null'), ' ' ORDER BY id), '') FROM ft WHERE id < 900`).Scan(&s)
	if err != nil {
		e.t.Fatalf("rows: %v", err)
	}
	return "ROWS[" + s + "]"
}

// both runs seq directly (on the guarded database) and through the pool, each after a reset of the rows, and
// returns the two streams, each ending with the committed rows. opts is the subject's startup options ("" or
// "-c fence.token=N").
func (e *fmEnv) both(seq []woMsg, opts string, noiseSeed int64) (d, p []string) {
	q := "&application_name=subject"
	if opts != "" {
		q += "&options=" + strings.ReplaceAll(url.QueryEscape(opts), "+", "%20")
	}
	user := e.user
	if user == "" {
		user = pgtest.SuperUser
	}
	c := e.cluster
	if c == nil {
		c = pg
	}
	e.reset(e.suD)
	dc := woConnect(e.t, c.DSN(user, "", e.dbD)+q)
	d = e.w.run(dc, seq, false)
	dc.Close(context.Background())
	d = append(d, e.rows(e.suD))

	for try := 0; ; try++ {
		e.reset(e.suP)
		e.w.nrand = rand.New(rand.NewSource(noiseSeed))
		pc := woConnect(e.t, e.p.DSN(user, "", e.dbP)+q)
		p = e.w.run(pc, seq, true)
		pc.Close(context.Background())
		if try == 2 || !woWaitedOut(p) {
			return d, append(p, e.rows(e.suP))
		}
	}
}

// minimize removes messages one at a time while the streams still differ with the same first difference.
func (e *fmEnv) minimize(seq []woMsg, opts string, noiseSeed int64, sig string) []woMsg {
	return woMinimize(seq, func(cand []woMsg) bool {
		d, p := e.both(cand, opts, noiseSeed)
		return !woEqual(d, p) && fmSig(d, p) == sig
	})
}

func fmSig(d, p []string) string {
	sig := woFirstDiff(d, p)
	if d[len(d)-1] != p[len(p)-1] {
		sig = "ROWS " + sig
	}
	return sig
}

// fmClass says how much a difference matters: "ROWS" (committed rows differ), "ACCEPT" (a statement accepted
// on one side and refused on the other), "CODE" (both refuse, with other SQLSTATEs or wording), "OTHER".
func fmClass(sig string) string {
	d, p, _ := strings.Cut(sig, " vs ")
	switch {
	case strings.HasPrefix(sig, "ROWS"):
		return "ROWS"
	case strings.HasPrefix(d, "E:") && strings.HasPrefix(p, "E:"):
		return "CODE"
	case strings.HasPrefix(d, "E:") != strings.HasPrefix(p, "E:"):
		return "ACCEPT"
	}
	return "OTHER"
}

// fmKnownDiff reports whether a first difference is one docs/pooling.md lists (woKnownDiff's, and those of
// fencing): filled in from the fuzzer's findings.
func fmKnownDiff(sig string, seq []woMsg, opts string, d []string) string {
	sig = strings.TrimPrefix(sig, "ROWS ")
	if woKnownDiff(sig) {
		return "wo"
	}
	dd, pp, ok := strings.Cut(sig, " vs ")
	if !ok {
		return ""
	}
	placeholder := strings.HasPrefix(pp, "E:55F03(") && strings.Contains(pp, "fenceproxy:pooled")
	// K1: a Query of several transactions, or a batch that starts with COMMIT or ROLLBACK: the statements after
	// them meet the placeholder (55F03).
	if placeholder {
		for _, m := range seq {
			switch m := m.m.(type) {
			case *pgproto3.Query:
				if strings.Contains(m.String, "COMMIT; ") || strings.Contains(m.String, "ROLLBACK; ") {
					return "K1"
				}
			case *pgproto3.Parse:
				if m.Query == "COMMIT" || m.Query == "ROLLBACK" {
					return "K1"
				}
			}
		}
	}
	// K2: with a startup token, a reset inside a transaction gives the pooled connection's '' (55F02); and a
	// transaction whose texts reset the token and may set it, read back as '', leaves the client no token
	// (docs/pooling.md, known differences: rewrite.SessionEffects), where directly the reset gave the startup
	// value.
	if opts != "" && (strings.HasPrefix(pp, "E:55F02(") && !strings.HasPrefix(dd, "E:55F02(") || pp == "D[-]") {
		for _, m := range seq {
			switch m := m.m.(type) {
			case *pgproto3.Query:
				if fmIsReset(m.String) {
					return "K2"
				}
			case *pgproto3.Parse:
				if fmIsReset(m.Query) {
					return "K2"
				}
			}
		}
	}
	// K4: the proxy refuses an invalid token where it is set (SET, set_config: 55F03); the guard at the write
	// (the contract: "at the SET or at the write").
	if strings.HasPrefix(pp, "E:55F03(invalid fencing token: \"") && !strings.Contains(pp, "fenceproxy:pooled") {
		for _, m := range seq {
			for _, b := range fmBadTokens {
				if strings.Contains(m.s, "'"+b+"'") || strings.Contains(m.s, "= "+b) || strings.Contains(m.s, "\\\""+b) {
					return "K4"
				}
				if bm, ok := m.m.(*pgproto3.Bind); ok && len(bm.Parameters) == 1 && string(bm.Parameters[0]) == b {
					return "K4"
				}
			}
		}
	}
	// K4 in a failed block: the refusal stands for the whole Query, which the server answers 25P02 there, so a
	// COMMIT or ROLLBACK first in that Query does not end the block as it does directly (docs/pooling.md, known
	// differences; fenced seed 40 #327). Both leave nothing written.
	if pp == "E:25P02" && dd == "C:ROLLBACK" {
		for _, m := range seq {
			q, ok := m.m.(*pgproto3.Query)
			if !ok || !(strings.HasPrefix(q.String, "COMMIT; ") || strings.HasPrefix(q.String, "ROLLBACK; ")) {
				continue
			}
			for _, b := range fmBadTokens {
				if strings.Contains(q.String, "'"+b+"'") || strings.Contains(q.String, "= "+b) {
					return "K4"
				}
			}
		}
	}
	// K5: a Query the proxy cannot parse that mentions the table: 55F04 where the server says 42601.
	if dd == "E:42601" && strings.HasPrefix(pp, "E:55F04(unfenceable write: cannot parse") {
		return "K5"
	}
	// K6: in an aborted block, an Execute of the unnamed portal that nothing of the client's bound in the batch:
	// "portal \"\" cannot be run" (55000) on one side where the other says 25P02 (the unnamed portal the server
	// holds there is the client's last simple Query's directly, the proxy's statements' through the pool). Both
	// refuse; nothing runs.
	if dd == "E:55000" && pp == "E:25P02" || dd == "E:25P02" && pp == "E:55000" {
		return "K6"
	}
	// K3: the proxy's rewrite refuses a write with no or an invalid token even when no row matches
	// (docs/fence-sql.md); the guard, a row trigger, has no row to refuse. Not pooling's.
	if (strings.HasPrefix(pp, "E:55F02(") || strings.HasPrefix(pp, "E:55F03(") && !placeholder) && !strings.HasPrefix(dd, "E:") {
		ds := woStrip(d)
		i := 0
		for ; i < len(ds); i++ {
			if ds[i] == dd {
				break
			}
		}
		for ; i < len(ds); i++ {
			x := ds[i]
			if strings.HasPrefix(x, "C:") {
				if x == "C:UPDATE 0" || x == "C:DELETE 0" || x == "C:INSERT 0 0" || x == "C:SELECT 1" && i > 0 && ds[i-1] == "D[0]" {
					return "K3"
				}
				break
			}
			if strings.HasPrefix(x, "E:") || strings.HasPrefix(x, "Z:") {
				break
			}
		}
	}
	return ""
}

func TestPooledFencedOracle(t *testing.T) {
	seed, n, budget, only, trace := woSettingsFrom("FENCEDORACLE", 300, 90*time.Second)
	strict := os.Getenv("FENCEDORACLE_STRICT") == "1"
	avoid := os.Getenv("FENCEDORACLE_AVOID") == "1"
	t.Logf("seed %d, n %d, avoid %v", seed, n, avoid)
	e := newFmEnv(t)
	defer func() { e.w.noise.Close(context.Background()) }()
	r := rand.New(rand.NewSource(seed))
	start := time.Now()
	type diff struct {
		i    int
		seq  []woMsg
		opts string
		d, p []string
	}
	bySig := map[string][]diff{}
	seqs, msgs, known := 0, 0, map[string]int{}
	for i := 0; i < n; i++ {
		opts := ""
		if r.Intn(3) == 0 {
			opts = "-c fence.token=" + woPick(r, fmTokens)
		}
		seq := fmGen(r, avoid, opts != "")
		if only >= 0 && i != only {
			continue
		}
		if time.Since(start) > budget {
			t.Logf("time budget reached after %d sequences", seqs)
			break
		}
		seqs++
		msgs += len(seq)
		noiseSeed := seed*100003 + int64(i)
		if trace {
			t.Logf("sequence %d (options %q): %v", i, opts, seq)
		}
		d, p := e.both(seq, opts, noiseSeed)
		if only >= 0 {
			t.Logf("sequence %d (options %q): %v\n direct: %v\n pooled: %v", i, opts, seq, d, p)
		}
		if !woEqual(d, p) {
			sig := fmSig(d, p)
			if k := fmKnownDiff(sig, seq, opts, d); !strict && k != "" {
				known[k]++
				continue
			}
			bySig[sig] = append(bySig[sig], diff{i, seq, opts, d, p})
		}
	}
	t.Logf("ran %d sequences, %d messages, in %v; listed differences %v; noise transactions %d, subject blocking noise in %d sequences",
		seqs, msgs, time.Since(start).Round(time.Millisecond), known, e.w.noiseOK, e.w.pinned)
	for _, b := range e.w.bad {
		t.Errorf("%s", b)
	}
	rank := map[string]int{"ROWS": 0, "ACCEPT": 1, "OTHER": 2, "CODE": 3}
	minimized := 0
	woWorstFirst(bySig, func(s string) int { return rank[fmClass(s)] }, func(d diff) int { return len(d.seq) }, func(s string, n int, best diff) {
		noiseSeed := seed*100003 + int64(best.i)
		min := best.seq
		if minimized < 12 && time.Since(start) < 3*budget {
			min = e.minimize(best.seq, best.opts, noiseSeed, s)
			minimized++
		}
		md, mp := e.both(min, best.opts, noiseSeed)
		t.Errorf("DIFF [%s] %q: %d sequences (first #%d, seed %d, options %q)\n  sequence: %v\n  direct:   %v\n  pooled:   %v\n  minimal:  %v\n  direct:   %v\n  pooled:   %v",
			fmClass(s), s, n, best.i, seed, best.opts, best.seq, best.d, best.p, min, md, mp)
	})
}

// TestPooledFencedPlaceholderLock is the fuzzer's one finding that weakened a fence (seed 2): a Query of
// several transactions, "COMMIT; SET LOCAL fence.token = 5; INSERT ...", runs its second transaction without
// the proxy's token statement, so with the pooled connection's placeholder as its lock. The guard took the
// placeholder for a lock name: every such write of every client raised and checked one shared lock called
// fenceproxy:pooled (client B refused 55F01 because client A wrote), and a stale holder of lock L (its mark 9,
// its token 5) committed where directly L refuses it (55F01). The guard now refuses the placeholder as a lock
// (55F03, schema.lockAcceptBody): through the pool each of these writes is refused, none commits, and no lock
// of that name is ever marked; directly they are accepted or refused by the client's own lock.
func TestPooledFencedPlaceholderLock(t *testing.T) {
	e := newFmEnv(t)
	defer e.w.noise.Close(context.Background())
	e.reset(e.suD)
	e.reset(e.suP)
	var got [2][]string
	for i, db := range []string{e.dbD, e.dbP} {
		dsn := pg.DSN(pgtest.SuperUser, "", db)
		if i == 1 {
			dsn = e.p.DSN(pgtest.SuperUser, "", db)
		}
		newer := woConnect(t, dsn+"&options=-c%20fence.token%3D9%20-c%20fence.lock%3DL")
		_, err := newer.Exec(ctxT(t), "INSERT INTO ft (id, v) VALUES (10, 0)").ReadAll()
		got[i] = append(got[i], lockReadCode(err))
		newer.Close(context.Background())
		for _, c := range []struct{ opts, q string }{
			{"-c%20fence.token%3D5%20-c%20fence.lock%3DL", "INSERT INTO ft (id, v) VALUES (20, 0)"},
			{"-c%20fence.token%3D5%20-c%20fence.lock%3DL", "COMMIT; SET LOCAL fence.token = 5; INSERT INTO ft (id, v) VALUES (22, 0)"},
			{"-c%20fence.token%3D5%20-c%20fence.lock%3DL", "COMMIT; SET LOCAL fence.token = 5; SET LOCAL fence.lock = 'L'; INSERT INTO ft (id, v) VALUES (23, 0)"},
			{"", "COMMIT; SET LOCAL fence.token = 12; INSERT INTO ft (id, v) VALUES (30, 0)"},
			{"", "COMMIT; SET LOCAL fence.token = 5; INSERT INTO ft (id, v) VALUES (31, 0)"},
		} {
			conn := woConnect(t, dsn+"&options="+c.opts)
			_, err := conn.Exec(ctxT(t), c.q).ReadAll()
			got[i] = append(got[i], lockReadCode(err))
			conn.Close(context.Background())
		}
	}
	var marks string
	e.suP.QueryRow(ctxT(t), "SELECT coalesce(string_agg(name || '=' || mark, ' ' ORDER BY name), '') FROM fenceproxy.lock_marks").Scan(&marks)
	rowsD, rowsP := e.rows(e.suD), e.rows(e.suP)
	t.Logf("direct %v\npooled %v\npooled lock marks: %s; rows direct %s pooled %s", got[0], got[1], marks, rowsD, rowsP)
	want := [2][]string{{"ok", "55F01", "55F01", "55F01", "ok", "ok"}, {"ok", "55F01", "55F03", "55F01", "55F03", "55F03"}}
	for i := range want {
		if strings.Join(got[i], " ") != strings.Join(want[i], " ") {
			t.Errorf("%s: %v, want %v", []string{"direct", "pooled"}[i], got[i], want[i])
		}
	}
	if marks != "L=9" {
		t.Errorf("pooled database's lock marks %q, want L=9 only", marks)
	}
	for _, id := range []string{"22", "30", "31"} {
		if strings.Contains(rowsP, "["+id+":") || strings.Contains(rowsP, " "+id+":") {
			t.Errorf("row %s committed through the pool under the placeholder lock: %s", id, rowsP)
		}
	}
}
