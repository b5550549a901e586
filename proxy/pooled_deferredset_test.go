package proxy_test

import (
	"strings"
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// A set_config whose text comes before a reset may run after it: a cursor's query runs at each FETCH, a
// portal's at each Execute (one suspended by a row limit runs again at the next), a view's when it is read. Its
// set to the empty string then wins, and directly the client has no token (writes refused 55F02). Until
// 2026-12-05 the pool read the texts as a set replaced by the later RESET, took the empty value read back for
// the reset, and gave the client its startup token back: a token the client had cleared wrote (a review's
// finding). What may run later now stays "may" through every statement after it (rewrite.Effect.Later), as
// directly: no token.
func TestPooledDeferredSetAfterReset(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	setEmpty := "SELECT set_config('fence.token', lower(''), false)"
	cases := []soCase{
		{"cursor, a block of Queries", soQ("BEGIN", "DECLARE c CURSOR FOR "+setEmpty, "RESET fence.token", "FETCH c", "COMMIT"), nil, ""},
		{"cursor, one Query", soQ("BEGIN; DECLARE c CURSOR FOR " + setEmpty + "; RESET fence.token; FETCH c; COMMIT"), nil, ""},
		{"cursor, RESET ALL", soQ("BEGIN; DECLARE c CURSOR FOR " + setEmpty + "; RESET ALL; FETCH c; COMMIT"), nil, ""},
		{"cursor, DISCARD ALL is refused in a block", soQ("BEGIN; DECLARE c CURSOR FOR "+setEmpty+"; COMMIT", "DISCARD ALL"), nil, ""},
		{"cursor moved", soQ("BEGIN; DECLARE c SCROLL CURSOR FOR " + setEmpty + "; SET fence.token TO DEFAULT; MOVE ABSOLUTE 1 IN c; COMMIT"), nil, ""},
		{"cursor of application_name", soQ("BEGIN; DECLARE c CURSOR FOR SELECT set_config('application_name', '', false); RESET ALL; FETCH c; COMMIT"), nil, ""},
		{"cursor opened by a DO block", soQ("BEGIN", "DO $$DECLARE c refcursor := 'mycur'; BEGIN OPEN c FOR SELECT set_config('application_name', '', false); END$$", "RESET ALL", "FETCH mycur", "COMMIT"), nil, ""},
		{"portal suspended", [][]woMsg{
			{woQ("BEGIN")},
			{woP("", setEmpty+" FROM generate_series(1, 2)"), woB("p", ""), woE("p", 1), woS},
			{woQ("RESET fence.token")},
			{woE("p", 1), woS},
			{woQ("COMMIT")},
		}, nil, ""},
		{"portal suspended, named statement bound", [][]woMsg{
			{woP("s1", "SELECT set_config('fence.token', $1, false) FROM generate_series(1, 2)"), woS},
			{woQ("BEGIN")},
			{woB("p", "s1", ""), woE("p", 1), woS},
			{woQ("RESET ALL")},
			{woE("p", 1), woS},
			{woQ("COMMIT")},
		}, nil, ""},
		{"view", soQ("BEGIN; CREATE VIEW review_deferred_v AS " + setEmpty + " AS x; RESET fence.token; SELECT * FROM review_deferred_v; DROP VIEW review_deferred_v; COMMIT"), nil, ""},
		// What runs in order still reads as it did: the set_config runs before the reset.
		{"in order", soQ("BEGIN; " + setEmpty + "; RESET fence.token; COMMIT"), nil, ""},
		// The pool cannot tell that the cursor ran before the reset, and no more: it fails closed.
		{"cursor fetched before the reset", soQ("BEGIN; DECLARE c CURSOR FOR " + setEmpty + "; FETCH c; CLOSE c; RESET fence.token; COMMIT"),
			strings.NewReplacer("token=5 ", "token= "), ""},
		{"portal run before the reset", [][]woMsg{
			{woQ("BEGIN")},
			{woP("", "SELECT set_config('application_name', 'y', false)"), woB("", ""), woE("", 0), woS},
			{woQ("RESET application_name; SET LOCAL application_name = 'x'")},
			{woQ("COMMIT")},
		}, strings.NewReplacer("application_name=subj ", "application_name= "), ""},
	}
	startupOracle(t, f, pgtest.SuperUser, soStartups, cases)
}
