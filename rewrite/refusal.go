package rewrite

import (
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// The refusal protocol. A statement the proxy refuses itself (55F03 at a SET, 55F04) is not answered by the
// proxy: it is replaced by RefusalSQL, a statement PostgreSQL fails at parse analysis with an error whose
// message carries the refusal. The server therefore aborts the transaction, answers the rest of a pipeline and
// sends ReadyForQuery exactly as for any error of its own, and the proxy only has to translate that error on
// its way back (Translate), as it translates the markers the fence raises inside rewritten statements.
//
// Both kinds of marker travel inside the text of a 22P02 "invalid input syntax for type bigint" error:
//
//	fenceproxy|refuse|CODE|TABLE|MESSAGE[\x1eHINT]   a refusal (RefusalSQL)
//	fenceproxy|refuse|CODE||@NAME[:ARG][|...]           a refusal known by its name (NamedRefusalMarker)
//	fenceproxy|CODE|A|B|TABLE|.                       a fence error (Marker, fragments.go; the guard's too)

// refusePrefix marks refusals decided by the proxy.
const refusePrefix = markerPrefix + "refuse|"

// hintSep separates a refusal's message from its HINT inside the refusal marker. Messages quote user-supplied
// values with %q, which escapes control characters, so the separator cannot come from a client.
const hintSep = "\x1e"

// refusalFallback is sent when the refusal statement cannot be built (a pg_query library failure).
const refusalFallback = "SELECT 'fenceproxy|refuse|55F04||unfenceable write'::pg_catalog.int8"

// MarkerPrefix is the text every marker starts with; a server error without it needs no translation.
const MarkerPrefix = markerPrefix

// RefusalSQL is the statement that makes the server fail with the refusal code, table, message and hint (hint
// may be ""). It is built as a parse tree and deparsed, so the message is quoted correctly whatever it contains.
func RefusalSQL(code, table, message, hint string) string {
	// Parsing a fixed template gives a tree with the version the deparser expects; only the literal changes.
	tree, err := pg.Parse("SELECT ''::pg_catalog.int8")
	if err != nil {
		return refusalFallback
	}
	cast := tree.Stmts[0].Stmt.GetSelectStmt().TargetList[0].GetResTarget().Val.GetTypeCast()
	cast.Arg = pg.MakeAConstStrNode(RefusalMarker(code, table, message, hint), -1)
	sql, err := pg.Deparse(tree)
	if err != nil {
		// Deparse of this fixed shape cannot fail short of a library bug; refuse with a plain statement then.
		return refusalFallback
	}
	return sql
}

// RefusalMarker is the text that, as the input of a failed cast to bigint, makes the proxy give the client the
// refusal code, table, message and hint (hint may be "").
func RefusalMarker(code, table, message, hint string) string {
	if hint != "" {
		message += hintSep + hint
	}
	return refusePrefix + code + "|" + table + "|" + message
}

// NamedRefusalMarker is RefusalMarker for a refusal known by its name (namedRefusal), with arg (a setting's
// name) in its message: the marker holds only the code, the name and arg, and Translate gives the message and hint.
// It is for statements whose text must stay short: the token statement of transaction pooling goes in front of
// the client's text, and the server shows only the first track_activity_query_size bytes of a Query in
// pg_stat_activity. Anything after a "|" that follows is ignored (a value appended to keep it from being folded).
func NamedRefusalMarker(code, name, arg string) string {
	m := refusePrefix + code + "||@" + name
	if arg != "" {
		m += ":" + arg
	}
	return m
}

// Names of refusals (NamedRefusalMarker).
const (
	// RefusalPooledSetting: the token or lock (arg) of a pooled server connection is not the placeholder at
	// the start of a transaction of the client that left it so.
	RefusalPooledSetting = "pooled-setting"
	// RefusalPooledRole: the role of a pooled server connection is not the one it logged in as, at the start of
	// a transaction of the client that left it so.
	RefusalPooledRole = "pooled-role"
)

// namedRefusal is the message and hint of the refusal called name.
func namedRefusal(name, arg string) (message, hint string, ok bool) {
	switch name {
	case RefusalPooledSetting:
		return "invalid fencing token: " + arg + " was changed on this pooled server connection behind fenceproxy's back (a function that calls set_config?); the transaction is refused",
			"Set it with SET, SET LOCAL or set_config in the statement, not in a function.", true
	case RefusalPooledRole:
		return "the role of this pooled server connection was changed in a way fenceproxy cannot follow (a function that calls set_config?); the transaction is refused",
			"Use SET ROLE in the client's own statements, or pool.mode session.", true
	}
	return "", "", false
}

// Translation is the error the client gets for a server error that carries a marker.
type Translation struct {
	Code, Message, Detail, Hint string
	// For logs and metrics: the protected table, the token the session presented and the row's newer token
	// (55F01), as far as the marker says.
	Table, Token, RowToken string
}

// Translate reads the marker in a server error's message (a refusal or a fence error) and returns the error
// the contract gives the client; false when the message holds no well-formed marker.
func Translate(serverMessage string) (Translation, bool) {
	i := strings.Index(serverMessage, markerPrefix)
	if i < 0 {
		return Translation{}, false
	}
	marker := serverMessage[i:]
	// The server quotes the cast's input: the marker ends before the last quote.
	if j := strings.LastIndexByte(marker, '"'); j >= 0 {
		marker = marker[:j]
	}
	if rest, ok := strings.CutPrefix(marker, refusePrefix); ok {
		parts := strings.SplitN(rest, "|", 3)
		if len(parts) != 3 {
			return Translation{}, false
		}
		t := Translation{Code: parts[0], Table: parts[1]}
		if named, ok := strings.CutPrefix(parts[2], "@"); ok {
			named, _, _ = strings.Cut(named, "|")
			name, arg, _ := strings.Cut(named, ":")
			if t.Message, t.Hint, ok = namedRefusal(name, arg); !ok {
				return Translation{}, false
			}
			return t, true
		}
		t.Message, t.Hint, _ = strings.Cut(parts[2], hintSep)
		return t, true
	}
	m, ok := DecodeMarker(marker)
	if !ok {
		return Translation{}, false
	}
	t := Translation{Code: m.Code, Table: m.Table, Token: m.Token, RowToken: m.RowToken}
	t.Message, t.Detail, t.Hint = m.Describe()
	return t, true
}
