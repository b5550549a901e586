package rewrite

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
	var words []string // the first statement's unquoted words, lower case
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
		w, _ := l.identValue(t, nil)
		if string(w) == "concurrently" {
			concurrently = true
		}
		if len(words) < 2 {
			words = append(words, string(w))
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
	first, second := "", ""
	if len(words) > 0 {
		first = words[0]
	}
	if len(words) > 1 {
		second = words[1]
	}
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

// BeginsWithTransactionModes reports whether a Query text's first statement is BEGIN or START TRANSACTION with
// transaction modes (ISOLATION LEVEL, READ ONLY or WRITE, [NOT] DEFERRABLE), which PostgreSQL refuses once a
// statement of the transaction took a snapshot (25001): the transaction pooler's token statement in front of it
// must then be one that takes none (proxy/pooled.go). Text the lexer cannot read gives false.
func BeginsWithTransactionModes(raw []byte, s Settings) bool {
	text, why := decode(raw, s)
	if why != "" {
		return false
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
	if l.err != nil || len(words) == 0 {
		return false
	}
	switch {
	case words[0] == "begin" && len(words) > 1 && (words[1] == "work" || words[1] == "transaction"):
		return tokens > 2
	case words[0] == "begin":
		return tokens > 1
	case words[0] == "start" && len(words) > 1 && words[1] == "transaction":
		return tokens > 2
	}
	return false
}
