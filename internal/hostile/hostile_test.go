package hostile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/catalog"
	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
	"github.com/fenceproxy/fenceproxy/rewrite"
	fpschema "github.com/fenceproxy/fenceproxy/schema"
	"github.com/fenceproxy/fenceproxy/tokens"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) { os.Exit(pgtest.RunMain(m, pgtest.Options{}, &pg)) }

// Tokens of the corpus.
const (
	freshToken  = 1000 // newer than every row of the template
	staleToken  = 20   // older than every row's token but the NULL one
	verifyShift = 10000
	corpusDB    = "hostile_corpus"
)

// resetSQL puts the corpus database back into its initial state before each case: every schema a case could
// have changed is dropped with what it holds, the database's own settings and large objects are removed, and the
// schema is created again. (A database copied from a template per case would be cleaner and is ten times slower.)
const resetSQL = `
DO $$DECLARE s text; BEGIN
	FOR s IN SELECT nspname FROM pg_catalog.pg_namespace WHERE nspname NOT LIKE 'pg\_%' AND nspname <> 'information_schema' LOOP
		EXECUTE pg_catalog.format('DROP SCHEMA %I CASCADE', s);
	END LOOP;
END$$;
SELECT pg_catalog.lo_unlink(oid) FROM pg_catalog.pg_largeobject_metadata;
ALTER DATABASE ` + corpusDB + ` RESET ALL;
CREATE SCHEMA public;
` + schema

// schema is the template database's content: the protected tables, related objects and their rows.
const schema = `
CREATE TABLE parents (id int PRIMARY KEY, name text NOT NULL DEFAULT '');
INSERT INTO parents VALUES (1, 'p1'), (2, 'p2'), (3, 'p3');
CREATE TABLE accounts (
	id int PRIMARY KEY,
	balance int NOT NULL DEFAULT 0,
	note text NOT NULL DEFAULT '',
	parent_id int REFERENCES parents (id) ON DELETE CASCADE ON UPDATE CASCADE,
	fence_token bigint);
INSERT INTO accounts VALUES (1, 100, 'a', 1, 50), (2, 200, 'b', 1, 100), (3, 300, 'c', 2, NULL), (4, 400, 'd', 2, 70);
CREATE TABLE ledger (id int, region int, amount int NOT NULL DEFAULT 0, fence_token bigint, PRIMARY KEY (id, region))
	PARTITION BY LIST (region);
CREATE TABLE ledger_eu PARTITION OF ledger FOR VALUES IN (1);
CREATE TABLE ledger_us PARTITION OF ledger FOR VALUES IN (2);
INSERT INTO ledger VALUES (11, 1, 10, 50), (12, 2, 20, 100), (13, 1, 30, NULL);
CREATE TABLE accounts_old (archived boolean NOT NULL DEFAULT true) INHERITS (accounts);
INSERT INTO accounts_old (id, balance, note, fence_token) VALUES (5, 500, 'e', 60);
CREATE VIEW accounts_v AS SELECT id, balance FROM accounts;
CREATE TABLE other (id int PRIMARY KEY, v int NOT NULL DEFAULT 0);
INSERT INTO other VALUES (1, 1), (2, 2);
CREATE SCHEMA evil;
`

// resetDefaultsSQL removes every role and database default (ALTER ROLE/DATABASE ... SET) in the cluster: the
// harness's cluster has none of its own.
const resetDefaultsSQL = `
DO $$DECLARE r record; BEGIN
	FOR r IN SELECT s.setrole, s.setdatabase, ro.rolname, d.datname FROM pg_catalog.pg_db_role_setting s
		LEFT JOIN pg_catalog.pg_roles ro ON ro.oid = s.setrole LEFT JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase LOOP
		IF r.setrole = 0 AND r.setdatabase = 0 THEN
			EXECUTE 'ALTER ROLE ALL RESET ALL';
		ELSIF r.setrole = 0 THEN
			EXECUTE pg_catalog.format('ALTER DATABASE %I RESET ALL', r.datname);
		ELSIF r.setdatabase = 0 THEN
			EXECUTE pg_catalog.format('ALTER ROLE %I RESET ALL', r.rolname);
		ELSE
			EXECUTE pg_catalog.format('ALTER ROLE %I IN DATABASE %I RESET ALL', r.rolname, r.datname);
		END IF;
	END LOOP;
END$$`

// proxyTables is the tables: block every proxy variant has.
const proxyTables = `tables:
  - name: accounts
    token_column: fence_token
  - name: ledger
    token_column: fence_token
`

// repoRoot is the repository's root directory.
func repoRoot(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// harness holds what the cases share: the proxy variants (started on first use) and a maintenance connection.
type harness struct {
	t       *testing.T
	maint   *pgx.Conn // to the maintenance database
	direct  *pgx.Conn // to the corpus database
	proxies map[string]*variant
	etcd    *etcdtest.Etcd
}

// variant is a running proxy of one config line, and, for catalog=on, its catalog reader.
type variant struct {
	*proxytest.Proxy
	catalog *catalog.Source         // nil without catalog=on
	ceiling *fpschema.CeilingKeeper // verify=on: the verifier keeps the token ceiling, as fenceproxy serve's does
}

// catalogYAML is the catalog section of the catalog=on variant: the reader connects to the corpus database as
// the superuser. The refresh interval never elapses during a run: the harness reads the catalog itself before
// each case (readCatalog), as the proxy's watcher does at start and on every refresh.
const catalogYAML = "catalog:\n  dsn: user=" + pgtest.SuperUser + " dbname=" + corpusDB + "\n  refresh: 1h\n"

func (h *harness) proxy(t *testing.T, config []string) *variant {
	key := strings.Join(config, ",")
	if p, ok := h.proxies[key]; ok {
		return p
	}
	yaml := proxyTables
	var token []string
	var verifier proxytest.Options
	var ceiling *fpschema.CeilingKeeper
	withCatalog := false
	for _, kv := range config {
		switch kv {
		case "catalog=on":
			withCatalog = true
			yaml += catalogYAML
		case "guard=on":
			// Not a proxy setting: run installs the guard into the case's database (installGuard).
		case "scope=transaction":
			token = append(token, "  scope: transaction")
		case "pool=transaction":
			// A transaction pool of one server connection, which every client of the case shares: the probes run
			// on it too, after the case's session has ended.
			yaml += "pool:\n  mode: transaction\n  size: 1\nauth:\n  type: trust\n"
		case "writes=refuse":
			yaml = strings.ReplaceAll(yaml, "    token_column: fence_token\n", "    token_column: fence_token\n    token_column_writes: refuse\n")
		case "verify=on":
			if h.etcd == nil {
				h.etcd = etcdtest.Start(h.t)
			}
			v, err := tokens.NewRevisionVerifier(tokens.VerifierConfig{Endpoints: h.etcd.Endpoints(), TokenOffset: verifyShift, Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			h.t.Cleanup(func() { v.Close() })
			// As fenceproxy serve does with a catalog section: the verifier keeps fenceproxy.token_ceiling over
			// the proxy's own connection (here the superuser's), for the guard (guard=on) to read.
			ceiling = fpschema.NewCeilingKeeper(v, "etcd", func(ctx context.Context) (*pgx.Conn, error) {
				return pgx.Connect(ctx, pg.DSN(pgtest.SuperUser, "", corpusDB))
			})
			h.t.Cleanup(ceiling.Close)
			verifier.Verifier = ceiling
			token = append(token, fmt.Sprintf("  offset: %d", verifyShift),
				"  verify:", "    etcd:", "      endpoints: ["+strings.Join(h.etcd.Endpoints(), ", ")+"]")
		}
	}
	if len(token) > 0 {
		yaml += "token:\n" + strings.Join(token, "\n") + "\n"
	}
	verifier.YAML = yaml
	p := &variant{Proxy: proxytest.Start(h.t, pg.Addr(), verifier), ceiling: ceiling}
	if withCatalog {
		cc, err := catalog.ConnConfig(p.Config)
		if err != nil {
			t.Fatal(err)
		}
		p.catalog = catalog.NewSource(cc, nil)
		h.t.Cleanup(p.catalog.Close)
	}
	h.proxies[key] = p
	return p
}

// readCatalog gives a catalog=on proxy a planner built from a catalog snapshot of the case's database as it is
// now, exactly as fenceproxy serve builds one at start (proxy.NewPlannerWithCatalog): the database was just
// rebuilt, so every OID differs from the previous case's.
func (h *harness) readCatalog(t *testing.T, p *variant) {
	ctx := ctxFor(t, 30*time.Second)
	snap, err := p.catalog.Snapshot(ctx, proxy.ConfiguredTables(p.Config))
	if err != nil {
		t.Fatalf("catalog snapshot: %v", err)
	}
	if len(snap.Unresolved) > 0 {
		t.Fatalf("catalog snapshot: protected tables not in the catalog: %v", snap.Unresolved)
	}
	planner, err := proxy.NewPlannerWithCatalog(p.Config, snap, nil)
	if err != nil {
		t.Fatalf("planner from the catalog snapshot: %v", err)
	}
	p.Server.SetPlanner(planner)
}

// installGuard puts the fenceproxy schema and the in-database guard into the case's database for the proxy's
// protected tables, exactly as fenceproxy install does (schema.FromConfig, schema.Install; no DDL guard, which
// install adds only with --ddl-guard).
func (h *harness) installGuard(t *testing.T, p *variant) {
	ctx := ctxFor(t, time.Minute)
	if err := fpschema.Install(ctx, h.direct, fpschema.FromConfig(p.Config)); err != nil {
		t.Fatalf("fenceproxy install: %v", err)
	}
}

// TestHostileCorpus runs every case of testdata/hostile (see the package documentation).
func TestHostileCorpus(t *testing.T) {
	pgtest.Require(t, pg)
	cases, err := parseCorpus(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, time.Minute)
	maint, err := pgx.Connect(ctx, pg.DSN(pgtest.SuperUser, "", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { maint.Close(context.Background()) })
	mustExec(t, maint, "DROP DATABASE IF EXISTS "+corpusDB+" WITH (FORCE)")
	mustExec(t, maint, "CREATE DATABASE "+corpusDB)
	t.Cleanup(func() { maint.Exec(context.Background(), "DROP DATABASE IF EXISTS "+corpusDB+" WITH (FORCE)") })
	direct, err := pgx.Connect(ctx, pg.DSN(pgtest.SuperUser, "", corpusDB))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close(context.Background()) })

	h := &harness{t: t, maint: maint, direct: direct, proxies: map[string]*variant{}}
	var held, holes, closed, failed int
	classes := map[string]int{}
	var runs []*hcase
	for _, c := range cases {
		runs = append(runs, c.runs()...)
	}
	for _, c := range runs {
		for _, proto := range c.protocols {
			name := c.name
			if len(c.protocols) > 1 {
				name += "/" + proto
			}
			classes[c.class]++
			ok := t.Run(name, func(t *testing.T) {
				problems, outcome := h.run(t, c, proto)
				v, msg := judge(c, problems, outcome)
				switch v {
				case knownHole:
					holes++
					t.Log(msg)
				case staleMark:
					closed++
					t.Error(msg)
				case violated:
					t.Error(msg)
				default:
					held++
				}
			})
			if !ok {
				failed++
			}
		}
	}
	t.Logf("hostile corpus: %d case runs held, %d failed, %d known holes, %d marked holes that hold now; by class %v",
		held, failed, holes, closed, classes)
}

// verdict is what a case run means for the corpus.
type verdict int

const (
	held      verdict = iota // no problem, no mark
	violated                 // problems, no mark: the run fails
	knownHole                // problems, marked expect-hole: logged
	staleMark                // no problem, but marked expect-hole: the run fails, so that marks cannot go stale
)

// judge decides a case run's verdict from its problems, with the message to log or fail with.
func judge(c *hcase, problems []string, outcome string) (verdict, string) {
	switch {
	case c.hole != "" && len(problems) > 0:
		return knownHole, fmt.Sprintf("KNOWN HOLE (closed by branch %s) %s: %s", c.hole, c.where(), strings.Join(problems, "; "))
	case c.hole != "":
		// A mark on a case that holds hides a weak test (nothing fails if the case breaks again).
		return staleMark, fmt.Sprintf("expect-hole %s case %s holds now (%s): remove its expect-hole line, keeping its expect line",
			c.hole, c.where(), outcome)
	case len(problems) > 0:
		return violated, fmt.Sprintf("%s: %s (%s)", c.where(), strings.Join(problems, "; "), outcome)
	}
	return held, ""
}

// run runs one case and returns what went wrong (violations of the invariant and unmet expectations) and a
// summary of what happened.
func (h *harness) run(t *testing.T, c *hcase, proto string) (problems []string, outcome string) {
	ctx := ctxFor(t, 90*time.Second)
	db, direct := corpusDB, h.direct
	// Cluster-wide leftovers of the previous case (defaults for roles, the server's configuration), then the
	// database.
	for _, q := range []string{resetDefaultsSQL, resetSQL} {
		mustExec(t, direct, q)
	}
	h.resetSystem(t)
	p := h.proxy(t, c.config)
	// The guard is installed before the case's direct SQL, as an operator installs it before anyone creates
	// hostile functions, triggers or rules; the catalog is read after it, as a refresh would see it.
	if slices.Contains(c.config, "guard=on") {
		h.installGuard(t, p)
		if p.ceiling != nil {
			// The schema is new: the proxy writes the ceiling again, as fenceproxy serve does at start and on
			// SIGHUP.
			if err := p.ceiling.Sync(ctx); err != nil {
				t.Fatalf("token ceiling: %v", err)
			}
		}
	}
	for _, q := range c.direct {
		mustExec(t, direct, q)
	}
	if p.catalog != nil {
		h.readCatalog(t, p)
	}
	verify := slices.Contains(c.config, "verify=on")

	before, err := snapshot(ctx, direct)
	if err != nil {
		t.Fatalf("snapshot before: %v", err)
	}

	// The session's token as the invariant sees it: 0 when the session holds no valid (verified) token.
	k := h.tokenValue(t, c.token, verify)
	var errs []error
	session, err := h.session(ctx, p, db, c, k)
	if err != nil {
		errs = append(errs, err)
		k = 0
	} else {
		defer session.Close(context.Background())
		for _, q := range c.setup {
			if err := execSimple(ctx, session, q); err != nil {
				t.Fatalf("setup %s: %v", q, err)
			}
		}
		if c.tokenVia == "set" && c.token != "none" {
			if err := execSimple(ctx, session, "SET fence.token = '"+h.tokenText(c.token)+"'"); err != nil {
				errs = append(errs, err)
				k = 0
			}
		}
		sql := c.sql
		if c.escapes {
			if sql, err = decodeEscapes(sql); err != nil {
				t.Fatal(err)
			}
		}
		if proto == "extended" {
			errs = append(errs, execExtended(ctx, session, sql))
		} else {
			errs = append(errs, execSimple(ctx, session, sql))
		}
		if slices.Contains(c.config, "pool=transaction") {
			// The pool's one server connection is the session's while it is in a transaction (a failed one
			// included): the session ends, its transaction rolled back, so that the probes get it and run.
			session.Close(context.Background())
		}
	}

	outcome = fmt.Sprintf("token %d, errors %v", k, errs)
	after, err := snapshot(ctx, direct)
	if err != nil {
		return append(problems, fmt.Sprintf("the protected rows cannot be read after the case: %v", err)), outcome
	}
	changed, bad := check(before, after, k)
	outcome += fmt.Sprintf(", %d protected rows changed", changed)
	problems = append(problems, bad...)
	problems = append(problems, expectation(c, errs, before, after, changed)...)

	// Probes: what the case left behind must not let a tokenless or stale writer change anything.
	for _, probe := range []struct {
		token int64
		sql   []string
	}{
		{0, []string{"DELETE FROM accounts WHERE id = 2", "DELETE FROM ledger WHERE id = 12"}},
		{staleToken, []string{
			fmt.Sprintf("BEGIN; SET LOCAL fence.token = %d; DELETE FROM accounts WHERE id = 2; COMMIT", staleToken),
			fmt.Sprintf("BEGIN; SET LOCAL fence.token = %d; UPDATE ledger SET amount = amount + 1 WHERE id = 12; COMMIT", staleToken),
		}},
	} {
		conn, err := pgconn.Connect(ctx, p.DSN(pgtest.SuperUser, "", db))
		if err != nil {
			problems = append(problems, fmt.Sprintf("probe connection: %v", err))
			continue
		}
		for _, q := range probe.sql {
			execSimple(ctx, conn, q)
		}
		conn.Close(context.Background())
		probed, err := snapshot(ctx, direct)
		if err != nil {
			return append(problems, fmt.Sprintf("the protected rows cannot be read after a probe: %v", err)), outcome
		}
		if _, bad := check(after, probed, probe.token); len(bad) > 0 {
			problems = append(problems, fmt.Sprintf("probe with token %d after the case: %s", probe.token, strings.Join(bad, "; ")))
		}
		after = probed
	}
	return problems, outcome
}

// resetSystem undoes ALTER SYSTEM: when postgresql.auto.conf holds settings, it resets them, reloads, and waits
// until new sessions no longer see a token (the reload is asynchronous).
func (h *harness) resetSystem(t *testing.T) {
	ctx := ctxFor(t, 30*time.Second)
	var n int
	if err := h.direct.QueryRow(ctx, "SELECT count(*) FROM pg_catalog.pg_file_settings WHERE sourcefile LIKE '%postgresql.auto.conf'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		return
	}
	mustExec(t, h.direct, "ALTER SYSTEM RESET ALL")
	mustExec(t, h.direct, "SELECT pg_catalog.pg_reload_conf()")
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := pgx.Connect(ctx, pg.DSN(pgtest.SuperUser, "", corpusDB))
		if err != nil {
			t.Fatal(err)
		}
		var v string
		err = c.QueryRow(ctx, "SELECT coalesce(pg_catalog.current_setting('fence.token', true), '')").Scan(&v)
		c.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if v == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a token set by ALTER SYSTEM is still in force after RESET ALL and a reload: %q", v)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tokenText is the literal the harness sets for a token line.
func (h *harness) tokenText(token string) string {
	switch token {
	case "fresh":
		return strconv.Itoa(freshToken)
	case "stale":
		return strconv.Itoa(staleToken)
	}
	return token
}

// tokenValue is the token the invariant holds the session to: 0 for none, invalid, or (with verification)
// not issued. Every etcd in these tests is far below verifyShift, so "issued" means at most verifyShift.
func (h *harness) tokenValue(t *testing.T, token string, verify bool) int64 {
	if token == "none" {
		return 0
	}
	v, ok := rewrite.ValidToken(h.tokenText(token))
	if !ok || verify && v > verifyShift {
		return 0
	}
	return v
}

// session connects through the proxy to db with the case's startup parameters.
func (h *harness) session(ctx context.Context, p *variant, db string, c *hcase, k int64) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(p.DSN(pgtest.SuperUser, "", db))
	if err != nil {
		return nil, err
	}
	if c.encoding != "" {
		cfg.RuntimeParams["client_encoding"] = c.encoding
	}
	if c.scs != "" {
		cfg.RuntimeParams["standard_conforming_strings"] = c.scs
	}
	if c.tokenVia == "options" && c.token != "none" {
		cfg.RuntimeParams["options"] = "-c fence.token=" + h.tokenText(c.token)
	}
	return pgconn.ConnectConfig(ctx, cfg)
}

// execSimple sends one Query message and returns the first error of its statements.
func execSimple(ctx context.Context, c *pgconn.PgConn, sql string) error {
	results, err := c.Exec(ctx, sql).ReadAll()
	if err != nil {
		return err
	}
	for _, r := range results {
		if r.Err != nil {
			return r.Err
		}
	}
	return nil
}

// execExtended runs one statement with Parse/Bind/Describe/Execute/Sync.
func execExtended(ctx context.Context, c *pgconn.PgConn, sql string) error {
	return c.ExecParams(ctx, sql, nil, nil, nil, nil).Read().Err
}

func mustExec(t *testing.T, c *pgx.Conn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// prow is a protected row as read directly: its columns but the token, and the token.
type prow struct {
	data  map[string]json.RawMessage
	token *int64
}

// sameData reports whether two versions of a row agree on every column both have: additive DDL (a new column, a
// dropped or renamed one) is not a write to the row.
func sameData(a, b prow) bool {
	for k, v := range a.data {
		if w, ok := b.data[k]; ok && string(v) != string(w) {
			return false
		}
	}
	return true
}

// snapshot reads every protected row (children and partitions included), keyed by table and id.
func snapshot(ctx context.Context, direct *pgx.Conn) (map[string]prow, error) {
	rows, err := direct.Query(ctx, `
		SELECT 'accounts:' || fenceproxy_row.id, (pg_catalog.to_jsonb(fenceproxy_row) OPERATOR(pg_catalog.-) 'fence_token')::text,
			fenceproxy_row.fence_token::text FROM public.accounts fenceproxy_row
		UNION ALL
		SELECT 'ledger:' || fenceproxy_row.id, (pg_catalog.to_jsonb(fenceproxy_row) OPERATOR(pg_catalog.-) 'fence_token')::text,
			fenceproxy_row.fence_token::text FROM public.ledger fenceproxy_row`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]prow{}
	for rows.Next() {
		var key, data string
		var tok *string
		if err := rows.Scan(&key, &data, &tok); err != nil {
			return nil, err
		}
		r := prow{}
		if err := json.Unmarshal([]byte(data), &r.data); err != nil {
			return nil, fmt.Errorf("row %s: %w", key, err)
		}
		if tok != nil {
			v, err := strconv.ParseInt(*tok, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("row %s holds token %q, not a bigint", key, *tok)
			}
			r.token = &v
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("two protected rows %s", key)
		}
		out[key] = r
	}
	return out, rows.Err()
}

func tokenString(p *int64) string {
	if p == nil {
		return "NULL"
	}
	return strconv.FormatInt(*p, 10)
}

// check applies the invariant to the rows before and after a session with token k (0: none) wrote: it returns
// how many rows changed, appeared or disappeared, and the violations.
func check(before, after map[string]prow, k int64) (int, []string) {
	keys := map[string]bool{}
	for key := range before {
		keys[key] = true
	}
	for key := range after {
		keys[key] = true
	}
	sorted := make([]string, 0, len(keys))
	for key := range keys {
		sorted = append(sorted, key)
	}
	slices.Sort(sorted)
	changed := 0
	var bad []string
	for _, key := range sorted {
		b, inB := before[key]
		a, inA := after[key]
		if inB && inA && sameData(b, a) && tokenString(b.token) == tokenString(a.token) {
			continue
		}
		changed++
		what := "changed"
		switch {
		case !inB:
			what = "appeared"
		case !inA:
			what = "disappeared"
		}
		if k == 0 {
			bad = append(bad, fmt.Sprintf("row %s %s (token %s -> %s) without a valid token", key, what, tokenString(b.token), tokenString(a.token)))
			continue
		}
		if inB && b.token != nil && *b.token > k {
			bad = append(bad, fmt.Sprintf("row %s holding token %d %s by a session with token %d", key, *b.token, what, k))
		}
		if inA && (a.token == nil || *a.token != k) {
			bad = append(bad, fmt.Sprintf("row %s %s and holds token %s, not the session's %d", key, what, tokenString(a.token), k))
		}
	}
	return changed, bad
}

// expectation checks a case's expect line against the errors and the rows.
func expectation(c *hcase, errs []error, before, after map[string]prow, changed int) []string {
	var codes []string
	var first error
	var problems []string
	for _, err := range errs {
		if err == nil {
			continue
		}
		if first == nil {
			first = err
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			codes = append(codes, "non-server error: "+err.Error())
			continue
		}
		codes = append(codes, pe.Code)
		if unreadable(pe) && !c.names(pe) {
			problems = append(problems, fmt.Sprintf("refused because the text cannot be read (%s %s), which tests nothing else: "+
				"fix the SQL, or name the reason (expect: refused %s <a fragment of the message>)", pe.Code, pe.Message, pe.Code))
		}
	}
	switch c.expect {
	case "refused":
		if !slices.ContainsFunc(errs, func(err error) bool {
			var pe *pgconn.PgError
			return errors.As(err, &pe) && pe.Code == c.expectCode && strings.Contains(pe.Message, c.expectText)
		}) {
			problems = append(problems, fmt.Sprintf("want SQLSTATE %s %q, got %v (%v)", c.expectCode, c.expectText, codes, first))
		}
	case "fenced":
		if first != nil {
			problems = append(problems, fmt.Sprintf("want the write fenced and applied, got %v", first))
		} else if changed == 0 {
			problems = append(problems, "want the write applied, but no protected row changed")
		}
	case "untouched":
		if changed > 0 {
			problems = append(problems, fmt.Sprintf("want no protected row changed, %d did (error: %v)", changed, first))
		}
	case "ok":
		if first != nil {
			problems = append(problems, fmt.Sprintf("want no error, got %v", first))
		}
	}
	return problems
}

// unreadable reports whether e refuses a text because it could not be read at all: a syntax error, or the
// proxy's refusal of a text it cannot parse or read (rewrite: "cannot parse ...", "cannot read ...").
func unreadable(e *pgconn.PgError) bool {
	return e.Code == "42601" || e.Code == "55F04" && (strings.Contains(e.Message, "cannot parse") || strings.Contains(e.Message, "cannot read"))
}

// names reports whether c's expect line names e's reason: refused with e's code and a fragment of its message.
func (c *hcase) names(e *pgconn.PgError) bool {
	return c.expect == "refused" && c.expectCode == e.Code && c.expectText != "" && strings.Contains(e.Message, c.expectText)
}
