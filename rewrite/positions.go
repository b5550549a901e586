package rewrite

import (
	"unicode"
	"unicode/utf8"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Positions of the server's errors and notices in a rewritten text.
//
// The server's position field (P of ErrorResponse and NoticeResponse) counts characters, from 1, of the text
// it ran: for a rewrite, the deparsed fenced text, not the client's. ClientPosition maps such a position back
// to the client's text. It is built only when an error or notice with a position comes back (rare), from what
// the proxy keeps anyway: the client's text, the settings it was planned under and the text sent.
//
// The fence keeps the client's nodes (it adds nodes around and next to them, and may repeat one, as the
// condition of a DELETE), and every node keeps the location where the client wrote it; the fragments it adds
// have their locations cleared (parseFragment). Parsing the sent text again gives the same tree with each node
// at its location in the sent text, so walking both trees in step pairs each client node's place in the sent
// text with its place in the client's. PostgreSQL points an error at a node's location (parser_errposition),
// so a position is mapped through the node that starts nearest at or before it in the same statement:
//
//   - a client's node: the position becomes that node's in the client's text;
//   - a node the fence added (its CTE, guard conditions, subqueries): the position becomes the start of the
//     client's statement. A caret under the first word of the statement the error is about says which
//     statement failed without pointing at a token of the client's that has nothing to do with it (as the
//     nearest client token before the fence's text would); dropping it instead would leave psql without the
//     LINE of a multi-statement text that says which statement it was.
//
// A position that cannot be mapped (the sent text does not parse again into the same statements, or it is read
// with standard_conforming_strings off and holds backslashes, where pg_query would read its literals
// differently) is dropped: PostgreSQL omits the field when it has no position, and no caret is better than
// one under the wrong token.

// ClientPosition maps pos, a position (characters from 1) in sent, the text the proxy sent for the client's
// text client planned under s (Plan.SQL or Plan.WithToken, in the client's encoding), to the client's text.
// ok is false when the position is best dropped.
func (r *Rewriter) ClientPosition(client []byte, s Settings, sent []byte, pos int) (int, bool) {
	rd := r.read(client, s)
	if rd.why != "" || !rd.touch || rd.normalise || rd.scsOff {
		return 0, false
	}
	// A SQL_ASCII server counts bytes (each is a character to it), and converts nothing: the bytes it counts are
	// the client's. Read as UTF-8 they are the texts' own bytes; read through another encoding they are not.
	inBytes := false
	if s.ServerEncoding == "SQL_ASCII" && !(isASCII(client) && isASCII(sent)) {
		if enc, ok := s.clientEncoding(); !ok || enc != nil {
			return 0, false
		}
		inBytes = true
	}
	csql := rd.sql()
	ctree, _, p := r.fence(csql, rd.scsOff, rd.inline)
	if p != nil {
		return 0, false
	}
	stext, why := decode(sent, s)
	if why != "" {
		return 0, false
	}
	stree, err := pg.Parse(string(stext))
	if err != nil {
		return 0, false
	}
	return mapPosition(ctree, csql, stree, string(stext), pos, inBytes)
}

// ClientPosition is the Rewriter's ClientPosition (not cached: it runs only for an error or a notice with a
// position).
func (c *Cache) ClientPosition(client []byte, s Settings, sent []byte, pos int) (int, bool) {
	return c.r.ClientPosition(client, s, sent, pos)
}

// mapPosition maps pos (characters from 1 in stext, whose parse is stree) to ctext, whose fenced tree ctree
// deparses to stext. inBytes: positions count bytes (a SQL_ASCII server), not characters.
func mapPosition(ctree *pg.ParseResult, ctext string, stree *pg.ParseResult, stext string, pos int, inBytes bool) (int, bool) {
	var b int
	var ok bool
	if inBytes {
		// Within the text and at a character's start: the server points at tokens, never inside a character.
		b, ok = pos-1, pos >= 1 && pos-1 <= len(stext) && (pos-1 == len(stext) || utf8.RuneStart(stext[pos-1]))
	} else {
		b, ok = byteOffset(stext, pos)
	}
	if !ok || len(ctree.Stmts) != len(stree.Stmts) {
		return 0, false
	}
	i := statementAt(stree, len(stext), b)
	if i < 0 {
		return 0, false
	}
	best, bestC, found := int32(-1), int32(0), false
	pairLocations(ctree.Stmts[i].Stmt.ProtoReflect(), stree.Stmts[i].Stmt.ProtoReflect(), func(sLoc, cLoc int32, mapped bool) {
		if sLoc < 0 || int(sLoc) > b || sLoc < best || sLoc == best && !mapped {
			return
		}
		best, found = sLoc, mapped
		if mapped {
			bestC = cLoc
		}
	})
	if !found || int(bestC) > len(ctext) {
		bestC = statementStart(ctree, ctext, i)
	}
	if inBytes {
		return int(bestC) + 1, true
	}
	return utf8.RuneCountInString(ctext[:bestC]) + 1, true
}

// byteOffset is the byte offset in text of the character at pos (from 1); pos may be one past the last.
func byteOffset(text string, pos int) (int, bool) {
	if pos < 1 {
		return 0, false
	}
	n := 1
	for i := range text {
		if n == pos {
			return i, true
		}
		n++
	}
	return len(text), n == pos
}

// statementAt is the index of the statement of tree (of a text of n bytes) that byte offset b is in; -1 when
// none.
func statementAt(tree *pg.ParseResult, n, b int) int {
	for i, st := range tree.Stmts {
		end := n
		if st.StmtLen > 0 {
			end = int(st.StmtLen + st.StmtLocation)
		}
		if b >= int(st.StmtLocation) && (b < end || i == len(tree.Stmts)-1 && b == end) {
			return i
		}
	}
	return -1
}

// statementStart is the byte offset in text of the first character of statement i of tree (past the
// whitespace that a statement's span starts with after a semicolon; comments stay).
func statementStart(tree *pg.ParseResult, text string, i int) int32 {
	at := int(tree.Stmts[i].StmtLocation)
	for at < len(text) {
		c, n := utf8.DecodeRuneInString(text[at:])
		if !unicode.IsSpace(c) {
			break
		}
		at += n
	}
	return int32(at)
}

// pairLocations walks s (a node of the sent text's tree) and c (its counterpart in the client's fenced tree,
// or an invalid message where there is none) in step and calls fn for every location field of s: cLoc is the
// counterpart's, mapped whether it is a client's location (the fence's fragments have theirs cleared to 0; a
// client's node at the very start of the text maps as the statement's start would).
func pairLocations(c, s protoreflect.Message, fn func(sLoc, cLoc int32, mapped bool)) {
	paired := c != nil && c.IsValid() && c.Descriptor() == s.Descriptor()
	if _, ok := s.Interface().(*pg.Node); ok {
		fd := s.WhichOneof(nodeOneof)
		if fd == nil {
			return
		}
		var cm protoreflect.Message
		if paired && c.WhichOneof(nodeOneof) == fd {
			cm = c.Get(fd).Message()
		}
		pairLocations(cm, s.Get(fd).Message(), fn)
		return
	}
	fields := s.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		switch {
		case fd.Name() == "location" && fd.Kind() == protoreflect.Int32Kind:
			var cLoc int32
			if paired {
				cLoc = int32(c.Get(fd).Int())
			}
			fn(int32(s.Get(fd).Int()), cLoc, cLoc > 0)
		case fd.Kind() != protoreflect.MessageKind || fd.IsMap() || !s.Has(fd):
		case fd.IsList():
			l := s.Get(fd).List()
			var cl protoreflect.List
			if paired && c.Has(fd) && c.Get(fd).List().Len() == l.Len() {
				cl = c.Get(fd).List()
			}
			for j := 0; j < l.Len(); j++ {
				var cm protoreflect.Message
				if cl != nil {
					cm = cl.Get(j).Message()
				}
				pairLocations(cm, l.Get(j).Message(), fn)
			}
		default:
			var cm protoreflect.Message
			if paired && c.Has(fd) {
				cm = c.Get(fd).Message()
			}
			pairLocations(cm, s.Get(fd).Message(), fn)
		}
	}
}
