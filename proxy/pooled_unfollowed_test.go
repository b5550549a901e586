package proxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The client's own function that changes the lock at session level (set_config of fence.lock, which the proxy
// does not see) is refused at the client's next checked start on that connection (55F03 naming the lock), as a
// token changed so is (TestPooledUnfollowedTokenChange), and the connection is closed: the checked token
// statement looks at the lock as well as the token. Without the lock's look the transaction ran as if nothing
// had changed behind the proxy's back.
func TestPooledUnfollowedLockChange(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "CREATE OR REPLACE FUNCTION pooled_sneak_lock() RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config('fence.lock', 'sneaked', false) $$")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_sneak_lock()") }) // t.Context() has ended by then
	for _, mode := range []string{"simple_protocol", "exec"} {
		a := pooledConn(t, f, "&default_query_exec_mode="+mode)
		fxExec(t, a, "SET fence.lock = 'mine'") // a checked start: the connection is checked for this client
		var got string
		if err := a.QueryRow(ctxT(t), "SELECT pooled_sneak_lock()").Scan(&got); err != nil || got != "sneaked" { // plain: no check, no probe
			t.Fatalf("%s: the function: %q, %v", mode, got, err)
		}
		pid := backendPID(t, a)
		_, err := a.Exec(ctxT(t), "SET application_name = 'a2'")
		wantPgErr(t, err, "55F03", "invalid fencing token: fence.lock was changed on this pooled server connection")
		if got := backendPID(t, a); got == pid {
			t.Fatalf("%s: the connection the client's own function changed serves on", mode)
		}
		a.Close(ctxT(t))
	}
}

// In pool.mode transaction a FunctionCall message of set_config for the token is refused (55F03), also without
// token.verify and token.scope transaction (docs/pooling.md names it among the token changes refused); the
// client's token stays its own, its writes carry it, and other fastpath calls of set_config run.
func TestPooledFunctionCallOfTokenRefused(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
	c := pooledConn(t, f, "&options=-c%20fence.token%3D5")
	for _, local := range []string{"false", "true"} {
		_, err := fastpath(t, c, setConfigOID, []byte("fence.token"), []byte("9"), []byte(local))
		wantCodeHint(t, "FunctionCall set_config(fence.token, 9, "+local+")", err, "55F03", "")
	}
	tx, err := c.Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	_, err = fastpath(t, c, setConfigOID, []byte("FENCE.TOKEN"), []byte("9"), []byte("true"))
	wantCodeHint(t, "FunctionCall set_config(FENCE.TOKEN, 9, true) in a block", err, "55F03", "")
	if err := tx.Rollback(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if res, err := fastpath(t, c, setConfigOID, []byte("application_name"), []byte("fc-app"), []byte("false")); err != nil || string(res) != "fc-app" {
		t.Fatalf("FunctionCall set_config(application_name): %q, %v", res, err)
	}
	if got := showToken(t, c); got != "5" {
		t.Fatalf("the client's token after the refused FunctionCalls is %q, want 5", got)
	}
	var tok int64
	if err := c.QueryRow(ctxT(t), "UPDATE "+f.label+" SET balance = balance + 1 WHERE id = 1 RETURNING fence_token").Scan(&tok); err != nil || tok != 5 {
		t.Fatalf("the client's write after the refused FunctionCalls: token %d, %v", tok, err)
	}
}

// The proxy's settings statement (fenceproxy_c) is prepared afresh on a connection whenever it comes to a
// client that another client held since (lend: serverConn.settingsFor), so what a function of the other client
// left under that name (DEALLOCATE, then PREPARE) never runs as the client's settings replay. The scenario needs
// the replay's statement prepared for the owner on a connection (X) and the owner's settings changed on
// another (Y), so that the hostile client, whose settings are X's, runs there without a replay or a probe of its
// own; the pool lends its idle connections last in, first out, and a client in a block holds the other.
func TestPooledSettingsStatementReplacedByAnotherClient(t *testing.T) {
	f := newPooledFenced(t, 2, "")
	fxExec(t, f.d, `CREATE OR REPLACE FUNCTION pooled_settings_hijack() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE 'DEALLOCATE fenceproxy_c';
	EXECUTE 'PREPARE fenceproxy_c(text[], text[]) AS SELECT pg_catalog.set_config(''work_mem'', ''64kB'', false)';
	RETURN 1;
END $$`)
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_settings_hijack()") }) // t.Context() has ended by then
	const q = "&default_query_exec_mode=simple_protocol"
	keeper, hostile, other, owner := pooledConn(t, f, q), pooledConn(t, f, q), pooledConn(t, f, q), pooledConn(t, f, q)
	ctx := ctxT(t)
	hold := func() uint32 { // the keeper holds the connection lent last, in a block
		t.Helper()
		fxExec(t, keeper, "BEGIN")
		return backendPID(t, keeper)
	}
	on := func(c *pgx.Conn, want uint32, what string) {
		t.Helper()
		if got := backendPID(t, c); got != want {
			t.Fatalf("%s ran on backend %d, want %d (the pool's order of lends changed?)", what, got, want)
		}
	}
	y := hold()
	fxExec(t, hostile, "SET work_mem = '5MB'") // X, opened: X holds 5MB
	x := backendPID(t, hostile)
	fxExec(t, owner, "SET work_mem = '5MB'")
	fxExec(t, other, "SET work_mem = '6MB'") // X holds 6MB
	on(owner, x, "the owner's replay")       // fenceproxy_c prepared for the owner on X, which holds 5MB again
	fxExec(t, keeper, "COMMIT")
	fxExec(t, owner, "SET work_mem = '7MB'") // on Y, lent last: the owner's settings change there
	on(owner, y, "the owner's SET")
	// Y goes back to the pool after the owner's answer is relayed (settle, and its probe): the keeper's BEGIN
	// may come first and find only X idle (the CI run at fff9958 under load: "the keeper holds backend 28233").
	eventually(t, 10*time.Second, "both server connections idle", func() bool { return poolServers(t, f, "idle") == 2 })
	if got := hold(); got != y {
		t.Fatalf("the keeper holds backend %d, want %d (the pool's order of lends changed?)", got, y)
	}
	var n int
	if err := hostile.QueryRow(ctx, "SELECT pooled_settings_hijack()").Scan(&n); err != nil || n != 1 { // its settings are X's: no replay, no probe
		t.Fatalf("the hostile function: %d, %v", n, err)
	}
	on(hostile, x, "the hostile function")
	var wm string
	if err := owner.QueryRow(ctx, "SHOW work_mem").Scan(&wm); err != nil || wm != "7MB" { // X: the owner's settings replayed
		t.Fatalf("the owner's work_mem on the connection another client's function changed: %q, %v (want its own 7MB)", wm, err)
	}
	on(owner, x, "the owner's replay after the hostile function")
	fxExec(t, keeper, "COMMIT")
}

// A lone BEGIN, as a Query and as an extended-protocol batch, on a connection where another client's function
// left a token at session level, gets the placeholder put back first (putBackFirst): the block's SET LOCAL of
// the client's values hides that token only until the block ends, and a ROLLBACK AND CHAIN after a statement
// that makes the proxy read the connection back starts a transaction with the session's values, which the
// proxy's chain statement sets only where the placeholder is in force. Without the put-back, the chained
// transaction wrote with the other client's token.
func TestPooledChainAfterLoneBeginIsPutBack(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
	fxExec(t, f.d, "CREATE OR REPLACE FUNCTION pooled_sneak_chain() RETURNS int LANGUAGE sql AS $$ SELECT pg_catalog.set_config('fence.token', '77', false)::int $$")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_sneak_chain()") }) // t.Context() has ended by then
	ctx := ctxT(t)
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	for _, extended := range []bool{false, true} {
		var n int
		if err := a.QueryRow(ctx, "SELECT pooled_sneak_chain()").Scan(&n); err != nil || n != 77 { // plain: no check, no probe
			t.Fatalf("extended %v: the function: %d, %v", extended, n, err)
		}
		d := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
		if extended {
			if _, err := d.ExecParams(ctx, "BEGIN", nil, nil, nil, nil).Close(); err != nil {
				t.Fatal(err)
			}
		} else if _, err := d.Exec(ctx, "BEGIN").ReadAll(); err != nil {
			t.Fatal(err)
		}
		for _, sql := range []string{"SET application_name = 'chain'", "ROLLBACK AND CHAIN"} {
			if _, err := d.Exec(ctx, sql).ReadAll(); err != nil {
				t.Fatalf("extended %v: %s: %v", extended, sql, err)
			}
		}
		res, err := d.Exec(ctx, "UPDATE "+f.label+" SET balance = balance + 1 WHERE id = 1 RETURNING fence_token; COMMIT").ReadAll()
		var rows [][][]byte
		if len(res) > 0 {
			rows = res[0].Rows
		}
		if err != nil || len(rows) != 1 || string(rows[0][0]) != "5" {
			t.Fatalf("extended %v: the chained transaction's write: %q, %v (want token 5, the client's own)", extended, rows, err)
		}
		d.Close(ctx)
	}
}

// The client's own function that changes the role at session level to one whose change the server does not
// report (another superuser role) is refused at the client's next checked start on that connection (0A000),
// and the connection is closed, as for the token and lock (TestPooledUnfollowedLockChange): the checked token
// statement looks at the role too (roleCheckSQL). Without that look the transaction ran as the other role.
func TestPooledUnfollowedRoleChange(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	for _, sql := range []string{
		"DROP ROLE IF EXISTS pooled_unfollowed_super", "CREATE ROLE pooled_unfollowed_super SUPERUSER",
		"CREATE OR REPLACE FUNCTION pooled_unfollowed_become() RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config('role', 'pooled_unfollowed_super', false) $$",
	} {
		fxExec(t, f.d, sql)
	}
	t.Cleanup(func() { // context.Background() has ended by then
		f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_unfollowed_become()")
		f.d.Exec(context.Background(), "DROP ROLE IF EXISTS pooled_unfollowed_super")
	})
	for _, mode := range []string{"simple_protocol", "exec"} {
		a := pooledConn(t, f, "&default_query_exec_mode="+mode)
		fxExec(t, a, "SET application_name = 'a'")        // a checked start: the connection is checked for this client
		fxExec(t, a, "SELECT pooled_unfollowed_become()") // plain: no check, no probe
		pid := backendPID(t, a)
		var user string
		err := a.QueryRow(ctxT(t), "SELECT current_user::text, pg_catalog.set_config('application_name', 'a2', false)").Scan(&user, new(string))
		wantPgErr(t, err, "0A000", "the role of this pooled server connection was changed")
		if got := backendPID(t, a); got == pid {
			t.Fatalf("%s: the connection the client's own function changed serves on", mode)
		}
		a.Close(ctxT(t))
	}
}

// A batch that starts with a BEGIN with transaction modes (its token statement goes after the BEGIN,
// closeWindow) on a connection where another client's function left a token at session level gets the
// placeholder put back first: its checked token statement then finds the connection as the proxy left it,
// and the client's write goes with its own token, never refused for what another client left.
func TestPooledBeginWithModesBatchIsPutBack(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
	fxExec(t, f.d, "CREATE OR REPLACE FUNCTION pooled_sneak_modes() RETURNS int LANGUAGE sql AS $$ SELECT pg_catalog.set_config('fence.token', '77', false)::int $$")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_sneak_modes()") }) // t.Context() has ended by then
	ctx := ctxT(t)
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	var n int
	if err := a.QueryRow(ctx, "SELECT pooled_sneak_modes()").Scan(&n); err != nil || n != 77 { // plain: no check, no probe
		t.Fatalf("the function: %d, %v", n, err)
	}
	d := pooledConn(t, f, "&default_query_exec_mode=exec&options=-c%20fence.token%3D5")
	batch := &pgx.Batch{}
	batch.Queue("BEGIN ISOLATION LEVEL REPEATABLE READ")
	batch.Queue("UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1 RETURNING fence_token")
	batch.Queue("COMMIT")
	br := d.SendBatch(ctx, batch)
	if _, err := br.Exec(); err != nil {
		t.Fatalf("BEGIN: %v", err)
	}
	var tok int64
	if err := br.QueryRow().Scan(&tok); err != nil || tok != 5 {
		t.Fatalf("the batch's write: token %d, %v (want 5, the client's own)", tok, err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
}

// poolServers is the fenceproxy_pool_servers gauge of f's proxy in state (active, idle, login), all pools.
func poolServers(t *testing.T, f *fenced, state string) float64 {
	t.Helper()
	mfs, err := f.p.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "fenceproxy_pool_servers" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "state" && lp.GetValue() == state {
					sum += m.GetGauge().GetValue()
				}
			}
		}
	}
	return sum
}
