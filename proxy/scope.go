package proxy

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

// Where the token in force can come from, and what the proxy does about each path when it verifies tokens
// (token.verify) or runs behind a transaction pooler (token.scope: transaction):
//
//   - SET, SET LOCAL, set_config with constant arguments, a function's SET clause: every literal in the text is
//     verified (rewrite.Plan.Tokens), not only the last one;
//   - set_config with a computed name or value: refused with verification on (rewrite.Plan.TokenDynamic);
//   - ALTER ROLE/DATABASE/SYSTEM ... SET of the token: refused with verification on or scope transaction (a
//     default for later sessions that the proxy never sees); its form is validated always; of the lock:
//     refused in transaction pooling (a pooled connection's default would reach clients that set no lock);
//   - startup options and startup parameters: verified (checkStartupToken), refused with scope transaction;
//   - a FunctionCall ('F') message of set_config for the token setting: refused with verification on or scope
//     transaction; other fastpath calls pass;
//   - a user function wrapping set_config: invisible to the proxy; the in-database guard covers it.
//
// With scope transaction, any session-level token (SET without LOCAL, set_config(..., false) or with a computed
// is_local, startup options) is refused with 55F03 and a hint to use SET LOCAL.

// setConfigOID is pg_catalog.set_config(text, text, boolean)'s OID, fixed in PostgreSQL's pg_proc.dat.
const setConfigOID = 2078

// transactionScope reports whether token.scope is transaction.
func (s *Server) transactionScope() bool { return s.cfg.Token.Scope == config.TokenScopeTransaction }

// scopeHint is the HINT of every session-level token refusal.
func (s *Server) scopeHint() string {
	return fmt.Sprintf("token.scope is transaction: use SET LOCAL %s = <token> inside a transaction (or set_config('%s', '<token>', true)).",
		s.cfg.Token.Setting, s.cfg.Token.Setting)
}

// checkScope refuses a plan that sets the token in a way the configuration does not allow: a persistent default
// with verification on or scope transaction, a session-level token with scope transaction.
func (s *Server) checkScope(plan rewrite.Plan) (rewrite.Plan, bool) {
	setting := s.cfg.Token.Setting
	if plan.TokenPersistent && (s.verifier != nil || s.transactionScope() || s.pooledTransactions()) {
		why := "fenceproxy verifies tokens and never sees the sessions that would start with this default"
		hint := fmt.Sprintf("Give each writer its token with SET %s (or SET LOCAL) through the proxy.", setting)
		if s.verifier == nil && !s.transactionScope() {
			why = "pool.mode is transaction, and pooled server connections keep the defaults they started with"
		} else if s.verifier == nil {
			why = "token.scope is transaction, and a default applies to whole sessions"
			hint = s.scopeHint()
		}
		return rewrite.Plan{Action: rewrite.Refuse, Code: sqlstateInvalid, Hint: hint, Message: fmt.Sprintf(
			"invalid fencing token: ALTER ROLE/DATABASE/SYSTEM ... SET %s is refused: %s", setting, why)}, true
	}
	if plan.LockPersistent && s.pooledTransactions() {
		lock := s.cfg.Token.LockSetting
		return rewrite.Plan{Action: rewrite.Refuse, Code: sqlstateInvalid,
			Hint:    fmt.Sprintf("Give each writer its lock with SET %s (or SET LOCAL) through the proxy.", lock),
			Message: fmt.Sprintf("invalid fencing token: ALTER ROLE/DATABASE/SYSTEM ... SET %s is refused: pool.mode is transaction, and pooled server connections would give the default to clients that set no lock", lock)}, true
	}
	if plan.TokenSession && s.transactionScope() {
		return rewrite.Plan{Action: rewrite.Refuse, Code: sqlstateInvalid, Hint: s.scopeHint(), Message: fmt.Sprintf(
			"invalid fencing token: a session-level %s would stay on a pooled server connection for its next client", setting)}, true
	}
	return plan, false
}

// fastpathGuarded reports whether FunctionCall messages must be inspected for set_config of the token.
func (s *Server) fastpathGuarded() bool {
	return s.verifier != nil || s.transactionScope() || s.pooledTransactions()
}

// functionCallOut writes the FunctionCall whose body is given to w, or, when it calls set_config of the token
// setting, a statement that fails with the refusal: the client gets an ErrorResponse and a ReadyForQuery, as for
// a FunctionCall that fails.
func (ss *session) functionCallOut(w msgSink, body []byte) error {
	setsToken, err := fastpathSetsToken(body, ss.srv.cfg.Token.Setting)
	if err != nil {
		return err
	}
	if !setsToken {
		writeMsg(w, msgFunctionCall, body, "")
		return nil
	}
	hint := fmt.Sprintf("Use SET %s = <token> (SET LOCAL with token.scope transaction).", ss.srv.cfg.Token.Setting)
	if ss.srv.transactionScope() {
		hint = ss.srv.scopeHint()
	}
	writeMsg(w, msgQuery, nil, ss.refusal(rewrite.Plan{Action: rewrite.Refuse, Code: sqlstateInvalid, Hint: hint, Message: fmt.Sprintf(
		"invalid fencing token: a FunctionCall of set_config for %s cannot be verified or scoped by fenceproxy", ss.srv.cfg.Token.Setting)}))
	if ss.pooled != nil {
		ss.pooled.queryDroppedUnnamed(ss.pooled.sc) // the refusal's Query dropped the server's unnamed statement (pl.mu held)
	}
	return nil
}

// fastpathSetsToken reports whether a FunctionCall body (function OID, argument format codes, arguments, result
// format) calls set_config with a first argument that is the token setting, or that it cannot read.
func fastpathSetsToken(body []byte, setting string) (bool, error) {
	if len(body) < 4 {
		return false, fmt.Errorf("%w: FunctionCall message of %d bytes", errProtocol, len(body))
	}
	if binary.BigEndian.Uint32(body) != setConfigOID {
		return false, nil
	}
	// The first argument's bytes are the setting's name in text and in binary format alike (text's send form is
	// its characters). Anything unreadable may be the token: refuse.
	b := body[4:]
	if len(b) < 2 {
		return true, nil
	}
	nfmt := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	if len(b) < 2*nfmt+2 {
		return true, nil
	}
	b = b[2*nfmt:]
	if nargs := binary.BigEndian.Uint16(b); nargs < 1 {
		return true, nil
	}
	b = b[2:]
	if len(b) < 4 {
		return true, nil
	}
	n := int32(binary.BigEndian.Uint32(b))
	b = b[4:]
	if n < 0 || int(n) > len(b) {
		return n >= 0, nil // NULL name: the server rejects it
	}
	name := strings.TrimSpace(string(b[:n]))
	// PostgreSQL folds a setting name's case; quoting and spaces around the dot are SQL syntax, not part of the
	// name, but compare leniently: any name that is the setting after removing quotes is the setting.
	return strings.EqualFold(strings.ReplaceAll(name, `"`, ""), setting), nil
}
