package proxy_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A client's named statement that PostgreSQL no longer holds (DISCARD ALL or DEALLOCATE ALL deallocated it, its
// Parse failed, or a failed batch skipped its Parse) gets 26000 at its next Bind or Describe, as directly. Until
// 2026-12-03 the pool prepared it again from the text it kept, and the Bind ran.
func TestPooledStatementGoneAsDirectly(t *testing.T) {
	parse := func(name, text string) *pgproto3.Parse { return &pgproto3.Parse{Name: name, Query: text} }
	run := func(name string) []pgproto3.FrontendMessage {
		return []pgproto3.FrontendMessage{&pgproto3.Bind{PreparedStatement: name}, &pgproto3.Execute{}, &pgproto3.Sync{}}
	}
	describe := func(name string) []pgproto3.FrontendMessage {
		return []pgproto3.FrontendMessage{&pgproto3.Describe{ObjectType: 'S', Name: name}, &pgproto3.Sync{}}
	}
	sync := &pgproto3.Sync{}
	for _, c := range []struct {
		name  string
		steps [][]pgproto3.FrontendMessage
	}{
		{"discard all", [][]pgproto3.FrontendMessage{
			{parse("g1", "SELECT 1 AS one"), sync}, run("g1"),
			{&pgproto3.Query{String: "DISCARD ALL"}}, run("g1"), describe("g1"),
			{parse("g1", "SELECT 2 AS two"), sync}, run("g1"),
		}},
		{"deallocate all", [][]pgproto3.FrontendMessage{
			{parse("g2", "SELECT 1 AS one"), sync},
			{&pgproto3.Query{String: "DEALLOCATE ALL"}}, run("g2"), describe("g2"),
		}},
		{"deallocate all in a block", [][]pgproto3.FrontendMessage{
			{parse("g3", "SELECT 1 AS one"), sync},
			{&pgproto3.Query{String: "BEGIN; DEALLOCATE ALL"}}, run("g3"), {&pgproto3.Query{String: "ROLLBACK"}}, run("g3"),
		}},
		{"pipelined after the discard", [][]pgproto3.FrontendMessage{
			{parse("g4", "SELECT 1 AS one"), sync},
			append(append([]pgproto3.FrontendMessage{&pgproto3.Query{String: "DISCARD ALL"}}, run("g4")...), run("g4")...),
			{&pgproto3.Query{String: "DISCARD ALL"}, parse("g4", "SELECT 3 AS three"), sync}, run("g4"),
		}},
		{"failed parse", [][]pgproto3.FrontendMessage{
			{parse("g5", "SELECT FROM nowhere_at_all"), sync}, run("g5"), describe("g5"),
		}},
		{"parse skipped by a failed batch", [][]pgproto3.FrontendMessage{
			{parse("", "SELECT 1/0"), &pgproto3.Bind{}, &pgproto3.Execute{}, parse("g6", "SELECT 1 AS one"), sync}, run("g6"),
			{parse("g6", "SELECT 4 AS four"), sync}, run("g6"),
		}},
		{"a failed discard in a block", [][]pgproto3.FrontendMessage{
			{parse("g7", "SELECT 1 AS one"), sync},
			{&pgproto3.Query{String: "BEGIN"}}, {&pgproto3.Query{String: "DISCARD ALL"}}, {&pgproto3.Query{String: "ROLLBACK"}}, run("g7"),
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newPooledFenced(t, 1, "")
			sameAsDirect(t, pooledPgConn(t, f, ""), c.steps...)
		})
	}
}
