package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// markerPrefix is how every fencing error raised by rewritten SQL, and every refusal the proxy sends to the
// server, shows up in the server's ErrorResponse (the refusal protocol: rewrite/refusal.go).
var markerPrefix = []byte(rewrite.MarkerPrefix)

// msgSink is where the core writes the messages it sends: a bufio.Writer in the goroutine transport, an outBuf
// in the event loop. Both copy what they are given, so a body passed on may be the reader's own buffer.
type msgSink interface {
	io.Writer
	io.ByteWriter
	io.StringWriter
}

// queryOut writes the Query whose body is given to w, rewritten or refused as p says when the server reads it
// under set.
func (ss *session) queryOut(w msgSink, p Planner, body []byte, set rewrite.Settings, quiet bool) error {
	text, ok := planText(msgQuery, body)
	if !ok {
		return fmt.Errorf("%w: Query message that is not one zero-terminated string", errProtocol)
	}
	ss.prep.clientText(text)
	ss.inlined = false
	set.InlineToken = ss.inlineToken != ""
	plan := ss.checkPlan(p.Plan(text, set))
	if ss.srv.router != nil {
		plan = ss.keptFencedQuery(plan, text, set)
	}
	plan = ss.sqlPrepared(text, plan) // reloadkept.go
	switch plan.Action {
	case rewrite.Rewrite:
		ss.srv.metrics.rewritten()
		var sql string
		ss.inlined = plan.TokenSegs != nil
		switch {
		case plan.TokenSegs != nil:
			sql = plan.WithToken(ss.inlineToken)
		case ss.sqlOnly:
			sql = plan.SQL
		default:
			sql = ss.prep.statementFor(plan, ss.srv.metrics)
		}
		ss.notePositions(quiet, p, text, set, &plan, sql) // positions.go
		writeQueryMsg(w, ss.takeQueryPrefix(w), nil, sql)
		return nil
	case rewrite.Refuse:
		writeQueryMsg(w, ss.takeQueryPrefix(w), nil, ss.refusal(plan))
	default:
		writeQueryMsg(w, ss.takeQueryPrefix(w), body, "")
	}
	ss.notePositions(quiet, p, text, set, &plan, "")
	return nil
}

// takeQueryPrefix writes to w what goes right before the client's next Query message (the token statement of a
// lone CALL or DO: pooled.go, procedureAlone), and returns the text that goes before its text (injectTokens),
// forgetting both; "" outside transaction pooling. Its caller writes the Query to w next.
func (ss *session) takeQueryPrefix(w msgSink) string {
	if k := ss.queryToken; k != tokenNone {
		ss.queryToken = tokenNone
		ss.procedureAlone(w, k)
	}
	p := ss.queryPrefix
	ss.queryPrefix = ""
	return p
}

// parseOut writes the Parse whose body is given to w, its SQL rewritten or refused as p says when the server
// reads it under set.
func (ss *session) parseOut(w msgSink, p Planner, body []byte, set rewrite.Settings, quiet bool) error {
	plan, query, sql, err := ss.fenceParseAs(w, p, body, set)
	if err == nil {
		ss.notePositions(quiet, p, query, set, &plan, sql) // positions.go
		ss.keepStmt(body, query, plan, set)                // reloadkept.go
	}
	if err == nil && ss.rewroteParse {
		ss.srv.metrics.rewritten()
	}
	return err
}

// fenceParse is parseOut without the metrics: the proxy's own Parse of a client's text again (refenceUnnamed)
// is not another statement of the client's.
func (ss *session) fenceParse(w msgSink, p Planner, body []byte, set rewrite.Settings) error {
	_, _, _, err := ss.fenceParseAs(w, p, body, set)
	return err
}

// fenceParseAs is fenceParse, which also returns the plan, the client's query and the text sent for it.
func (ss *session) fenceParseAs(w msgSink, p Planner, body []byte, set rewrite.Settings) (rewrite.Plan, []byte, string, error) {
	ss.rewroteParse = false
	name, rest, ok := cutNul(body)
	if !ok {
		return rewrite.Plan{}, nil, "", fmt.Errorf("%w: Parse message with an unterminated statement name", errProtocol)
	}
	query, tail, ok := cutNul(rest)
	if !ok {
		return rewrite.Plan{}, nil, "", fmt.Errorf("%w: Parse message with an unterminated query", errProtocol)
	}
	ss.prep.clientText(query)
	ss.inlined = false
	set.InlineToken = ss.inlineToken != ""
	plan := ss.checkPlan(p.Plan(query, set))
	if ss.srv.router != nil {
		ss.noteKeptFenced(plan) // the statement stays, named or unnamed, for Binds to come
		if ss.keptFenced == "" && commitsPrepared(query, set) {
			ss.keptFenced = preparedTxTables // its Executes are judged as a fenced statement's (keptFencedRefused)
		}
	}
	var sql string
	switch plan.Action {
	case rewrite.Rewrite:
		ss.rewroteParse = true
		sql = plan.WithToken(ss.inlineToken)
		ss.inlined = plan.TokenSegs != nil
	case rewrite.Refuse:
		sql = ss.refusal(plan)
	default:
		writeMsg(w, msgParse, body, "")
		return plan, query, "", nil
	}
	// name \0 sql \0 parameter types
	w.WriteByte(msgParse)
	n := 4 + len(name) + 1 + len(sql) + 1 + len(tail)
	w.Write([]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
	w.Write(name)
	w.WriteByte(0)
	w.WriteString(sql)
	w.WriteByte(0)
	_, err := w.Write(tail)
	return plan, query, sql, err
}

// writeMsg writes a message whose body is raw, or the string s followed by a zero byte. bufio.Writer
// keeps the error; the next Flush reports it.
func writeMsg(w msgSink, typ byte, raw []byte, s string) {
	n := 4 + len(raw)
	if raw == nil {
		n = 4 + len(s) + 1
	}
	writeHeader(w, typ, n)
	if raw != nil {
		w.Write(raw)
		return
	}
	w.WriteString(s)
	w.WriteByte(0)
}

// writeHeader writes a message's type and its length n (the length word included, the type not).
func writeHeader(w msgSink, typ byte, n int) {
	w.WriteByte(typ)
	writeUint32(w, uint32(n))
}

// writeUint32 writes n big-endian, byte by byte: no slice for w to keep.
func writeUint32(w msgSink, n uint32) {
	w.WriteByte(byte(n >> 24))
	w.WriteByte(byte(n >> 16))
	w.WriteByte(byte(n >> 8))
	w.WriteByte(byte(n))
}

// writeParamStatus writes a ParameterStatus message of name and value, as writeMsg would with its body.
func writeParamStatus(w msgSink, name, value string) {
	writeHeader(w, msgParameterStatus, 4+len(name)+1+len(value)+1)
	w.WriteString(name)
	w.WriteByte(0)
	w.WriteString(value)
	w.WriteByte(0)
}

// checkPlan applies the proxy's own checks to a plan: a statement that sets the token to a literal has the
// token verified here, at the SET, before the server accepts it.
func (ss *session) checkPlan(plan rewrite.Plan) rewrite.Plan {
	if plan.Action == rewrite.Refuse {
		return plan
	}
	if refused, ok := ss.srv.checkScope(plan); ok { // scope.go
		return refused
	}
	if ss.srv.router != nil && plan.Action == rewrite.Rewrite && len(plan.Tables) > 0 {
		// A fenced write goes only to the published primary, and to none while two hosts claim to be it.
		if why := ss.fencedWriteRefusal(plan.Tables[0]); why != "" {
			return unfenceablePlan(plan.Tables[0], why)
		}
	}
	if plan.TokenDynamic && ss.srv.verifier != nil {
		// A token computed at execution time (an expression or a parameter of set_config) cannot be checked
		// against etcd here; accepting it would let a forged token through.
		return rewrite.Plan{Action: rewrite.Refuse, Code: sqlstateInvalid, Message: fmt.Sprintf(
			"invalid fencing token: fenceproxy verifies tokens against etcd and cannot verify one computed by an expression or a parameter; use SET %s = <token>", ss.srv.cfg.Token.Setting)}
	}
	// Every literal the text sets is checked, not only the one left in force at its end (which may be any of
	// them: set_config calls run in the order the plan evaluates them).
	for _, tok := range plan.Tokens {
		if code, msg, ok := ss.srv.verifyToken(tok); !ok {
			return rewrite.Plan{Action: rewrite.Refuse, Code: code, Message: msg}
		}
	}
	return plan
}

// unfenceablePlan refuses a write to table (55F04) that the router does not let through now (why: writeRefusal),
// with the contract's message for it.
func unfenceablePlan(table, why string) rewrite.Plan {
	return rewrite.Plan{Action: rewrite.Refuse, Code: sqlstateUnfenceable, Table: table,
		Message: "unfenceable write to " + table + ": " + why}
}

// prepareWords are the words of a Query whose fenced statement the server may keep to run later (SQL PREPARE);
// executeWords those of a Query that may run one (EXECUTE, also inside EXPLAIN or CREATE TABLE AS).
var (
	prepareWords = rewrite.NewFoldWords("prepare")
	executeWords = rewrite.NewFoldWords("execute")
	// commitPreparedWords are the letters every text that may end a prepared transaction holds: commitsPrepared
	// lexes only a text that holds them.
	commitPreparedWords = rewrite.NewFoldWords("prepared")
)

// commitsPrepared reports whether text may commit (or roll back) a prepared transaction, read under set
// (rewrite.CommitsPrepared: the keywords COMMIT or ROLLBACK then PREPARED, not the letters in a column, a
// string or a comment). Its writes were made in a transaction that has ended (PREPARE TRANSACTION), so no rule of
// the session's follows them: with upstream.hosts it is judged as a fenced write of preparedTxTables
// (keptFencedQuery, parseOut). Until 2026-12-06 any text holding the letters prepared was, a read of a column
// prepared_at or of pg_prepared_xacts too, refused during a split brain
// (TestReadHoldingPreparedOnARefusedHost).
func commitsPrepared(text []byte, set rewrite.Settings) bool {
	return commitPreparedWords.In(text) && rewrite.CommitsPrepared(text, set)
}

// preparedTxTables names, in errors, what a COMMIT PREPARED may write: the proxy does not know which tables.
const preparedTxTables = "the tables of a prepared transaction"

// noteKeptFenced remembers that the server keeps, for the session, the statement of plan (a Parse's), when it
// writes a protected table (keptFenced).
func (ss *session) noteKeptFenced(plan rewrite.Plan) {
	if ss.keptFenced == "" && plan.Action == rewrite.Rewrite && len(plan.Tables) > 0 {
		ss.keptFenced = plan.Tables[0]
	}
}

// keptFencedQuery is the plan of a Query's text with upstream.hosts: refused when the text may EXECUTE a fenced
// statement a PREPARE made before, or may commit a prepared transaction (commitsPrepared), and the router
// refuses fenced writes on the session's host now, as a text that writes is; and a fenced text that may PREPARE
// is remembered (keptFenced).
func (ss *session) keptFencedQuery(plan rewrite.Plan, text []byte, set rewrite.Settings) rewrite.Plan {
	if plan.Action != rewrite.Refuse && commitsPrepared(text, set) {
		if why := ss.fencedWriteRefusal(preparedTxTables); why != "" {
			return unfenceablePlan(preparedTxTables, why)
		}
	}
	if plan.Action != rewrite.Refuse && ss.keptFenced != "" && executeWords.In(text) {
		if why := ss.keptFencedRefusal(); why != "" {
			return unfenceablePlan(ss.keptFenced, why)
		}
	}
	if ss.keptFenced == "" && plan.Action == rewrite.Rewrite && len(plan.Tables) > 0 && prepareWords.In(text) {
		ss.keptFenced = plan.Tables[0]
	}
	return plan
}

// keptFencedRefusal says why a run of a fenced statement the session prepared before (keptFenced) must be
// refused now, as checkPlan would refuse its text: two hosts claim to be primary, or the session's host is
// no longer the published primary. "" when it may run, the transaction then noted as fenced
// (fencedWriteRefusal).
func (ss *session) keptFencedRefusal() string {
	if ss.srv.router == nil || ss.keptFenced == "" {
		return ""
	}
	return ss.fencedWriteRefusal(ss.keptFenced)
}

// keptFencedRefused ends a session whose Execute may run a fenced statement prepared before, while the router
// refuses fenced writes on its host (keptFencedRefusal): the Execute names a portal, which the proxy does not
// follow to its statement, and an answer of its own in the middle of the client's batch is not one the
// protocol has room for, so the session ends with FATAL 55F04 before the Execute reaches the server; nil when
// it may run.
func (ss *session) keptFencedRefused() error {
	why := ss.keptFencedRefusal()
	if why == "" {
		return nil
	}
	return &sessionRefused{code: sqlstateUnfenceable, msg: fmt.Sprintf("unfenceable write to %s: %s", ss.keptFenced, why),
		detail: "The session holds a statement prepared before that writes " + ss.keptFenced + ", and it sent an Execute.",
		hint:   "Connect again: a statement prepared now is judged when it is prepared."}
}

// fencedWriteRefusal judges a fenced write to table on the session's host (router.writeRefusal: why it must be
// refused now, "" when it may go) and leaves the transaction under way noted as one that may write table
// through the proxy (fencedTxOut), which it may still commit after the router stopped trusting the host. The
// note comes before the judgement, which Server.fencedHostsRefused relies on: that runs after a change has
// left the router's lock, so a change the judgement did not see is followed by a look at the sessions that
// sees the note. Noted after the judgement, a change and the whole of that look could run in between, and a
// write judged before the change would be sent to the refused host unseen. A refusal takes back a note this
// call made (the write is not sent); a look that saw it meanwhile ends a session that wrote nothing (fail
// closed).
func (ss *session) fencedWriteRefusal(table string) string {
	made := ss.fencedTxOut.Load() == nil
	if made {
		ss.fencedTxOut.Store(&table)
	}
	why := ss.srv.router.writeRefusal(ss.host.addr, ss.host.epoch)
	if why != "" {
		if made {
			ss.fencedTxOut.Store(nil)
		}
		return why
	}
	if ss.srv.fencedJudged != nil {
		ss.srv.fencedJudged()
	}
	return ""
}

// fencedTxRefused ends the session before a message of the client's (typ; any but Terminate) reaches the
// server, when the transaction under way wrote a protected table (fencedTxOut) and the router refuses fenced
// writes on the session's host now (writeRefusal: the host is no longer the published primary, or two hosts
// claim to be primary). The fenced write was allowed when it was planned; its transaction must not commit on a
// host the new primary does not follow, and the proxy cannot tell which message would commit it (a COMMIT, END,
// PREPARE TRANSACTION, a Sync or a Query ending an implicit transaction, a CALL of a procedure that commits, a
// CopyDone): so none goes. Closing the connection rolls the transaction back there (PREPARE TRANSACTION is one
// of the messages refused). The message is not answered in the client's stream (it may be in the middle of a
// batch): the session ends with FATAL 55F04, as keptFencedRefused, or 08007 while an answer is still owed
// (what is in flight may be a COMMIT). nil when the message may go; the transaction's end is seen at the next
// message (the session idle).
func (ss *session) fencedTxRefused(typ byte) error {
	if ss.srv.router == nil || typ == msgTerminate {
		return nil
	}
	table := ss.fencedTxOut.Load()
	if table == nil {
		return nil
	}
	if ss.state.idle() {
		ss.fencedTxOut.Store(nil)
		return nil
	}
	why := ss.srv.router.writeRefusal(ss.host.addr, ss.host.epoch)
	if why == "" {
		return nil
	}
	return fencedTxFarewell(why, *table, ss.state.pending.Load() > 0)
}

// fencedTxFarewell is how a session whose transaction wrote table ends when the router refuses fenced writes on
// its host (why): before a message of the client's reaches the server (fencedTxRefused), or at once when the
// router's change comes (Server.fencedHostsRefused). owed: an answer is still owed to the client.
func fencedTxFarewell(why, table string, owed bool) *sessionRefused {
	if owed {
		// A Query, Sync or FunctionCall sent before is not answered yet: it may be a COMMIT, and its answer is
		// lost with the session, so the client is told what the proxy knows: nothing (as end.go tells a client
		// whose upstream was lost with a statement in flight).
		return &sessionRefused{code: sqlstateTransactionResolutionUnknown,
			msg:    fmt.Sprintf("transaction resolution unknown: %s, and the transaction that wrote %s there had a statement still running", why, table),
			detail: "fenceproxy sends nothing more of the session to that host; what the statement still running had committed there stays, the rest is rolled back.",
			hint:   "Check whether the transaction's changes are there before doing it again."}
	}
	return &sessionRefused{code: sqlstateUnfenceable, msg: fmt.Sprintf("unfenceable write to %s: %s", table, why),
		detail: "The transaction wrote " + table + " on that host; fenceproxy closed the connection there before anything more of it, which could have committed it, reached the server: the server rolls the transaction back.",
		hint:   "The transaction still open did not commit. Connect again and run it again."}
}

// sessionRefused ends a session with a FATAL of its own (end: endRefused), before the client's message that
// caused it reaches the server.
type sessionRefused struct{ code, msg, detail, hint string }

func (e *sessionRefused) Error() string { return e.msg }

// farewell is the FATAL that ends the session.
func (e *sessionRefused) farewell() []byte {
	return errorResponse("FATAL", e.code, e.msg, e.detail, e.hint)
}

// checkToken validates a token's form and, with verification on, that a lock service could have issued it.
func (s *Server) checkToken(v string) (code, msg string, ok bool) {
	tok, valid := rewrite.ValidToken(v)
	if !valid {
		return sqlstateInvalid, rewrite.InvalidTokenMessage(v), false
	}
	return s.verifyToken(tok)
}

// verifyToken checks, with verification on, that a lock service could have issued tok (valid in form).
func (s *Server) verifyToken(tok int64) (code, msg string, ok bool) {
	if s.verifier != nil {
		// The verifier bounds its own round trip with the same timeout and then applies fail_open; this outer
		// bound only guards against a verifier that never returns, so it must be the longer of the two.
		ctx, cancel := context.WithTimeout(context.Background(), 2*s.cfg.Token.Verify.Etcd.Timeout+time.Second)
		defer cancel()
		if err := s.verifier.Check(ctx, tok); err != nil {
			return sqlstateInvalid, fmt.Sprintf("invalid fencing token: %d: %v", tok, err), false
		}
	}
	return "", "", true
}

// refusal returns the SQL that makes the server fail a refused statement. The refusal is logged and counted
// once, when the server's error comes back through translateError.
func (ss *session) refusal(plan rewrite.Plan) string {
	return rewrite.RefusalSQL(plan.Code, plan.Table, ss.refusalMessage(plan), plan.Hint)
}

// errorOut writes the ErrorResponse whose body is given to w, translating fencing markers.
func (ss *session) errorOut(w msgSink, body []byte) error {
	if bytes.Contains(body, markerPrefix) {
		if translated, ok := ss.translateError(body); ok {
			body = translated
		}
	} else {
		ss.countGuardRefusal(body)
		if ss.prep.max > 0 && bytes.Contains(body, preparedPrefixBytes) {
			ss.prep.noteMissingPrepared(errorField(body, fieldCode))
		}
	}
	if sev := errorField(body, fieldSeverity); sev == "FATAL" || sev == "PANIC" {
		// The server is ending the session and said why; the client needs no second message from us.
		ss.state.serverFatal = true
	}
	writeMsg(w, msgErrorResponse, body, "")
	return nil
}

// translateError rewrites a server error that carries a fencing marker into the contract's error.
func (ss *session) translateError(body []byte) ([]byte, bool) {
	var e pgproto3.ErrorResponse
	if err := e.Decode(body); err != nil {
		return nil, false
	}
	t, ok := rewrite.Translate(e.Message)
	if !ok {
		return nil, false
	}
	out := pgproto3.ErrorResponse{Severity: e.Severity, SeverityUnlocalized: e.SeverityUnlocalized,
		Code: t.Code, Message: t.Message, Detail: t.Detail, Hint: t.Hint}
	if out.SeverityUnlocalized == "" {
		out.SeverityUnlocalized = "ERROR"
	}
	table, presented, rowToken := t.Table, t.Token, t.RowToken
	ss.srv.metrics.refusal(out.Code, table)
	ss.logger().Warn("fencing refusal", "code", out.Code, "table", table, "token", presented, "row_token", rowToken, "application_name", *ss.appName.Load(), "message", out.Message)
	b, err := out.Encode(nil)
	if err != nil {
		return nil, false
	}
	return b[5:], true // Encode includes the message header; the caller adds its own
}

// errorField returns the value of one field of an ErrorResponse body, or "".
func errorField(body []byte, field byte) string {
	for len(body) > 0 && body[0] != 0 {
		f := body[0]
		v, rest, ok := cutNul(body[1:])
		if !ok {
			return ""
		}
		if f == field {
			return string(v)
		}
		body = rest
	}
	return ""
}

// optionSetting finds the value a startup options string gives the setting name (-c name=value, --name=value,
// in any of the forms PostgreSQL reads: optionSettings). The last occurrence wins, as in PostgreSQL.
func optionSetting(options, name string) (string, bool) {
	var value string
	found := false
	for _, o := range optionSettings(splitOptions(options)) {
		if sameSetting(o.name, name) {
			value, found = o.value, true
		}
	}
	return value, found
}

// withoutOptionSettings is a startup options string without the settings named in names, the rest kept in order
// (a flag grouped before a removed -c keeps its place) and escaped as PostgreSQL reads it.
func withoutOptionSettings(options string, names ...string) string {
	args := splitOptions(options)
	drop := make([]bool, len(args)) // whole arguments dropped
	for _, o := range optionSettings(args) {
		if !slices.ContainsFunc(names, func(name string) bool { return sameSetting(o.name, name) }) {
			continue
		}
		if o.at > 1 {
			args[o.arg] = args[o.arg][:o.at] // the flags before it stay: "-e" of "-ec name=value"
		} else {
			drop[o.arg] = true
		}
		for i := o.arg + 1; i <= o.last; i++ {
			drop[i] = true
		}
	}
	var b strings.Builder
	first := true
	for i, a := range args {
		if drop[i] {
			continue
		}
		if !first {
			b.WriteByte(' ')
		}
		first = false
		for _, r := range a {
			if r == '\\' || r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == '\f' || r == '\v' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
	}
	return b.String()
}

// sameSetting compares setting names as PostgreSQL does for options (case and - against _ do not matter).
func sameSetting(a, b string) bool {
	return strings.EqualFold(strings.ReplaceAll(a, "-", "_"), strings.ReplaceAll(b, "-", "_"))
}

// optionFlagsWithArg are the backend's command-line flags that take an argument (PostgreSQL 15's
// process_postgres_switches: "B:bc:C:D:d:EeFf:h:ijk:lN:nOPp:r:S:sTt:v:W:-:"); the others take none.
const optionFlagsWithArg = "BcCDdfhkNprStvW-"

// optionSettingAt is one setting a startup options string makes (-c or --): its name and value, and where it
// is: its flag is byte at of argument arg, and its value ends in argument last (arg, or the next one).
type optionSettingAt struct {
	name, value   string
	arg, at, last int
}

// optionSettings reads split startup options as PostgreSQL's getopt does, and returns the settings they make,
// in order. Flags may be grouped in one argument ("-ec name=value" is -e, then -c with the next argument;
// "-e-name=value" is -e, then -- with the rest); a flag's argument is the rest of its argument, or the next one.
// "--" alone ends the options. One rule for every reader of options (the token's check at startup, the
// transaction pooler's startup values and pool key): a form read otherwise than the server reads it would let
// a token through unchecked, or give a pooled client another token than the server would.
func optionSettings(args []string) []optionSettingAt {
	var out []optionSettingAt
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if len(a) < 2 || a[0] != '-' {
			continue // not an option: the server refuses it, or takes it for the database name
		}
		for j := 1; j < len(a); j++ {
			if strings.IndexByte(optionFlagsWithArg, a[j]) < 0 {
				continue // a flag without an argument; the next byte is another flag
			}
			flag, arg, last := a[j], a[j+1:], i
			if arg == "" {
				if i+1 >= len(args) {
					return out // the flag's argument is missing: the server refuses the options
				}
				arg, last = args[i+1], i+1
			}
			if flag == 'c' || flag == '-' {
				if name, value, ok := strings.Cut(arg, "="); ok {
					out = append(out, optionSettingAt{name: name, value: value, arg: i, at: j, last: last})
				}
			}
			i = last
			break
		}
	}
	return out
}

// splitOptions splits a startup options string the way PostgreSQL does (white space separates, a backslash
// escapes the next character).
func splitOptions(options string) []string {
	var args []string
	var cur strings.Builder
	inArg, escaped := false, false
	for _, r := range options {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped, inArg = false, true
		case r == '\\':
			escaped, inArg = true, true
		case r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == '\f' || r == '\v':
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteRune(r)
			inArg = true
		}
	}
	if inArg {
		args = append(args, cur.String())
	}
	return args
}
