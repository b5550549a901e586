package rewrite

import "strings"

// OwnTransaction reports whether a Query text must reach the server as it is, without the transaction pooler's
// token statement put before it (proxy/pooled.go): a text of no statement (the server answers it with
// EmptyQueryResponse, which a statement in front would turn into a result), or one statement that PostgreSQL
// refuses inside a transaction block (VACUUM, DISCARD ALL, CREATE/DROP DATABASE, ... CONCURRENTLY), which a
// statement in front would put into one. Such statements write no table through the proxy; run without the
// token statement they see the pooled connection's placeholder, which no fence accepts (fail closed).
// Text the lexer cannot read gets the token statement (false).
func OwnTransaction(raw []byte, s Settings) bool {
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
	case "vacuum", "discard", "cluster", "reindex", "checkpoint", "commit", "rollback", "end", "abort":
		return true
	case "create", "drop":
		return second == "database" || second == "tablespace" || second == "subscription"
	case "alter":
		return second == "system" || second == "subscription" || second == "database"
	}
	return false
}

// CustomSettings returns the names (lower case) of the custom settings (a dotted name, such as myapp.tenant)
// that a text may set or reset at session level: the target of a SET or RESET statement, and the first argument
// of set_config when it is a string constant. PostgreSQL lists custom settings nowhere (pg_settings leaves
// them out), so the transaction pooler (proxy/pooledsettings.go) asks the server for these names by name.
// unfollowed reports a name it cannot give: one that is not ASCII (the proxy would send it back in another
// encoding than the client's). A name computed or bound as a parameter is not seen. Text the lexer cannot read
// gives no names.
func CustomSettings(raw []byte, s Settings) (names []string, unfollowed bool) {
	text, why := decode(raw, s)
	if why != "" {
		return nil, false
	}
	l := newLexer(text, s.StandardConformingStrings)
	var toks []token
	for t := l.next(); t.kind != tokEOF; t = l.next() {
		toks = append(toks, t)
	}
	if l.err != nil {
		return nil, false
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

// BeginsWithTransactionModes reports whether a Query text's first statement is BEGIN or START TRANSACTION with
// transaction modes (ISOLATION LEVEL, READ ONLY or WRITE, [NOT] DEFERRABLE), which PostgreSQL refuses once a
// statement of the transaction took a snapshot (25001): the transaction pooler's token statement in front of it
// must then be one that takes none (proxy/pooled.go). Text the lexer cannot read gives false.
func BeginsWithTransactionModes(raw []byte, s Settings) bool {
	begin, modes, _ := transactionStart(raw, s)
	return begin && modes
}

// LoneBegin reports whether a Query text is one statement, BEGIN or START TRANSACTION without transaction
// modes (and semicolons): it opens a block and runs nothing, so the transaction pooler can read what the
// connection held before it and refuse the transaction before the client's next message goes
// (proxy/pooled.go: a verified start). Text the lexer cannot read gives false.
func LoneBegin(raw []byte, s Settings) bool {
	begin, modes, alone := transactionStart(raw, s)
	return begin && !modes && alone
}

// transactionStart reads a text's first statement: whether it is BEGIN or START TRANSACTION, whether with
// transaction modes, and whether it is the text's only statement.
func transactionStart(raw []byte, s Settings) (begin, modes, alone bool) {
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

// PlainStatements reports whether a text is one or more statements that each begin with SELECT, INSERT,
// UPDATE, DELETE, MERGE, WITH, VALUES, TABLE or SHOW: statements that by their own words neither open a
// transaction block nor leave session state (no SET, RESET, BEGIN, PREPARE, DECLARE, LISTEN, CREATE, DO, CALL,
// ...). What the functions they call do is not seen here. The transaction pooler gives such a text a token
// statement that checks nothing (proxy/pooled.go: plainText). Text the lexer cannot read, or of no
// statement, gives false.
func PlainStatements(raw []byte, s Settings) bool {
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
