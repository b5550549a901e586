package rewrite

import (
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

// AfterBlockExit is sql with front (statements, each a text of one) put after its first statement, deparsed,
// when that statement is one a failed transaction block lets run (COMMIT, ROLLBACK, ROLLBACK TO, PREPARE
// TRANSACTION: each ends the failed state) and others follow it; false otherwise. In a failed block statements
// in front of it would be refused (25P02), and the whole text with them, where the client's own text runs. at
// is the byte offset in out where front starts: an error's position before it is in the client's text, one
// inside it in none of the client's.
func AfterBlockExit(sql string, front []string) (out string, at int, ok bool) {
	tree, err := pg.Parse(sql)
	if err != nil || len(tree.Stmts) < 2 {
		return "", 0, false
	}
	ts := tree.Stmts[0].GetStmt().GetTransactionStmt()
	if ts == nil {
		return "", 0, false
	}
	switch ts.Kind {
	case pg.TransactionStmtKind_TRANS_STMT_COMMIT, pg.TransactionStmtKind_TRANS_STMT_ROLLBACK,
		pg.TransactionStmtKind_TRANS_STMT_ROLLBACK_TO, pg.TransactionStmtKind_TRANS_STMT_PREPARE:
	default:
		return "", 0, false
	}
	first, err := deparse(&pg.ParseResult{Version: tree.Version, Stmts: tree.Stmts[:1]})
	if err != nil {
		return "", 0, false
	}
	stmts := []*pg.RawStmt{tree.Stmts[0]}
	for _, f := range front {
		ft, err := pg.Parse(f)
		if err != nil || len(ft.Stmts) != 1 {
			return "", 0, false
		}
		stmts = append(stmts, ft.Stmts[0])
	}
	tree.Stmts = append(stmts, tree.Stmts[1:]...)
	if out, err = deparse(tree); err != nil || !strings.HasPrefix(out, first+"; ") {
		return "", 0, false
	}
	return out, len(first) + 2, true
}
