package rewrite

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// SQL-level prepared statements under transaction pooling (proxy/pooledsqlprep.go). A client's PREPARE, EXECUTE
// and DEALLOCATE name statements of the client's session; on a pooled server connection the proxy gives them
// server names of its own. The names are found and replaced in the parse tree, and the text deparsed: never
// spliced.

// PreparedKind is what a statement does with a prepared statement's name.
type PreparedKind int

const (
	// PrepareName: PREPARE name [(types)] AS statement.
	PrepareName PreparedKind = iota
	// ExecuteName: EXECUTE name [(arguments)], also under EXPLAIN and CREATE TABLE AS.
	ExecuteName
	// DeallocateName: DEALLOCATE [PREPARE] name.
	DeallocateName
	// DeallocateAll: DEALLOCATE [PREPARE] ALL (Name is "").
	DeallocateAll
)

// PreparedRef is one use of a prepared statement's name in a text, in the order the server meets them.
type PreparedRef struct {
	Stmt int // the statement's index among the text's statements: its CommandComplete's
	Kind PreparedKind
	Name string
	// Body is, for PrepareName, the PREPARE deparsed with the name p: what the statement is, whatever the client
	// calls it.
	Body string
}

// PreparedRefs returns the uses of prepared statements' names in sql (UTF-8, read as pg_query reads it), in
// order; an error when it does not parse or cannot be deparsed exactly.
func PreparedRefs(sql string) ([]PreparedRef, error) {
	tree, err := pg.Parse(sql)
	if err != nil {
		return nil, fmt.Errorf("prepared statements: %w", err)
	}
	var refs []PreparedRef
	for i, raw := range tree.Stmts {
		var err error
		eachNode(raw, func(n *pg.Node) {
			switch x := n.GetNode().(type) {
			case *pg.Node_PrepareStmt:
				name := x.PrepareStmt.Name
				x.PrepareStmt.Name = "p" // the deparser needs a name (an empty one crashes it)
				var body string
				body, err = deparse(&pg.ParseResult{Version: tree.Version, Stmts: []*pg.RawStmt{{Stmt: n}}})
				x.PrepareStmt.Name = name
				refs = append(refs, PreparedRef{Stmt: i, Kind: PrepareName, Name: name, Body: body})
			case *pg.Node_ExecuteStmt:
				refs = append(refs, PreparedRef{Stmt: i, Kind: ExecuteName, Name: x.ExecuteStmt.Name})
			case *pg.Node_DeallocateStmt:
				if x.DeallocateStmt.Isall || x.DeallocateStmt.Name == "" {
					refs = append(refs, PreparedRef{Stmt: i, Kind: DeallocateAll})
				} else {
					refs = append(refs, PreparedRef{Stmt: i, Kind: DeallocateName, Name: x.DeallocateStmt.Name})
				}
			}
		})
		if err != nil {
			return nil, fmt.Errorf("prepared statements: deparse of a PREPARE: %w", err)
		}
	}
	return refs, nil
}

// PreparedRefsAs is PreparedRefs of raw, a text in the session's client encoding, read as the server reads it
// under s (as the planner reads it): decoded from the client encoding, and, with standard_conforming_strings
// off, every '...' literal holding a backslash read with escapes (normalise). An error wrapping ErrUnreadable
// when it cannot be read exactly (an encoding the proxy cannot read, settings in flux, a lexical error). It
// tells whether a text uses names at all; the names it finds are not for replacing in the text the client
// sent (RenamePrepared deparses the reading, not the client's bytes).
func PreparedRefsAs(raw []byte, s Settings) ([]PreparedRef, error) {
	text, why := decode(raw, s)
	if why != "" {
		return nil, fmt.Errorf("%w: %s", ErrUnreadable, why)
	}
	if bytes.IndexByte(text, '\\') >= 0 {
		if !s.known() {
			return nil, fmt.Errorf("%w: a backslash, and standard_conforming_strings is not known", ErrUnreadable)
		}
		l := newLexer(text, s.StandardConformingStrings)
		for t := l.next(); t.kind != tokEOF; t = l.next() {
		}
		if l.err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUnreadable, l.err)
		}
		if !s.StandardConformingStrings {
			text = []byte(normalise(text))
		}
	}
	return PreparedRefs(string(text))
}

// RenamePrepared is sql with the name of each use PreparedRefs found replaced by names[i] (same order), deparsed,
// and each PREPARE alone, renamed and deparsed (prepares[i] for a PrepareName use, "" for the others).
func RenamePrepared(sql string, names []string) (out string, prepares []string, err error) {
	tree, err := pg.Parse(sql)
	if err != nil {
		return "", nil, fmt.Errorf("prepared statements: %w", err)
	}
	prepares = make([]string, len(names))
	i := 0
	var bad error
	for _, raw := range tree.Stmts {
		eachNode(raw, func(n *pg.Node) {
			if bad != nil {
				return
			}
			var target *string
			switch x := n.GetNode().(type) {
			case *pg.Node_PrepareStmt:
				target = &x.PrepareStmt.Name
			case *pg.Node_ExecuteStmt:
				target = &x.ExecuteStmt.Name
			case *pg.Node_DeallocateStmt:
				if x.DeallocateStmt.Isall || x.DeallocateStmt.Name == "" {
					i++
					return
				}
				target = &x.DeallocateStmt.Name
			default:
				return
			}
			if i >= len(names) {
				bad = errors.New("more names used than given")
				return
			}
			*target = names[i]
			if n.GetPrepareStmt() != nil {
				prepares[i], bad = deparse(&pg.ParseResult{Version: tree.Version, Stmts: []*pg.RawStmt{{Stmt: n}}})
			}
			i++
		})
	}
	if bad == nil && i != len(names) {
		bad = fmt.Errorf("%d names given for %d uses", len(names), i)
	}
	if bad != nil {
		return "", nil, fmt.Errorf("prepared statements: %w", bad)
	}
	if out, err = deparse(tree); err != nil {
		return "", nil, fmt.Errorf("prepared statements: deparse: %w", err)
	}
	return out, prepares, nil
}

// Put is a statement (a text of one) to go right before statement Before of a text (its index among the
// text's statements).
type Put struct {
	Before int
	SQL    string
}

// Span is a stretch of a text: Len bytes from byte At.
type Span struct{ At, Len int }

// PutBefore is sql with each statement of put inserted right before the statement of sql it names (several
// before one statement in the order given), deparsed, and the spans of out the inserted statements take (one
// for those before each statement, with the separator after them), in order: out with the spans taken off is
// sql deparsed. A statement
// that goes in front of the one that first needs it, not in front of the whole text, runs after what the text
// does before (a table made again, work committed, a failed block ended), as the client's own would.
func PutBefore(sql string, put []Put) (out string, spans []Span, err error) {
	tree, err := pg.Parse(sql)
	if err != nil {
		return "", nil, fmt.Errorf("put before: %w", err)
	}
	before := make([][]*pg.RawStmt, len(tree.Stmts))
	for _, p := range put {
		if p.Before < 0 || p.Before >= len(tree.Stmts) {
			return "", nil, fmt.Errorf("put before: no statement %d of %d", p.Before, len(tree.Stmts))
		}
		pt, err := pg.Parse(p.SQL)
		if err != nil || len(pt.Stmts) != 1 {
			return "", nil, fmt.Errorf("put before: not one statement: %q", p.SQL)
		}
		before[p.Before] = append(before[p.Before], pt.Stmts[0])
	}
	// Each statement deparsed alone, and the text whole: the whole must be the parts joined by "; " (as the
	// deparser joins them), or the spans would not be where the inserted statements are.
	var stmts []*pg.RawStmt
	var b strings.Builder
	part := func(s *pg.RawStmt) error {
		one, err := deparse(&pg.ParseResult{Version: tree.Version, Stmts: []*pg.RawStmt{s}})
		if err != nil {
			return fmt.Errorf("put before: deparse: %w", err)
		}
		b.WriteString(one)
		stmts = append(stmts, s)
		return nil
	}
	for i, raw := range tree.Stmts {
		if i > 0 {
			b.WriteString("; ")
		}
		if len(before[i]) > 0 {
			at := b.Len()
			for _, s := range before[i] {
				if err := part(s); err != nil {
					return "", nil, err
				}
				b.WriteString("; ")
			}
			spans = append(spans, Span{At: at, Len: b.Len() - at})
		}
		if err := part(raw); err != nil {
			return "", nil, err
		}
	}
	tree.Stmts = stmts
	if out, err = deparse(tree); err != nil || out != b.String() {
		return "", nil, fmt.Errorf("put before: the deparsed text is not its statements joined (%v)", err)
	}
	return out, spans, nil
}
