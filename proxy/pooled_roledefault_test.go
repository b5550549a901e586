package proxy_test

import (
	"context"
	"strings"
	"testing"
)

// A role's default of the token or lock (set on the server, outside the proxy, which refuses it) is what a
// RESET gives on the pool's server connections, and also what a set to that value gives. A client whose reset
// value is another (a startup option) that sets the token to the default's value has that token directly; until
// 2026-12-05 the pool took every such read for a reset and gave the client its startup token back, an older
// token for a newer one (a review's finding). The value a reset gives is read as one rule for every pool reset
// value now: a reset where the texts leave the setting reset, a set where they leave it set, and otherwise no
// token (the lock: the session ends, as for the empty lock).
func TestPooledSetToTheRoleDefault(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	const role = "review_roledefault"
	for _, sql := range []string{
		"DROP ROLE IF EXISTS " + role, "CREATE ROLE " + role + " LOGIN",
		"ALTER ROLE " + role + " SET fence.token = '7'", "ALTER ROLE " + role + " SET fence.lock = 'LD'",
	} {
		fxExec(t, f.d, sql)
	}
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	startups := map[string]map[string]string{
		"startup token and lock": {"options": "-c fence.token=5 -c fence.lock=L1"},
		"role defaults":          {},
	}
	// Where both readings differ and the texts cannot tell them apart, no token.
	closed := strings.NewReplacer("token=7 ", "token= ")
	cases := []soCase{
		{"SET to the default", soQ("SET fence.token = 7"), nil, ""},
		{"SET to the default in a block", soQ("BEGIN", "SET fence.token = 7", "COMMIT"), nil, ""},
		{"set_config to the default", soQ("SELECT set_config('fence.token', '7', false)"), nil, ""},
		{"RESET", soQ("RESET fence.token"), nil, ""},
		{"SET another", soQ("SET fence.token = 8"), nil, ""},
		{"RESET, then SET to the default", soQ("RESET fence.token; SET fence.token = 7"), nil, ""},
		{"SET to the default, then RESET", soQ("SET fence.token = 7; RESET fence.token"), nil, ""},
		{"RESET ALL, then SET LOCAL", soQ("SET fence.token = 8", "RESET ALL; SET LOCAL fence.token = 9"), nil, ""},
		{"SET to the default, a RESET rolled back", soQ("BEGIN", "SET fence.token = 7", "SAVEPOINT a", "RESET fence.token", "ROLLBACK TO a", "COMMIT"), closed, "startup token and lock"},
		{"a SET rolled back, then SET to the default", soQ("BEGIN", "SAVEPOINT a", "SET fence.token = 8", "ROLLBACK TO a", "SET fence.token = 7", "COMMIT"), nil, ""},
		{"lock SET to the default", soQ("SET fence.lock = 'LD'"), nil, ""},
		{"lock RESET", soQ("SET fence.lock = 'LX'", "RESET fence.lock"), nil, ""},
	}
	startupOracle(t, f, role, startups, cases)
}
