package rewrite

import (
	"fmt"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// Lock fences (contract "Lock fences") are enforced in the database by the guard that `fenceproxy install`
// puts on every protected table (package schema): its row trigger calls fenceproxy.lock_accept, which checks
// and raises the lock's mark in the same statement, for the proxy's writes and for every other write path
// alike. A session that names a lock in a database without the guard gets row fencing, as any session does:
// `fenceproxy lock` names the lock for every writer, and a deployment that has not installed lock fences keeps
// working as before. A table that must have lock fences says require_lock; for it the rewrite adds, once per
// statement inside k (the token InitPlan), after the token has been validated:
//
//   - a session that names no lock: 55F02 naming the lock setting, as the guard raises it;
//   - a session that names a lock in a database without the fenceproxy schema (no lock fences to check):
//     55F04, never row fencing only.
//
// In SQL, replacing the token's valid arm (s::int8) with
//
//	CASE WHEN COALESCE(current_setting(lock, true), '') = '' THEN s::int8 (or, with require_lock, the 55F02 marker)
//	     WHEN to_regprocedure('fenceproxy.lock_accept(text)') IS NOT NULL THEN s::int8
//	     ELSE <55F04 refusal marker naming the lock>::int8 END
//
// Every marker holds the lock setting's value, so none is a constant the planner would fold.
const tmplLockCheck = `SELECT CASE
	WHEN COALESCE(pg_catalog.current_setting('@lock@', true), '') OPERATOR(pg_catalog.=) '' THEN fenceproxy_nolock
	WHEN pg_catalog.to_regprocedure('fenceproxy.lock_accept(pg_catalog.text)') IS NOT NULL THEN fenceproxy_v
	ELSE ('fenceproxy|refuse|55F04|@table@|unfenceable write: this session names lock ' OPERATOR(pg_catalog.||)
		pg_catalog.current_setting('@lock@', true) OPERATOR(pg_catalog.||)
		' in @lock@, but this database has no lock fences (run fenceproxy install); refusing the write to @table@')::pg_catalog.int8 END`

// tmplLockMissing is 55F02 for the lock setting: the 55F03 marker with an empty value (see fragments.go).
const tmplLockMissing = `SELECT ('fenceproxy|55F03|@lock@|' OPERATOR(pg_catalog.||)
	pg_catalog.encode(pg_catalog.convert_to(COALESCE(pg_catalog.current_setting('@lock@', true), ''), 'UTF8'), 'hex')
	OPERATOR(pg_catalog.||) '|@table@|.')::pg_catalog.int8`

// addLockCheck puts the lock check of a require_lock table into the token's valid arms (wrapValidArms). Other
// tables, and lockSetting "", leave e as it is.
func (e *tableEntry) addLockCheck(lockSetting string, requireLock bool) error {
	if lockSetting == "" || !requireLock {
		return nil
	}
	if err := validSettingName(lockSetting); err != nil {
		return fmt.Errorf("lock setting: %w", err)
	}
	consts := strings.NewReplacer("@lock@", lockSetting, "@table@", e.label)
	check, err := parseFragment(tmplLockCheck, consts)
	if err != nil {
		return err
	}
	noLock, err := parseFragment(tmplLockMissing, consts)
	if err != nil {
		return err
	}
	if err := e.wrapValidArms(func(valid *pg.Node) *pg.Node {
		return substitute(check, map[string]*pg.Node{"fenceproxy_v": valid, "fenceproxy_nolock": noLock})
	}); err != nil {
		return fmt.Errorf("lock check: %w", err)
	}
	return nil
}
