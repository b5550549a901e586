package rewrite

import (
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// tokenScope is what a text does to the token setting beyond its last value:
// every literal it sets (a verifier must check each one: with two set_config
// calls in one statement, the one left in force need not be the last one
// written), and whether any of them outlives the transaction.
//
// The proxy (proxy.checkPlan) uses it for two rules:
//
//   - with verification on, every value in tokens is verified, and a
//     persistent default (ALTER ROLE/DATABASE/SYSTEM ... SET) is refused:
//     it would give later sessions a token the proxy never sees set;
//   - with token.scope transaction, any session-level token is refused, because
//     behind a transaction pooler it stays on the server connection for the
//     next client.
type tokenScope struct {
	tokens     []int64 // every token literal set, in text order
	session    bool    // a session-level (or persistent) set of the token, or of a setting named by an expression
	persistent bool    // ALTER ROLE/DATABASE/SYSTEM ... SET of the token
	// persistentLock: the same of the lock setting (Plan.LockPersistent)
	persistentLock bool
}

// setConfig records the scope of set_config(name, value, is_local) where
// name is the token setting or an expression (which may evaluate to it).
func (s *tokenScope) setConfig(f *pg.FuncCall) {
	if c := unwrapCast(f.Args[1]).GetAConst(); c != nil && c.Isnull {
		return // NULL resets the setting: nothing is set
	}
	if !constTrue(f.Args[2]) {
		s.session = true
	}
}

// persistentSet records ALTER ROLE/DATABASE/SYSTEM ... SET of the token
// setting; its value is validated (and listed in tokens) when the walk reaches
// the VariableSetStmt inside.
func (a *analysis) persistentSet(v *pg.VariableSetStmt) {
	if v == nil {
		return
	}
	switch v.Kind {
	case pg.VariableSetKind_VAR_SET_VALUE, pg.VariableSetKind_VAR_SET_CURRENT:
	default:
		return
	}
	switch {
	case strings.EqualFold(v.Name, a.r.setting):
		a.scope.persistent, a.scope.session = true, true
	case a.r.lockSetting != "" && strings.EqualFold(v.Name, a.r.lockSetting):
		a.scope.persistentLock = true
	}
}

// constTrue reports whether n is the boolean constant true as PostgreSQL
// reads a bool argument: true, or a string constant ('t', 'on', 'yes', ...),
// possibly cast. Anything else, including parameters and expressions, may be
// false.
func constTrue(n *pg.Node) bool {
	c := constArg(n)
	if c == nil || c.Isnull {
		return false
	}
	switch v := c.Val.(type) {
	case *pg.A_Const_Boolval:
		return v.Boolval.GetBoolval()
	case *pg.A_Const_Sval:
		// boolin: trimmed, case-insensitive, any unique prefix of true/yes/on, or 1.
		s := strings.ToLower(strings.TrimSpace(v.Sval.GetSval()))
		switch {
		case s == "":
			return false
		case strings.HasPrefix("true", s), strings.HasPrefix("yes", s), s == "on", s == "1":
			return true
		}
	}
	return false
}
