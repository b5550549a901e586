package proxy_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/schema"
)

// An adversarial review of transaction pooling where the transaction that carries the client's token (set
// transaction-locally at the start of each lend) ends or changes before the client's writes do: COMMIT, END,
// ROLLBACK, ABORT (with and without AND CHAIN) among a Query's statements or a batch's, procedures that commit or
// roll back, functions and procedures with a SET clause of the token (and FROM CURRENT), cursors (WITH HOLD, and
// portals suspended across SETs of the token), triggers, deferred constraint triggers and rules on tables the proxy
// does not protect that write a protected one, and two-phase commit. The judge is a direct connection to a
// database where the guard (fenceproxy install) protects the table, as in the fenced oracle (fmEnv), whose noise
// client uses the pool's one server connection with its own much higher token between every two of the subject's
// transactions. Each case either answers and commits exactly as directly, or is one of the listed differences
// where the pool fails closed (docs/pooling.md): a write after the boundary meets the pool's placeholder and is
// refused 55F03, and what the pool committed is a part of what the direct side committed. No write ever lands
// with a token the client does not hold.

// r53Objects are the server-side objects the cases call, made in both databases.
const r53Objects = `
CREATE PROCEDURE pc(a int, b int) LANGUAGE plpgsql AS $$ BEGIN UPDATE ft SET v = v + 1 WHERE id = a; COMMIT; UPDATE ft SET v = v + 1 WHERE id = b; END $$;
CREATE PROCEDURE prb(a int) LANGUAGE plpgsql AS $$ BEGIN ROLLBACK; UPDATE ft SET v = v + 1 WHERE id = a; END $$;
CREATE PROCEDURE pset(a int) SET fence.token = '999' LANGUAGE plpgsql AS $$ BEGIN UPDATE ft SET v = v + 1 WHERE id = a; END $$;
CREATE FUNCTION fset(a int) RETURNS int SET fence.token = '999' LANGUAGE plpgsql AS $$ BEGIN UPDATE ft SET v = v + 1 WHERE id = a; RETURN a; END $$;
CREATE FUNCTION fw(a int) RETURNS int LANGUAGE plpgsql AS $$ BEGIN UPDATE ft SET v = v + 1 WHERE id = a; RETURN a; END $$;
CREATE TABLE u (id int);
CREATE FUNCTION tu() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN UPDATE ft SET v = v + 1 WHERE id = NEW.id; RETURN NEW; END $$;
CREATE TRIGGER tu AFTER INSERT ON u FOR EACH ROW EXECUTE FUNCTION tu();
CREATE TABLE ud (id int);
CREATE CONSTRAINT TRIGGER tud AFTER INSERT ON ud DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tu();
CREATE TABLE ur (id int);
CREATE RULE rr AS ON INSERT TO ur DO ALSO UPDATE ft SET v = v + 1 WHERE id = NEW.id;
`

// r53Env is a fmEnv on cluster c, with r53Objects in both databases.
func r53Env(t *testing.T, c *pgtest.Cluster) *fmEnv {
	e := &fmEnv{t: t, cluster: c}
	mk := func(prefix string) (string, *pgx.Conn) {
		db := fxName(t, prefix)
		c.Exec("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)")
		if err := c.Exec("CREATE DATABASE " + db); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Exec("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)") })
		su := connect(t, c.DSN(pgtest.SuperUser, "", db))
		fxExec(t, su, "CREATE TABLE ft (id int PRIMARY KEY, v int NOT NULL DEFAULT 0, fence_token bigint)")
		cfg, err := config.Parse("t.yaml", []byte("upstream:\n  address: a:1\n"+fmTables))
		if err != nil {
			t.Fatal(err)
		}
		if err := schema.Install(ctxT(t), su, schema.FromConfig(cfg)); err != nil {
			t.Fatalf("fenceproxy install: %v", err)
		}
		fxExec(t, su, r53Objects)
		return db, su
	}
	e.dbD, e.suD = mk("r5d")
	e.dbP, e.suP = mk("r5p")
	fxExec(t, e.suP, "BEGIN; SET LOCAL fence.token = "+fmNoiseToken+"; INSERT INTO ft VALUES (900, 0), (901, 0), (902, 0); COMMIT")
	e.p = proxytest.Start(t, c.Addr(), proxytest.Options{YAML: fmTables + "pool:\n  mode: transaction\n  size: 1\n  max_client_wait: 1s\nauth:\n  type: trust\n"})
	e.w = &woRunner{t: t, short: fmShort}
	e.w.noiseFn = e.noise
	e.connectNoise()
	t.Cleanup(func() { e.w.noise.Close(context.Background()) })
	return e
}

// r53Case is one script of the subject's (opts: its startup options) and what the pool must do: answer and
// commit as directly (same), or refuse with the placeholder where directly a write after the boundary runs
// (closed: docs/pooling.md's known differences), committing a part of what directly commits.
type r53Case struct {
	name, opts string
	seq        []woMsg
	closed     bool
}

func r53Q(qs ...string) []woMsg {
	var out []woMsg
	for _, q := range qs {
		out = append(out, woQ(q))
	}
	return out
}

// r53Batch is one extended-protocol batch of the statements, each parsed, bound and executed unnamed.
func r53Batch(qs ...string) []woMsg {
	var out []woMsg
	for _, q := range qs {
		out = append(out, woP("", q), woB("", ""), woE("", 0))
	}
	return append(out, woS)
}

func r53Cat(xs ...[]woMsg) []woMsg {
	var out []woMsg
	for _, x := range xs {
		out = append(out, x...)
	}
	return out
}

func r53Upd(id string) string { return "UPDATE ft SET v = v + 1 WHERE id = " + id }

// r53Rows reads the committed rows a stream ends with (fmEnv.rows) as id -> "v:token".
func r53Rows(stream []string) map[string]string {
	s := strings.TrimSuffix(strings.TrimPrefix(stream[len(stream)-1], "ROWS["), "]")
	m := map[string]string{}
	for _, r := range strings.Fields(s) {
		id, rest, _ := strings.Cut(r, ":")
		m[id] = rest
	}
	return m
}

func r53Run(t *testing.T, e *fmEnv, cases []r53Case, after func()) {
	initial := map[string]string{}
	for _, r := range fmInitial {
		initial[r[0]] = "0:" + r[1]
	}
	for i, c := range cases {
		d, p := e.both(c.seq, c.opts, int64(i))
		if after != nil {
			after()
		}
		if !c.closed {
			if !woEqual(d, p) {
				t.Errorf("%s: the pool differs from a direct connection (%s)\n  direct: %v\n  pooled: %v", c.name, fmSig(d, p), d, p)
			}
			continue
		}
		placeholder := false
		for _, s := range p {
			placeholder = placeholder || strings.HasPrefix(s, "E:55F03(") && strings.Contains(s, "fenceproxy:pooled")
		}
		if !placeholder {
			t.Errorf("%s: no write refused for the placeholder\n  direct: %v\n  pooled: %v", c.name, d, p)
		}
		rd, rp := r53Rows(d), r53Rows(p)
		for id, v := range rp {
			if v != rd[id] && v != initial[id] {
				t.Errorf("%s: row %s committed through the pool as %s, directly %s (from %s)\n  direct: %v\n  pooled: %v", c.name, id, v, rd[id], initial[id], d, p)
			}
		}
	}
}

// Transaction boundaries inside a Query or batch, procedures, function SET clauses, cursors, triggers and rules:
// held (same as directly, or closed) on main when written; kept as regression cases.
func TestPooledTransactionBoundariesReview(t *testing.T) {
	pgtest.Require(t, pg)
	e := r53Env(t, pg)
	const tok5 = "-c fence.token=5"
	r53Run(t, e, []r53Case{
		// END and ABORT end the transaction that had the token as COMMIT and ROLLBACK do (K1).
		{"END among a Query's statements", tok5, r53Q(r53Upd("1") + "; END; " + r53Upd("2")), true},
		{"ABORT among a Query's statements", tok5, r53Q("BEGIN; " + r53Upd("1") + "; ABORT; " + r53Upd("2")), true},
		{"ROLLBACK AND CHAIN after a SET, then a write", tok5, r53Q("BEGIN; SET fence.token = 6; ROLLBACK AND CHAIN; " + r53Upd("2") + "; COMMIT"), true},
		{"a batch's COMMIT after a SET, then a write", "", r53Batch("SET fence.token = 6", "COMMIT", r53Upd("2")), true},
		// Chains that end a Query, spelled with comments and noise words: the chained transaction has the
		// client's token (chainTokens), never the placeholder.
		{"END AND CHAIN, ABORT AND CHAIN by Queries", tok5, r53Q("BEGIN", r53Upd("1"), "END AND CHAIN", r53Upd("2"), "ABORT AND CHAIN", r53Upd("4"), "COMMIT"), false},
		{"COMMIT AND/**/CHAIN", tok5, r53Q("BEGIN", "COMMIT AND/**/CHAIN", r53Upd("2"), "COMMIT"), false},
		{"COMMIT AND -- comment, CHAIN", tok5, r53Q("BEGIN", "COMMIT AND -- x\nCHAIN", r53Upd("2"), "COMMIT"), false},
		{"commit work and chain ;;", tok5, r53Q("BEGIN", "commit work and chain ;;", r53Upd("2"), "COMMIT"), false},
		{"COMMIT AND CHAIN of a failed block, after a SET", tok5, r53Q("BEGIN", "SET fence.token = 6", "SELECT 1/0", "COMMIT AND CHAIN", r53Upd("2"), "COMMIT", "SHOW fence.token"), false},
		{"ROLLBACK AND CHAIN of a failed block, after a RESET", tok5, r53Q("SET fence.token = 7", "BEGIN", "RESET fence.token", "SELECT 1/0", "ROLLBACK AND CHAIN", r53Upd("2"), "COMMIT", "SHOW fence.token"), false},
		{"an error before the chain in its Query", tok5, r53Q("BEGIN", "SELECT 1/0; COMMIT AND CHAIN", "ROLLBACK", r53Upd("2"), "SHOW fence.token"), false},
		{"a batch's chain after a SET", "", r53Cat(r53Batch("BEGIN", "SET fence.token = 6", "COMMIT AND CHAIN"), r53Batch(r53Upd("2"), "COMMIT", "SHOW fence.token")), false},
		// Procedures that commit or roll back: the writes after their COMMIT meet the placeholder, by the
		// extended protocol and, since 2026-12-05, alone in a Query (TestPooledProcedureCommitsAlone); in a block
		// they cannot commit (2D000), as directly.
		{"CALL of a committing procedure, extended", tok5, r53Batch("CALL pc(1, 2)"), true},
		{"SET, then CALL of a committing procedure", "", r53Cat(r53Batch("SET fence.token = 6", "CALL pc(1, 2)"), r53Batch("SHOW fence.token")), true},
		{"SET, then a procedure's ROLLBACK undoes it", tok5, r53Cat(r53Batch("SET fence.token = 6", "CALL prb(2)"), r53Batch("SHOW fence.token", r53Upd("4"))), true},
		{"RESET, then a procedure's ROLLBACK undoes it", tok5, r53Cat(r53Q("SET fence.token = 7"), r53Batch("RESET fence.token", "CALL prb(2)"), r53Batch("SHOW fence.token", r53Upd("4"))), true},
		{"CALL in a block", tok5, r53Q("BEGIN; CALL pc(1, 2); COMMIT"), false},
		// A token given by a function's or procedure's SET clause, or captured FROM CURRENT: as directly.
		{"a function's SET clause", tok5, r53Q("SELECT fset(3)", "SHOW fence.token"), false},
		{"a procedure's SET clause", tok5, r53Q("CALL pset(3)", "SHOW fence.token"), false},
		{"SET FROM CURRENT", tok5, r53Q("ALTER FUNCTION fw(int) SET fence.token FROM CURRENT", "SET fence.token = 3", "SELECT fw(2)", "ALTER FUNCTION fw(int) RESET ALL"), false},
		// Cursors and suspended portals run their query with the token in force at each FETCH or Execute.
		{"a cursor fetched after SET and SET LOCAL", tok5, r53Q("BEGIN", "DECLARE c CURSOR FOR SELECT fw(i) FROM generate_series(1, 2) i", "SET fence.token = 9", "FETCH 1 FROM c", "SET LOCAL fence.token = 1", "FETCH 1 FROM c", "COMMIT"), false},
		{"a WITH HOLD cursor, rest run at its COMMIT", tok5, r53Q("BEGIN; DECLARE c CURSOR WITH HOLD FOR SELECT fw(i) FROM generate_series(1, 3) i; FETCH 1 FROM c; SET LOCAL fence.token = 9; COMMIT", "FETCH ALL FROM c", "CLOSE c"), false},
		{"a portal suspended across SETs", tok5, []woMsg{woQ("BEGIN"), woP("s1", "SELECT fw(i) FROM generate_series(1, 3) i"), woB("p1", "s1"), woE("p1", 1), woS, woQ("SET fence.token = 9"), woE("p1", 1), woS, woQ("SET LOCAL fence.token = 1"), woE("p1", 1), woS, woQ("COMMIT")}, false},
		// Triggers, deferred constraint triggers and rules on unprotected tables: the guard, with the client's token.
		{"a trigger", tok5, r53Q("INSERT INTO u VALUES (1)", "INSERT INTO u VALUES (3)"), false},
		{"a trigger, no token", "", r53Q("INSERT INTO u VALUES (1)"), false},
		{"a deferred trigger", tok5, r53Q("INSERT INTO ud VALUES (1)", "BEGIN; INSERT INTO ud VALUES (2); SET LOCAL fence.token = 9; COMMIT", "INSERT INTO ud VALUES (3)"), false},
		{"a deferred trigger across a chain", tok5, r53Q("BEGIN", "INSERT INTO ud VALUES (2)", "SET fence.token = 9", "COMMIT AND CHAIN", "INSERT INTO ud VALUES (4)", "COMMIT"), false},
		{"a deferred trigger, extended", "", r53Batch("SET fence.token = 6", "INSERT INTO ud VALUES (2)"), false},
		{"a rule", tok5, r53Q("INSERT INTO ur VALUES (1)", "INSERT INTO ur VALUES (3)"), false},
	}, nil)

	// Several batches and Queries in one write, chains among them: each unit is answered before the next goes,
	// so the chained transaction gets the client's values before the statements behind it run.
	for _, c := range []struct {
		name, opts string
		seq        []woMsg
	}{
		{"chains, batches in one write", "options=-c%20fence.token%3D5", r53Cat(r53Batch("BEGIN"), r53Batch(r53Upd("1")), r53Batch("COMMIT AND CHAIN"), r53Batch(r53Upd("2")), r53Batch("COMMIT"), r53Batch("SHOW fence.token"))},
		{"a SET, chains, batches and Queries in one write", "", r53Cat(r53Batch("BEGIN", "SET fence.token = 6"), r53Batch("COMMIT AND CHAIN"), r53Q(r53Upd("2")), r53Batch("ROLLBACK AND CHAIN"), r53Q(r53Upd("4"), "COMMIT", "SHOW fence.token"))},
		{"SET LOCAL, ROLLBACK AND CHAIN in one write", "options=-c%20fence.token%3D5", r53Cat(r53Batch("BEGIN", "SET LOCAL fence.token = 9"), r53Batch(r53Upd("3")), r53Batch("ROLLBACK AND CHAIN"), r53Batch(r53Upd("4")), r53Batch("COMMIT"), r53Batch("SHOW fence.token"))},
	} {
		e.reset(e.suD)
		d := append(woPipelined(t, pg.DSN(pgtest.SuperUser, "", e.dbD)+"&"+c.opts, c.seq), e.rows(e.suD))
		e.reset(e.suP)
		p := append(woPipelined(t, e.p.DSN(pgtest.SuperUser, "", e.dbP)+"&"+c.opts, c.seq), e.rows(e.suP))
		if !woEqual(d, p) {
			t.Errorf("%s: the pool differs from a direct connection\n  direct: %v\n  pooled: %v", c.name, d, p)
		}
	}
}

// Two-phase commit through the pool (a cluster with max_prepared_transactions): a prepared transaction keeps the
// client's fenced writes and is committed or rolled back by a later transaction, the session token a SET in it
// gave stays (PostgreSQL keeps it, as at COMMIT), and a deferred trigger fires at PREPARE with the client's
// token. A PREPARE TRANSACTION alone in a Query outside a block warns and prepares nothing directly; until
// 2026-12-05 the pool's token statement in front made the Query an implicit block, which PREPARE TRANSACTION
// then prepared: a prepared transaction of the proxy's under the client's name, holding an xid (and so the
// server's xmin horizon) until someone ended it, where the client was told a ROLLBACK would have happened.
func TestPooledPrepareTransaction(t *testing.T) {
	c := pgtest.MustStart(t, pgtest.Options{ExtraConf: map[string]string{"max_prepared_transactions": "4"}})
	e := r53Env(t, c)
	const tok5 = "-c fence.token=5"
	const px = "SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'x'"
	r53Run(t, e, []r53Case{
		{"PREPARE TRANSACTION alone", tok5, r53Q("PREPARE TRANSACTION 'x'", px, "ROLLBACK PREPARED 'x'"), false},
		{"prepare transaction alone, lower case, a comment", tok5, r53Q("prepare /* c */ transaction 'x';", px, "ROLLBACK PREPARED 'x'"), false},
		{"PREPARE TRANSACTION alone, extended", tok5, r53Cat(r53Batch("PREPARE TRANSACTION 'x'"), r53Q(px, "ROLLBACK PREPARED 'x'")), false},
		{"a write, then PREPARE TRANSACTION", tok5, r53Q(r53Upd("1")+"; PREPARE TRANSACTION 'x'", px, "COMMIT PREPARED 'x'"), false},
		{"a block prepared, committed later", tok5, r53Q("BEGIN; "+r53Upd("1")+"; PREPARE TRANSACTION 'x'", px, "COMMIT PREPARED 'x'"), false},
		{"a SET in a prepared block", "", r53Q("BEGIN; SET fence.token = 6; "+r53Upd("2")+"; PREPARE TRANSACTION 'x'", "SHOW fence.token", r53Upd("4"), "ROLLBACK PREPARED 'x'", "SHOW fence.token"), false},
		{"a RESET in a prepared block", tok5, r53Q("SET fence.token = 7", "BEGIN; RESET fence.token; PREPARE TRANSACTION 'x'", "SHOW fence.token", r53Upd("2"), "COMMIT PREPARED 'x'", "SHOW fence.token"), false},
		{"a block of Queries prepared", tok5, r53Q("BEGIN", "SET LOCAL fence.token = 6", r53Upd("2"), "PREPARE TRANSACTION 'x'", "SHOW fence.token", r53Upd("4"), "COMMIT PREPARED 'x'"), false},
		{"an extended block prepared", tok5, r53Cat(r53Batch("BEGIN"), r53Batch(r53Upd("1")), r53Batch("PREPARE TRANSACTION 'x'"), r53Batch("COMMIT PREPARED 'x'")), false},
		{"a deferred trigger at PREPARE", tok5, r53Q("BEGIN; INSERT INTO ud VALUES (1); PREPARE TRANSACTION 'x'", "COMMIT PREPARED 'x'"), false},
		// Statements after the PREPARE TRANSACTION in the same Query or batch run in a transaction of their own
		// without the token statement, as after a COMMIT (K1).
		{"a write after PREPARE TRANSACTION in the Query", tok5, r53Q("BEGIN; "+r53Upd("1")+"; PREPARE TRANSACTION 'x'; "+r53Upd("2"), "COMMIT PREPARED 'x'"), true},
		{"a write after PREPARE TRANSACTION in the batch", "", r53Cat(r53Batch("BEGIN", "SET fence.token = 6", r53Upd("2"), "PREPARE TRANSACTION 'x'", r53Upd("4")), r53Batch("SHOW fence.token"), r53Q("ROLLBACK PREPARED 'x'")), true},
	}, func() {
		// A case that failed may leave its prepared transaction, which would hold the rows the next resets.
		for _, su := range []*pgx.Conn{e.suD, e.suP} {
			su.Exec(context.Background(), "ROLLBACK PREPARED 'x'")
		}
	})
}
