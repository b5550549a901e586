package schema

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Marks reads each lock's accepted token (lock fences) from fenceproxy.lock_marks, which every role may read.
// It returns an empty map when the schema is not installed. It is the source for a lock-mark gauge: a proxy
// with its own connection to the database (catalog awareness) can export it at scrape time.
func Marks(ctx context.Context, conn *pgx.Conn) (map[string]int64, error) {
	var installed bool
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.to_regclass('fenceproxy.lock_marks') IS NOT NULL").Scan(&installed); err != nil {
		return nil, fmt.Errorf("look for fenceproxy.lock_marks: %w", err)
	}
	marks := map[string]int64{}
	if !installed {
		return marks, nil
	}
	rows, err := conn.Query(ctx, "SELECT name, mark FROM fenceproxy.lock_marks")
	if err != nil {
		return nil, fmt.Errorf("read fenceproxy.lock_marks: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var mark int64
		if err := rows.Scan(&name, &mark); err != nil {
			return nil, fmt.Errorf("read fenceproxy.lock_marks: %w", err)
		}
		marks[name] = mark
	}
	return marks, rows.Err()
}

// RaiseMarks raises each lock's mark in fenceproxy.lock_marks to at least the token want gives it (inserting
// the lock's row when it has none), as a write with that token would, and reports how many marks it raised.
// It is the failover barrier's step on a new primary (docs/ha.md): GREATEST semantics, so it never lowers a
// mark, is idempotent, and several proxies may run it at once. Like lock_accept raising a mark, it first takes
// the lock's advisory lock exclusively, so it waits for the transactions in flight on the lock, and writers
// with an older token that come after it get 55F01. It needs the right to change lock_marks: the schema's
// owner (the role that ran install) or a superuser. Without the schema installed it does nothing.
func RaiseMarks(ctx context.Context, conn *pgx.Conn, want map[string]int64) (int, error) {
	var installed bool
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.to_regclass('fenceproxy.lock_marks') IS NOT NULL").Scan(&installed); err != nil {
		return 0, fmt.Errorf("look for fenceproxy.lock_marks: %w", err)
	}
	if !installed || len(want) == 0 {
		return 0, nil
	}
	raised := 0
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for name, token := range want {
			if token <= 0 {
				continue
			}
			tag, err := tx.Exec(ctx, `INSERT INTO fenceproxy.lock_marks (name, mark) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, name, token)
			if err != nil {
				return fmt.Errorf("insert the mark of lock %s: %w", name, err)
			}
			if tag.RowsAffected() == 1 {
				raised++
				continue
			}
			var id int32
			var mark int64
			if err := tx.QueryRow(ctx, `SELECT id, mark FROM fenceproxy.lock_marks WHERE name = $1`, name).Scan(&id, &mark); err != nil {
				return fmt.Errorf("read the mark of lock %s: %w", name, err)
			}
			if mark >= token {
				continue
			}
			if _, err := tx.Exec(ctx, `SELECT pg_catalog.pg_advisory_xact_lock($1, $2)`, int32(lockClass), id); err != nil {
				return fmt.Errorf("lock the mark of lock %s: %w", name, err)
			}
			tag, err = tx.Exec(ctx, `UPDATE fenceproxy.lock_marks SET mark = $2 WHERE id = $1 AND mark < $2`, id, token)
			if err != nil {
				return fmt.Errorf("raise the mark of lock %s: %w", name, err)
			}
			raised += int(tag.RowsAffected())
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return raised, nil
}
