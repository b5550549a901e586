package rewrite

import (
	"encoding/hex"
	"fmt"
	"strings"
)

// Marker is a fencing error raised inside a rewritten statement. PostgreSQL
// reports it as SQLSTATE 22P02 with a message containing the marker string
// (see fragments.go); the proxy decodes it and sends the client Code with
// the texts from Describe instead.
type Marker struct {
	Code     string // CodeStale, CodeMissing or CodeInvalid
	Table    string // label of the protected table
	RowToken string // 55F01: the token the row holds
	Token    string // 55F01: the session's token; 55F03: the invalid value
	Setting  string // 55F02, 55F03: the token setting's name
	// Lock is set for a lock fence's 55F01 (the lock named in the lock
	// setting has accepted a newer token, RowToken, than the session's
	// Token), and for the 55F03 of a lock setting that holds
	// PoolPlaceholder. The in-database guard raises both; see package schema.
	Lock string
}

// PoolPlaceholder is the session-level value of the token and lock settings
// on every server connection of a transaction pool (package proxy), where a
// client's values are only ever transaction-local: never a client's. As a
// token it is not a number (55F03). As a lock the guard refuses it too
// (55F03, Marker.Lock): a transaction the proxy gave no values (one after a
// COMMIT in the same Query) may set a token of its own, and must not then
// write under a lock that every such transaction of every client shares,
// instead of the client's own lock.
const PoolPlaceholder = "fenceproxy:pooled"

const markerPrefix = "fenceproxy|"
const markerEnd = "|."

// DecodeMarker finds a marker in a server error message. It does not depend
// on the message's language: it looks for the marker itself, which ends at
// the last "|.".
func DecodeMarker(msg string) (m Marker, ok bool) {
	i := strings.Index(msg, markerPrefix)
	if i < 0 {
		return Marker{}, false
	}
	j := strings.LastIndex(msg, markerEnd)
	if j < i+len(markerPrefix) {
		return Marker{}, false
	}
	parts := strings.SplitN(msg[i+len(markerPrefix):j], "|", 4)
	if len(parts) != 4 || parts[3] == "" {
		return Marker{}, false
	}
	m = Marker{Code: parts[0], Table: parts[3]}
	switch m.Code {
	case CodeStale:
		if !digits(parts[1]) || !digits(parts[2]) {
			return Marker{}, false
		}
		m.RowToken, m.Token = parts[1], parts[2]
	case CodeMissing:
		if parts[1] == "" || parts[2] != "" {
			return Marker{}, false
		}
		m.Setting = parts[1]
	case CodeInvalid:
		v, err := hex.DecodeString(parts[2])
		if parts[1] == "" || err != nil {
			return Marker{}, false
		}
		m.Setting, m.Token = parts[1], string(v)
		if len(v) == 0 {
			// The setting is unset or empty: a missing token (fragments.go).
			m.Code, m.Token = CodeMissing, ""
		}
	default:
		return Marker{}, false
	}
	return m, true
}

func digits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// staleHint is the HINT of every 55F01.
const staleHint = "This writer's lock has been taken over by a newer holder. Stop writing, acquire the lock again " +
	"and re-read the data before writing; do not retry with the same token."

// Describe gives the ErrorResponse texts for the marker, per the contract:
// the message starts with the error's name and names the table; 55F01 says in
// DETAIL which tokens were compared and in HINT what to do.
func (m Marker) Describe() (message, detail, hint string) {
	switch m.Code {
	case CodeStale:
		if m.Lock != "" {
			return fmt.Sprintf("stale fencing token: lock %s has accepted a newer token; refusing the write to %s", m.Lock, m.Table),
				fmt.Sprintf("Lock %s has accepted fencing token %s; this session presented token %s.", m.Lock, m.RowToken, m.Token),
				staleHint
		}
		return fmt.Sprintf("stale fencing token: a newer lock holder has already written to %s", m.Table),
			fmt.Sprintf("The row holds fencing token %s; this session presented token %s.", m.RowToken, m.Token),
			staleHint
	case CodeMissing:
		return fmt.Sprintf("missing fencing token: writes to %s need %s to be set", m.Table, m.Setting),
			"",
			fmt.Sprintf("Take the lock, then SET %s = <token> (or run the writer under \"fenceproxy lock\").", m.Setting)
	case CodeInvalid:
		if m.Lock != "" {
			return fmt.Sprintf("no fencing lock for a write to %s: %s holds %s, the transaction pool's placeholder, not a lock", m.Table, m.Setting, m.Lock),
				"In transaction pooling, fenceproxy gives each transaction the client's token and lock where it starts; a transaction it cannot give them to (one started by a later statement of the same Query or batch, after a COMMIT or ROLLBACK) holds the placeholder.",
				"Send each transaction as a Query or batch of its own."
		}
		if _, ok := ValidToken(m.Token); ok {
			// Only the inline fence (inline.go) raises 55F03 for a valid token: the setting is not the token
			// the proxy gave the transaction.
			return fmt.Sprintf("fencing token changed behind the proxy for a write to %s: %s is %q, not the token fenceproxy gave this transaction", m.Table, m.Setting, m.Token),
				fmt.Sprintf("In transaction pooling a change to %s that fenceproxy cannot follow (a function calling set_config?), or one between the Bind of the unnamed portal and its Execute, is refused.", m.Setting),
				fmt.Sprintf("Set %s with SET, SET LOCAL or set_config in the statement text.", m.Setting)
		}
		return fmt.Sprintf("invalid fencing token for a write to %s: %q", m.Table, m.Token),
			fmt.Sprintf("%s must be a decimal integer in 1..9223372036854775807.", m.Setting),
			fmt.Sprintf("Set %s to the token of the lock you hold.", m.Setting)
	}
	return "", "", ""
}

// StaleLock returns the lock a lock fence's 55F01 message names (the message Describe gives a Marker with
// Lock set, for the table), and false for any other message.
func StaleLock(message, table string) (string, bool) {
	text, _, _ := Marker{Code: CodeStale, Table: table, Lock: "\x00"}.Describe()
	prefix, suffix, _ := strings.Cut(text, "\x00")
	if len(message) <= len(prefix)+len(suffix) || !strings.HasPrefix(message, prefix) || !strings.HasSuffix(message, suffix) {
		return "", false
	}
	return message[len(prefix) : len(message)-len(suffix)], true
}
