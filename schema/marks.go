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
