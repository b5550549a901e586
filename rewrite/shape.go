package rewrite

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// The shape cache (issue 20): statements that differ only in their constants
// share one plan template. See "Shape cache" in doc.go for what is
// normalised, what is not, and why a template gives the same SQL as the full
// rewrite.

// maxShapeConsts bounds the constants of a normalised text: placeholders are
// parameters $1..$n, and the server knows at most 65535 of them.
const maxShapeConsts = 65535

// shapeTemplate is the plan of one statement shape. ok is false for a shape
// not built yet (pending) or whose texts are planned in full (the
// normalised text does not parse, or its plan differs from the plan of the
// text it was built from).
type shapeTemplate struct {
	// pending: the shape was seen once; the template is built when it is
	// seen again.
	pending bool
	ok      bool
	plan    Plan // Action (Pass or Rewrite), Tables; SQL is empty
	// segs and consts are the rewritten text: segs[0], the constant
	// consts[0], segs[1], ... (len(segs) == len(consts)+1). A const of -1 is
	// the token of an inline rewrite (inline.go), cut there in the plan.
	segs   []string
	consts []int
	inline bool // some const is -1
	// ascii: every seg is ASCII, so a text in ASCII fills it in ASCII.
	ascii bool
	// prep is the template as a statement to prepare on the server
	// (prepared.go); nil when it cannot be one.
	prep *Prepared
}

// shaped is a text read for the shape cache: its key and the byte spans, in
// the text, of the constants that the key replaces.
type shaped struct {
	key   []byte
	spans [][2]int
	// unprepared: as a prepared statement the template would not mean
	// what it means as SQL (a typed literal, a number after -(: shapeOf;
	// prepared.go), so it is not prepared.
	unprepared bool
}

// shapeStarts are the first words of the statements whose texts are
// normalised: plain DML, whose analysis never reads a constant's value (it
// tells constants from other expressions, and integers from other constants:
// both are in the key).
var shapeStarts = []string{"select", "insert", "update", "delete", "with", "values"}

// constKeywords are the keywords after which a constant is an expression (an
// operand), so a parameter can stand in its place. After any other
// identifier a constant may be part of the grammar (DATE '...', INTERVAL '1'
// DAY, ORDER BY 1, FETCH FIRST 5 ROWS, a quoted type name 'literal') and is
// kept in the key as written.
var constKeywords = []string{
	"select", "where", "and", "or", "not", "then", "else", "when", "case", "like", "ilike",
	"similar", "escape", "between", "symmetric", "asymmetric", "limit", "offset", "returning",
	"having", "on", "distinct",
}

// shapeOf reads text (UTF-8, as pg_query reads it: standard_conforming_strings
// on) for the shape cache. ok is false when the text is not normalised: a
// statement that is not plain DML, a parameter, set_config or the token
// setting's name anywhere (their analysis reads constants), or a lexical
// error.
func (r *Rewriter) shapeOf(text []byte) (s shaped, ok bool) {
	if bytes.IndexByte(text, 0) >= 0 || containsFoldBytes(text, "set_config") || containsFoldBytes(text, r.filter.settingFirst) {
		// A zero byte: the key delimits its placeholders with zero bytes, so such a text could share the key of
		// another text with other constants (PostgreSQL reads no text past a zero byte anyway).
		return s, false
	}
	l := newLexer(text, true)
	var tokBuf [64]token // enough for most statements; longer ones grow it
	toks := tokBuf[:0]
	for t := l.next(); t.kind != tokEOF; t = l.next() {
		toks = append(toks, t)
	}
	if l.err != nil {
		return s, false
	}
	is := func(i int, kind tokenKind, w string) bool {
		return i >= 0 && i < len(toks) && toks[i].kind == kind && string(text[toks[i].start:toks[i].end]) == w
	}
	start := true
	last := 0
	s.key = make([]byte, 0, len(text)+16)
	s.spans = make([][2]int, 0, 8)
	for i, t := range toks {
		switch {
		case t.kind == tokSemicolon:
			start = true
			continue
		case start:
			if t.kind != tokIdent || !wordIn(text[t.start:t.end], shapeStarts) {
				return s, false
			}
			start = false
			continue
		case t.kind == tokParam:
			return s, false
		case t.kind != tokNumber && !t.isString():
			continue
		}
		if t.kind == tokUString || t.escapes {
			// Escapes the server refuses (an invalid Unicode escape, a
			// byte sequence that is not UTF-8, a zero byte) fail the
			// full rewrite's parse but would fill a template: such a
			// text is planned in full.
			var scratch [128]byte
			v, err := l.stringValue(t, scratch[:0])
			if err != nil || bytes.IndexByte(v, 0) >= 0 {
				return s, false
			}
		}
		if j := closingParens(toks, i+1, text); j > i+1 && (is(j, tokSelf, "[") || is(j, tokSelf, ".")) {
			// A parenthesised constant with a subscript or field:
			// the full plan respells or refuses it (deparse.go),
			// by its value.
			return s, false
		}
		if (t.kind == tokBitString || t.kind == tokHexString) && bytes.IndexByte(text[t.start:t.end], '\\') >= 0 {
			// Not a bit string (the server rejects it); the full plan
			// refuses it (deparse.go), a template would fill it in.
			return s, false
		}
		class := constClass(t, text)
		if class == 0 || i > 0 && !operandSlot(toks[i-1], text) {
			if t.isString() {
				// DATE '...', INTERVAL '1' DAY: converted when the
				// statement is analysed, with the settings of that
				// moment (DateStyle, TimeZone, IntervalStyle; 'now'),
				// which for a prepared statement is its PREPARE
				// (prepared.go).
				s.unprepared = true
			}
			continue // kept in the key as written
		}
		from, first := t.start, i
		if t.kind == tokNumber && is(i-1, tokSelf, "-") && (i == 1 || !endsOperand(toks[i-2], text)) {
			// A unary minus: the parser folds it into the constant,
			// unless an operator that binds tighter than it follows.
			if !(is(i+1, tokOp, "::") || is(i+1, tokSelf, "[") || is(i+1, tokSelf, ".")) {
				from, first = toks[i-1].start, i-1
				class = negatedClass(class, text[t.start:t.end])
			}
		}
		if t.kind == tokNumber && minusBeforeParens(toks, first, text) {
			// -(5), -(-5): the parser folds a minus into the
			// parenthesised constant too and types the value it makes,
			// so -(2147483648) is an int4 and -(-2147483648) an int8: a
			// parameter would not have the constant's type (prepared.go).
			// The key has the parentheses, so every text of the shape
			// has such a constant.
			s.unprepared = true
		}
		if len(s.spans) == maxShapeConsts {
			return s, false
		}
		s.key = append(s.key, text[last:from]...)
		s.key = append(s.key, 0, class)
		s.key = strconv.AppendInt(s.key, int64(len(s.spans)), 10)
		s.key = append(s.key, 0)
		s.spans = append(s.spans, [2]int{from, t.end})
		last = t.end
	}
	if len(s.spans) == 0 {
		return s, false // nothing to share
	}
	s.key = append(s.key, text[last:]...)
	return s, true
}

// minusBeforeParens reports whether toks[i] (a constant, or the minus folded
// into it) follows one or more '(' after a unary minus (conservatively:
// whatever follows the constant).
func minusBeforeParens(toks []token, i int, text []byte) bool {
	k := i - 1
	for k >= 0 && toks[k].kind == tokSelf && text[toks[k].start] == '(' {
		k--
	}
	if k == i-1 || k < 0 || toks[k].kind != tokSelf || text[toks[k].start] != '-' {
		return false
	}
	return k == 0 || !endsOperand(toks[k-1], text)
}

// classes returns the class (constClass) of each constant the key
// replaces, in order: each placeholder is a zero byte, the class, the
// constant's number and a zero byte, and a normalised text holds no zero
// byte of its own (shapeOf).
func (s shaped) classes() []byte {
	cs := make([]byte, 0, len(s.spans))
	for i := 0; i < len(s.key); i++ {
		if s.key[i] == 0 {
			cs = append(cs, s.key[i+1])
			i += 2 + bytes.IndexByte(s.key[i+2:], 0) // to the placeholder's closing zero byte
		}
	}
	return cs
}

// closingParens returns the index of the first token from i on that is not
// a ')'.
func closingParens(toks []token, i int, text []byte) int {
	for i < len(toks) && toks[i].kind == tokSelf && text[toks[i].start] == ')' {
		i++
	}
	return i
}

// constClass is the class of a constant the shape replaces, which the key
// keeps: the parser makes an integer that fits 32 bits an Integer and other
// numbers a Float, and each string form its own node (N'...' a cast to bpchar,
// B'...' and X'...' bit strings). A Float is an int8 constant when it is an
// integer that fits 64 bits and a numeric one otherwise: the classes keep
// the type apart too (i, l, f), so that a shape's constants have one type
// each (prepared.go). 0 keeps the constant in the key as written (numbers in
// other notations).
func constClass(t token, text []byte) byte {
	switch t.kind {
	case tokString:
		return 's'
	case tokEString:
		return 'e'
	case tokNString:
		return 'n'
	case tokUString:
		return 'u'
	case tokBitString:
		return 'b'
	case tokHexString:
		return 'x'
	case tokDollar:
		return 'd'
	case tokNumber:
	default:
		return 0
	}
	digits := text[t.start:t.end]
	integer := true
	for _, c := range digits {
		switch {
		case isDigit(c):
		case c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-':
			integer = false
		default:
			return 0 // 0x1F, 1_000: kept as written
		}
	}
	if integer {
		if n, err := strconv.ParseInt(string(digits), 10, 64); err == nil {
			if n <= 1<<31-1 {
				return 'i'
			}
			return 'l'
		}
	}
	return 'f'
}

// negatedClass is the class of a number (class c, spelled digits) with a
// unary minus folded into it: the parser folds the sign into the constant
// and types the negative value, so -2147483648 is an int4 and
// -9223372036854775808 an int8 (j, k); other negatives are numeric (-).
func negatedClass(c byte, digits []byte) byte {
	if c != 'i' && c != 'l' && c != 'f' {
		return '-'
	}
	n, err := strconv.ParseInt("-"+string(digits), 10, 64) // fails for 1.5, 1e3
	switch {
	case err != nil:
		return '-'
	case n >= -1<<31:
		return 'j'
	}
	return 'k'
}

// operandSlot reports whether a constant after prev is an operand that a
// parameter may replace: after an operator, punctuation other than ')' and
// ']' (and '.'), a constant, or a keyword of constKeywords.
func operandSlot(prev token, text []byte) bool {
	w := text[prev.start:prev.end]
	switch prev.kind {
	case tokOp:
		return true
	case tokSelf:
		return !(len(w) == 1 && (w[0] == ')' || w[0] == ']' || w[0] == '.'))
	case tokIdent:
		return wordIn(w, constKeywords)
	}
	return false
}

// wordIn reports whether the unquoted identifier w is one of the lower-case
// words, ASCII case-insensitively.
func wordIn(w []byte, words []string) bool {
	for _, x := range words {
		if equalFoldASCII(w, x) {
			return true
		}
	}
	return false
}

// endsOperand reports whether a '-' after t is a binary minus: t ends an
// operand (a name, a constant, a parameter, ')' or ']').
func endsOperand(t token, text []byte) bool {
	w := text[t.start:t.end]
	switch {
	case t.kind == tokIdent:
		return !wordIn(w, constKeywords)
	case t.kind == tokQIdent, t.kind == tokUIdent, t.kind == tokNumber, t.kind == tokParam, t.isString():
		return true
	case t.kind == tokSelf:
		return len(w) == 1 && (w[0] == ')' || w[0] == ']')
	}
	return false
}

// normalised is text with each span replaced by its placeholder $1, $2, ...
// (spaced, so that it joins no neighbouring token).
func normalisedText(text []byte, spans [][2]int) string {
	out := make([]byte, 0, len(text)+4*len(spans))
	last := 0
	for i, sp := range spans {
		out = append(out, text[last:sp[0]]...)
		out = append(out, " $"...)
		out = strconv.AppendInt(out, int64(i+1), 10)
		out = append(out, ' ')
		last = sp[1]
	}
	return string(append(out, text[last:]...))
}

// buildTemplate plans the normalised form of text once and checks it
// against full, the plan of text itself (UTF-8, before re-encoding): the
// template is kept (ok) only when its plan has the same outcome and, for a
// rewrite, the template filled with text's own constants parses to the same
// tree as full's SQL. A shape that fails is planned in full every time.
func (r *Rewriter) buildTemplate(text []byte, sh shaped, scsOff, inline bool, full Plan) *shapeTemplate {
	bad := &shapeTemplate{}
	if full.Action != Pass && full.Action != Rewrite || full.TokenSet || full.TokenDynamic || len(full.Tokens) > 0 || full.TokenSession {
		return bad
	}
	norm := normalisedText(text, sh.spans)
	if _, err := pg.Parse(norm); err != nil {
		return bad // a constant the grammar needs as a literal
	}
	p := r.plan(norm, scsOff, inline)
	if (p.TokenSegs == nil) != (full.TokenSegs == nil) {
		return bad
	}
	if p.Action != full.Action || !slices.Equal(p.Tables, full.Tables) || p.TokenSet || p.TokenDynamic || len(p.Tokens) > 0 || p.TokenSession {
		return bad
	}
	t := &shapeTemplate{ok: true, plan: p}
	t.plan.SQL = ""
	if p.Action == Pass {
		return t
	}
	out := []byte(p.SQL)
	l := newLexer(out, true)
	last := 0
	for tok := l.next(); tok.kind != tokEOF; tok = l.next() {
		if tok.kind != tokParam {
			continue
		}
		n, err := strconv.Atoi(string(out[tok.start+1 : tok.end]))
		if n == inlineSlot && p.TokenSegs != nil {
			n, t.inline = 0, true // const -1: the token
		} else if err != nil || n < 1 || n > len(sh.spans) {
			return bad
		}
		t.segs = append(t.segs, string(out[last:tok.start]))
		t.consts = append(t.consts, n-1)
		last = tok.end
	}
	if l.err != nil {
		return bad
	}
	t.segs = append(t.segs, string(out[last:]))
	t.ascii = isASCII(out)
	filled, _ := t.fill(text, sh.spans)
	same, err := sameParse(filled, full.SQL)
	if err != nil || !same {
		return bad
	}
	if !sh.unprepared && !t.inline {
		t.prep = preparedOf(p.SQL, sh.classes())
	}
	return t
}

// fill is the template's SQL with the constants of text (at spans) in place
// of the placeholders, spaced; a constant with its minus sign in
// parentheses, so that no operator before it absorbs the sign and no
// operator after it binds tighter than the sign.
func (t *shapeTemplate) fill(text []byte, spans [][2]int) (sql string, tokenSegs []string) {
	n := len(t.segs[0])
	for i, c := range t.consts {
		n += len(t.segs[i+1]) + 4
		if c >= 0 {
			n += spans[c][1] - spans[c][0]
		} else {
			n += len(inlineSlotText)
		}
	}
	var out strings.Builder
	out.Grow(n)
	out.WriteString(t.segs[0])
	var cuts []int // where each token goes in out, and where it ends
	for i, c := range t.consts {
		if c < 0 {
			cuts = append(cuts, out.Len(), out.Len()+len(inlineSlotText))
			out.WriteString(inlineSlotText)
			out.WriteString(t.segs[i+1])
			continue
		}
		v := text[spans[c][0]:spans[c][1]]
		if v[0] == '-' {
			out.WriteString(" (")
			out.Write(v)
			out.WriteString(") ")
		} else {
			out.WriteByte(' ')
			out.Write(v)
			out.WriteByte(' ')
		}
		out.WriteString(t.segs[i+1])
	}
	sql = out.String()
	if cuts != nil {
		last := 0
		for i := 0; i < len(cuts); i += 2 {
			tokenSegs = append(tokenSegs, sql[last:cuts[i]])
			last = cuts[i+1]
		}
		tokenSegs = append(tokenSegs, sql[last:])
	}
	return sql, tokenSegs
}

// planShaped is the plan of a text served by a template (t.ok).
func (r *Rewriter) planShaped(t *shapeTemplate, text []byte, spans [][2]int, rd reading) Plan {
	p := t.plan
	if p.Action == Pass {
		return p
	}
	p.SQL, p.TokenSegs = t.fill(text, spans)
	if r.verify {
		if err := r.verifyText(p.SQL, t.inline); err != nil {
			a := &analysis{r: r, tables: p.Tables}
			return a.internal(err)
		}
	}
	if t.prep != nil && !t.prep.Failed() {
		p.Prepared, p.Args = t.prep, executeArgs(text, spans)
	}
	if t.ascii && !rd.nonASCII {
		return p // ASCII: the same bytes in every client encoding
	}
	p = r.forClient(p, rd)
	if p.Action != Rewrite {
		p.Prepared, p.Args = nil, ""
	}
	if p.Prepared != nil && !isASCIIString(p.Args) {
		// The arguments are read in the client's encoding too.
		args, err := encodeFor(p.Args, rd.outEnc)
		if !rd.outOK || err != nil {
			p.Prepared, args = nil, ""
		}
		p.Args = args
	}
	return p
}

// SameRewrite reports whether a and b, two rewrites of one text planned under the reading settings set, send
// the server the same statements: the same bytes, or texts that decode and parse to the same tree, locations
// aside. A shape's template and a full deparse spell one fence with other white space (a template's fill
// keeps the blanks around each constant), so bytes alone would call the same fence another. A text that does
// not decode or parse is not the same, so a caller that refuses what changed refuses it.
func SameRewrite(a, b string, set Settings) bool {
	if a == b {
		return true
	}
	da, whyA := decode([]byte(a), set)
	db, whyB := decode([]byte(b), set)
	if whyA != "" || whyB != "" {
		return false
	}
	same, err := sameParse(string(da), string(db))
	return err == nil && same
}

// sameParse reports whether a and b parse to the same tree, locations aside.
func sameParse(a, b string) (bool, error) {
	ta, err := pg.Parse(a)
	if err != nil {
		return false, fmt.Errorf("parse %q: %w", a, err)
	}
	tb, err := pg.Parse(b)
	if err != nil {
		return false, fmt.Errorf("parse %q: %w", b, err)
	}
	for _, t := range []*pg.ParseResult{ta, tb} {
		clearLocations(t)
		for _, st := range t.Stmts {
			st.StmtLocation, st.StmtLen = 0, 0
		}
	}
	return proto.Equal(ta, tb), nil
}
