package rewrite

import (
	"math"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// deparse is pg.Deparse with the tree first respelled around the deparser's known faults, so that the text
// reads back as the same tree (the same meaning):
//
//   - a negative number with a subscript or field selection, (-1)[1] or (-1.5).f, is printed without its
//     parentheses, -1[1], which PostgreSQL reads as the minus of 1[1] (a syntax error, or another meaning).
//     The number is given to the deparser as the operator expression - 1, which it parenthesises, (- 1)[1];
//     the parser folds - 1 back into the constant -1, so the text reads back as the client's tree. Any
//     other constant with a subscript or field selection ((1)[1], (-0)[1], ('{1}')[1], (NULL).f) has no
//     such spelling, and PostgreSQL rejects it anyway (no constant has subscripts or fields): refused.
//   - a bit string holding a backslash, B'1\0', is printed bE'1\\0': the type name be and a string, a cast
//     to whatever type be is. Such a constant is no bit string (the server rejects it), so the text is refused
//     (an undeparsable error).
func deparse(tree *pg.ParseResult) (string, error) {
	var bad error
	eachNode(tree, func(n *pg.Node) {
		if ind := n.GetAIndirection(); ind != nil && ind.Arg.GetAConst() != nil {
			if neg := negatedNumber(ind.Arg); neg != nil {
				ind.Arg = neg
			} else if bad == nil {
				bad = undeparsable("a constant with a subscript or field selection, which PostgreSQL rejects and the deparser cannot print as written")
			}
		}
		if b := n.GetAConst().GetBsval(); b != nil && strings.ContainsRune(b.Bsval, '\\') && bad == nil {
			bad = undeparsable("a bit string constant holding a backslash (not a valid bit string), which cannot be rewritten exactly")
		}
	})
	if bad != nil {
		return "", bad
	}
	return pg.Deparse(tree)
}

// undeparsable is a tree the deparser cannot print as the client wrote it.
type undeparsable string

func (u undeparsable) Error() string { return string(u) }

// negatedNumber returns - c for a negative numeric constant -c (the form the parser folds into -c), or nil.
func negatedNumber(n *pg.Node) *pg.Node {
	c := n.GetAConst()
	if c == nil || c.Isnull {
		return nil
	}
	var pos *pg.Node
	switch {
	case c.GetIval() != nil && c.GetIval().Ival < 0:
		v := c.GetIval().Ival
		if v == math.MinInt32 {
			pos = floatConst(strconv.FormatInt(-int64(v), 10), c.Location)
		} else {
			pos = pg.MakeAConstIntNode(int64(-v), c.Location)
		}
	case c.GetFval() != nil && strings.HasPrefix(c.GetFval().Fval, "-"):
		pos = floatConst(c.GetFval().Fval[1:], c.Location)
	default:
		return nil
	}
	return pg.MakeAExprNode(pg.A_Expr_Kind_AEXPR_OP, []*pg.Node{pg.MakeStrNode("-")}, nil, pos, c.Location)
}

func floatConst(digits string, location int32) *pg.Node {
	return &pg.Node{Node: &pg.Node_AConst{AConst: &pg.A_Const{Val: &pg.A_Const_Fval{Fval: &pg.Float{Fval: digits}}, Location: location}}}
}
