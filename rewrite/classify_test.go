package rewrite

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// FuzzClassifyPooling: ClassifyPooling's one pass gives what the separate passes it replaced gave (the
// references below are those passes as they were), under both readings of backslashes. The seeds are the
// golden inputs, the hostile corpus's statements and the pooling tests' texts; go test runs them.
func FuzzClassifyPooling(f *testing.F) {
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.sql"))
	if err != nil {
		f.Fatal(err)
	}
	for _, path := range files {
		f.Add(readGolden(f, path).input)
	}
	corpus, err := filepath.Glob(filepath.Join("..", "testdata", "hostile", "*.txt"))
	if err != nil || len(corpus) == 0 {
		f.Fatalf("hostile corpus: %v (%d files)", err, len(corpus))
	}
	for _, path := range corpus {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		// A case's statement is the lines after "sql:" up to its expectation; a rough cut is seed enough.
		for _, part := range strings.Split(string(b), "sql:")[1:] {
			sql, _, _ := strings.Cut(part, "\nexpect")
			f.Add(strings.TrimSpace(sql))
		}
	}
	for _, s := range []string{
		"", ";", " ; ;", "BEGIN", "begin;", "BEGIN; SELECT 1", "BEGIN ISOLATION LEVEL SERIALIZABLE", "BEGIN WORK",
		"begin transaction read only", "START TRANSACTION", "start transaction; ", "START TRANSACTION ISOLATION LEVEL READ COMMITTED",
		"BEGIN; SELECT 'unterminated", "BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT 'unterminated", "BEGIN 'x", `BEGIN; "`,
		"VACUUM", "vacuum analyze t; select 1", "create index concurrently i on t (a)", "CREATE DATABASE d", "drop tablespace x",
		"ALTER SYSTEM SET x = 1", "DISCARD ALL", "COMMIT", "end", "(SELECT 1)", "SELECT 1; UPDATE t SET a = 1", "SET x = 1; SELECT 1",
		"with a as (select 1) select * from a", "SHOW fence.token", "TABLE t", "VALUES (1)", `SELECT 'it\'; SET role = x; --'`,
		"select $$ ; begin $$", "/* BEGIN */ SELECT 1", "-- c\nBEGIN", `"begin"`, "BEGIN/*x*/;", "U&\"begin\"", "begin work work",
		"COMMIT AND CHAIN", "commit work and chain;", "END AND NO CHAIN", "ROLLBACK AND CHAIN", "abort transaction and chain",
		"COMMIT AND CHAIN; SELECT 1", "rollback to savepoint chain", `COMMIT AND "chain"`, "COMMIT /*x*/ AND -- y\n CHAIN",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		for _, scs := range []bool{true, false} {
			set := Settings{StandardConformingStrings: scs, ClientEncoding: "UTF8", ServerEncoding: "UTF8"}
			raw := []byte(sql)
			c := ClassifyPooling(raw, set)
			begin, modes, alone := refTransactionStart(raw, set)
			want := PoolingClass{Own: refOwnTransaction(raw, set), Begin: begin, Modes: modes, Alone: alone, Plain: refPlainStatements(raw, set), Chain: refChain(raw, set)}
			// Alone is only meaningful with Begin (LoneBegin): the reference reports it for any first statement.
			if !want.Begin {
				want.Alone, c.Alone = false, false
			}
			// No pass gave them before (TestClassifyPoolingModesLater, ...ChainsLast, ...NeedsBlock, ...Procedure).
			c.ModesLater, c.ChainsLast, c.NeedsBlock, c.Procedure = false, false, false, false
			if c != want {
				t.Errorf("scs=%v ClassifyPooling(%q) = %+v, the separate passes give %+v", scs, sql, c, want)
			}
		}
	})
}

// refChain reads Chain from all the text's tokens: one statement, COMMIT, END, ROLLBACK or ABORT first, AND
// CHAIN last, all unquoted words.
func refChain(raw []byte, s Settings) bool {
	text, why := decode(raw, s)
	if why != "" {
		return false
	}
	l := newLexer(text, s.StandardConformingStrings)
	var words []string
	for t := l.next(); t.kind != tokEOF; t = l.next() {
		if t.kind == tokSemicolon {
			if len(words) > 0 {
				words = append(words, ";")
			}
			continue
		}
		if t.kind != tokIdent {
			words = append(words, "?")
			continue
		}
		v, _ := l.identValue(t, nil)
		words = append(words, string(v))
	}
	for len(words) > 0 && words[len(words)-1] == ";" {
		words = words[:len(words)-1]
	}
	if l.err != nil || len(words) < 3 || slices.Contains(words, ";") {
		return false
	}
	switch words[0] {
	case "commit", "end", "rollback", "abort":
		return words[len(words)-2] == "and" && words[len(words)-1] == "chain"
	}
	return false
}

func refOwnTransaction(raw []byte, s Settings) bool {
	text, why := decode(raw, s)
	if why != "" {
		return false
	}
	l := newLexer(text, s.StandardConformingStrings)
	// The first statement's first two unquoted words, lower case, in buffers of their own: this runs on every
	// Query a pooled client sends, and only these words and CONCURRENTLY matter.
	var buf [2][16]byte
	var words [2][]byte
	nwords := 0
	concurrently := false
	statements := 0
	inStmt := false
	for t := l.next(); t.kind != tokEOF; t = l.next() {
		if t.kind == tokSemicolon {
			inStmt = false
			continue
		}
		if !inStmt {
			statements++
			inStmt = true
		}
		if statements > 1 {
			return false // several statements are one implicit transaction block already
		}
		if t.kind != tokIdent {
			continue
		}
		// An unquoted word is its bytes in lower case (identValue).
		if raw := text[t.start:t.end]; equalFoldASCII(raw, "concurrently") {
			concurrently = true
		}
		if nwords < 2 {
			words[nwords], _ = l.identValue(t, buf[nwords][:0])
			nwords++
		}
	}
	if l.err != nil {
		return false
	}
	if statements == 0 {
		return true
	}
	if concurrently {
		return true
	}
	first, second := string(words[0]), string(words[1])
	switch first {
	case "vacuum", "discard", "cluster", "reindex", "checkpoint", "commit", "end", "abort":
		return true
	case "rollback":
		return !rollbackTo(text, s)
	case "create", "drop":
		return second == "database" || second == "tablespace" || second == "subscription"
	case "alter":
		return second == "system" || second == "subscription" || second == "database"
	}
	return false
}

// rollbackTo reports whether text (one statement, starting with ROLLBACK) is ROLLBACK [WORK | TRANSACTION] TO ...:
// its unquoted words, lower case, from the lexer's tokens.
func rollbackTo(text []byte, s Settings) bool {
	l := newLexer(text, s.StandardConformingStrings)
	var words []string
	for t := l.next(); t.kind != tokEOF && len(words) < 3; t = l.next() {
		if t.kind != tokIdent || text[t.start] == '"' {
			return false
		}
		v, _ := l.identValue(t, nil)
		words = append(words, string(v))
	}
	return len(words) >= 2 && (words[1] == "to" || len(words) == 3 && (words[1] == "work" || words[1] == "transaction") && words[2] == "to")
}

func refTransactionStart(raw []byte, s Settings) (begin, modes, alone bool) {
	text, why := decode(raw, s)
	if why != "" {
		return false, false, false
	}
	l := newLexer(text, s.StandardConformingStrings)
	var words []string // the first statement's leading unquoted words, lower case
	tokens := 0
	t := l.next()
	for t.kind == tokSemicolon {
		t = l.next()
	}
	for ; t.kind != tokEOF && t.kind != tokSemicolon; t = l.next() {
		if t.kind == tokIdent && len(words) == tokens {
			w, _ := l.identValue(t, nil)
			words = append(words, string(w))
		}
		tokens++
	}
	for t.kind == tokSemicolon {
		t = l.next()
	}
	alone = t.kind == tokEOF
	if l.err != nil || len(words) == 0 {
		return false, false, false
	}
	switch {
	case words[0] == "begin" && len(words) > 1 && (words[1] == "work" || words[1] == "transaction"):
		return true, tokens > 2, alone
	case words[0] == "begin":
		return true, tokens > 1, alone
	case words[0] == "start" && len(words) > 1 && words[1] == "transaction":
		return true, tokens > 2, alone
	}
	return false, false, alone
}

func refPlainStatements(raw []byte, s Settings) bool {
	text, why := decode(raw, s)
	if why != "" {
		return false
	}
	l := newLexer(text, s.StandardConformingStrings)
	statements := 0
	start := true
	var buf [16]byte // a statement's first word, without an allocation: this runs on every pooled Query
	for t := l.next(); t.kind != tokEOF; t = l.next() {
		if t.kind == tokSemicolon {
			start = true
			continue
		}
		if !start {
			continue
		}
		start = false
		statements++
		if t.kind != tokIdent {
			return false // a parenthesis, a quoted word: not a plain statement's start
		}
		w, _ := l.identValue(t, buf[:0])
		switch string(w) {
		case "select", "insert", "update", "delete", "merge", "with", "values", "table", "show":
		default:
			return false
		}
	}
	return l.err == nil && statements > 0
}

// ModesLater: a statement that fails 25001 after a snapshot (BEGIN or START TRANSACTION with modes, SET
// TRANSACTION) anywhere but first (SET TRANSACTION also first), as each statement's leading words say.
func TestClassifyPoolingModesLater(t *testing.T) {
	for sql, want := range map[string]bool{
		"BEGIN ISOLATION LEVEL SERIALIZABLE":                           false, // first: Begin and Modes say so
		"SET fence.token = '6'; BEGIN ISOLATION LEVEL REPEATABLE READ": true,
		"SET DateStyle TO 'German'; start transaction read only":       true,
		"SELECT 1; BEGIN":      false,
		"SELECT 1; BEGIN WORK": false,
		"BEGIN; SET TRANSACTION ISOLATION LEVEL SERIALIZABLE":            true,
		"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; SELECT 1":         true,
		"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE":                   true,
		"BEGIN; SELECT 'BEGIN ISOLATION LEVEL SERIALIZABLE'":             false,
		"SELECT 1; /* begin read only */ SELECT 2":                       false,
		"SELECT 1; \"begin\" read only":                                  false, // a quoted word is not the keyword
		"SELECT 1; BEGIN TRANSACTION DEFERRABLE; COMMIT":                 true,
		"SELECT 1;; begin not deferrable":                                true,
		"SET transaction_isolation = 'serializable'; BEGIN":              true, // sets this transaction's characteristic
		"SET transaction_isolation = 'serializable'":                     true,
		"BEGIN; SET LOCAL TRANSACTION ISOLATION LEVEL SERIALIZABLE":      true,
		"BEGIN; SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE":    true,
		"SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE; SELECT 1": true,
		"BEGIN; SET transaction_deferrable = on; COMMIT":                 true,
		"BEGIN; set local transaction_read_only = on":                    true,
		"SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY; SELECT 1": false,
		"SET LOCAL work_mem = '1MB'; SELECT 1":                           false,
		"BEGIN; SET LOCAL fence.token = 5; UPDATE t SET a = 1; COMMIT":   false,
		// The setting's name quoted, in any case, as PostgreSQL takes it; keywords only unquoted.
		`SET "transaction_isolation" = 'serializable'`:                   true,
		`SET LOCAL "Transaction_Isolation" TO 'serializable'; SELECT 1`:  true,
		`set session "TRANSACTION_DEFERRABLE" = on`:                      true,
		`SELECT 1; SET U&"transaction_read_only" = on`:                   true,
		`SELECT 1; SET LOCAL "transaction_isolation" = 'serializable'`:   true,
		`SET "transaction" ISOLATION LEVEL SERIALIZABLE`:                 false, // a setting named transaction
		`SET LOCAL "transaction" ISOLATION LEVEL SERIALIZABLE; SELECT 1`: false,
		`SELECT 1; "set" transaction_isolation = 'serializable'`:         false,
		`SET "transaction_isolation_x" = 'a'`:                            false,
	} {
		if got := ClassifyPooling([]byte(sql), DefaultSettings).ModesLater; got != want {
			t.Errorf("ModesLater(%q) = %v, want %v", sql, got, want)
		}
	}
}

// ChainsLast: a text of several statements whose last (empty ones aside) is COMMIT, END, ROLLBACK or ABORT AND
// CHAIN, in unquoted words.
func TestClassifyPoolingChainsLast(t *testing.T) {
	for sql, want := range map[string]bool{
		"COMMIT AND CHAIN":                                false, // one statement: Chain says so
		"BEGIN; END AND CHAIN":                            true,
		"BEGIN; END AND CHAIN;":                           true,
		"BEGIN; END AND CHAIN; ;":                         true,
		"BEGIN READ ONLY; rollback work and chain":        true,
		"BEGIN; COMMIT AND CHAIN; SELECT 1":               false,
		"BEGIN; COMMIT AND NO CHAIN":                      false,
		"BEGIN; ROLLBACK TO SAVEPOINT chain":              false,
		`BEGIN; COMMIT AND "chain"`:                       false,
		"SELECT 1; abort transaction and chain":           true,
		"BEGIN; COMMIT /* and chain */":                   false,
		"SET LOCAL x.y = 1; commit and chain; (SELECT 1)": false,
	} {
		if got := ClassifyPooling([]byte(sql), DefaultSettings).ChainsLast; got != want {
			t.Errorf("ChainsLast(%q) = %v, want %v", sql, got, want)
		}
	}
}

// NeedsBlock: one statement that PostgreSQL refuses or ignores outside a transaction block, in unquoted words.
func TestClassifyPoolingNeedsBlock(t *testing.T) {
	for sql, want := range map[string]bool{
		"DECLARE c CURSOR FOR SELECT 1":                               true,
		"declare c binary no scroll cursor without hold for select 1": true,
		"DECLARE c CURSOR WITH HOLD FOR SELECT 1":                     false,
		"DECLARE c CURSOR FOR SELECT 'with hold'":                     true,
		"DECLARE c CURSOR FOR SELECT 1 AS with, 2 AS hold":            true,
		"DECLARE c CURSOR /* with hold */ FOR SELECT 1":               true,
		"LOCK TABLE t IN ACCESS SHARE MODE":                           true,
		"lock t":                                                      true,
		"SET LOCAL work_mem = '7MB'":                                  true,
		"SET LOCAL fence.token = '5';":                                true,
		"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE":                true,
		"SET CONSTRAINTS ALL DEFERRED":                                true,
		"SET work_mem = '7MB'":                                        false,
		"SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY":        false,
		"SET LOCAL work_mem = '7MB'; SELECT 1":                        false, // an implicit block directly too
		"BEGIN; DECLARE c CURSOR FOR SELECT 1":                        false,
		"SELECT 1":                                                    false,
		"SAVEPOINT a":                                                 false, // refused in an implicit block too
		"SET SESSION TRANSACTION READ ONLY":                           true,
		"SET LOCAL local.x = 1":                                       true,
		"SET local.x = 'a'":                                           false, // a custom setting, at session level
		"SET transaction.x = 'a'":                                     false,
		"SET constraints.x TO 'a'":                                    false,
		`SET "x.y" = local`:                                           false,
		`SET LOCAL "work_mem" = '7MB'`:                                true, // a quoted name
		`SET "local".x = 1`:                                           false,
		`SET SESSION "transaction_isolation" = 'serializable'`:        false, // only SET SESSION TRANSACTION, as before
		"PREPARE TRANSACTION 'x'":                                     true,
		"prepare /* c */ transaction E'x' ;":                          true,
		"PREPARE TRANSACTION $$x$$":                                   true,
		"PREPARE transaction AS SELECT 1":                             false, // an SQL PREPARE of a statement named transaction
		"PREPARE transaction (int) AS SELECT $1":                      false,
		`PREPARE "transaction" 'x'`:                                   false,
		"PREPARE TRANSACTION 'x'; SELECT 1":                           false, // an implicit block directly too
		"SELECT 1; PREPARE TRANSACTION 'x'":                           false,
		"COMMIT PREPARED 'x'":                                         false, // Own
	} {
		if got := ClassifyPooling([]byte(sql), DefaultSettings).NeedsBlock; got != want {
			t.Errorf("NeedsBlock(%q) = %v, want %v", sql, got, want)
		}
	}
}

// Procedure: one CALL or DO statement, its first word unquoted.
func TestClassifyPoolingProcedure(t *testing.T) {
	for sql, want := range map[string]bool{
		"CALL p()":                             true,
		"call p(1, 'x');":                      true,
		"/* c */ Call s.p() ; ;":               true,
		"-- c\nCALL p()":                       true,
		"DO $$ BEGIN COMMIT; END $$":           true,
		"do language plpgsql 'begin end'":      true,
		"DO $$ BEGIN COMMIT; END $$; SELECT 1": false, // an implicit block directly too
		"SELECT 1; CALL p()":                   false,
		"CALL p(); CALL q()":                   false,
		`"call" p()`:                           false,
		"(CALL p())":                           false,
		"SELECT call FROM t":                   false,
		"BEGIN; CALL p(); COMMIT":              false,
		"CALL p('unterminated":                 false,
		"EXPLAIN CALL p()":                     false,
	} {
		if got := ClassifyPooling([]byte(sql), DefaultSettings).Procedure; got != want {
			t.Errorf("Procedure(%q) = %v, want %v", sql, got, want)
		}
	}
}
