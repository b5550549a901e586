package faults

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// fuzzTableSQL creates the fuzzer's protected table, granted to role, and the triggers that record each row
// write in <table>_writes: the operation, the row's token before and after, and the session's token when the
// statement started. The statement-level trigger takes that token before any row is processed, so a
// set_config inside the statement (which the fence ignores: one token per statement) does not blur the record.
// The functions are SECURITY DEFINER (owned by the superuser): the fuzzed role can neither read nor forge the
// record, nor drop or disable the triggers (it does not own the table).
func fuzzTableSQL(table, role string) string {
	return fmt.Sprintf(`
CREATE TABLE IF NOT EXISTS %[1]s (id int PRIMARY KEY, val text, fence_token bigint);
CREATE TABLE IF NOT EXISTS %[1]s_writes (
	seq bigserial PRIMARY KEY,
	op text NOT NULL,
	id int,
	old_token bigint,
	new_token bigint,
	stmt_token text
);
CREATE OR REPLACE FUNCTION %[1]s_stmt() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog AS $$
BEGIN
	PERFORM set_config('fuzz.stmt_token', coalesce(current_setting('fence.token', true), ''), true);
	IF TG_OP = 'TRUNCATE' THEN
		INSERT INTO public.%[1]s_writes (op, stmt_token) VALUES (TG_OP, current_setting('fuzz.stmt_token'));
	END IF;
	RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION %[1]s_row() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog AS $$
BEGIN
	INSERT INTO public.%[1]s_writes (op, id, old_token, new_token, stmt_token)
	VALUES (TG_OP,
		CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END,
		CASE WHEN TG_OP <> 'INSERT' THEN OLD.fence_token END,
		CASE WHEN TG_OP <> 'DELETE' THEN NEW.fence_token END,
		current_setting('fuzz.stmt_token', true));
	RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS %[1]s_stmt ON %[1]s;
DROP TRIGGER IF EXISTS %[1]s_truncate ON %[1]s;
DROP TRIGGER IF EXISTS %[1]s_row ON %[1]s;
CREATE TRIGGER %[1]s_stmt BEFORE INSERT OR UPDATE OR DELETE ON %[1]s FOR EACH STATEMENT EXECUTE FUNCTION %[1]s_stmt();
CREATE TRIGGER %[1]s_truncate BEFORE TRUNCATE ON %[1]s FOR EACH STATEMENT EXECUTE FUNCTION %[1]s_stmt();
CREATE TRIGGER %[1]s_row AFTER INSERT OR UPDATE OR DELETE ON %[1]s FOR EACH ROW EXECUTE FUNCTION %[1]s_row();
REVOKE ALL ON %[1]s_writes FROM PUBLIC;
GRANT ALL ON %[1]s TO %[2]s;
`, table, role)
}

// fuzzReset gives every input the same start: row 1 with token 5, row 2 with none, an empty record.
func fuzzReset(t *testing.T, ctx context.Context, d *pgx.Conn, table string) {
	t.Helper()
	if _, err := d.Exec(ctx, fmt.Sprintf(`DELETE FROM %[1]s; INSERT INTO %[1]s VALUES (1, 'x', 5), (2, 'y', NULL); TRUNCATE %[1]s_writes`, table)); err != nil {
		t.Fatalf("reset %s: %v", table, err)
	}
}

// fuzzCheckInvariant judges what the input committed to the table, read directly: each written row was written
// by a statement that started with a valid token k, an inserted or updated row holds k, no row that held a
// token above k was updated or deleted, and nothing was truncated. It returns how many row writes committed.
func fuzzCheckInvariant(t *testing.T, ctx context.Context, d *pgx.Conn, table string, input []byte) int {
	t.Helper()
	rows, err := d.Query(ctx, fmt.Sprintf("SELECT op, id, old_token, new_token, stmt_token FROM %s_writes ORDER BY seq", table))
	if err != nil {
		t.Fatalf("read the writes to %s: %v", table, err)
	}
	type write struct {
		op                 string
		id                 *int32
		oldToken, newToken *int64
		stmtToken          *string
	}
	var writes []write
	for rows.Next() {
		var w write
		if err := rows.Scan(&w.op, &w.id, &w.oldToken, &w.newToken, &w.stmtToken); err != nil {
			t.Fatal(err)
		}
		writes = append(writes, w)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d row writes committed", len(writes))
	var violations []string
	show := func(p *int64) string {
		if p == nil {
			return "NULL"
		}
		return fmt.Sprint(*p)
	}
	for _, w := range writes {
		stmt := ""
		if w.stmtToken != nil {
			stmt = *w.stmtToken
		}
		id := "?"
		if w.id != nil {
			id = fmt.Sprint(*w.id)
		}
		desc := fmt.Sprintf("%s row %s: token %s -> %s, statement token %q", w.op, id, show(w.oldToken), show(w.newToken), stmt)
		if w.op == "TRUNCATE" {
			violations = append(violations, "TRUNCATE of the protected table went through")
			continue
		}
		k, ok := rewrite.ValidToken(stmt)
		if !ok {
			violations = append(violations, desc+": written without a valid token")
			continue
		}
		if w.oldToken != nil && *w.oldToken > k {
			violations = append(violations, desc+": a newer token was overwritten (stale write applied)")
		}
		if w.op != "DELETE" && (w.newToken == nil || *w.newToken != k) {
			violations = append(violations, desc+": the row does not hold the statement's token")
		}
	}
	if len(violations) > 0 {
		t.Fatalf("fencing invariant broken by input %q:\n%s", input, strings.Join(violations, "\n"))
	}
	return len(writes)
}
