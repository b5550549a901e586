package proxy

import (
	"bytes"
	"encoding/binary"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// Transaction pooling: the client's other session-level settings (search_path, application_name, DateStyle,
// TimeZone, statement_timeout, ...), kept per client and replayed where its transactions run. The server is the
// judge, as for the token (pooled.go):
//
//   - A pooled server connection holds, at session level, the settings of the last client that used it
//     (serverConn.settings, as read back from the server). Nothing resets it when it goes back to the pool.
//   - When a client's transaction starts on a connection whose settings differ from the client's
//     (pooledState.settings), the difference goes first, in the same write: a Bind, Execute and Sync of
//     settingsStmtName, set_config(name, value, false) for each setting that differs (NULL, which resets it,
//     for one the client does not have). It is a unit of its own, committed before the client's first message
//     is even read by the server: a rollback of the client's transaction cannot undo it, and the settings the
//     server reads the client's text under (standard_conforming_strings) are the client's before it reads it.
//     Its answers are not relayed (replayAnswer); a failure ends the client's session.
//   - When a transaction may have changed session state (the probe's triggers, pooled.go), the probe reads the
//     connection's session-level settings back (replayableSettingsSQL): they are the client's settings now, as
//     PostgreSQL computed them (SET, RESET, RESET ALL, DISCARD ALL, set_config, a SET rolled back or in a failed
//     transaction), and the connection's.
//
// What cannot move this way pins the client (pool.on_session_state): a setting only a superuser may set, the ones
// in pinnedSettings, SET ROLE and SET SESSION AUTHORIZATION; the transaction characteristics need not move
// (transactionSettings). Settings pg_settings does not show (custom
// settings such as myapp.tenant, apart from the token and lock) are neither replayed nor seen (docs/pooling.md).

// settingsStmtName is the statement that puts a client's settings on a server connection.
const settingsStmtName = "fenceproxy_c"

// settingsStmtSQL sets each setting named in $1 to the value at the same place in $2, at session level.
const settingsStmtSQL = "SELECT pg_catalog.set_config(s.n, s.v, false) FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.text[])) AS s(n, v)"

// The operators of the proxy's own SQL on pooled connections, named with pg_catalog: that SQL runs under a
// client's search_path, which may put a schema of its own, with operators of its own, before pg_catalog.
const (
	sqlEq     = " OPERATOR(pg_catalog.=) "
	sqlNe     = " OPERATOR(pg_catalog.<>) "
	sqlConcat = " OPERATOR(pg_catalog.||) "
)

// pinnedSettings are the user-settable settings a pooled client cannot take from one server connection to
// another with set_config: client_encoding (the proxy reads what the server sends under it, and the values it
// replays are bytes in it). role and session_authorization are not in pg_settings; the probe compares them
// itself.
var pinnedSettings = []string{"client_encoding"}

// transactionSettings are the transaction characteristics, which every transaction takes from the
// default_transaction_* settings (those move with the client) at its start: their SET, SET TRANSACTION or BEGIN
// ISOLATION LEVEL means "this transaction" and reaches no later one, though pg_settings then shows them set at
// session level. They are neither replayed nor a reason to pin. (Until 2026-12-04 they pinned: a client that ran
// SET TRANSACTION ISOLATION LEVEL after BEGIN, as Rails does for an isolated transaction, kept its server
// connection for good.)
var transactionSettings = []string{"transaction_isolation", "transaction_read_only", "transaction_deferrable"}

// sqlTextArray is the names of lists as an SQL text[] literal.
func sqlTextArray(lists ...[]string) string {
	var quoted []string
	for _, names := range lists {
		for _, n := range names {
			quoted = append(quoted, quoteLiteral(n))
		}
	}
	return "ARRAY[" + strings.Join(quoted, ", ") + "]::pg_catalog.text[]"
}

// replayable is the SQL condition on a pg_settings row for a session-level setting the pool replays.
func replayable() string {
	return "context" + sqlEq + "'user' AND pg_catalog.lower(name)" + sqlNe + "ALL (" + sqlTextArray(pinnedSettings, transactionSettings) + ")"
}

// unmovableSettingsSQL is an SQL expression naming the session-level settings of a server connection that
// pin its client (NULL: none). The role is not among them: the probe reads it on its own (loginRoleSQL), since
// it pins only a client whose transaction started as the login role (probeOnce).
func unmovableSettingsSQL() string {
	return "(SELECT 'session-level SET of '" + sqlConcat + "pg_catalog.string_agg(name, ' ') FROM pg_catalog.pg_settings WHERE source" + sqlEq + "'session' AND NOT (" +
		replayable() + ") AND pg_catalog.lower(name)" + sqlNe + "ALL (" + sqlTextArray(transactionSettings) + "))"
}

// roleReason is the pin reason of a role the client's transaction left at session level.
const roleReason = "SET ROLE or SET SESSION AUTHORIZATION"

// loginRoleSQL is true when the session runs as the role it logged in as (user): no SET ROLE, no SET SESSION
// AUTHORIZATION in force.
func loginRoleSQL(user string) string {
	return "pg_catalog.current_setting('role')" + sqlEq + "'none' AND pg_catalog.current_setting('session_authorization')" + sqlEq + quoteLiteral(user)
}

// replayableSettingsSQL reads a server connection's session-level settings that the pool replays: one row
// (name, setting) each, for those pg_settings shows and for the custom settings named in custom (their
// session values; the empty string, a custom setting's default, is left out).
func replayableSettingsSQL(custom []string) string {
	sql := "SELECT name, setting FROM pg_catalog.pg_settings WHERE source" + sqlEq + "'session' AND " + replayable()
	if len(custom) == 0 {
		return sql
	}
	quoted := make([]string, len(custom))
	for i, n := range custom {
		quoted[i] = quoteLiteral(n)
	}
	return sql + " UNION ALL SELECT n, pg_catalog.current_setting(n, true) FROM pg_catalog.unnest(ARRAY[" + strings.Join(quoted, ", ") +
		"]::pg_catalog.text[]) AS n WHERE pg_catalog.current_setting(n, true)" + sqlNe + "''"
}

// setWord is noteCustomSettings' sign of a setting.
var setWord = rewrite.NewFoldWords("set")

// noteCustomSettings notes the custom settings a client's text may set or reset (pl.mu held), so that the probe
// asks for them by name: pg_settings does not show them. A dotted name with set in the text is the cheap sign
// that there may be one, unless an escape may spell the dot or the word without their characters
// (rewrite.MayEscape: set_config(U&'myapp\002etenant', ...) has no dot, U&"\0073et_config" no set).
func (ss *session) noteCustomSettings(text []byte) {
	if !rewrite.MayEscape(text) && (bytes.IndexByte(text, '.') < 0 || !setWord.In(text)) {
		return
	}
	pl := ss.pooled
	names, unfollowed := rewrite.CustomSettings(text, ss.readingSettings())
	if unfollowed {
		pl.customUnfollowed = true
	}
	tok := ss.srv.cfg.Token
	for _, n := range names {
		if strings.EqualFold(n, tok.Setting) || strings.EqualFold(n, tok.LockSetting) {
			continue // the token and lock have the placeholder (pooled.go)
		}
		if pl.customNames == nil {
			pl.customNames = map[string]bool{}
		}
		pl.customNames[n] = true
	}
}

// customToRead are the custom settings a probe of sc asks for: those the client named, those it holds and
// those sc holds.
func (ss *session) customToRead(sc *serverConn) []string {
	pl := ss.pooled
	seen := maps.Clone(pl.customNames)
	if seen == nil {
		seen = map[string]bool{}
	}
	for _, m := range []map[string]string{pl.settings, sc.settings} {
		for n := range m {
			if strings.Contains(n, ".") {
				seen[strings.ToLower(n)] = true
			}
		}
	}
	names := slices.Sorted(maps.Keys(seen))
	return names
}

// settingsPinReason adds to the reasons a probe found why the client cannot move the one the proxy knows of
// itself: a custom setting it could not name.
func (ss *session) settingsPinReason(reasons string) string {
	if !ss.pooled.customUnfollowed {
		return reasons
	}
	r := "a custom setting whose name is not ASCII"
	if reasons == "" {
		return r
	}
	return reasons + ", " + r
}

// startupSettings are a client's first settings: its own application_name, which is not part of its pool's
// key (the pool's server connections start without it).
// Without one they are nil (nothing writes to pl.settings but a copy of what a probe read), not a map made
// for every client that never holds anything.
func startupSettings(params map[string]string) map[string]string {
	if app, ok := params["application_name"]; ok {
		return map[string]string{"application_name": app}
	}
	return nil
}

// settingsRead records the session-level settings a probe read back (pl.mu held): they are the server
// connection's and the client's. Custom settings' names are lower case, as the proxy asks for them. A client's
// application_name the transaction reset (resetRead) returns to its startup value, which the pool's connections
// do not have as their reset value.
func (ss *session) settingsRead(sc *serverConn, read map[string]string) {
	pl := ss.pooled
	for n, v := range read {
		if l := strings.ToLower(n); l != n && strings.Contains(n, ".") {
			delete(read, n) // an extension's setting pg_settings shows, and the proxy asked for by name too
			read[l] = v
		}
	}
	held := sc.settings // what the connection held at session level when the transaction began (replaySettings)
	sc.settings = read
	pl.settings = maps.Clone(read)
	if app, ok := ss.params[rewrite.AppSetting]; ok {
		v, atSession := read[rewrite.AppSetting]
		h, had := held[rewrite.AppSetting]
		if !atSession || v == sc.pool.resetApp && resetRead(pl.probeEffects.App, pl.mayUndo, had && h == v) {
			pl.settings[rewrite.AppSetting] = app
		}
	}
	sc.settingsFor = nil // a DISCARD ALL or DEALLOCATE may have dropped the statement
}

// resetRead is the pool's one rule for a setting whose reset value on its server connections is not the
// client's (the token and lock from startup options, a startup application_name), once the probe has read, at
// session level, the value a RESET gives there: on those connections a reset and a set to that value leave the
// same, and PostgreSQL keeps a reset at session level when a SET LOCAL after it in the transaction is undone
// (RESET ALL; SET LOCAL application_name = 'x' reads as the empty string, source session). It is a reset, the
// client's reset value, when the transaction's texts (e, rewrite.SessionEffects) leave the setting reset:
//   - where nothing may have rolled back (undo, pooledState.mayUndo), every statement of the transaction's
//     Queries ran in order, so it is what they leave (rewrite.Effect.NetResetOnly: a RESET after a SET, and
//     only SET LOCAL after the RESET);
//   - else, when they may reset it and cannot set it anywhere (rewrite.Effect.ResetOnly), unless the
//     connection held that value before the transaction (held), which a rollback would have left.
//
// Otherwise it is what was read, which for the token means no token: never a token the client may not have.
func resetRead(e rewrite.Effect, undo, held bool) bool {
	if !undo {
		return e.NetResetOnly()
	}
	return e.ResetOnly() && !held
}

// setRead is resetRead's other side, for the token (followedToken): the value a reset gives was set, where
// nothing may have rolled back and the texts leave the setting set (a SET after the last RESET, with nothing
// after it that may reset it), or where they can only set it.
func setRead(e rewrite.Effect, undo bool) bool {
	if !undo {
		return e.NetSet && !e.NetReset
	}
	return e.SetOnly()
}

// readingDiff is names and values (settingsDiff) with the settings that decide how the server reads SQL text
// (client_encoding, standard_conforming_strings) put to the client's reading where the connection, as the
// server last reported it, reads otherwise: the proxy reads the client's texts under the client's reading, so
// the server must too. The proxy's record of the connection's settings (serverConn.settings) knows only what
// the clients' texts showed; a function's or dynamic SQL's change (DO ... EXECUTE 'SET
// standard_conforming_strings = off') is told by the server alone, and before 2026-12-05 it reached the
// connection's next client, whose text the server then read as the proxy did not: an UPDATE of a protected
// table inside what the proxy read as a string ran unfenced
// (TestPooledHiddenStandardConformingStringsNeverReachesTheNextClient).
func (ss *session) readingDiff(sc *serverConn, names []string, values []*string) ([]string, []*string) {
	want, has := ss.state.reading.p.Load(), sc.reading.p.Load()
	if want == nil || has == nil {
		return names, values
	}
	put := func(name, value string) {
		if i := slices.Index(names, name); i >= 0 {
			values[i] = &value
			return
		}
		names, values = append(names, name), append(values, &value)
	}
	if want.StandardConformingStrings != has.StandardConformingStrings {
		scs := "off"
		if want.StandardConformingStrings {
			scs = "on"
		}
		put("standard_conforming_strings", scs)
	}
	if want.ClientEncoding != "" && want.ClientEncoding != has.ClientEncoding {
		put("client_encoding", want.ClientEncoding)
	}
	return names, values
}

// settingsDiff is what turns settings have into want: names, and values (nil: reset), by name.
func settingsDiff(have, want map[string]string) (names []string, values []*string) {
	if maps.Equal(have, want) {
		return nil, nil // the common case: the same client again, or clients with the same settings
	}
	for n, v := range want {
		if h, ok := have[n]; !ok || h != v {
			names = append(names, n)
		}
	}
	for n := range have {
		if _, ok := want[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		if v, ok := want[n]; ok {
			values = append(values, &v)
		} else {
			values = append(values, nil)
		}
	}
	return names, values
}

// replaySettings puts the client's settings on the server connection lent to it, where they differ, before
// the first message of its transaction (pl.mu held): a unit of its own, whose answers serveLend does not relay
// (replayAnswer).
func (ss *session) replaySettings() {
	pl := ss.pooled
	sc := pl.sc
	names, values := settingsDiff(sc.settings, pl.settings)
	names, values = ss.readingDiff(sc, names, values)
	if len(names) == 0 {
		return
	}
	// Counted before anything is written: a full buffer may send it, and the answer must not find it uncounted.
	pl.replaying.Add(1)
	if sc.settingsFor != pl {
		// Prepared afresh for each client: whatever a client's function left under this name (DEALLOCATE, then
		// PREPARE of it) never runs for another.
		writeMsg(sc.w, msgClose, []byte("S"+settingsStmtName+"\x00"), "")
		b := append(append([]byte(settingsStmtName), 0), settingsStmtSQL...)
		writeMsg(sc.w, msgParse, append(b, 0, 0, 0), "")
		sc.settingsFor = pl
	}
	// Bind: unnamed portal, no parameter formats (text), two parameters, no result formats.
	b := append([]byte{0}, settingsStmtName...)
	b = append(b, 0, 0, 0, 0, 2)
	for _, arr := range []string{textArray(names, nil), textArray(nil, values)} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(arr)))
		b = append(b, arr...)
	}
	b = append(b, 0, 0)
	writeMsg(sc.w, msgBind, b, "")
	writeMsg(sc.w, msgExecute, executeUnnamedBody[:], "")
	writeMsg(sc.w, msgSync, []byte{}, "")
	sc.settings = maps.Clone(pl.settings)
}

// textArray is the text form of a text[] of names, or else of values (nil: NULL).
func textArray(names []string, values []*string) string {
	var b strings.Builder
	b.WriteByte('{')
	elem := func(i int, v *string) {
		if i > 0 {
			b.WriteByte(',')
		}
		if v == nil {
			b.WriteString("NULL")
			return
		}
		b.WriteByte('"')
		b.WriteString(strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(*v))
		b.WriteByte('"')
	}
	for i := range names {
		elem(i, &names[i])
	}
	for i, v := range values {
		elem(i, v)
	}
	b.WriteByte('}')
	return b.String()
}

// replayAnswer takes one message of the answer to replaySettings (its type typ, the body unread) off the server
// connection: nothing of it reaches the client but the ParameterStatus values that change what the client was
// shown, and a notification. At its ReadyForQuery a failure ends the session (the settings the client's
// transaction would run under are not its own).
func (ss *session) replayAnswer(sc *serverConn, typ byte) error {
	pl := ss.pooled
	body, err := sc.r.body()
	if err != nil {
		return err
	}
	defer sc.r.release()
	switch typ {
	case msgErrorResponse:
		pl.replayFailure = replayFailed(body)
	case msgParameterStatus:
		ss.pooledParamStatus(sc, body)
	case msgNotificationResponse:
		writeMsg(ss.cw, typ, body, "")
	case msgReadyForQuery:
		if f := pl.replayFailure; f != nil {
			// Not counted as answered: checkFirst must not take it for a success before the lend's end
			// (lendFailed) has been recorded.
			pl.replayFailure = nil
			return f
		}
		pl.replaying.Add(-1)
		ss.ownUnitAnswered() // checkFirst may wait for it (awaitReplayed); without pl.mu
	}
	return nil
}

// replayError: a server connection refused a client's settings, or a check of checkFirst failed.
type replayError struct{ code, msg string }

func (e *replayError) Error() string { return e.msg }

// replayFailed is the replayError of the server's error (body) in a unit of the proxy's own.
func replayFailed(body []byte) *replayError {
	if tr, ok := rewrite.Translate(errorField(body, fieldMessage)); ok {
		return &replayError{code: tr.Code, msg: tr.Message}
	}
	return &replayError{code: sqlstateConnectionFailure,
		msg: "fenceproxy could not give the client's session settings to a pooled server connection: " + errorField(body, fieldMessage)}
}

// checkFirst makes sure the lent connection's session state was checked since it last served another client
// (pl.mu held), when what injectTokens put in front (prefix) does not make the client's transaction its own:
//   - prefixChecked checks it (the token statement), which counts once it ran (settle: checkRan);
//   - prefixSet needs no check: it sets the client's token and lock for the transaction, whatever the
//     session's are, and the role where a change of it would not be reported (serverConn.roleSeen; one that
//     is reported keeps the connection from serving anyone else: release);
//   - prefixSetLocal (SET LOCAL of the values) and prefixNone (a FunctionCall, a text that must run
//     outside a transaction block, which run with the session's values) get, as a unit of its own first, the
//     token and lock put back to the placeholder and the role to the login role where code the proxy does not
//     see left them otherwise (staleResetSQL).
//
// After a unit of its own the client's message goes only once it is answered: a failure ends the session
// (replayAnswer) before the message reaches the server. The settings replay, if any, is waited for the same way.
// A text of no statement runs nothing and waits for nothing. A pinned client's connection is its own, role
// included.
func (ss *session) checkFirst(typ byte, body []byte, prefix tokenPrefix) error {
	pl := ss.pooled
	sc := pl.sc
	defer func() { pl.startChecked = pl.pin != "" || sc.checkedFor == pl }()
	pl.checkRan.Store(false)
	pl.checkSent.Store(prefix == prefixChecked)
	if prefix == prefixChecked || prefix == prefixSet {
		// A checked token statement counts once the server ran it (settle); it may not run at all. (Another
		// client's check was forgotten at the lend.)
		return nil
	}
	if typ == msgQuery {
		// A Query of no statement runs nothing. (A Parse of none gets a token statement: injectTokens.)
		if text, ok := planText(typ, body); ok && noStatement(text, ss.readingSettings()) {
			return nil
		}
	}
	// What code the proxy did not see left at session level is put back, in a transaction of its own that
	// commits: the client's statement then runs with the placeholders, as the login role.
	ss.putBackFirst()
	if pl.replaying.Load() == 0 {
		return nil
	}
	if err := sc.w.Flush(); err != nil {
		return nil // the lend's server side sees the connection fail and ends the session
	}
	if err := ss.awaitReplayed(); err != nil {
		return err
	}
	if pl.lost != nil {
		return errLendLost
	}
	return nil
}

// pooledParamStatus handles a ParameterStatus a lent server connection sent (body read): the connection's
// reported value is noted, and the client sees it only when it differs from what the client was shown, as a
// connection of its own reports only changes. It reports whether it went to the client.
func (ss *session) pooledParamStatus(sc *serverConn, body []byte) bool {
	k, rest, ok := cutNul(body)
	v, _, ok2 := cutNul(rest)
	if !ok || !ok2 {
		return false
	}
	name, value := string(k), string(v)
	sc.reading.note(name, value)
	if ss.srv.router != nil {
		ss.srv.router.observe(sc.host.addr, name, value)
	}
	switch name {
	case "is_superuser":
		sc.superMoved.Store(value != sc.loginSuperuser)
	case "session_authorization":
		sc.authMoved.Store(value != sc.pool.params["user"])
	}
	for _, p := range ss.state.serverParams {
		if p.name == name && p.value == value {
			return false
		}
	}
	ss.noteParam(body)
	writeMsg(ss.cw, msgParameterStatus, body, "")
	return true
}

// settingsFailure is the FATAL that ends a session whose settings a server connection refused, or whose
// connection's check failed (checkFirst).
func settingsFailure(err *replayError) []byte {
	hint := "A setting the session holds may have become invalid (a dropped object it names); connect again."
	if err.code != sqlstateConnectionFailure {
		hint = ""
	}
	return errorResponse("FATAL", err.code, err.msg, "", hint)
}

// roleCheckSQL is a column of the checked token statement that fails it, before the client's statement runs,
// when the server connection is not the role it logged in as (user). The connection was put back to that role
// when it came to the client (putBackFirst), so only the client's own function, which called set_config on role
// or session_authorization, can have left another: refused, and the connection is then closed
// (noteTokenStmtRefusal).
func roleCheckSQL(user string) string {
	marker := quoteLiteral(rewrite.NamedRefusalMarker(sqlstateFeatureNotSupported, rewrite.RefusalPooledRole, "") + "|")
	return "CASE WHEN " + loginRoleSQL(user) + " THEN NULL ELSE pg_catalog.concat(" + marker + ", pg_catalog.current_setting('role'))::pg_catalog.int8 END"
}

// noteTokenStmtRefusal looks at the error that ended a token statement (body): a refusal of the proxy's own (the
// placeholder or the role changed behind its back by the client's own function) means the server connection
// holds state the proxy did not follow, so it is closed when the client's transaction ends instead of serving
// another. Any other error (the client's text did not parse) leaves it as it is.
func (ss *session) noteTokenStmtRefusal(body []byte) {
	if _, ok := rewrite.Translate(errorField(body, fieldMessage)); ok {
		ss.pooled.tainted = true
	}
}

// tokenStmtCache holds a pool's texts of the token statement, built once: for clients that are
// not pinned, with the role check, and for pinned ones, whose connection is their own, role included.
type tokenStmtCache struct {
	once  [2]sync.Once
	texts [2]tokenTexts
}

// tokenTexts are the texts of the token statement on the pool's connections for a client that is pinned or not.
func (p *txPool) tokenTexts(pinned bool) *tokenTexts {
	i := 0
	if pinned {
		i = 1
	}
	c := &p.tokenStmts
	c.once[i].Do(func() {
		cfg := p.srv.cfg.Token
		c.texts[i] = newTokenTexts(cfg.Setting, cfg.LockSetting, p.params["user"], pinned)
	})
	return &c.texts[i]
}
