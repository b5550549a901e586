package proxy_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// The attack: a client whose client_encoding is SJIS sets its token to a value holding 表 (0x95 0x5C in SJIS,
// its second byte a backslash) followed by a quote and SQL. The proxy keeps that value and gives it back to the
// client's next transaction in the text of a Query; quoted byte by byte (a backslash doubled, a quote doubled),
// the server, reading SJIS, would take 0x95 0x5C as one character, let the doubled backslash escape the first
// quote and end the constant at the second: the rest of the value would run as SQL the proxy never read, an
// unfenced UPDATE of a protected table among it. By construction, every value the proxy writes into SQL text is
// ASCII that means the same in every encoding.
func TestPooledTokenValueCannotBreakOutOfItsConstant(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, balance, fence_token) VALUES (1, 1, 1)")
	ctx := ctxT(t)
	cfg, err := pgconn.ParseConfig(f.dsn())
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["client_encoding"] = "SJIS"
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	// PostgreSQL refuses \' in a client-only encoding (backslash_quote = safe_encoding), unless the client says
	// otherwise: any client may.
	if _, err := c.Exec(ctx, "SET backslash_quote = on").ReadAll(); err != nil {
		t.Fatalf("SET backslash_quote: %v", err)
	}
	payload := fmt.Sprintf("); UPDATE %s SET balance = 666 WHERE id = 1; SELECT ", f.label)
	value := "\x95\x5c''" + payload // 表' and the payload, the quote doubled in the SET's own constant
	if _, err := c.Exec(ctx, "SET fence.lock = '"+value+"'").ReadAll(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	// A text of the client's own that is harmless alone and would close the constant the payload leaves open.
	res, err := c.Exec(ctx, "SELECT 1 -- '").ReadAll()
	if err != nil {
		t.Fatalf("SELECT: %v", err)
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatalf("SELECT: %v", r.Err)
		}
	}
	var balance int
	if err := f.d.QueryRow(ctx, "SELECT balance FROM "+f.label+" WHERE id = 1").Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if balance != 1 {
		t.Fatalf("the token's value ran as SQL: balance is %d (an unfenced UPDATE the proxy never read)", balance)
	}
	// And the value is the client's, byte for byte, as PostgreSQL keeps it.
	res, err = c.Exec(ctx, "SHOW fence.lock").ReadAll()
	if err != nil || len(res) != 1 || res[0].Err != nil || len(res[0].Rows) != 1 {
		t.Fatalf("SHOW fence.lock: %v %v", err, res)
	}
	if got, want := string(res[0].Rows[0][0]), "\x95\x5c'"+payload; got != want {
		t.Fatalf("SHOW fence.lock = %q, want %q", got, want)
	}
	// A BEGIN with transaction modes gets the values by SET LOCAL, where an expression cannot go: the same value,
	// and nothing of it runs.
	res, err = c.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ; SHOW fence.lock; COMMIT").ReadAll()
	if err != nil || len(res) != 3 || res[1].Err != nil || len(res[1].Rows) != 1 {
		t.Fatalf("BEGIN ISOLATION LEVEL ...; SHOW fence.lock: %v %+v", err, res)
	}
	if got, want := string(res[1].Rows[0][0]), "\x95\x5c'"+payload; got != want {
		t.Fatalf("after BEGIN with modes, SHOW fence.lock = %q, want %q", got, want)
	}
}
