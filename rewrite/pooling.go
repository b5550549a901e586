package rewrite

import (
	"bytes"
	"slices"
	"strings"
)

// OwnTransaction reports whether a Query text must reach the server as it is, without the transaction pooler's
// token statement put before it (proxy/pooled.go): a text of no statement (the server answers it with
// EmptyQueryResponse, which a statement in front would turn into a result), or one statement that PostgreSQL
// refuses inside a transaction block (VACUUM, DISCARD ALL, CREATE/DROP DATABASE, ... CONCURRENTLY), which a
// statement in front would put into one. Such statements write no table through the proxy; run without the
// token statement they see the pooled connection's placeholder, which no fence accepts (fail closed).
// Text the lexer cannot read gets the token statement (false).
func OwnTransaction(raw []byte, s Settings) bool { return ClassifyPooling(raw, s).Own }

// PoolingClass is what the transaction pooler reads from a text's words (proxy/pooled.go), all in one pass of
// the lexer (ClassifyPooling): the pooler asks several of these questions of every Query and Parse a client
// sends, and of the statement every Bind binds, and a pass each cost it a tenth of its user time.
type PoolingClass struct {
	Own   bool // OwnTransaction: no statement, or one that must run outside a transaction block
	Begin bool // the first statement is BEGIN or START TRANSACTION (transactionStart)
	Modes bool // ... with transaction modes (BeginsWithTransactionModes)
	Alone bool // ... and it is the text's only statement (LoneBegin: Begin && !Modes && Alone)
	Plain bool // PlainStatements
	// Chain: the text is one COMMIT, END, ROLLBACK or ABORT with AND CHAIN, which starts the next transaction
	// at once, with the session's values: the pooler gives it the client's (proxy/pooled.go: chainTokens).
	Chain bool
	// ChainsLast: the text has several statements and its last is COMMIT, END, ROLLBACK or ABORT with AND
	// CHAIN (as Chain is for a text of one statement).
	ChainsLast bool
	// ModesLater: a statement after the first is BEGIN or START TRANSACTION with transaction modes, or SET
	// TRANSACTION, or the first is SET TRANSACTION. PostgreSQL refuses them (25001) once the transaction took a
	// snapshot, as the pooler's token statement does (a SELECT): such a text gets one that takes none.
	ModesLater bool
	// NeedsBlock: the text is one statement that PostgreSQL refuses (DECLARE of a cursor without HOLD, LOCK)
	// or warns of and ignores (SET LOCAL, SET [SESSION] TRANSACTION, SET CONSTRAINTS, PREPARE TRANSACTION)
	// outside a transaction block. A statement in front of it in one Query would put it into the Query's
	// implicit block, where it runs (a PREPARE TRANSACTION there prepares that block, the pooler's token
	// statement with it): the pooler sends such a Query as it is, to fail or warn as directly (nothing of it
	// runs, so nothing needs the token).
	NeedsBlock bool
	// Procedure: the text is one CALL or DO statement (its first word, unquoted). PostgreSQL lets the procedure
	// or block COMMIT or ROLLBACK only outside a transaction block, and a statement in front of it in one Query
	// makes the Query an implicit block, where it fails 2D000: the pooler gives it the token by the extended
	// protocol in front of the Query instead (proxy/pooled.go: procedureAlone).
	Procedure bool
}

// ClassifyPooling reads a text once for OwnTransaction, BeginsWithTransactionModes, LoneBegin and
// PlainStatements, each as its documentation says. The first statement's answers are taken where the first
// statement ends, with the lexer's state there: a text the lexer cannot read further on still has a first
// statement that opens a block, as the server would not run it either way. Text it cannot decode gives the
// zero class.
func ClassifyPooling(raw []byte, s Settings) PoolingClass {
	var c PoolingClass
	text, why := decode(raw, s)
	if why != "" {
		return c
	}
	l := newLexer(text, s.StandardConformingStrings)
	// The first statement's first two unquoted words anywhere in it (for Own), in buffers of their own: no
	// allocation; and its leading words, while every token so far is one (for Begin).
	var buf [2][16]byte
	var words [2][]byte
	var lead leadWords
	nwords, tokens := 0, 0
	concurrently := false
	// WITH HOLD before the first statement's FOR (a DECLARE's cursor outlives its transaction: NeedsBlock).
	withHold, forSeen, prevWith := false, false, false
	statements := 0
	inStmt := false
	plain := true
	// firstDone is set where the first statement's answers are taken: at the second statement's first token,
	// or at the end.
	firstDone := false
	// The first statement's last two tokens (Chain), and its third (NeedsBlock: PREPARE TRANSACTION 'gid').
	var prevTok, lastTok, thirdTok token
	// beginModes reads a statement's leading words and its count of tokens: it opens a block, and does so with
	// transaction modes; or it sets the transaction's characteristics (SET [LOCAL | SESSION] TRANSACTION, or
	// SET of transaction_isolation, _read_only, _deferrable). The keywords are unquoted words; the setting's
	// name may be quoted, in any case, as PostgreSQL takes it (SET "Transaction_Isolation" = ...).
	beginModes := func(w *leadWords, n int) (begin, modes, setTransaction bool) {
		w0, w1 := w.keyword(0), w.keyword(1)
		switch {
		case w0 == "begin" && (w1 == "work" || w1 == "transaction"), w0 == "start" && w1 == "transaction":
			return true, n > 2, false
		case w0 == "begin":
			return true, n > 1, false
		}
		characteristics := func(i int) bool {
			if w.keyword(i) == "transaction" {
				return true
			}
			switch w.name(i) {
			case "transaction_isolation", "transaction_read_only", "transaction_deferrable":
				return true
			}
			return false
		}
		return false, false, w0 == "set" && (characteristics(1) || (w1 == "local" || w1 == "session") && characteristics(2))
	}
	endFirst := func(alone bool) {
		firstDone = true
		if l.err != nil || lead.n == 0 {
			return
		}
		var setTransaction bool
		c.Begin, c.Modes, setTransaction = beginModes(&lead, tokens)
		c.ModesLater = c.ModesLater || setTransaction
		c.Alone = alone
	}
	// A later statement's leading words while every token so far is a word, its count of tokens, and its last
	// two tokens (ModesLater, ChainsLast).
	var later leadWords
	laterTokens := 0
	var laterPrev, laterLast token
	endLater := func() {
		if laterTokens == 0 {
			return // an empty statement: the one before stays the last
		}
		c.ChainsLast = false
		if later.n > 0 {
			if _, modes, setTransaction := beginModes(&later, laterTokens); modes || setTransaction {
				c.ModesLater = true
			}
			if w0 := later.keyword(0); w0 == "commit" || w0 == "end" || w0 == "rollback" || w0 == "abort" {
				var b0, b1 [8]byte
				and, _ := l.identValue(laterPrev, b0[:0])
				chain, _ := l.identValue(laterLast, b1[:0])
				c.ChainsLast = laterTokens >= 3 && laterPrev.kind == tokIdent && laterLast.kind == tokIdent && string(and) == "and" && string(chain) == "chain"
			}
		}
		later.n, laterTokens = 0, 0
	}
	for t := l.next(); t.kind != tokEOF; t = l.next() {
		if t.kind == tokSemicolon {
			inStmt = false
			if statements > 1 {
				endLater()
			}
			continue
		}
		first := !inStmt
		if first {
			statements++
			inStmt = true
			if statements == 2 {
				endFirst(false)
			}
		}
		if first && plain {
			if t.kind != tokIdent {
				plain = false // a parenthesis, a quoted word: not a plain statement's start
			} else {
				var b [16]byte
				switch w, _ := l.identValue(t, b[:0]); string(w) {
				case "select", "insert", "update", "delete", "merge", "with", "values", "table", "show":
				default:
					plain = false
				}
			}
		}
		if statements > 1 {
			// Own is false with several statements; Plain is decided at each statement's start; ModesLater
			// needs each later statement's leading words.
			if t.isIdent() && later.n == laterTokens {
				later.add(&l, t)
			}
			laterTokens++
			laterPrev, laterLast = laterLast, t
			continue
		}
		prevTok, lastTok = lastTok, t
		if tokens == 2 {
			thirdTok = t
		}
		if t.isIdent() && lead.n == tokens {
			lead.add(&l, t)
		}
		tokens++
		if t.kind != tokIdent {
			continue
		}
		// An unquoted word is its bytes in lower case (identValue).
		raw := text[t.start:t.end]
		if equalFoldASCII(raw, "concurrently") {
			concurrently = true
		}
		if !forSeen {
			withHold = withHold || prevWith && equalFoldASCII(raw, "hold")
			forSeen = equalFoldASCII(raw, "for")
			prevWith = equalFoldASCII(raw, "with")
		}
		if nwords < 2 {
			words[nwords], _ = l.identValue(t, buf[nwords][:0])
			nwords++
		}
	}
	if !firstDone {
		endFirst(true)
	}
	if statements > 1 && l.err == nil {
		endLater()
	} else {
		c.ChainsLast = false
	}
	c.Plain = plain && l.err == nil && statements > 0
	switch {
	case statements > 1, l.err != nil:
	case statements == 0, concurrently:
		c.Own = true
	default:
		switch first, second := string(words[0]), string(words[1]); first {
		case "vacuum", "discard", "cluster", "reindex", "checkpoint":
			c.Own = true
		case "commit", "rollback", "end", "abort":
			// ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name ends no block: outside one PostgreSQL refuses it
			// (25P01) the same with a statement in front, and in a batch that starts with it, only parsed, the
			// statements behind it are the client's transaction, which needs the token like any other.
			w1, w2 := lead.keyword(1), lead.keyword(2)
			c.Own = first != "rollback" || w1 != "to" && (w1 != "work" && w1 != "transaction" || w2 != "to")
			// ... AND CHAIN: its last two words (AND NO CHAIN ends with "no chain"; ROLLBACK TO SAVEPOINT
			// takes no chain).
			var b0, b1 [8]byte
			and, _ := l.identValue(prevTok, b0[:0])
			chain, _ := l.identValue(lastTok, b1[:0])
			c.Chain = tokens >= 3 && prevTok.kind == tokIdent && lastTok.kind == tokIdent && string(and) == "and" && string(chain) == "chain"
		case "create", "drop":
			c.Own = second == "database" || second == "tablespace" || second == "subscription"
		case "alter":
			c.Own = second == "system" || second == "subscription" || second == "database"
		case "lock":
			c.NeedsBlock = true
		case "call", "do":
			c.Procedure = lead.keyword(0) == first
		case "prepare":
			// PREPARE TRANSACTION 'gid' (not an SQL PREPARE of a statement named transaction, which goes on
			// with AS or a parenthesis): outside a block it warns and prepares nothing, where in an implicit
			// block it prepares the block.
			c.NeedsBlock = lead.keyword(0) == "prepare" && lead.keyword(1) == "transaction" && tokens == 3 && thirdTok.isString()
		case "declare":
			c.NeedsBlock = !withHold
		case "set":
			// Three leading words, so that a custom setting of that prefix (SET local.x = 1: a dot after the
			// second word) is not taken for one; SET SESSION TRANSACTION is SET TRANSACTION.
			w1, w2 := lead.keyword(1), lead.keyword(2)
			c.NeedsBlock = lead.n >= 3 && (w1 == "local" || w1 == "transaction" || w1 == "constraints" || w1 == "session" && w2 == "transaction")
		}
	}
	return c
}

// CustomSettings returns the names (lower case) of the custom settings (a dotted name, such as myapp.tenant)
// that a text may set or reset at session level: the target of a SET or RESET statement, and the first argument
// of set_config when it is a string constant. PostgreSQL lists custom settings nowhere (pg_settings leaves
// them out), so the transaction pooler (proxy/pooledsettings.go) asks the server for these names by name.
// unfollowed reports a name it cannot give: one that is not ASCII (the proxy would send it back in another
// encoding than the client's). A name computed or bound as a parameter is not seen. A text it cannot decode
// or lex is read byte by byte instead (rawCustomSettings), never taken for one that names none.
func CustomSettings(raw []byte, s Settings) (names []string, unfollowed bool) {
	text, why := decode(raw, s)
	if why != "" {
		return rawCustomSettings(raw)
	}
	l := newLexer(text, s.StandardConformingStrings)
	var toks []token
	for t := l.next(); t.kind != tokEOF; t = l.next() {
		toks = append(toks, t)
	}
	if l.err != nil {
		return rawCustomSettings(raw)
	}
	ident := func(i int) string {
		if i >= len(toks) || !toks[i].isIdent() {
			return ""
		}
		v, _ := l.identValue(toks[i], nil)
		return string(v)
	}
	self := func(i int, c byte) bool {
		return i < len(toks) && toks[i].kind == tokSelf && toks[i].end == toks[i].start+1 && text[toks[i].start] == c
	}
	add := func(name string) {
		if !strings.Contains(name, ".") {
			return
		}
		for i := 0; i < len(name); i++ {
			if name[i] >= 0x80 {
				unfollowed = true
				return
			}
		}
		names = append(names, strings.ToLower(name))
	}
	start := true
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		if t.kind == tokSemicolon {
			start = true
			continue
		}
		first := start
		start = false
		w := ident(i)
		switch {
		case first && (w == "set" || w == "reset") && t.kind == tokIdent:
			j := i + 1
			if w == "set" && (ident(j) == "session" || ident(j) == "local") && toks[j].kind == tokIdent && !self(j+1, '.') {
				j++
			}
			var name strings.Builder
			for ; j < len(toks) && toks[j].isIdent(); j += 2 {
				name.WriteString(ident(j))
				if !self(j+1, '.') {
					break
				}
				name.WriteByte('.')
			}
			add(name.String())
		case w == "set_config" && t.kind == tokIdent && self(i+1, '(') && i+2 < len(toks) && toks[i+2].isString():
			v, err := l.stringValue(toks[i+2], nil)
			if err == nil {
				add(string(v))
			}
		}
	}
	return names, unfollowed
}

// rawCustomSettings is CustomSettings for a text it cannot read: non-ASCII sent before the server answered an
// earlier statement of its batch that may have changed client_encoding, or one its lexer cannot read (the
// server may read it all the same). Until 2026-12-04 such a text named no setting, so a SET of a custom
// setting in it stayed on the server connection unasked for, where the next client read it (the settings
// fuzzer's finding: an RLS tenant reached another client). Every byte that can start or end a name, a quote or
// a dot is ASCII in every client encoding PostgreSQL accepts; multi-byte characters may only hide letters,
// digits or a backslash in their later bytes. So each dot between two ASCII name characters is read as part of
// the dotted name around it (one that starts with a digit is a number), and a dot next to anything else (a
// space, a quote, a comment, a byte of a multi-byte character), or an escape that may spell a dot or a name
// without its letters (a backslash, a U& string or identifier), is a setting it cannot name: unfollowed. It
// over-asks: every dotted name of the text (a schema-qualified table) is asked for, at a probe's cost only.
func rawCustomSettings(raw []byte) (names []string, unfollowed bool) {
	if MayEscape(raw) {
		return nil, true
	}
	nameByte := func(c byte) bool { return c < 0x80 && isIdentCont(c) }
	for i := 0; i < len(raw); {
		j := bytes.IndexByte(raw[i:], '.')
		if j < 0 {
			break
		}
		dot := i + j
		if dot == 0 || dot+1 == len(raw) || !nameByte(raw[dot-1]) || !nameByte(raw[dot+1]) {
			return names, true
		}
		start, end := dot, dot
		for start > 0 && (nameByte(raw[start-1]) || raw[start-1] == '.') {
			start--
		}
		for end < len(raw) && (nameByte(raw[end]) || raw[end] == '.') {
			end++
		}
		if start > 0 && raw[start-1] >= 0x80 || end < len(raw) && raw[end] >= 0x80 {
			return names, true // the name goes on in a multi-byte character
		}
		if run := raw[start:end]; !isDigit(run[0]) {
			if name := strings.ToLower(string(run)); !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
		i = end
	}
	return names, false
}

// MayEscape reports whether a text holds an escape that may spell any character, a dot or a name's letters
// among them: a backslash (in an escape string, E'...', or in any string under standard_conforming_strings
// off), or U& (a Unicode-escaped string or quoted identifier, in any letter case).
func MayEscape(raw []byte) bool {
	if bytes.IndexByte(raw, '\\') >= 0 {
		return true
	}
	for i := 1; i < len(raw); i++ {
		j := bytes.IndexByte(raw[i:], '&')
		if j < 0 {
			return false
		}
		i += j
		if c := raw[i-1]; c == 'u' || c == 'U' {
			return true
		}
	}
	return false
}

// BeginsWithTransactionModes reports whether a Query text's first statement is BEGIN or START TRANSACTION with
// transaction modes (ISOLATION LEVEL, READ ONLY or WRITE, [NOT] DEFERRABLE), which PostgreSQL refuses once a
// statement of the transaction took a snapshot (25001): the transaction pooler's token statement in front of it
// must then be one that takes none (proxy/pooled.go). Text the lexer cannot read gives false.
func BeginsWithTransactionModes(raw []byte, s Settings) bool {
	c := ClassifyPooling(raw, s)
	return c.Begin && c.Modes
}

// LoneBegin reports whether a Query text is one statement, BEGIN or START TRANSACTION without transaction
// modes (and semicolons): it opens a block and runs nothing, so the transaction pooler can read what the
// connection held before it and refuse the transaction before the client's next message goes
// (proxy/pooled.go: a verified start). Text the lexer cannot read gives false.
func LoneBegin(raw []byte, s Settings) bool { return ClassifyPooling(raw, s).LoneBegin() }

// LoneBegin is LoneBegin's answer from the class.
func (c PoolingClass) LoneBegin() bool { return c.Begin && !c.Modes && c.Alone }

// PlainStatements reports whether a text is one or more statements that each begin with SELECT, INSERT,
// UPDATE, DELETE, MERGE, WITH, VALUES, TABLE or SHOW: statements that by their own words neither open a
// transaction block nor leave session state (no SET, RESET, BEGIN, PREPARE, DECLARE, LISTEN, CREATE, DO, CALL,
// ...). What the functions they call do is not seen here. The transaction pooler gives such a text a token
// statement that checks nothing (proxy/pooled.go: plainText). Text the lexer cannot read, or of no
// statement, gives false.
func PlainStatements(raw []byte, s Settings) bool { return ClassifyPooling(raw, s).Plain }

// leadWords are a statement's leading words, while every token so far is an identifier of any form: the first
// three, a fourth and more only counted (n), as the first three decide. Each is kept in lower case, in a buffer
// of its own (transaction_deferrable fits: no allocation), with whether it was written unquoted: only an
// unquoted word is a keyword (BEGIN, SET, LOCAL, TRANSACTION; "begin" is a name), and a setting's name may be
// either, in any case, since PostgreSQL matches setting names case-insensitively. Until 2026-12-05 only unquoted
// words were read, so SET "transaction_isolation" = ... was not taken for one that sets the transaction's
// characteristics (ModesLater), and failed 25001 through the pool where directly it runs.
type leadWords struct {
	buf  [3][24]byte
	size [3]int // of each word in buf; -1 for one longer than buf, which no keyword or name compared is
	bare [3]bool
	n    int
}

// add appends the identifier t, read by l.
func (w *leadWords) add(l *lexer, t token) {
	if i := w.n; i < len(w.buf) {
		v, _ := l.identValue(t, w.buf[i][:0])
		w.size[i], w.bare[i] = len(v), t.kind == tokIdent
		if len(v) > len(w.buf[i]) {
			w.size[i] = -1 // appended beyond the buffer, elsewhere: long, a word that nothing compared is
		}
		for j := range max(w.size[i], 0) {
			w.buf[i][j] = lower(w.buf[i][j]) // unquoted is lower case already; a quoted name in any case names the same setting
		}
	}
	w.n++
}

// word is the i-th word, nil where there is none or it is long.
func (w *leadWords) word(i int) []byte {
	if i < w.n && i < len(w.buf) && w.size[i] >= 0 {
		return w.buf[i][:w.size[i]]
	}
	return nil
}

// keyword is the i-th word where it was written unquoted, else "".
func (w *leadWords) keyword(i int) string {
	if i < len(w.bare) && w.bare[i] {
		return string(w.word(i))
	}
	return ""
}

// name is the i-th word however it was written, "" where there is none.
func (w *leadWords) name(i int) string { return string(w.word(i)) }
