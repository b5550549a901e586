package rewrite

import (
	"errors"
	"fmt"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/fenceproxy/fenceproxy/setting"
)

// SQLSTATEs of the contract.
const (
	CodeStale       = "55F01" // stale fencing token: a newer holder already wrote
	CodeMissing     = "55F02" // no fencing token set for a write to a protected table
	CodeInvalid     = "55F03" // invalid fencing token
	CodeUnfenceable = "55F04" // a write to a protected table that cannot be fenced
)

// DefaultTokenSetting is the session setting that carries the fencing token.
const DefaultTokenSetting = setting.DefaultToken

// Table is one protected table.
type Table struct {
	// Schema is the schema name; "" protects Name in every schema.
	Schema string
	// Name is the table name. Schema and Name are PostgreSQL's own (case-folded)
	// names: accounts matches accounts, ACCOUNTS and "accounts"; "Accounts" is a
	// different table and is configured as Accounts.
	Name string
	// TokenColumn is the bigint column holding the token of the row's last writer.
	TokenColumn string
	// RefuseTokenColumnWrites refuses (55F04) writes that name TokenColumn
	// (config token_column_writes: refuse). By default they are fenced like
	// any write, and the column is written as the statement's token whatever
	// value the statement supplies.
	RefuseTokenColumnWrites bool
	// RequireLock refuses (55F02) writes by sessions whose lock setting is empty (lockfence.go).
	RequireLock bool
}

// Label is the table's name as configured, used in errors and metrics.
func (t Table) Label() string {
	if t.Schema == "" {
		return t.Name
	}
	return t.Schema + "." + t.Name
}

// Config is what New needs.
type Config struct {
	Tables []Table
	// TokenSetting is the setting holding the session's token; "" means
	// DefaultTokenSetting. It must be a custom setting name (prefix.name).
	TokenSetting string
	// Verify re-parses every rewritten text and checks that each protected
	// write in it carries the fence (the check the tests and the fuzzer apply
	// to every rewrite), refusing with 55F04 if not. It guards against a
	// deparser fault and about triples the cost of a cache miss.
	Verify bool
	// Refused lists relations, derived from the catalog, some writes to which
	// are refused (see Refused).
	Refused []Refused
	// LockSetting is the setting naming the lock a token belongs to (lock fences, lockfence.go); "" leaves
	// lock fences out of the rewrite (the guard still enforces them).
	LockSetting string
	// SynchronousCommit, when set (one of SynchronousCommitLevels), is the synchronous_commit level the
	// transaction of every fenced write runs with (synccommit.go).
	SynchronousCommit string
}

// Action says what the proxy does with a statement.
type Action uint8

const (
	// Pass: forward the client's original text unchanged.
	Pass Action = iota
	// Rewrite: forward Plan.SQL instead.
	Rewrite
	// Refuse: do not forward the client's text; forward instead the refusal SQL built from Code, Message and
	// Hint (RefusalSQL), so that the server itself raises the error and aborts the transaction as for any
	// error, and the proxy's ErrorResponse is the server's, translated.
	Refuse
)

func (a Action) String() string {
	switch a {
	case Pass:
		return "pass"
	case Rewrite:
		return "rewrite"
	case Refuse:
		return "refuse"
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// Plan is the outcome of analysing one SQL text (which may hold several
// statements). Plans returned by a Cache are shared: treat Tables as read-only.
type Plan struct {
	Action Action
	// SQL is the text to send for Rewrite. For Pass it is the original text or
	// empty (Cache.Plan on a statement the prefilter rules out): the proxy
	// forwards the client's own bytes either way.
	SQL string
	// Code is the SQLSTATE for Refuse: CodeUnfenceable or CodeInvalid.
	Code string
	// Table is the label of the protected table concerned (as configured);
	// empty for an invalid token in a SET.
	Table string
	// Message is the full error message for Refuse.
	Message string
	// TokenSet reports that the text sets the token setting to the literal
	// Token (SET, SET LOCAL, set_config with constant arguments; the last one
	// when there are several), as ValidToken reads it: an invalid literal
	// gives Refuse with CodeInvalid instead.
	TokenSet bool
	Token    int64
	// TokenDynamic reports a set_config call that may set the token setting to
	// a value only known at execution time (the SQL-level check still applies
	// to every fenced write).
	TokenDynamic bool
	// Tokens lists every token literal the text sets anywhere (SET, SET
	// LOCAL, each set_config, a function's SET clause, ALTER ROLE/DATABASE/
	// SYSTEM ... SET), each valid in form, so that a verifier can check every
	// one, not only the last (see scope.go).
	Tokens []int64
	// TokenSession reports that the text may set the token for the session
	// rather than the transaction: SET without LOCAL, set_config with an
	// is_local that is not the constant true (of the token setting or of a
	// setting named by an expression), or TokenPersistent.
	TokenSession bool
	// TokenPersistent reports ALTER ROLE, ALTER DATABASE or ALTER SYSTEM ...
	// SET (or FROM CURRENT) of the token setting: a default for later
	// sessions that the proxy never sees set.
	TokenPersistent bool
	// LockPersistent reports the same of the lock setting (Config.LockSetting): the transaction pooler refuses
	// it, as its server connections would give the default to clients that set no lock.
	LockPersistent bool
	// Hint is the HINT of a refusal, if any.
	Hint string
	// Tables lists the labels of the protected tables the text writes (fenced
	// for Rewrite, the offending one for Refuse), without duplicates.
	Tables []string
	// Prepared is set for a Rewrite served by a shape template that the
	// server may prepare (prepared.go): the statement to PREPARE once per
	// upstream connection, after which EXECUTE name Args (the text's
	// constants, in the client's encoding) runs what SQL says. nil when the
	// text can only be sent as SQL.
	Prepared *Prepared
	Args     string
	// TokenSegs is set for a Rewrite planned with Settings.InlineToken that carries the token as a constant
	// (inline.go): the text to send, in the client's encoding, cut where the token goes. Send WithToken(T),
	// T the token in force, never SQL (which holds a parameter there). Prepared is nil then.
	TokenSegs []string
}

// Rewriter analyses and fences SQL. It is immutable after New and safe for
// concurrent use.
type Rewriter struct {
	setting string // token setting name as configured
	// lockSetting is the lock setting's name as configured (Config.LockSetting), "" when none: a persistent
	// default of it is reported (Plan.LockPersistent).
	lockSetting string
	verify      bool
	tables      []*tableEntry
	byName      map[string][]*tableEntry // relname -> entries (config order)
	refused     map[string][]*Refused    // relname -> catalog-derived refusals
	filter      prefilter
	// fingerprint is the query of what protects the tables, for statements checked by their result (bycheck.go).
	fingerprint string
}

// tableEntry is a configured table with its precomputed, immutable SQL
// fragments. The fragments are shared (never mutated) by every rewritten tree.
type tableEntry struct {
	Table
	label string
	token *pg.Node // k: scalar subquery yielding the validated session token
	cte   *pg.Node // WITH item fenceproxy_stmt AS MATERIALIZED (SELECT k AS token)
	ref   *pg.Node // (SELECT token FROM fenceproxy_stmt): the statement's token
	light *pg.Node // current_setting(...)::int8, for inert VALUES rows after the first
	check *pg.Node // template: C <= t check with the 55F01 marker (placeholders)
	// setCheck is the template of an UPDATE's value for C: t when C <= t, else the 55F01 marker.
	setCheck *pg.Node
	guard    *pg.Node // template: CASE WHEN cond THEN check ELSE false END
	ignored  *pg.Node // template: CASE WHEN false THEN (v)::int8 ELSE t END
	once     *pg.Node // ref IS NOT NULL, the one-time filter
	notNull  *pg.Node // template: fenceproxy_t IS NOT NULL
	// inline is the variant with the token as a constant (inline.go); nil for the variant itself.
	inline *tableEntry
}

// New validates cfg and prepares the SQL fragments.
func New(cfg Config) (*Rewriter, error) {
	setting := cfg.TokenSetting
	if setting == "" {
		setting = DefaultTokenSetting
	}
	if err := validSettingName(setting); err != nil {
		return nil, err
	}
	r := &Rewriter{setting: setting, lockSetting: cfg.LockSetting, verify: cfg.Verify, byName: make(map[string][]*tableEntry)}
	seen := make(map[[2]string]bool)
	for i, t := range cfg.Tables {
		if t.Name == "" || t.TokenColumn == "" {
			return nil, fmt.Errorf("rewrite: table %d: name and token column are required", i+1)
		}
		if strings.ContainsRune(t.Schema+t.Name+t.TokenColumn, 0) {
			return nil, fmt.Errorf("rewrite: table %q: names must not contain NUL", t.Label())
		}
		key := [2]string{t.Schema, t.Name}
		if seen[key] {
			return nil, fmt.Errorf("rewrite: table %q is configured twice", t.Label())
		}
		seen[key] = true
		e, err := newTableEntry(t, setting)
		if err == nil {
			e.inline, err = newInlineEntry(e, setting)
		}
		if err == nil {
			err = e.addLockCheck(cfg.LockSetting, t.RequireLock)
		}
		if err == nil {
			err = e.addSyncCommit(cfg.SynchronousCommit)
		}
		if err != nil {
			return nil, fmt.Errorf("rewrite: table %q: %w", t.Label(), err)
		}
		r.tables = append(r.tables, e)
		r.byName[t.Name] = append(r.byName[t.Name], e)
	}
	if err := r.addRefused(cfg.Refused); err != nil {
		return nil, err
	}
	r.filter = newPrefilter(prefilterTables(cfg.Tables, cfg.Refused), setting)
	r.fingerprint = fingerprintSQL(r.tables)
	return r, nil
}

// TokenSetting is the name of the setting that carries the token.
func (r *Rewriter) TokenSetting() string { return r.setting }

// validSettingName is setting.Validate: names the rewriter puts into SQL literals and markers.
func validSettingName(s string) error {
	if err := setting.Validate(s); err != nil {
		return fmt.Errorf("rewrite: token setting: %w", err)
	}
	return nil
}

// MayTouch is the prefilter under DefaultSettings (UTF-8,
// standard_conforming_strings on): false means the text can neither write a
// protected table nor set the token, so it passes without parsing. It errs
// toward true and does not allocate.
func (r *Rewriter) MayTouch(sql []byte) bool { return r.MayTouchWith(sql, DefaultSettings) }

// MayTouchWith is MayTouch for a session's settings. Text it cannot read
// exactly may touch when its raw bytes hold a keyword that could write
// (rawMayTouch).
func (r *Rewriter) MayTouchWith(sql []byte, s Settings) bool {
	rd := r.read(sql, s)
	if rd.why != "" {
		return r.rawMayTouch(sql)
	}
	return rd.touch
}

// Plan analyses sql under DefaultSettings. It does not cache.
func (r *Rewriter) Plan(sql string) Plan { return r.PlanWith([]byte(sql), DefaultSettings) }

// PlanWith analyses sql as the server reads it under s: decode, lex,
// prefilter, normalise, parse, fence. It does not cache.
func (r *Rewriter) PlanWith(sql []byte, s Settings) Plan {
	rd := r.read(sql, s)
	p, done := r.early(sql, rd)
	if !done {
		p = r.planReading(rd)
	}
	if p.Action == Pass {
		p.SQL = string(sql)
	}
	return p
}

// early decides about a text without parsing it: Pass when the prefilter
// rules it out, Refuse when it cannot be read exactly and may touch.
func (r *Rewriter) early(raw []byte, rd reading) (Plan, bool) {
	if rd.why != "" {
		if !r.rawMayTouch(raw) {
			return Plan{Action: Pass}, true
		}
		label := r.mentions(string(raw))
		if label == "" {
			label = "a protected table"
		}
		return refusal(CodeUnfenceable, label, fmt.Sprintf(
			"unfenceable write: cannot read this text exactly as the server will (%s), and it may write %s", rd.why, label)), true
	}
	if !rd.touch {
		return Plan{Action: Pass}, true
	}
	return Plan{}, false
}

// planReading plans a readable text the prefilter let through; a rewrite is
// re-encoded to the client's encoding.
func (r *Rewriter) planReading(rd reading) Plan {
	return r.forClient(r.plan(rd.sql(), rd.scsOff, rd.inline), rd)
}

// forClient turns a plan of the UTF-8 text rd.sql() into the plan for the
// client: a rewrite is re-encoded to the client's encoding.
func (r *Rewriter) forClient(p Plan, rd reading) Plan {
	if p.Action == Rewrite && !isASCIIString(p.SQL) {
		// The server reads the rewrite in the client's encoding.
		a := &analysis{r: r, tables: p.Tables}
		if !rd.outOK {
			return a.internal(fmt.Errorf("the rewritten statement holds non-ASCII characters and client_encoding %q is not known or not one the proxy can write", rd.client))
		}
		out, err := encodeFor(p.SQL, rd.outEnc)
		if err != nil {
			return a.internal(err)
		}
		p.SQL = out
		if p.TokenSegs != nil {
			// Each cut is at an ASCII parameter, between characters: the segments encode as the whole does.
			segs := make([]string, len(p.TokenSegs))
			for i, s := range p.TokenSegs {
				if segs[i], err = encodeFor(s, rd.outEnc); err != nil {
					return a.internal(err)
				}
			}
			p.TokenSegs = segs
		}
	}
	if p.Action == Pass {
		p.SQL = ""
	}
	return p
}

// fence parses sql and fences every protected write in its tree (the tree plan deparses), or gives the plan
// to return instead (a refusal, a pass, an internal error). ClientPosition fences the same text again to find
// where the client's nodes went.
func (r *Rewriter) fence(sql string, scsOff, inline bool) (*pg.ParseResult, *analysis, *Plan) {
	tree, err := pg.Parse(sql)
	if err != nil {
		p := r.unparsable(sql, err)
		return nil, nil, &p
	}
	if inline {
		inline = inlineable(tree)
	}
	a := &analysis{r: r, scsOff: scsOff, inline: inline}
	for _, raw := range tree.Stmts {
		a.statement(raw.Stmt)
		a.refuseCatalog(raw.Stmt)
	}
	if a.refusal != nil {
		return nil, nil, a.refusal
	}
	if len(a.writes) == 0 && len(a.checked) == 0 {
		p := a.result(Pass, sql)
		return nil, nil, &p
	}
	if len(a.writes) > 0 {
		if a.reservedName {
			p := refusal(CodeUnfenceable, a.writes[0].table.label, fmt.Sprintf(
				"unfenceable write: the name %s is reserved for the fence; rename the WITH query", stmtTokenName))
			return nil, nil, &p
		}
		if a.paramZero {
			p := refusal(CodeUnfenceable, a.writes[0].table.label,
				"unfenceable write: parameter $0 does not exist; parameters are numbered from $1")
			return nil, nil, &p
		}
	}
	for _, w := range a.writes {
		w.fence(a)
		if a.refusal != nil {
			return nil, nil, a.refusal
		}
	}
	if err := a.wrapChecked(tree); err != nil {
		p := a.internal(err)
		return nil, nil, &p
	}
	return tree, a, nil
}

// plan is the analysis of a UTF-8 text that pg_query reads as the server
// does. inline asks for the inline form (inline.go), which a text with a
// PREPARE does not get: its body runs later, under whatever token is then in
// force.
func (r *Rewriter) plan(sql string, scsOff, inline bool) Plan {
	tree, a, early := r.fence(sql, scsOff, inline)
	if early != nil {
		return *early
	}
	out, err := deparse(tree)
	var u undeparsable
	if errors.As(err, &u) {
		label := "a protected table"
		if len(a.writes) > 0 {
			label = a.writes[0].table.label
		}
		return refusal(CodeUnfenceable, label, fmt.Sprintf("unfenceable write to %s: %s", label, u))
	}
	if err != nil {
		return a.internal(fmt.Errorf("deparse: %w", err))
	}
	if len(a.checked) > 0 {
		if err := a.verifyChecked(out); err != nil {
			return a.internal(err)
		}
	}
	if r.verify {
		if err := r.verifyText(out, a.inlined); err != nil {
			return a.internal(err)
		}
	}
	p := a.result(Rewrite, out)
	if a.inlined {
		segs, ok := tokenSegments(out)
		if !ok || len(segs) < 2 {
			return a.internal(fmt.Errorf("the inline rewrite's token places cannot be found"))
		}
		p.TokenSegs = segs
	}
	return p
}

// verifyText parses sql and checks that every protected write in it is
// fenced; inline: in the inline form where a table has one.
func (r *Rewriter) verifyText(sql string, inline bool) error {
	tree, err := pg.Parse(sql)
	if err != nil {
		return fmt.Errorf("re-parse of the rewritten SQL: %w", err)
	}
	return verifyFenced(r, tree, inline)
}

// unparsable decides about text the parser rejects: refused when it mentions
// a protected table (or has a U&"..." identifier, which could spell one), else
// passed on for the server to reject.
func (r *Rewriter) unparsable(sql string, err error) Plan {
	msg := err.Error()
	if label := r.mentions(sql); label != "" {
		return refusal(CodeUnfenceable, label,
			fmt.Sprintf("unfenceable write: cannot parse a statement that mentions %s: %s", label, msg))
	}
	if containsFold(sql, `u&"`) {
		return refusal(CodeUnfenceable, "",
			fmt.Sprintf("unfenceable write: cannot parse a statement with unicode-escaped names, which may hide a protected table: %s", msg))
	}
	return Plan{Action: Pass, SQL: sql}
}

func refusal(code, table, msg string) Plan {
	p := Plan{Action: Refuse, Code: code, Table: table, Message: msg}
	if table != "" {
		p.Tables = []string{table}
	}
	return p
}

// containsFold reports whether s contains sub, ASCII case-insensitively.
func containsFold(s, sub string) bool {
	n := len(sub)
	for i := 0; i+n <= len(s); i++ {
		if strings.EqualFold(s[i:i+n], sub) {
			return true
		}
	}
	return false
}

// lookup finds the configured table a RangeVar denotes. It returns nil when
// the relation is not protected, and a refusal when an unqualified name could
// be several protected tables with different token columns.
func (r *Rewriter) lookup(rv *pg.RangeVar) (*tableEntry, *Plan) {
	if rv == nil {
		return nil, nil
	}
	cands := r.byName[rv.Relname]
	if len(cands) == 0 {
		return nil, nil
	}
	if rv.Schemaname != "" {
		var bare *tableEntry
		for _, e := range cands {
			if e.Schema == rv.Schemaname {
				return e, nil
			}
			if e.Schema == "" {
				bare = e
			}
		}
		return bare, nil
	}
	// Unqualified: it may resolve (through search_path) to any of them.
	first := cands[0]
	for _, e := range cands[1:] {
		if e.TokenColumn != first.TokenColumn {
			p := refusal(CodeUnfenceable, first.label, fmt.Sprintf(
				"unfenceable write: %s may be %s or %s, which have different token columns; qualify the table name",
				rv.Relname, first.label, e.label))
			return nil, &p
		}
	}
	for _, e := range cands {
		if e.Schema == "" {
			return e, nil
		}
	}
	return first, nil
}
