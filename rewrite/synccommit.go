package rewrite

import (
	"fmt"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// Synchronous fenced writes (fence.synchronous_commit, docs/ha.md): with a level set, the transaction of every
// fenced write runs with synchronous_commit at that level, transaction-locally (SET LOCAL), so that with a
// synchronous standby a fenced write the client saw committed is on the standby too, and survives a failover.
// Other statements are not touched and pay nothing.
//
// The setting is made inside the statement, where its token is validated (e.token's valid arm, once per
// statement, like the lock check), so it costs no extra message and no extra round trip:
//
//	CASE WHEN set_config('synchronous_commit', level, true) IS NOT NULL THEN <valid token> END
//
// set_config never returns NULL; the CASE only orders the call before the token's use. synchronous_commit is
// read at COMMIT, so setting it at any statement of the transaction covers the whole transaction.
const tmplSyncCommit = `SELECT CASE WHEN pg_catalog.set_config('synchronous_commit', '@level@', true) IS NOT NULL THEN fenceproxy_v END`

// SynchronousCommitLevels are the values fence.synchronous_commit may name besides "" (off: not set).
var SynchronousCommitLevels = []string{"remote_apply", "on", "remote_write", "local"}

// addSyncCommit makes the table's fenced writes set synchronous_commit to level; "" leaves e as it is.
func (e *tableEntry) addSyncCommit(level string) error {
	if level == "" {
		return nil
	}
	valid := false
	for _, l := range SynchronousCommitLevels {
		valid = valid || l == level
	}
	if !valid {
		return fmt.Errorf("synchronous_commit level %q", level)
	}
	set, err := parseFragment(tmplSyncCommit, strings.NewReplacer("@level@", level))
	if err != nil {
		return err
	}
	if err := e.wrapValidArms(func(valid *pg.Node) *pg.Node {
		return substitute(set, map[string]*pg.Node{"fenceproxy_v": valid})
	}); err != nil {
		return fmt.Errorf("synchronous_commit: %w", err)
	}
	if e.inline != nil {
		// set_config is volatile, and PostgreSQL makes only a condition without volatile functions a one-time
		// filter: the inline check, now holding it, goes into a scalar subquery (an InitPlan, run once), so that
		// it is still checked once, before any row, also when no row matches.
		once, err := parseFragment(tmplInlineOnceSubquery, strings.NewReplacer())
		if err != nil {
			return err
		}
		e.inline.once = substitute(once, map[string]*pg.Node{phTok: e.inline.token})
	}
	return nil
}
