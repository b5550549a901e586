package schema

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// Name is the schema fenceproxy puts into a database.
const Name = "fenceproxy"

// Trigger names. PostgreSQL fires BEFORE ROW triggers of one event in the order of their names (bytewise), and
// each sees the row the previous one returned: the guard's row trigger is named to sort after every name that
// starts with a letter, a digit or an underscore, so that it sees (and stamps) the final row. A trigger whose
// name sorts after it could still change the token column afterwards; `fenceproxy check` lists triggers on
// protected tables.
const (
	RowTrigger      = "~fenceproxy_guard"
	TruncateTrigger = "~fenceproxy_guard_truncate"
	// StatementStartTrigger and StatementEndTrigger (statement level, BEFORE and AFTER INSERT OR UPDATE OR
	// DELETE) keep the statement's token (statementBody). The start trigger's name sorts before every name
	// that starts with a letter, a digit or an underscore, so that it fires before any other BEFORE STATEMENT
	// trigger can change the setting.
	StatementStartTrigger = "!fenceproxy_statement_start"
	StatementEndTrigger   = "~fenceproxy_statement_end"
)

// The transaction-local settings in which the statement triggers keep the statement's token and lock
// (statementBody). Private to the guard: nothing else sets them.
const (
	statementDepthSetting = "fenceproxy.statement_depth"
	statementTokenSetting = "fenceproxy.statement_token"
	statementLockSetting  = "fenceproxy.statement_lock"
)

// Settings are the names of the session settings the guard reads, and whether it compares tokens with the
// token ceiling.
type Settings struct {
	Token string // token.setting, e.g. fence.token
	Lock  string // token.lock_setting, e.g. fence.lock
	// Ceiling: tokens are verified (token.verify), and the guard refuses a token above the ceiling the proxy
	// keeps in fenceproxy.token_ceiling. Off, the guard reads no ceiling (a read per row costs about 4 us).
	Ceiling bool
}

// guardSpec is what one generated guard function enforces: one configured table (and its partitions and
// children), identified in errors by Label, with its token column.
type guardSpec struct {
	Label       string
	TokenColumn string
	RequireLock bool
}

// functionName is the guard function's name in the schema: a hash of what makes the function differ, so that
// tables configured alike share one function and a changed configuration gets a new one.
func (g guardSpec) functionName() string {
	h := sha256.Sum256([]byte(g.Label + "\x00" + g.TokenColumn + "\x00" + fmt.Sprint(g.RequireLock)))
	return "guard_" + hex.EncodeToString(h[:8])
}

// validTokenSQL is rewrite.ValidToken's rule for the text s, in SQL as in the proxy's rewrite (rewrite/doc.go),
// with every operator, function and collation schema-qualified so that no search_path changes its meaning.
const validTokenSQL = `pg_catalog.ltrim(s, '0123456789') OPERATOR(pg_catalog.=) ''
		AND pg_catalog.ltrim(s, '0') OPERATOR(pg_catalog.<>) ''
		AND (pg_catalog.length(s) OPERATOR(pg_catalog.<) 19
			OR (pg_catalog.length(s) OPERATOR(pg_catalog.=) 19
				AND s COLLATE pg_catalog."C" OPERATOR(pg_catalog.<=) '9223372036854775807'))`

// statementSettingsBlock is the PL/pgSQL that reads the statement's token text into s and its lock name into
// l (statementBody): the values the settings held when the outermost write to a protected relation that is
// running started, or, when no statement trigger has fired (a write through a parent the guard is not on,
// logical replication), the session's settings now.
func statementSettingsBlock(st Settings) string {
	return fmt.Sprintf(`IF pg_catalog.current_setting(%s, true) COLLATE pg_catalog."C" OPERATOR(pg_catalog.>) '0' THEN
		s := pg_catalog.current_setting(%s, true);
		l := pg_catalog.current_setting(%s, true);
	ELSE
		s := pg_catalog.current_setting(%s, true);
		l := pg_catalog.current_setting(%s, true);
	END IF;`, quoteLiteral(statementDepthSetting), quoteLiteral(statementTokenSetting), quoteLiteral(statementLockSetting),
		quoteLiteral(st.Token), quoteLiteral(st.Lock))
}

// tokenBlock is the PL/pgSQL that turns the token text s into k, raising 55F02 or 55F03 as the proxy does, and,
// with st.Ceiling, 55F03 when k is above a ceiling in fenceproxy.token_ceiling (the highest token the proxy's
// verifier has accepted as issued: docs/verification.md). The ceiling is read for every row, from the table only
// the proxy's role may write, so no setting a session can change stands between the token stamped and the check.
// table is the SQL expression of the table's label.
func tokenBlock(st Settings, table string) (string, error) {
	missing, err := errorSQL(rewrite.Marker{Code: rewrite.CodeMissing, Table: sentinel(partTable), Setting: st.Token},
		map[string]string{partTable: table})
	if err != nil {
		return "", err
	}
	invalid, err := errorSQL(rewrite.Marker{Code: rewrite.CodeInvalid, Table: sentinel(partTable), Setting: st.Token, Token: sentinel(partToken)},
		map[string]string{partTable: table, partToken: goQuoted("s")})
	if err != nil {
		return "", err
	}
	msg, _, hint := rewrite.Marker{Code: rewrite.CodeInvalid, Table: sentinel(partTable), Setting: st.Token, Token: sentinel(partToken)}.Describe()
	parts := map[string]string{partTable: table, partToken: goQuoted("s"), partRowToken: "c"}
	msgSQL, err := textSQL(msg, parts)
	if err != nil {
		return "", err
	}
	detailSQL, err := textSQL(ceilingDetail, parts)
	if err != nil {
		return "", err
	}
	hintSQL, err := textSQL(hint, parts)
	if err != nil {
		return "", err
	}
	block := fmt.Sprintf(`IF s IS NULL OR s OPERATOR(pg_catalog.=) '' THEN
		%s
	END IF;
	IF NOT (%s) THEN
		%s
	END IF;
	k := s::pg_catalog.int8;`, missing, validTokenSQL, invalid)
	if !st.Ceiling {
		return block, nil
	}
	return block + fmt.Sprintf(`
	SELECT pg_catalog.min(tc.ceiling) INTO c FROM %s.token_ceiling AS tc;
	IF k OPERATOR(pg_catalog.>) c THEN
		RAISE EXCEPTION USING ERRCODE = %s, MESSAGE = %s, DETAIL = %s, HINT = %s, TABLE = %s;
	END IF;`, Name, quoteLiteral(rewrite.CodeInvalid), msgSQL, detailSQL, hintSQL, table), nil
}

// ceilingDetail is the DETAIL of the guard's 55F03 for a token above the ceiling; the ceiling is the row-token
// part.
var ceilingDetail = "fenceproxy verifies tokens: no lock service has issued a token above " + sentinel(partRowToken) +
	" (fenceproxy.token_ceiling), so this one was not issued to anyone."

// statementBody is the body of fenceproxy.guard_statement(), the statement-level trigger function behind
// StatementStartTrigger and StatementEndTrigger on every guarded relation: one token per statement.
//
// The row guard must check and stamp the token that was in force when the statement started, whatever the
// statement does to the setting while it runs (a set_config in a VALUES row, a SET list, a WHERE, a function
// it calls). PostgreSQL fires BEFORE STATEMENT triggers when a write (a ModifyTable: INSERT, UPDATE, DELETE,
// MERGE, a CTE's write, COPY FROM) starts, before it evaluates anything of its own, and AFTER STATEMENT
// triggers when the query it belongs to ends (errors end the (sub)transaction instead). So:
//   - start: when no write is running (depth 0), the token and lock settings are copied into the private
//     settings; the depth goes up by one. A write inside a running one (a function in a VALUES row, a trigger,
//     a cascade, a second CTE) keeps the copy: the outermost write's token is the statement's token, for all
//     it does. A write that starts when none runs (the next statement, or a function's next statement after
//     a set_config between them) copies the settings again.
//   - end: the depth goes down by one; at 0 the copy stops counting.
//   - every setting is set transaction-locally, so an error that aborts a statement (or the savepoint an
//     exception block opened) takes back its changes with it, and a transaction starts at depth 0.
//
// The row guard and lock_accept read the copy while the depth is above 0 (statementSettingsBlock). A session
// could set the private settings itself; that gets it nothing a SET of the token before the statement would
// not: every row is still checked against the token it is stamped with, and the ceiling is read from a
// table for every row.
func statementBody(st Settings) string {
	return fmt.Sprintf(`
-- fenceproxy guard: one token per statement; generated by fenceproxy install, do not edit.
DECLARE
	ds pg_catalog.text := pg_catalog.current_setting(%[1]s, true);
	d pg_catalog.int4 := 0;
BEGIN
	IF ds IS NOT NULL AND ds OPERATOR(pg_catalog.<>) '' THEN
		d := ds::pg_catalog.int4;
	END IF;
	IF TG_WHEN OPERATOR(pg_catalog.=) 'BEFORE' THEN
		IF d OPERATOR(pg_catalog.<=) 0 THEN
			PERFORM pg_catalog.set_config(%[2]s, COALESCE(pg_catalog.current_setting(%[4]s, true), ''), true);
			PERFORM pg_catalog.set_config(%[3]s, COALESCE(pg_catalog.current_setting(%[5]s, true), ''), true);
			d := 0;
		END IF;
		PERFORM pg_catalog.set_config(%[1]s, (d OPERATOR(pg_catalog.+) 1)::pg_catalog.text, true);
	ELSIF d OPERATOR(pg_catalog.>) 0 THEN
		PERFORM pg_catalog.set_config(%[1]s, (d OPERATOR(pg_catalog.-) 1)::pg_catalog.text, true);
	END IF;
	RETURN NULL;
END
`, quoteLiteral(statementDepthSetting), quoteLiteral(statementTokenSetting), quoteLiteral(statementLockSetting),
		quoteLiteral(st.Token), quoteLiteral(st.Lock))
}

// guardFunctionBody is the PL/pgSQL body of the row-level guard for g. No dynamic SQL: the token column is
// named in the code, so PL/pgSQL caches its plans per table.
//
// The generated code runs with the writer's search_path (a SET clause on the trigger functions would cost a
// setting change per row), so every operator is written OPERATOR(pg_catalog.x), and no construct that looks an
// operator up by name behind the text is used: IS DISTINCT FROM, NULLIF, IN, BETWEEN and CASE x WHEN resolve =
// or < through the search_path, where a session may have put its own (TestGuardIgnoresSearchPathOperators).
//
// guarded are the relations install put the whole guard on (wholeGuardBlock).
func guardFunctionBody(g guardSpec, st Settings, guarded []uint32) (string, error) {
	label := quoteLiteral(g.Label)
	tok, err := tokenBlock(st, label)
	if err != nil {
		return "", err
	}
	whole := wholeGuardBlock(label, guarded)
	col := quoteIdent(g.TokenColumn)
	stale, err := errorSQL(rewrite.Marker{Code: rewrite.CodeStale, Table: g.Label, RowToken: sentinel(partRowToken), Token: sentinel(partToken)},
		map[string]string{partRowToken: "OLD." + col, partToken: "k"})
	if err != nil {
		return "", err
	}
	noLock := ""
	if g.RequireLock {
		e, err := errorSQL(rewrite.Marker{Code: rewrite.CodeMissing, Table: g.Label, Setting: st.Lock}, nil)
		if err != nil {
			return "", err
		}
		noLock = "\n\tELSE\n\t\t" + e
	}
	return fmt.Sprintf(`
-- fenceproxy guard for %s (token column %s); generated by fenceproxy install, do not edit.
DECLARE
	s pg_catalog.text;
	k pg_catalog.int8;
	c pg_catalog.int8;
	l pg_catalog.text;
BEGIN
	%s
	%s
	%s
	IF l IS NOT NULL AND l OPERATOR(pg_catalog.<>) '' THEN
		IF COALESCE(pg_catalog.current_setting('fenceproxy.lock_accepted', true), '') OPERATOR(pg_catalog.<>) pg_catalog.concat(k, '|', l) THEN
			PERFORM %s.lock_accept(%s);
		END IF;%s
	END IF;
	IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
		NEW.%s := k;
		RETURN NEW;
	END IF;
	IF OLD.%s OPERATOR(pg_catalog.>) k THEN
		%s
	END IF;
	IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
		NEW.%s := k;
		RETURN NEW;
	END IF;
	RETURN OLD;
END
`, strings.ReplaceAll(g.Label, "\n", " "), strings.ReplaceAll(g.TokenColumn, "\n", " "), whole, statementSettingsBlock(st), tok,
		Name, label, noLock, col, col, stale, col), nil
}

// wholeGuardBlock is the PL/pgSQL that refuses (55F04) a row write to a relation that lacks the rest of the
// guard: its TRUNCATE trigger and its statement triggers, enabled ALWAYS.
//
// PostgreSQL clones a partitioned table's row triggers onto every partition made or attached later, but not its
// statement-level ones, TRUNCATE's among them; an inheritance child gets none. Without the DDL guard (whose event
// trigger gives a new descendant the whole guard: ddlguard.go) nothing runs when such a relation is made, so
// the row guard, which does reach it as a clone, is where the rule is kept: no row is written to, or changed in,
// a relation that TRUNCATE could empty unguarded. A new partition takes no fenced row until install runs again
// (or the DDL guard has guarded it), so TRUNCATE of it, by a stale holder or a session with no token, empties
// no fenced row. The relations install guarded (guarded, their oids) are known to hold the whole guard and skip
// the catalog read; any other reads pg_trigger once per row.
func wholeGuardBlock(label string, guarded []uint32) string {
	oids := make([]string, len(guarded))
	for i, o := range guarded {
		oids[i] = strconv.FormatUint(uint64(o), 10)
	}
	// Each trigger by its name, function and kind (tgtype: 2 before, 4 insert, 8 delete, 16 update, 32
	// truncate), unconditional and enabled ALWAYS: a look-alike that calls something else does not count.
	return fmt.Sprintf(`IF TG_RELID OPERATOR(pg_catalog.<>) ALL (%[1]s::pg_catalog.oid[]) AND (SELECT pg_catalog.count(*) FROM pg_catalog.pg_trigger t
			WHERE t.tgrelid OPERATOR(pg_catalog.=) TG_RELID AND t.tgenabled OPERATOR(pg_catalog.=) 'A' AND t.tgqual IS NULL
				AND ((t.tgname OPERATOR(pg_catalog.=) %[2]s AND t.tgtype OPERATOR(pg_catalog.=) 34
						AND t.tgfoid OPERATOR(pg_catalog.=) %[5]s::pg_catalog.regprocedure)
					OR (t.tgname OPERATOR(pg_catalog.=) %[3]s AND t.tgtype OPERATOR(pg_catalog.=) 30
						AND t.tgfoid OPERATOR(pg_catalog.=) %[6]s::pg_catalog.regprocedure)
					OR (t.tgname OPERATOR(pg_catalog.=) %[4]s AND t.tgtype OPERATOR(pg_catalog.=) 28
						AND t.tgfoid OPERATOR(pg_catalog.=) %[6]s::pg_catalog.regprocedure))) OPERATOR(pg_catalog.<>) 3 THEN
		RAISE EXCEPTION USING ERRCODE = %[7]s,
			MESSAGE = pg_catalog.concat('unfenceable write: ', pg_catalog.quote_ident(TG_TABLE_SCHEMA), '.', pg_catalog.quote_ident(TG_TABLE_NAME),
				' holds rows of ', %[8]s, ' but lacks the guard of its TRUNCATE and statements (made after fenceproxy install)'),
			HINT = 'Run fenceproxy install again: it guards partitions and inheritance children made since (the DDL guard, install --ddl-guard, guards them as they are made).',
			TABLE = %[8]s;
	END IF;`, quoteLiteral("{"+strings.Join(oids, ",")+"}"), quoteLiteral(TruncateTrigger), quoteLiteral(StatementStartTrigger),
		quoteLiteral(StatementEndTrigger), quoteLiteral(Name+".guard_truncate()"), quoteLiteral(Name+".guard_statement()"),
		quoteLiteral(rewrite.CodeUnfenceable), label)
}

// truncateFunctionBody refuses TRUNCATE (55F04) with the proxy's message; the table's label is the trigger's
// argument.
const truncateFunctionBody = `
-- fenceproxy guard: TRUNCATE cannot be fenced; generated by fenceproxy install, do not edit.
BEGIN
	RAISE EXCEPTION USING ERRCODE = '55F04',
		MESSAGE = pg_catalog.concat('unfenceable write: TRUNCATE of ', TG_ARGV[0], ' cannot be fenced'), TABLE = TG_ARGV[0];
END
`

// lockClass is the first key of the advisory locks lock fences take, (lockClass, lock_marks.id): "fenc".
const lockClass = 0x66656e63

// lockAcceptBody is the body of fenceproxy.lock_accept(tbl text): it checks and raises the mark of the lock
// named in the session's lock setting with the session's token, or raises 55F01 when the lock has accepted a
// newer token. It reads the statement's token and lock itself (statementSettingsBlock) and checks the token
// as the row guard does (ceiling included), so calling it directly is no more than a write with the
// session's own token is (it runs as its owner: writers cannot change lock_marks otherwise). A lock setting
// that holds a transaction pool's placeholder (rewrite.PoolPlaceholder) names no lock: 55F03, never a lock
// of that name.
//
// Who waits for whom is decided by a transaction-level advisory lock per lock (keyed by lock_marks.id), which
// costs no tuple write, no WAL and no MultiXact, unlike a row lock on the mark taken by every writer:
//   - mark = k (the steady state): a shared advisory lock, which writers with the same token share: they do not
//     serialize. It is held until the transaction ends, so a newer writer waits for this one. Then the mark is
//     read again: a newer writer may have raised it while this one waited for the shared lock (55F01).
//   - mark < k: the exclusive advisory lock, which waits for every transaction on the lock in flight (older
//     holders, holding it shared) and makes every later writer wait for this transaction to end; then the mark
//     is raised (UPDATE ... WHERE mark < k: another raiser with the same token may have been first). A
//     same-token writer that found mark < k too waits for the first raiser, then finds nothing to raise; it
//     keeps its exclusive lock to the end of its transaction, so writers serialize only during the handover
//     to a new token, not in the steady state.
//   - no row yet: INSERT ... ON CONFLICT DO NOTHING; a concurrent first writer makes it wait for the first's
//     transaction (so nothing older can be accepted before that one ends) and then read the row.
//   - The mark is read with a new snapshot after each lock wait (READ COMMITTED). Under REPEATABLE READ and
//     SERIALIZABLE the re-read is FOR SHARE, so a mark raised after the transaction's snapshot gives
//     PostgreSQL's serialization failure (40001) rather than a stale read.
//
// Once accepted, the transaction holds the advisory lock until it ends, so it records (lock, token) in the
// transaction-local setting fenceproxy.lock_accepted and the guard skips lock_accept for the transaction's
// further rows with the same lock and token: the lock fence costs one call per transaction, not per row. A
// rolled-back savepoint takes back the record, and also the advisory lock taken under it. A session can set
// that setting itself and skip the check, which gives it nothing it could not get by naming another lock or
// none: lock fences guard against stale holders, not against sessions that lie about their lock (token
// verification is the defence against forged tokens).
func lockAcceptBody(st Settings) (string, error) {
	tok, err := tokenBlock(st, "tbl")
	if err != nil {
		return "", err
	}
	stale, err := errorSQL(rewrite.Marker{Code: rewrite.CodeStale, Table: sentinel(partTable), Lock: sentinel(partLock),
		RowToken: sentinel(partRowToken), Token: sentinel(partToken)},
		map[string]string{partTable: "tbl", partLock: "l", partRowToken: "m", partToken: "k"})
	if err != nil {
		return "", err
	}
	noLock, err := errorSQL(rewrite.Marker{Code: rewrite.CodeInvalid, Table: sentinel(partTable), Setting: st.Lock, Lock: rewrite.PoolPlaceholder},
		map[string]string{partTable: "tbl"})
	if err != nil {
		return "", err
	}
	return strings.NewReplacer("@schema@", Name, "@class@", fmt.Sprint(lockClass), "@stale@", stale,
		"@placeholder@", quoteLiteral(rewrite.PoolPlaceholder), "@noLock@", noLock).Replace(fmt.Sprintf(`
-- fenceproxy lock fence; generated by fenceproxy install, do not edit.
DECLARE
	s pg_catalog.text;
	k pg_catalog.int8;
	c pg_catalog.int8;
	l pg_catalog.text;
	m pg_catalog.int8;
	lid pg_catalog.int4;
	rc pg_catalog.bool := pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed';
	tries pg_catalog.int4 := 0;
BEGIN
	%s
	IF l IS NULL OR l OPERATOR(pg_catalog.=) '' THEN
		RETURN;
	END IF;
	%s
	IF l OPERATOR(pg_catalog.=) @placeholder@ THEN
		@noLock@
	END IF;
	LOOP
		SELECT lm.mark, lm.id INTO m, lid FROM @schema@.lock_marks AS lm WHERE lm.name OPERATOR(pg_catalog.=) l;
		IF NOT FOUND THEN
			INSERT INTO @schema@.lock_marks AS lm (name, mark) VALUES (l, k) ON CONFLICT (name) DO NOTHING;
			IF FOUND THEN
				EXIT;
			END IF;
		ELSIF m OPERATOR(pg_catalog.>) k THEN
			@stale@
		ELSE
			IF m OPERATOR(pg_catalog.=) k THEN
				PERFORM pg_catalog.pg_advisory_xact_lock_shared(@class@, lid);
			ELSE
				PERFORM pg_catalog.pg_advisory_xact_lock(@class@, lid);
				UPDATE @schema@.lock_marks AS lm SET mark = k WHERE lm.id OPERATOR(pg_catalog.=) lid AND lm.mark OPERATOR(pg_catalog.<) k;
			END IF;
			IF rc THEN
				SELECT lm.mark INTO m FROM @schema@.lock_marks AS lm WHERE lm.id OPERATOR(pg_catalog.=) lid;
			ELSE
				SELECT lm.mark INTO m FROM @schema@.lock_marks AS lm WHERE lm.id OPERATOR(pg_catalog.=) lid FOR SHARE;
			END IF;
			IF m OPERATOR(pg_catalog.>) k THEN
				@stale@
			END IF;
			IF m OPERATOR(pg_catalog.=) k THEN
				EXIT;
			END IF;
		END IF;
		-- Only a mark lowered or deleted by hand between two statements gets here; do not spin on it.
		tries := tries OPERATOR(pg_catalog.+) 1;
		IF tries OPERATOR(pg_catalog.>=) 10 THEN
			RAISE EXCEPTION USING ERRCODE = '55F04',
				MESSAGE = pg_catalog.concat('unfenceable write: the mark of lock ', l, ' keeps changing under a write to ', tbl), TABLE = tbl;
		END IF;
	END LOOP;
	-- This transaction holds the lock's advisory lock (or the uncommitted mark row it inserted) until it
	-- ends: no newer token can be accepted on l before then, so its later writes with the same lock and token
	-- need not ask again (the guard reads this). Transaction-local: it goes at commit or rollback, and with a
	-- rolled-back savepoint, as the advisory lock taken under it does.
	PERFORM pg_catalog.set_config('fenceproxy.lock_accepted', pg_catalog.concat(k, '|', l), true);
END
`, statementSettingsBlock(st), tok)), nil
}
