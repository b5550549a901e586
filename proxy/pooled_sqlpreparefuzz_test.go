package proxy_test

// A differential fuzzer of SQL-level prepared statements under transaction pooling (proxy/pooledsqlprep.go):
// seeded random scripts of two or three clients that use the same statement names (s0..s3, a few spellings of
// them, names never prepared, one in the proxy's own prefix) for texts of their own (each result names its
// client, name and text, so a statement run for the wrong client shows), in simple Queries of one to four
// statements: PREPARE with and without parameter types, of the same or another text for a name in use,
// EXECUTE with arguments (now and then of the wrong number or type), DEALLOCATE [PREPARE] n, DEALLOCATE ALL,
// DISCARD ALL, EXPLAIN EXECUTE, CREATE TABLE AS EXECUTE, BEGIN, COMMIT, ROLLBACK, savepoints, a division by
// zero in the middle of a Query. Half the time the client of the last step goes again, and so gets the server
// connection it held last (where the bug of 274c763 hid: a Close sent in front of a Query undid what the same
// Query needed); otherwise clients alternate. The judge is one direct connection per client; the other side
// is the proxy in transaction mode with a pool of one server connection (two for every third script), whose
// server connections keep what earlier scripts left on them. Every step's command tags, rows, SQLSTATE and
// transaction status must be the same, and no client may be pinned.
//
// A script is generated while it runs directly, so a client is only picked when the pool has a server
// connection for it (no more clients inside a block than the pool has connections). A difference is reduced
// (steps, then statements, are left out while the first difference stays at the same step) and printed with
// its seed and script number, the reduced script in the form of sqlPrepareScript.
//
//	SQLPREPFUZZ_SEED   the seed (default 1)
//	SQLPREPFUZZ_N      the number of scripts (default 60)
//	SQLPREPFUZZ_STEPS  the steps of a script (default 24)
//	SQLPREPFUZZ_BUDGET the time budget (default 50s)
//	SQLPREPFUZZ_ONLY   run only this script number (with its seed)
//	SQLPREPFUZZ_TRACE  1: log every script and both outcomes
//	SQLPREPFUZZ_REDUCE how many differences to reduce (default 3)

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/jackc/pgx/v5/pgconn"
)

// spfStep is one simple Query of one client (0-based), its statements.
type spfStep struct {
	client int
	stmts  []string
}

func (s spfStep) sql() string { return strings.Join(s.stmts, "; ") }

// spfNames are the canonical statement names a script uses: the shared ones, one never prepared by anyone, one
// in the proxy's own prefix and one that differs from s0 only in case (quoted).
var spfNames = []string{"s0", "s1", "s2", "s3", "nope", "fenceproxy_s", "S0"}

// spfSpell writes a canonical name as SQL, now and then in another spelling of the same name.
func spfSpell(r *rand.Rand, n string) string {
	if n == "S0" {
		return `"S0"`
	}
	switch r.Intn(20) {
	case 0:
		return strings.ToUpper(n)
	case 1:
		return `"` + n + `"`
	}
	return n
}

// spfText is a statement text of client c for name n, variant v, and its parameter types; "" as a type is a
// parameter whose type the server infers (text).
func spfText(c int, n string, v int) (string, []string) {
	tag := fmt.Sprintf("c%d-%s-t%d", c+1, n, v)
	switch v {
	case 0:
		return fmt.Sprintf("AS SELECT '%s'", tag), nil
	case 1:
		return fmt.Sprintf("(int) AS SELECT '%s:' || $1", tag), []string{"int"}
	case 2:
		return fmt.Sprintf("AS SELECT '%s:' || $1::text", tag), []string{""}
	case 3:
		// The same text for every client: the same server statement name (its hash is of name and text).
		return fmt.Sprintf("AS SELECT 'shared-%s'", n), nil
	case 4:
		// A literal with what reads as statement separators and words in it.
		return fmt.Sprintf("AS SELECT '%s; EXECUTE %s; DEALLOCATE ALL', 2 + 2", tag, n), nil
	case 5:
		return fmt.Sprintf("AS SELECT '%s', 1/0", tag), nil // prepares; every EXECUTE fails 22012
	case 6:
		return "AS SELECT * FROM no_such_table_sqlpf", nil // PREPARE fails 42P01
	default:
		return fmt.Sprintf("(int, text) AS VALUES ($1, $2 || '-%s')", tag), []string{"int", "text"}
	}
}

const spfVariants = 8

// spfGen makes a script's statements; believed is each client's last PREPAREd variant of each name, for
// arguments that mostly fit.
type spfGen struct {
	r        *rand.Rand
	ctas     string
	believed map[string]int
}

func (g *spfGen) name() string {
	if g.r.Intn(12) == 0 {
		return spfNames[4+g.r.Intn(3)]
	}
	return spfNames[g.r.Intn(4)]
}

func (g *spfGen) args(c int, n string) string {
	v, ok := g.believed[fmt.Sprint(c, n)]
	var types []string
	if ok {
		_, types = spfText(c, n, v)
	}
	if g.r.Intn(10) == 0 { // the wrong number or type
		types = [][]string{nil, {"int"}, {"bad"}, {"int", "int", "int"}}[g.r.Intn(4)]
	}
	if len(types) == 0 {
		return ""
	}
	var a []string
	for _, ty := range types {
		switch ty {
		case "int":
			a = append(a, strconv.Itoa(g.r.Intn(100)))
		case "bad":
			a = append(a, "'bad'")
		default:
			a = append(a, fmt.Sprintf("'x%d'", g.r.Intn(10)))
		}
	}
	return "(" + strings.Join(a, ", ") + ")"
}

// stmt is one statement (CREATE TABLE AS EXECUTE comes with its DROP) of client c, inTx whether it is in a
// block now.
func (g *spfGen) stmt(c int, inTx bool) []string {
	r := g.r
	for {
		switch k := r.Intn(100); {
		case k < 24:
			n := g.name()
			v := r.Intn(spfVariants)
			text, _ := spfText(c, n, v)
			g.believed[fmt.Sprint(c, n)] = v
			return []string{"PREPARE " + spfSpell(r, n) + " " + text}
		case k < 50:
			n := g.name()
			return []string{"EXECUTE " + spfSpell(r, n) + g.args(c, n)}
		case k < 58:
			verb := "DEALLOCATE "
			if r.Intn(3) == 0 {
				verb = "DEALLOCATE PREPARE "
			}
			return []string{verb + spfSpell(r, g.name())}
		case k < 62:
			return []string{"DEALLOCATE ALL"}
		case k < 64:
			return []string{"DISCARD ALL"}
		case k < 68:
			n := g.name()
			return []string{"EXPLAIN (COSTS OFF) EXECUTE " + spfSpell(r, n) + g.args(c, n)}
		case k < 70:
			n := g.name()
			t := fmt.Sprintf("%s_c%d", g.ctas, c+1)
			return []string{"CREATE TABLE " + t + " AS EXECUTE " + spfSpell(r, n) + g.args(c, n), "DROP TABLE " + t}
		case k < 76:
			if inTx && r.Intn(4) != 0 {
				continue
			}
			return []string{"BEGIN"}
		case k < 84:
			if !inTx && r.Intn(4) != 0 {
				continue
			}
			return []string{[]string{"COMMIT", "ROLLBACK", "END", "ABORT"}[r.Intn(4)]}
		case k < 88:
			if !inTx {
				continue
			}
			if r.Intn(2) == 0 {
				return []string{"SAVEPOINT sp"}
			}
			return []string{"ROLLBACK TO SAVEPOINT sp"}
		case k < 93:
			return []string{"SELECT 1/0"}
		default:
			return []string{fmt.Sprintf("SELECT 'c%d-plain'", c+1)}
		}
	}
}

// step is one Query of client c: one to four statements.
func (g *spfGen) step(c int, inTx bool) spfStep {
	n := 1
	switch k := g.r.Intn(20); {
	case k >= 18:
		n = 4
	case k >= 15:
		n = 3
	case k >= 11:
		n = 2
	}
	s := spfStep{client: c}
	for len(s.stmts) < n {
		s.stmts = append(s.stmts, g.stmt(c, inTx)...)
		if last := s.stmts[len(s.stmts)-1]; last == "BEGIN" {
			inTx = true
		}
	}
	return s
}

// spfRunner runs scripts directly and through a pool of a given size.
type spfRunner struct {
	t     *testing.T
	pools map[int]*fenced
	ctas  string
}

// spfConns are a script's connections, one per client.
type spfConns []*pgconn.PgConn

func (cs spfConns) close() {
	for _, c := range cs {
		if c != nil {
			c.Close(context.Background())
		}
	}
}

func (w *spfRunner) connect(ctx context.Context, dsn string, clients int) (spfConns, error) {
	cs := make(spfConns, clients)
	for i := range cs {
		c, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			cs.close()
			return nil, err
		}
		cs[i] = c
	}
	return cs, nil
}

// allowed are the clients that may go next: all, unless as many clients are inside a block as the pool has
// server connections (then the others would wait for one).
func allowed(cs spfConns, poolSize int) []int {
	var in, all []int
	for i, c := range cs {
		all = append(all, i)
		if c.TxStatus() != 'I' {
			in = append(in, i)
		}
	}
	if len(in) >= poolSize {
		return in
	}
	return all
}

func spfOutcome(ctx context.Context, c *pgconn.PgConn, sql string) string {
	return simpleOutcome(ctx, c, sql) + " [" + string(c.TxStatus()) + "]"
}

// generate makes a script of steps Queries while it runs it directly, and returns the direct outcomes.
func (w *spfRunner) generate(r *rand.Rand, clients, poolSize, steps int) ([]spfStep, []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs, err := w.connect(ctx, pg.SuperDSN(), clients)
	if err != nil {
		w.t.Fatal(err)
	}
	defer cs.close()
	g := &spfGen{r: r, ctas: w.ctas, believed: map[string]int{}}
	var script []spfStep
	var out []string
	last := -1
	for len(script) < steps {
		ok := allowed(cs, poolSize)
		c := ok[r.Intn(len(ok))]
		for _, o := range ok {
			if o == last && r.Intn(2) == 0 { // the same client again: the server connection it held last
				c = last
			}
		}
		s := g.step(c, cs[c].TxStatus() != 'I')
		script = append(script, s)
		out = append(out, spfOutcome(ctx, cs[c], s.sql()))
		last = c
	}
	return script, out
}

// run runs a script directly (valid: every step's client was allowed) or through the pool of poolSize.
func (w *spfRunner) run(script []spfStep, clients, poolSize int, pooled bool) (out []string, valid bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dsn := pg.SuperDSN()
	if pooled {
		dsn = w.pools[poolSize].dsn()
	}
	cs, err := w.connect(ctx, dsn, clients)
	if err != nil {
		w.t.Fatal(err)
	}
	defer cs.close()
	valid = true
	for _, s := range script {
		ok := false
		for _, o := range allowed(cs, poolSize) {
			ok = ok || o == s.client
		}
		valid = valid && ok
		if !pooled && !valid {
			return nil, false
		}
		out = append(out, spfOutcome(ctx, cs[s.client], s.sql()))
	}
	return out, valid
}

func (w *spfRunner) pins() float64 {
	n := 0.0
	for _, f := range w.pools {
		n += fxCounter(w.t, f.p.Registry, "fenceproxy_pool_pins_total", nil)
	}
	return n
}

func firstDiff(a, b []string) int {
	for i := range a {
		if i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	if len(b) > len(a) {
		return len(a)
	}
	return -1
}

// reduce leaves out steps and statements of a script whose first difference is at step at, as long as the
// first difference stays at the same (renumbered) step.
func (w *spfRunner) reduce(script []spfStep, at, clients, poolSize int) ([]spfStep, int) {
	still := func(cand []spfStep, at int) bool {
		d, ok := w.run(cand, clients, poolSize, false)
		if !ok {
			return false
		}
		p, _ := w.run(cand, clients, poolSize, true)
		return firstDiff(d, p) == at
	}
	cur := append([]spfStep(nil), script[:at+1]...)
	deadline := time.Now().Add(60 * time.Second)
	for changed := true; changed && time.Now().Before(deadline); {
		changed = false
		for i := at - 1; i >= 0; i-- {
			cand := append(append([]spfStep(nil), cur[:i]...), cur[i+1:]...)
			if still(cand, at-1) {
				cur, at, changed = cand, at-1, true
			}
		}
		for i := 0; i <= at; i++ {
			for j := len(cur[i].stmts) - 1; j >= 0 && len(cur[i].stmts) > 1; j-- {
				cand := append([]spfStep(nil), cur...)
				cand[i].stmts = append(append([]string(nil), cur[i].stmts[:j]...), cur[i].stmts[j+1:]...)
				if still(cand, at) {
					cur, changed = cand, true
				}
			}
		}
	}
	return cur, at
}

func spfFormat(script []spfStep) string {
	var b strings.Builder
	for _, s := range script {
		fmt.Fprintf(&b, "\t{%q, %q},\n", string(rune('A'+s.client)), s.sql())
	}
	return b.String()
}

// spfPool is newPooledFenced for a second proxy of the same test (its table named apart).
func spfPool(t *testing.T, size int, extra string) *fenced {
	d := direct(t)
	name := fxName(t, fmt.Sprintf("tp%d", size))
	fxCreateTable(t, d, "public."+name)
	yaml := fxTables("public."+name) + fmt.Sprintf("pool:\n  mode: transaction\n  size: %d\n", size) + extra + "auth:\n  type: trust\n"
	return &fenced{p: startProxy(t, proxytest.Options{YAML: yaml}), d: d, name: name, label: "public." + name}
}

func TestPooledSQLPrepareFuzzOracle(t *testing.T) {
	seed, n, budget, only, trace := woSettingsFrom("SQLPREPFUZZ", 60, 50*time.Second)
	steps, reduceN := 24, 3
	if s := os.Getenv("SQLPREPFUZZ_STEPS"); s != "" {
		steps, _ = strconv.Atoi(s)
	}
	if s := os.Getenv("SQLPREPFUZZ_REDUCE"); s != "" {
		reduceN, _ = strconv.Atoi(s)
	}
	t.Logf("seed %d, n %d, steps %d", seed, n, steps)
	w := &spfRunner{t: t, pools: map[int]*fenced{
		// A client that would wait for a connection fails soon instead (a script the generator got wrong).
		1: newPooledFenced(t, 1, "  max_client_wait: 2s\n"),
		2: spfPool(t, 2, "  max_client_wait: 2s\n"),
	}}
	w.ctas = fxName(t, "ctas")
	defer direct(t).Exec(context.Background(), fmt.Sprintf("DROP TABLE IF EXISTS %[1]s_c1, %[1]s_c2, %[1]s_c3", w.ctas))
	start := time.Now()
	diffs, ran := 0, 0
	for i := 0; i < n; i++ {
		if only >= 0 && i != only {
			continue
		}
		if time.Since(start) > budget {
			t.Logf("time budget reached after %d scripts", ran)
			break
		}
		ran++
		r := rand.New(rand.NewSource(seed*100003 + int64(i)))
		poolSize := 1
		if i%3 == 2 {
			poolSize = 2
		}
		clients := 2 + r.Intn(2)
		script, d := w.generate(r, clients, poolSize, steps)
		pins := w.pins()
		p, _ := w.run(script, clients, poolSize, true)
		if trace {
			for k, s := range script {
				t.Logf("script %d step %d %c: %s\n  direct %s\n  pooled %s", i, k, 'A'+s.client, s.sql(), d[k], p[k])
			}
		}
		if got := w.pins() - pins; got != 0 {
			t.Errorf("seed %d script %d: %v clients pinned\n%s", seed, i, got, spfFormat(script))
		}
		at := firstDiff(d, p)
		if at < 0 {
			continue
		}
		diffs++
		s := script[at]
		t.Errorf("DIFF seed %d script %d (pool %d, %d clients) step %d, client %c: %s\n  pooled %s\n  direct %s",
			seed, i, poolSize, clients, at, 'A'+s.client, s.sql(), p[at], d[at])
		if diffs > reduceN {
			continue
		}
		min, mat := w.reduce(script, at, clients, poolSize)
		md, _ := w.run(min, clients, poolSize, false)
		mp, _ := w.run(min, clients, poolSize, true)
		if firstDiff(md, mp) != mat {
			t.Logf("  (the reduced script does not differ again: it depends on what earlier scripts left)")
		}
		var b strings.Builder
		for k := range min {
			fmt.Fprintf(&b, "    direct %s\n    pooled %s\n", md[k], mp[k])
		}
		t.Logf("  reduced (difference at step %d):\n%s  outcomes:\n%s", mat, spfFormat(min), b.String())
	}
	t.Logf("ran %d scripts of %d steps in %v, %d differing", ran, steps, time.Since(start).Round(time.Millisecond), diffs)
}
