package rewrite

import (
	"bytes"
	"fmt"
	"unicode/utf8"

	"golang.org/x/text/encoding"
	"golang.org/x/text/encoding/charmap"
	"golang.org/x/text/encoding/japanese"
	"golang.org/x/text/encoding/korean"
	"golang.org/x/text/encoding/simplifiedchinese"
	"golang.org/x/text/encoding/traditionalchinese"
)

// Settings are the session settings that decide how the server reads a
// text: the server reports each in ParameterStatus, at startup and whenever
// it changes. The zero value means "not known": only pure ASCII text without
// backslashes is readable then.
type Settings struct {
	// ClientEncoding and ServerEncoding are PostgreSQL's encoding names as
	// ParameterStatus reports them (UTF8, LATIN1, SJIS, SQL_ASCII ...).
	ClientEncoding string
	ServerEncoding string
	// StandardConformingStrings: '...' treats backslashes literally (on) or
	// as escapes (off).
	StandardConformingStrings bool
	// Unsettled: an earlier message the server has not answered yet may
	// have changed the settings (a SET, a function, a rollback), so they are
	// known only for texts that read the same under every setting.
	Unsettled bool
	// InlineToken: the caller knows the token in force wherever the text's statements run and puts it into
	// the rewrite itself (Plan.WithToken): fence in the inline form (inline.go). A text with a PREPARE, or with
	// a parameter numbered like the token's place, is planned in the usual form.
	InlineToken bool
}

// DefaultSettings are PostgreSQL's defaults for a UTF-8 database.
var DefaultSettings = Settings{ClientEncoding: "UTF8", ServerEncoding: "UTF8", StandardConformingStrings: true}

func (s Settings) known() bool {
	return s.ClientEncoding != "" && s.ServerEncoding != "" && !s.Unsettled
}

// clientEncoding returns the x/text encoding that reads the client's bytes
// exactly as PostgreSQL does, nil for UTF-8 itself, and false for an encoding
// the proxy cannot read. SQL_ASCII as client encoding means no conversion:
// the bytes are the server encoding's. A SQL_ASCII server does not convert
// either; it validates the text in the client encoding and lexes its bytes,
// which (every such encoding being ASCII-safe) splits it into the same
// tokens. Raw bytes with SQL_ASCII on both sides are read as UTF-8 when they
// are valid UTF-8 (decode refuses them otherwise).
func (s Settings) clientEncoding() (encoding.Encoding, bool) {
	name := s.ClientEncoding
	if name == "SQL_ASCII" {
		name = s.ServerEncoding
	}
	if name == "SQL_ASCII" {
		return nil, true
	}
	return pgEncoding(name)
}

// pgEncoding maps a PostgreSQL encoding name (as ParameterStatus reports it)
// to the x/text encoding that splits its bytes into the same characters; nil
// is UTF-8. Encodings missing here (JOHAB, EUC_TW, MULE_INTERNAL,
// EUC_JIS_2004, SHIFT_JIS_2004) cannot be read: their non-ASCII texts are
// refused when they may touch a protected table.
func pgEncoding(name string) (encoding.Encoding, bool) {
	switch name {
	case "UTF8":
		return nil, true
	case "LATIN1":
		return charmap.ISO8859_1, true
	case "LATIN2":
		return charmap.ISO8859_2, true
	case "LATIN3":
		return charmap.ISO8859_3, true
	case "LATIN4":
		return charmap.ISO8859_4, true
	case "LATIN5":
		return charmap.ISO8859_9, true
	case "LATIN6":
		return charmap.ISO8859_10, true
	case "LATIN7":
		return charmap.ISO8859_13, true
	case "LATIN8":
		return charmap.ISO8859_14, true
	case "LATIN9":
		return charmap.ISO8859_15, true
	case "LATIN10":
		return charmap.ISO8859_16, true
	case "ISO_8859_5":
		return charmap.ISO8859_5, true
	case "ISO_8859_6":
		return charmap.ISO8859_6, true
	case "ISO_8859_7":
		return charmap.ISO8859_7, true
	case "ISO_8859_8":
		return charmap.ISO8859_8, true
	case "KOI8R":
		return charmap.KOI8R, true
	case "KOI8U":
		return charmap.KOI8U, true
	case "WIN866":
		return charmap.CodePage866, true
	case "WIN874":
		return charmap.Windows874, true
	case "WIN1250":
		return charmap.Windows1250, true
	case "WIN1251":
		return charmap.Windows1251, true
	case "WIN1252":
		return charmap.Windows1252, true
	case "WIN1253":
		return charmap.Windows1253, true
	case "WIN1254":
		return charmap.Windows1254, true
	case "WIN1255":
		return charmap.Windows1255, true
	case "WIN1256":
		return charmap.Windows1256, true
	case "WIN1257":
		return charmap.Windows1257, true
	case "WIN1258":
		return charmap.Windows1258, true
	case "SJIS":
		return japanese.ShiftJIS, true
	case "EUC_JP":
		return japanese.EUCJP, true
	case "BIG5":
		return traditionalchinese.Big5, true
	case "GBK", "EUC_CN": // GBK is a superset of EUC_CN with the same character boundaries
		return simplifiedchinese.GBK, true
	case "GB18030":
		return simplifiedchinese.GB18030, true
	case "UHC", "EUC_KR": // x/text's EUC-KR is the UHC (CP949) superset
		return korean.EUCKR, true
	}
	return nil, false
}

// reading is a text as the server will read it: its UTF-8 form, and what
// the prefilter says about it.
type reading struct {
	text      []byte            // UTF-8 (raw itself when no conversion was needed)
	outEnc    encoding.Encoding // the client encoding to write a rewrite in; nil for UTF-8 (or bytes as they are)
	outOK     bool              // a rewrite holding non-ASCII characters can be written for the client (outEnc)
	client    string            // the client encoding's name, for errors
	nonASCII  bool              // raw holds bytes >= 0x80 (the encodings matter)
	why       string            // non-empty: the text cannot be read exactly, for this reason
	touch     bool              // the prefilter: the text may touch a protected table or the token
	normalise bool              // '...' literals read with escapes (standard_conforming_strings off) hold backslashes
	// scsOff: standard_conforming_strings is off and the text holds a
	// backslash, so strings nested in it (DO bodies) may read differently.
	scsOff bool
	inline bool // Settings.InlineToken
}

// sql is the text for pg_query, which reads standard_conforming_strings =
// on: normalised when the server reads it with off.
func (rd reading) sql() string {
	if rd.normalise {
		return normalise(rd.text)
	}
	return string(rd.text)
}

// isASCII reports whether b holds no byte >= 0x80.
func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

// isASCIIString is isASCII for a string.
func isASCIIString(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// decode converts the client's bytes to UTF-8 exactly, or reports why it
// cannot. ASCII text is returned as is, in every encoding.
func decode(raw []byte, s Settings) ([]byte, string) {
	if isASCII(raw) {
		return raw, ""
	}
	if !s.known() {
		if s.Unsettled {
			return nil, "non-ASCII text sent before the server answered an earlier statement that may have changed client_encoding"
		}
		return nil, "client_encoding is not known"
	}
	enc, ok := s.clientEncoding()
	if !ok {
		return nil, fmt.Sprintf("client_encoding %s is not one the proxy can read", s.ClientEncoding)
	}
	if enc == nil {
		if !utf8.Valid(raw) {
			return nil, "invalid UTF-8"
		}
		return raw, ""
	}
	text, err := enc.NewDecoder().Bytes(raw)
	if err != nil {
		return nil, fmt.Sprintf("invalid %s: %v", s.ClientEncoding, err)
	}
	back, err := enc.NewEncoder().Bytes(text)
	if err != nil || !bytes.Equal(back, raw) {
		return nil, fmt.Sprintf("the text does not convert exactly from %s", s.ClientEncoding)
	}
	return text, ""
}

// read decodes and lexes raw under s and runs the prefilter on its tokens.
// It does not allocate for UTF-8 (or ASCII) text.
func (r *Rewriter) read(raw []byte, s Settings) reading {
	if !r.rawMayTouch(raw) {
		return reading{} // nothing in it can touch, however it is read
	}
	return r.readText(raw, s)
}

// readText is read for a text the raw prefilter (rawMayTouch) let through.
func (r *Rewriter) readText(raw []byte, s Settings) reading {
	text, why := decode(raw, s)
	if why != "" {
		return reading{why: why}
	}
	rd := reading{text: text, nonASCII: !isASCII(raw), client: s.ClientEncoding}
	rd.inline = s.InlineToken
	if s.known() {
		rd.outEnc, rd.outOK = s.clientEncoding()
	}
	scs := s.StandardConformingStrings
	if !s.known() && bytes.IndexByte(text, '\\') >= 0 {
		// A '...' literal holding a backslash reads differently under the
		// other standard_conforming_strings; when none does (in the reading
		// with escapes), both readings are the same.
		off := r.scan(text, false)
		if off.err == nil && off.do {
			// A DO body is read by PL/pgSQL under the session's
			// standard_conforming_strings too.
			rd.why = "a DO block and a backslash, and standard_conforming_strings is not known (an earlier statement that may change it is in flight)"
			return rd
		}
		if off.err != nil || off.normalise {
			on := r.scan(text, true)
			if on.err == nil && !on.touch && (off.err != nil || !off.touch) {
				return rd // neither reading touches (or the server rejects the text)
			}
			rd.why = "a backslash in a string literal, and standard_conforming_strings is not known (an earlier statement that may change it is in flight)"
			return rd
		}
		scs = true
	}
	sc := r.scan(text, scs)
	if sc.err != nil {
		rd.why = fmt.Sprintf("cannot read the text: %v", sc.err)
		return rd
	}
	if rd.nonASCII && s.ServerEncoding != "UTF8" && longNonASCIIIdent(text, scs) {
		// The server truncates identifiers to 63 bytes of its own
		// encoding; pg_query and the lexer count UTF-8 bytes.
		rd.why = "an identifier with non-ASCII characters longer than 63 bytes, which a " + s.ServerEncoding + " server truncates differently"
		return rd
	}
	rd.touch, rd.normalise = sc.touch, sc.normalise
	rd.scsOff = !scs && bytes.IndexByte(text, '\\') >= 0
	return rd
}

// longNonASCIIIdent reports whether text has an identifier holding non-ASCII
// characters and at least namedatalen bytes (of UTF-8).
func longNonASCIIIdent(text []byte, scs bool) bool {
	l := newLexer(text, scs)
	for t := l.next(); t.kind != tokEOF; t = l.next() {
		if t.isIdent() && t.end-t.start >= namedatalen && !isASCII(text[t.start:t.end]) {
			return true
		}
	}
	return false
}

// validParam reports whether the digits of $n name a parameter a Bind can
// fill (1..65535).
func validParam(digits []byte) bool {
	n := 0
	for _, d := range digits {
		n = n*10 + int(d-'0')
		if n > 65535 {
			return false
		}
	}
	return n >= 1
}

// scanResult is what one pass of the lexer learns about a text.
type scanResult struct {
	touch     bool  // the prefilter says: parse it
	do        bool  // the text holds the keyword DO
	normalise bool  // standard_conforming_strings is off and a '...' or N'...' literal holds a backslash
	err       error // a lexical error: the server rejects the text (or the lexer is wrong: unreadable)
}

// scan runs the lexer over text and applies the prefilter to its decoded
// tokens. A text may touch a protected table or the token when it holds
//
//   - a write keyword (insert, update, delete, merge, truncate, copy, and
//     alter, drop, create for DDL: a keyword is a bare identifier token, it
//     cannot be quoted or escaped)
//     and an identifier whose value (after case folding, "" and U& decoding)
//     is a protected table's name; or
//   - the keyword DO (a DO block's body is a string: always analysed); or
//   - an identifier naming set_config or holding the token setting's first
//     part (GUC names are case-insensitive); or
//   - an identifier naming a schema of the in-database guard, search_path or
//     SCHEMA (prefilter.alone: a guard schema may not enter the search_path,
//     guardpath.go).
//
// It does not allocate.
func (r *Rewriter) scan(text []byte, scs bool) scanResult {
	l := newLexer(text, scs)
	var res scanResult
	var write, name bool
	var buf [2 * namedatalen]byte
	for {
		t := l.next()
		if t.kind == tokEOF {
			break
		}
		if !scs && (t.kind == tokString || t.kind == tokNString) && t.backslash {
			res.normalise = true
		}
		if t.kind == tokParam && !validParam(text[t.start+1:t.end]) && res.err == nil {
			// $0 (or a number no Bind can fill): the server rejects the
			// statement at parse analysis, possibly after earlier
			// statements of the text ran; pg_query deparses $0 as ?.
			res.err = fmt.Errorf("%w: parameter %s", errLex, text[t.start:t.end])
		}
		if !t.isIdent() {
			continue
		}
		if t.kind == tokIdent && isWriteOrDo(text[t.start:t.end]) {
			switch {
			case t.end-t.start == 2:
				res.touch, res.do = true, true
			case reachesUnnamed(text[t.start:t.end]) && len(r.tables) > 0:
				// DDL that can reach a protected table without naming it (ddl.go).
				res.touch = true
			default:
				write = true
			}
		}
		if t.kind == tokIdent && len(r.tables) > 0 && equalFoldASCII(text[t.start:t.end], "trigger") {
			// CREATE TRIGGER ... FOR EACH ROW can reach a protected partition without naming it (ddl.go).
			res.touch = true
		}
		if t.kind == tokIdent && t.end-t.start < namedatalen {
			// Unquoted and short: its value is its ASCII-downcased bytes,
			// compared without copying.
			word := text[t.start:t.end]
			name = name || r.filter.namesFolded(word)
			res.touch = res.touch || r.filter.alone(word)
			continue
		}
		v, ok := l.identValue(t, buf[:0])
		if !ok {
			res.touch = true // the server rejects it; the parser will say why
			continue
		}
		if r.filter.names(v) {
			name = true
		}
		if r.filter.alone(v) {
			res.touch = true
		}
	}
	if l.err != nil {
		res.err = l.err
	}
	res.touch = res.touch || write && name
	return res
}

// normalise respells, for a reader that assumes standard_conforming_strings
// = on, every '...' and N'...' literal that the server reads with backslash
// escapes (standard_conforming_strings = off) and that holds a backslash: the
// server scans such a literal exactly like E'...' (scan.l: {xqstart} begins
// state xe when standard_conforming_strings is off), so an E goes before its
// opening quote (N'...' is NCHAR '...', and becomes NCHAR E'...'). A space
// keeps the E from joining a preceding identifier. Nothing else changes.
func normalise(text []byte) string {
	l := newLexer(text, false)
	out := make([]byte, 0, len(text)+16)
	last := 0
	for {
		t := l.next()
		if t.kind == tokEOF {
			break
		}
		if !t.backslash || t.kind != tokString && t.kind != tokNString {
			continue
		}
		out = append(out, text[last:t.start]...)
		if t.kind == tokNString {
			out = append(out, " NCHAR E"...)
			out = append(out, text[t.start+1:t.end]...)
		} else {
			out = append(out, " E"...)
			out = append(out, text[t.start:t.end]...)
		}
		last = t.end
	}
	return string(append(out, text[last:]...))
}

// rawMayTouch is the prefilter on raw bytes, for text the proxy cannot read
// exactly (an unknown encoding, invalid bytes, settings in flux) and as a
// fast path that rules texts out before they are decoded and lexed. It errs
// toward true. Whatever the encoding, a keyword is a run of ASCII letters in
// the raw bytes that does not continue an identifier (the byte before it is
// not a letter, _ or a byte >= 0x80; a digit or $ does not join a letter, as
// in PostgreSQL 14's 1update and in 0$do), and an identifier can hold the token setting's
// name or set_config only as those raw letters unless it is a U& identifier.
// It reports whether raw holds a write keyword, DO or SCHEMA as such a word,
// u&, or set_config, search_path or the setting's first part anywhere.
func (r *Rewriter) rawMayTouch(raw []byte) bool {
	n := len(raw)
	first := r.filter.settingFirst // lower case, not empty
	for i := 0; i < n; i++ {
		c := lower(raw[i])
		if c == first[0] && n-i >= len(first) && equalFoldASCII(raw[i:i+len(first)], first) {
			return true
		}
		switch c {
		case 's':
			if n-i >= 10 && equalFoldASCII(raw[i:i+10], "set_config") || n-i >= 11 && equalFoldASCII(raw[i:i+11], "search_path") {
				return true
			}
			if n-i < 6 || !equalFoldASCII(raw[i:i+6], "schema") {
				continue
			}
		case 'u':
			if i+1 < n && raw[i+1] == '&' {
				return true
			}
		case 'i', 'd', 'm', 't', 'c', 'a', 'r': // first letters of isWriteOrDo's words
		default:
			continue
		}
		if i > 0 && continuesWord(raw[i-1]) {
			continue
		}
		j := i + 1
		for j < n && isIdentCont(raw[j]) {
			j++
		}
		if isWriteOrDo(raw[i:j]) || equalFoldASCII(raw[i:j], "schema") {
			return true
		}
	}
	return false
}

// continuesWord reports whether a letter after c surely continues c's
// identifier. A $ does not count: after a number or an operator it is a token
// of its own ($do is $ and DO).
func continuesWord(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

// isWriteOrDo reports whether word is DO or a keyword that starts a
// statement able to write a table or change it: insert, update, delete,
// merge, truncate, copy, and the DDL verbs alter, drop, create and reassign
// (so that DDL naming a protected table reaches the analysis).
func isWriteOrDo(word []byte) bool {
	switch len(word) {
	case 2:
		return equalFoldASCII(word, "do")
	case 4:
		return equalFoldASCII(word, "copy") || equalFoldASCII(word, "drop")
	case 5:
		return equalFoldASCII(word, "merge") || equalFoldASCII(word, "alter")
	case 6:
		return equalFoldASCII(word, "insert") || equalFoldASCII(word, "update") || equalFoldASCII(word, "delete") || equalFoldASCII(word, "create")
	case 8:
		return equalFoldASCII(word, "truncate") || equalFoldASCII(word, "reassign")
	}
	return false
}

// reachesUnnamed reports whether word is a keyword whose statement can reach
// a protected table without naming it: ALTER (a schema rename), DROP (...
// CASCADE, DROP OWNED), TRUNCATE (... CASCADE) and REASSIGN (OWNED). Texts
// with them are parsed whenever a table is protected; they are rare outside
// migrations. (So are texts holding TRIGGER, for CREATE TRIGGER: scan.)
func reachesUnnamed(word []byte) bool {
	return equalFoldASCII(word, "alter") || equalFoldASCII(word, "drop") || equalFoldASCII(word, "truncate") || equalFoldASCII(word, "reassign")
}

func containsFoldBytes(raw []byte, sub string) bool {
	n := len(sub)
	for i := 0; i+n <= len(raw); i++ {
		if equalFoldASCII(raw[i:i+n], sub) {
			return true
		}
	}
	return false
}

// encodeFor converts a rewritten statement (UTF-8) back to the client's
// encoding, in which the server will read it.
func encodeFor(sql string, enc encoding.Encoding) (string, error) {
	if enc == nil {
		return sql, nil
	}
	b, err := enc.NewEncoder().Bytes([]byte(sql))
	if err != nil {
		return "", fmt.Errorf("re-encode the rewritten statement: %w", err)
	}
	return string(b), nil
}
