package proxy_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// dirtyPooledConnection leaves token 77 in the session of f's (single) pooled server connection, as a function
// (named fn) of one client's can: a plain transaction, no check, no probe.
func dirtyPooledConnection(t *testing.T, f *fenced, fn string) {
	t.Helper()
	fxExec(t, f.d, "CREATE OR REPLACE FUNCTION "+fn+"() RETURNS int LANGUAGE sql AS $$ SELECT pg_catalog.set_config('fence.token', '77', false)::int $$")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS "+fn+"()") })
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	fxExec(t, a, "SELECT "+fn+"()")
	a.Close(ctxT(t))
}

// rawBatch sends msgs and a Sync on pc and returns, up to the ReadyForQuery, the first column of every DataRow and
// the SQLSTATE of every error.
func rawBatch(t *testing.T, pc *pgconn.PgConn, msgs ...pgproto3.FrontendMessage) (rows, codes []string) {
	t.Helper()
	return pipeline(t, pc, msgs...)
}

// untilFatal sends msgs on pc and reads its answers up to the FATAL that ends the session, which it returns with
// the tags of the commands that completed before it; the session ending without one fails the test.
func untilFatal(t *testing.T, pc *pgconn.PgConn, msgs ...pgproto3.FrontendMessage) (fatal *pgproto3.ErrorResponse, ran []string) {
	t.Helper()
	pc.Conn().SetDeadline(time.Now().Add(30 * time.Second)) // a session that goes on answering never sends one
	err := exchange(pc.Frontend(), msgs, func(m pgproto3.BackendMessage) bool {
		switch m := m.(type) {
		case *pgproto3.ErrorResponse:
			if m.Severity == "FATAL" {
				fatal = m
				return true
			}
		case *pgproto3.CommandComplete:
			ran = append(ran, string(m.CommandTag))
		}
		return false
	})
	if err != nil {
		t.Fatalf("no FATAL (%v); the commands that ran: %q", err, ran)
	}
	return fatal, ran
}

// exchange sends msgs on fe and gives each answer to each until it reports true. It returns the error of the
// send or the read that failed, or nil.
func exchange(fe *pgproto3.Frontend, msgs []pgproto3.FrontendMessage, each func(pgproto3.BackendMessage) bool) error {
	for _, m := range msgs {
		fe.Send(m)
	}
	if err := fe.Flush(); err != nil {
		return err
	}
	for {
		m, err := fe.Receive()
		if err != nil {
			return err
		}
		if each(m) {
			return nil
		}
	}
}

// A batch that binds a portal to a BEGIN with transaction modes, then binds it again to a fenced write (the
// unnamed portal, or a named one after its Close) and executes it: that Execute runs the write, not the BEGIN,
// so the token statement goes before it. A write that ran first would have the token a function left in the
// connection's session (77), another client's.
func TestPooledBeginPortalReboundGetsTokenFirst(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
	write := "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1 RETURNING fence_token"
	for name, batch := range map[string][]pgproto3.FrontendMessage{
		"unnamed portal bound again": {
			&pgproto3.Parse{Query: "BEGIN ISOLATION LEVEL SERIALIZABLE"},
			&pgproto3.Bind{},
			&pgproto3.Parse{Query: write},
			&pgproto3.Bind{},
			&pgproto3.Execute{},
		},
		"named portal closed and bound again": {
			&pgproto3.Parse{Query: "BEGIN ISOLATION LEVEL SERIALIZABLE"},
			&pgproto3.Bind{DestinationPortal: "p"},
			&pgproto3.Close{ObjectType: 'P', Name: "p"},
			&pgproto3.Parse{Query: write},
			&pgproto3.Bind{DestinationPortal: "p"},
			&pgproto3.Execute{Portal: "p"},
		},
	} {
		dirtyPooledConnection(t, f, "pooled_sneak_rebind")
		b := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
		rows, codes := rawBatch(t, b, batch...)
		for _, r := range rows {
			if r != "5" {
				t.Fatalf("%s: the write wrote with token %s (errors %v), not the client's 5", name, r, codes)
			}
		}
		if len(rows) == 0 && len(codes) == 0 {
			t.Fatalf("%s: the write neither ran nor failed", name)
		}
		if got := f.token(t, 1); got == 77 {
			t.Fatalf("%s: row 1 has the token a function of another client left: %d", name, got)
		}
		b.Close(ctxT(t))
	}
}

// A transaction whose checked token statement never ran (a syntax error in the Query it prefixes; an error, or
// no Execute, before a BEGIN batch's token statement) was not checked: the probe at its end does not take the
// token a function of another client's left in the connection's session for the client's.
func TestPooledCheckThatDidNotRunIsNoCheck(t *testing.T) {
	for name, start := range map[string][]pgproto3.FrontendMessage{
		// The whole Query fails to parse: the token statement in front of it never runs. set_config: the end is
		// probed.
		"query syntax error": {&pgproto3.Query{String: "SELECT set_config('application_name', 'x', false); SELEC"}},
		// A BEGIN with transaction modes, then an error before its Execute: no token statement runs. The Parse of
		// a named statement that failed: the end is probed.
		"begin batch error": {
			&pgproto3.Parse{Query: "BEGIN ISOLATION LEVEL SERIALIZABLE"},
			&pgproto3.Parse{Name: "pooled_broken", Query: "SELEC"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newPooledFenced(t, 1, "")
			dirtyPooledConnection(t, f, "pooled_sneak_check")
			b := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
			if q, ok := start[0].(*pgproto3.Query); ok {
				if _, err := b.Exec(ctxT(t), q.String).ReadAll(); err == nil {
					t.Fatal("the broken Query did not fail")
				}
			} else {
				_, codes := rawBatch(t, b, start...)
				if len(codes) == 0 {
					t.Fatal("the broken batch did not fail")
				}
			}
			got, err := b.Exec(ctxT(t), "SHOW fence.token").ReadAll()
			if err != nil {
				t.Fatal(err)
			}
			if v := string(got[0].Rows[0][0]); v != "5" {
				t.Fatalf("after the unchecked transaction the client's token is %q, want its own 5", v)
			}
		})
	}
}

// A BEGIN batch with no Execute runs no token statement: the connection was not checked for the client, so its
// next FunctionCall there (which runs with the session's values) gets the placeholder put back first, as a unit
// of its own (staleResetSQL): the function sees the placeholder, which no fence accepts, never the token a
// function of another client's left.
func TestPooledFunctionCallAfterUncheckedStartIsPutBack(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "CREATE FUNCTION pooled_fc_token() RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.current_setting('fence.token') $$")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_fc_token()") })
	var oid uint32
	if err := f.d.QueryRow(ctxT(t), "SELECT 'pooled_fc_token'::regproc::oid").Scan(&oid); err != nil {
		t.Fatal(err)
	}
	dirtyPooledConnection(t, f, "pooled_sneak_fc")
	b := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	if _, codes := rawBatch(t, b, &pgproto3.Parse{Query: "BEGIN ISOLATION LEVEL SERIALIZABLE"}); len(codes) > 0 {
		t.Fatalf("the BEGIN's Parse failed: %v", codes)
	}
	if got := pooledFunctionCall(t, b, oid); !slices.Equal(got, []string{"fenceproxy:pooled"}) {
		t.Fatalf("the FunctionCall saw %q, want the placeholder", got)
	}
}

// A function that a superuser's client calls may change the session's authorization (set_config of
// session_authorization at session level); the plain token statement of the next client's transaction makes it
// the login role again, as the checked one puts it back: no client's transaction runs as a role another's left.
func TestPooledPlainTransactionRunsAsLoginRole(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "DROP ROLE IF EXISTS pooled_other")
	fxExec(t, f.d, "CREATE ROLE pooled_other")
	fxExec(t, f.d, "CREATE FUNCTION pooled_become_sa() RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config('session_authorization', 'pooled_other', false) $$")
	t.Cleanup(func() {
		f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_become_sa()")
		f.d.Exec(context.Background(), "DROP ROLE IF EXISTS pooled_other")
	})
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	fxExec(t, a, "SELECT pooled_become_sa()") // plain: no check, no probe
	for _, mode := range []string{"simple_protocol", "exec"} {
		b := pooledConn(t, f, "&default_query_exec_mode="+mode)
		var who string
		if err := b.QueryRow(ctxT(t), "SELECT session_user || ' ' || current_user").Scan(&who); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if who != "postgres postgres" {
			t.Fatalf("%s: a plain transaction of another client runs as %q", mode, who)
		}
		b.Close(ctxT(t))
	}
}

// The words by which the proxy looks at a transaction's end (set_config, advisory, temp) cannot hide behind
// Unicode escapes: a text that spells them so is probed as one that spells them out, and the client is pinned
// with its advisory lock or temporary table.
func TestPooledSessionStateSpelledWithEscapesPins(t *testing.T) {
	for _, tc := range []struct{ name, sql, reason string }{
		{"advisory", `SELECT U&"pg_\0061dvisory_lock"(4243)`, "advisory"},
		{"temp", `SELECT 1 AS x INTO U&"pg_t\0065mp".pinned_escaped`, "temporary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newPooledFenced(t, 2, "")
			q := "&default_query_exec_mode=simple_protocol"
			a := pooledConn(t, f, q)
			fxExec(t, a, tc.sql)
			pid := backendPID(t, a)
			b := pooledConn(t, f, q)
			for range 3 {
				if got := backendPID(t, b); got == pid {
					t.Fatalf("another client got the server connection with the %s", tc.name)
				}
			}
			if n := fxCounter(t, f.p.Registry, "fenceproxy_pool_pins_total", map[string]string{"reason": tc.reason}); n != 1 {
				t.Fatalf("pins{reason=%s} = %v, want 1", tc.reason, n)
			}
		})
	}
}

// UPDATE pg_settings sets a setting at session level (its rule calls set_config): the transaction's end is
// looked at as after set_config, so the next client on the connection does not run with that search_path.
func TestPooledUpdateOfPgSettingsIsFollowed(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	for _, mode := range []string{"simple_protocol", "exec"} {
		a := pooledConn(t, f, "&default_query_exec_mode="+mode)
		fxExec(t, a, "UPDATE pg_settings SET setting = 'pooled_elsewhere' WHERE name = 'search_path'")
		b := pooledConn(t, f, "&default_query_exec_mode="+mode)
		var got string
		if err := b.QueryRow(ctxT(t), "SELECT current_setting('search_path')").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got == "pooled_elsewhere" {
			t.Fatalf("%s: another client's transaction runs with the search_path a client set by UPDATE pg_settings", mode)
		}
		a.Close(ctxT(t))
		b.Close(ctxT(t))
	}
}

// A BEGIN batch whose window (before the BEGIN's Execute, where the token statement goes) holds Parses, a Describe
// of a statement and of a portal, a Flush and a Close: the client gets exactly its own answers, in order, none of
// the token statement's, and the write after it has the client's token.
func TestPooledBeginBatchWindowAnswers(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
	b := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	got := shortAnswers(t, b,
		// The window: what takes no snapshot (a Parse of a write would: 25001, as on a connection of its own).
		&pgproto3.Parse{Name: "pb", Query: "BEGIN ISOLATION LEVEL SERIALIZABLE"},
		&pgproto3.Parse{Name: "pc", Query: "COMMIT"},
		&pgproto3.Describe{ObjectType: 'S', Name: "pb"},
		&pgproto3.Flush{},
		&pgproto3.Close{ObjectType: 'S', Name: "pooled_never_prepared"},
		&pgproto3.Bind{PreparedStatement: "pb"},
		&pgproto3.Describe{ObjectType: 'P'},
		&pgproto3.Execute{},
		// The token statement goes here.
		&pgproto3.Parse{Name: "pu", Query: "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1 RETURNING fence_token"},
		&pgproto3.Bind{PreparedStatement: "pu"},
		&pgproto3.Execute{},
		&pgproto3.Bind{PreparedStatement: "pc"},
		&pgproto3.Execute{},
		&pgproto3.Sync{},
	)
	want := []string{"1", "1", "t", "n", "3", "2", "n", "BEGIN", "1", "2", "D5", "UPDATE 1", "2", "COMMIT", "ZI"}
	if !slices.Equal(got, want) {
		t.Fatalf("the client got %v, want %v", got, want)
	}
	f.wantToken(t, 1, 5)
}

// A client that pipelines a lone BEGIN, by a Query or by an extended-protocol batch, with the block's statements
// and COMMIT behind it, on a connection a function left as another role: the role is put back before the BEGIN,
// in a transaction of its own (putBackFirst). The block runs, and writes as the login role.
func TestPooledPipelinedBeginRunsAsLoginRole(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	for _, sql := range []string{
		"DROP ROLE IF EXISTS pooled_superrole2", "CREATE ROLE pooled_superrole2 SUPERUSER",
		"DROP TABLE IF EXISTS pooled_ran_as", "CREATE TABLE pooled_ran_as (who text)",
		"CREATE OR REPLACE FUNCTION pooled_become2() RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config('role', 'pooled_superrole2', false) $$",
	} {
		fxExec(t, f.d, sql)
	}
	t.Cleanup(func() {
		f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_become2()")
		f.d.Exec(context.Background(), "DROP TABLE IF EXISTS pooled_ran_as")
	})
	insert := "INSERT INTO pooled_ran_as SELECT current_user"
	for name, msgs := range map[string][]pgproto3.FrontendMessage{
		"simple": {&pgproto3.Query{String: "BEGIN"}, &pgproto3.Query{String: insert}, &pgproto3.Query{String: "COMMIT"}},
		"extended": {
			&pgproto3.Parse{Query: "BEGIN"}, &pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{},
			&pgproto3.Parse{Query: insert}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
			&pgproto3.Parse{Query: "COMMIT"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
		},
	} {
		a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
		fxExec(t, a, "SELECT pooled_become2()")
		pc := pooledPgConn(t, f, "")
		pc.Conn().SetDeadline(time.Now().Add(30 * time.Second))
		var ran []string
		readies := 0
		err := exchange(pc.Frontend(), msgs, func(m pgproto3.BackendMessage) bool {
			switch m := m.(type) {
			case *pgproto3.CommandComplete:
				ran = append(ran, string(m.CommandTag))
			case *pgproto3.ErrorResponse:
				t.Fatalf("%s: %s %s %s", name, m.Severity, m.Code, m.Message)
			case *pgproto3.ReadyForQuery:
				readies++
			}
			return readies == 3
		})
		if err != nil || !slices.Equal(ran, []string{"BEGIN", "INSERT 0 1", "COMMIT"}) {
			t.Fatalf("%s: the pipeline ran %q (%v)", name, ran, err)
		}
		var who []string
		rows, err := f.d.Query(ctxT(t), "DELETE FROM pooled_ran_as RETURNING who")
		if err == nil {
			who, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil || !slices.Equal(who, []string{pgtest.SuperUser}) {
			t.Fatalf("%s: the block wrote as %q (%v), want the login role", name, who, err)
		}
		a.Close(ctxT(t))
	}
}

// The role a login can take changes with the catalog, not with the connection: a login that was a member of no
// role when its pooled server connection opened may be granted one later (GRANT by an administrator, or by the
// login itself with CREATEROLE). A function that then makes that role the session's (a change the server does
// not report: is_superuser stays off) must not run the next client's plain transaction on that connection.
func TestPooledRoleGrantedAfterLoginIsSetBack(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	for _, sql := range []string{
		"DROP ROLE IF EXISTS pooled_lone", "DROP ROLE IF EXISTS pooled_granted_later",
		"CREATE ROLE pooled_lone LOGIN", "CREATE ROLE pooled_granted_later",
		"CREATE OR REPLACE FUNCTION pooled_become_later() RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config('role', 'pooled_granted_later', false) $$",
	} {
		fxExec(t, f.d, sql)
	}
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_become_later()") })
	who := func(c *pgx.Conn) (user string, pid int) {
		t.Helper()
		if err := c.QueryRow(ctxT(t), "SELECT current_user::text, pg_backend_pid()").Scan(&user, &pid); err != nil {
			t.Fatal(err)
		}
		return user, pid
	}
	for _, mode := range []string{"simple_protocol", "exec"} {
		dsn := f.p.DSN("pooled_lone", "", pgtest.TestDB) + "&default_query_exec_mode=" + mode
		a := connect(t, dsn)
		_, before := who(a) // the pool's connection for pooled_lone is open: a member of no role
		fxExec(t, f.d, "GRANT pooled_granted_later TO pooled_lone")
		fxExec(t, a, "SELECT pooled_become_later()") // plain: no check, no probe
		b := connect(t, dsn)
		if user, pid := who(b); user != "pooled_lone" {
			t.Fatalf("%s: the next client's plain transaction runs as %q on backend %d (the changed one was %d)", mode, user, pid, before)
		}
		a.Close(ctxT(t))
		b.Close(ctxT(t))
		fxExec(t, f.d, "REVOKE pooled_granted_later FROM pooled_lone")
	}
}

// A ParameterStatus of is_superuser says a function changed the role only when compared with what that
// connection's login reported, not the pool's first connection's: a login made a superuser after the pool
// opened (ALTER ROLE ... SUPERUSER) opens connections whose role changes the server reports, so their plain
// transactions do not set the role back; a function there that makes a role that is not a superuser the
// session's (is_superuser turns off, as it was on the pool's first connection) must still keep that
// connection from the next client.
func TestPooledRoleReportComparedWithItsOwnLogin(t *testing.T) {
	f := newPooledFenced(t, 2, "")
	for _, sql := range []string{
		"DROP ROLE IF EXISTS pooled_promoted", "DROP ROLE IF EXISTS pooled_lesser",
		"CREATE ROLE pooled_promoted LOGIN", "CREATE ROLE pooled_lesser",
		"CREATE OR REPLACE FUNCTION pooled_become_lesser() RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config('role', 'pooled_lesser', false) $$",
	} {
		fxExec(t, f.d, sql)
	}
	t.Cleanup(func() {
		f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_become_lesser()")
		f.d.Exec(context.Background(), "ALTER ROLE pooled_promoted NOSUPERUSER")
	})
	dsn := f.p.DSN("pooled_promoted", "", pgtest.TestDB) + "&default_query_exec_mode=simple_protocol"
	// The pool's first connection logs in while pooled_promoted is no superuser; a transaction holds it.
	a := connect(t, dsn)
	tx, err := a.Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctxT(t))
	fxExec(t, f.d, "ALTER ROLE pooled_promoted SUPERUSER")
	// The second logs in as a superuser.
	b := connect(t, dsn)
	fxExec(t, b, "SELECT pooled_become_lesser()") // plain: no check, no probe
	c := connect(t, dsn)
	var user string
	if err := c.QueryRow(ctxT(t), "SELECT current_user::text").Scan(&user); err != nil || user != "pooled_promoted" {
		t.Fatalf("the next client's plain transaction runs as %q (%v)", user, err)
	}
}

// A Query (or FunctionCall) inside an extended-protocol batch, before its Sync: PostgreSQL answers it with a
// ReadyForQuery of its own, or skips it unanswered when a message of the batch before it failed. The pool
// cannot know which when it must, and counting on the one that did not come held the client's server
// connection for ever (a handful of such clients, the whole pool). The session ends with FATAL 0A000 at once,
// whether the batch failed or not; nothing of the batch commits; the pool's one connection serves the next
// client.
func TestPooledQueryInsideUnsyncedBatch(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "DROP TABLE IF EXISTS pooled_midbatch")
	fxExec(t, f.d, "CREATE TABLE pooled_midbatch (n int)")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP TABLE IF EXISTS pooled_midbatch") })
	for _, first := range []string{"INSERT INTO pooled_midbatch VALUES (1)", "SELECT 1/0"} {
		for _, mid := range []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 2"}, &pgproto3.FunctionCall{Function: 1}} {
			fatal, _ := untilFatal(t, pooledPgConn(t, f, "&options=-c%20fence.token%3D5"),
				&pgproto3.Parse{Query: first}, &pgproto3.Bind{}, &pgproto3.Execute{}, mid, &pgproto3.Sync{}, &pgproto3.Query{String: "SELECT 3"})
			if fatal.Code != "0A000" || !strings.Contains(fatal.Message, "inside an extended-protocol batch") {
				t.Fatalf("%q then %T: got %s %q", first, mid, fatal.Code, fatal.Message)
			}
			c := pooledConn(t, f, "")
			var n int
			if err := c.QueryRow(ctxT(t), "SELECT count(*) FROM pooled_midbatch").Scan(&n); err != nil || n != 0 {
				t.Fatalf("%q then %T: the next client: %d rows, %v", first, mid, n, err)
			}
		}
	}
}

// A transaction whose start was not checked (a plain one: its token statement sets the values and the role
// for itself) may still be looked at when it ends (an error after a Parse of a named statement). What the probe
// then finds at session level may be what a function of another client left: a role there must not pin the
// client to that connection, where its later transactions (a pinned client's connection is its own: no role
// set back) would run as that role; nor may anything else found there (the function's advisory lock).
func TestPooledUncheckedProbeDoesNotPinToAnothersRole(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	for _, sql := range []string{
		"DROP ROLE IF EXISTS pooled_member3", "DROP ROLE IF EXISTS pooled_plainrole3",
		"CREATE ROLE pooled_plainrole3", "CREATE ROLE pooled_member3 LOGIN IN ROLE pooled_plainrole3",
		"CREATE OR REPLACE FUNCTION pooled_become3() RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.pg_advisory_lock(4711); SELECT pg_catalog.set_config('role', 'pooled_plainrole3', false) $$",
	} {
		fxExec(t, f.d, sql)
	}
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_become3()") })
	dsn := f.p.DSN("pooled_member3", "", pgtest.TestDB)
	b := connect(t, dsn+"&default_query_exec_mode=simple_protocol")
	fxExec(t, b, "SELECT pooled_become3()") // plain: no check, no probe; the role and the lock stay in the session
	b.Close(ctxT(t))

	pc, err := pgconn.Connect(ctxT(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close(context.Background()) })
	// A plain batch with a named statement whose execution fails: the probe looks at the connection.
	_, codes := rawBatch(t, pc, &pgproto3.Parse{Name: "s1", Query: "SELECT 1/0"}, &pgproto3.Bind{PreparedStatement: "s1"}, &pgproto3.Execute{})
	if !slices.Equal(codes, []string{"22012"}) {
		t.Fatalf("the batch gave %q, want 22012", codes)
	}
	for range 2 {
		rows, codes := rawBatch(t, pc, &pgproto3.Parse{Query: "SELECT current_user::text"}, &pgproto3.Bind{}, &pgproto3.Execute{})
		if len(codes) > 0 || !slices.Equal(rows, []string{"pooled_member3"}) {
			t.Fatalf("the client's next transaction runs as %q (%q)", rows, codes)
		}
	}
}

// What another client's function left on a connection, put back before the client's transaction, costs the
// client nothing of its own (review of the first put-back, which ran inside the client's transaction): its own
// error keeps its token, and a lock name that happens to be the one the function left (holders of one resource
// share it) is the client's when it sets it.
func TestPooledPutBackKeepsTheClientsValues(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
	dirtyPooledConnection(t, f, "pooled_sneak_err")
	b := pooledConn(t, f, "&default_query_exec_mode=simple_protocol&options=-c%20fence.token%3D5")
	_, err := b.Exec(ctxT(t), "SET application_name = 'b'; SELECT 1/0")
	wantPgErr(t, err, "22012", "")
	var tok int64
	if err := b.QueryRow(ctxT(t), "UPDATE "+f.label+" SET balance = balance + 1 WHERE id = 1 RETURNING fence_token").Scan(&tok); err != nil || tok != 5 {
		t.Fatalf("after its own failed statement on a connection put back, the client's write: token %d, %v (want 5)", tok, err)
	}
	b.Close(ctxT(t))

	fxExec(t, f.d, "CREATE OR REPLACE FUNCTION pooled_sneak_lock() RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config('fence.lock', 'settle', false) $$")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_sneak_lock()") })
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	fxExec(t, a, "SELECT pooled_sneak_lock()")
	a.Close(ctxT(t))
	c := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	fxExec(t, c, "SET fence.lock = 'settle'")
	var lock string
	if err := c.QueryRow(ctxT(t), "SHOW fence.lock").Scan(&lock); err != nil || lock != "settle" {
		t.Fatalf("the client's committed SET fence.lock = 'settle' became %q (%v)", lock, err)
	}
}

// pooledFunctionCall sends a FunctionCall of oid (no arguments) on pc and returns its result, or "E" and the
// SQLSTATE of its error.
func pooledFunctionCall(t *testing.T, pc *pgconn.PgConn, oid uint32) []string {
	t.Helper()
	var got []string
	err := exchange(pc.Frontend(), []pgproto3.FrontendMessage{&pgproto3.FunctionCall{Function: oid, ResultFormatCode: 0}}, func(m pgproto3.BackendMessage) bool {
		switch m := m.(type) {
		case *pgproto3.FunctionCallResponse:
			got = append(got, string(m.Result))
		case *pgproto3.ErrorResponse:
			got = append(got, "E"+m.Code)
		case *pgproto3.ReadyForQuery:
			return true
		}
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A lone-BEGIN batch on a connection another client's function left token 77 on, that fails before its BEGIN
// runs (a Bind the server refuses): the put-back before it committed all the same, so the client's next
// FunctionCall sees the placeholder, and its next write its own token; the probe after its next transaction
// never takes 77 for the client's (second review of the put-back, written for the verified start it replaced).
func TestPooledFailedBeginBatchLeavesNoStaleToken(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token) VALUES (1, 1)")
	fxExec(t, f.d, "CREATE OR REPLACE FUNCTION pooled_fv_token() RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.current_setting('fence.token') $$")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_fv_token()") })
	var oid uint32
	if err := f.d.QueryRow(ctxT(t), "SELECT 'pooled_fv_token'::regproc::oid").Scan(&oid); err != nil {
		t.Fatal(err)
	}
	dirtyPooledConnection(t, f, "pooled_fv_sneak1")
	b := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	if _, codes := rawBatch(t, b, &pgproto3.Parse{Query: "BEGIN"}, &pgproto3.Bind{Parameters: [][]byte{[]byte("1")}}, &pgproto3.Execute{}); !slices.Equal(codes, []string{"08P01"}) {
		t.Fatalf("the BEGIN batch with a bad Bind: %v", codes)
	}
	if got := pooledFunctionCall(t, b, oid); !slices.Equal(got, []string{"fenceproxy:pooled"}) {
		t.Fatalf("the FunctionCall after the failed BEGIN batch saw %q, want the placeholder (77 is another client's)", got)
	}

	dirtyPooledConnection(t, f, "pooled_fv_sneak2")
	c := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
	if _, codes := rawBatch(t, c, &pgproto3.Parse{Name: "fv_begin", Query: "BEGIN"}, &pgproto3.Bind{PreparedStatement: "fv_begin", Parameters: [][]byte{[]byte("1")}}, &pgproto3.Execute{}); !slices.Equal(codes, []string{"08P01"}) {
		t.Fatalf("the BEGIN batch with a bad Bind: %v", codes)
	}
	rows, codes := rawBatch(t, c, &pgproto3.Parse{Query: "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 1 RETURNING fence_token"}, &pgproto3.Bind{}, &pgproto3.Execute{})
	if len(codes) > 0 || !slices.Equal(rows, []string{"5"}) {
		t.Fatalf("the client's write after the failed BEGIN batch: rows %v, errors %v (want token 5; 77 is another client's)", rows, codes)
	}
}

// A lone-BEGIN batch on a connection another client's function left token 77 on, whose block then fails (an
// Execute of no portal): the client's next statements fail as they would have (25P02), and a block chained out
// of it has the client's token, never the stale one (written for the verified start's begin-again, which the
// put-back before the BEGIN replaced).
func TestPooledFailedBeginBatchStaysFailed(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	fxExec(t, f.d, "INSERT INTO "+f.label+" (id, fence_token, balance) VALUES (1, 1, 0)")
	failedBlock := func(sneak string) *pgconn.PgConn {
		t.Helper()
		dirtyPooledConnection(t, f, sneak)
		b := pooledPgConn(t, f, "&options=-c%20fence.token%3D5")
		if _, codes := rawBatch(t, b, &pgproto3.Parse{Query: "BEGIN"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Execute{Portal: "no_such_portal"}); !slices.Equal(codes, []string{"34000"}) {
			t.Fatalf("the BEGIN batch with an Execute of no portal: %v", codes)
		}
		return b
	}
	b := failedBlock("pooled_rb_sneak1")
	_, err := b.Exec(ctxT(t), "UPDATE "+f.label+" SET balance = balance + 100 WHERE id = 1").ReadAll()
	wantPgErr(t, err, "25P02", "")
	if _, err := b.Exec(ctxT(t), "COMMIT").ReadAll(); err != nil {
		t.Fatal(err)
	}
	var bal int64
	if err := f.d.QueryRow(ctxT(t), "SELECT balance FROM "+f.label+" WHERE id = 1").Scan(&bal); err != nil || bal != 0 {
		t.Fatalf("balance %d (%v): a statement of a failed block committed", bal, err)
	}

	b = failedBlock("pooled_rb_sneak2")
	if _, err := b.Exec(ctxT(t), "ROLLBACK AND CHAIN").ReadAll(); err != nil {
		t.Fatal(err)
	}
	res, err := b.Exec(ctxT(t), "UPDATE "+f.label+" SET balance = balance + 1 WHERE id = 1 RETURNING fence_token").ReadAll()
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "5" {
		t.Fatalf("a write in the block chained from the failed one: %v, %v (want token 5; 77 is another client's)", res, err)
	}
	if _, err := b.Exec(ctxT(t), "COMMIT").ReadAll(); err != nil {
		t.Fatal(err)
	}

	b = failedBlock("pooled_rb_sneak3")
	b.Exec(ctxT(t), "ROLLBACK AND CHAIN; UPDATE "+f.label+" SET balance = balance + 1 WHERE id = 1; COMMIT").ReadAll()
	if got := f.token(t, 1); got == 77 {
		t.Fatal("a write chained out of the failed block went with the token another client's function left")
	}
}

// The proxy's own statements before and inside a client's block take no snapshot: SET TRANSACTION works after
// a lone BEGIN (Rails' isolated transactions send BEGIN, then SET TRANSACTION ISOLATION LEVEL), on a clean
// connection and on one put back, and after COMMIT AND CHAIN.
func TestPooledHiddenStatementsTakeNoSnapshot(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	// serializable makes c's block serializable, as the block's first statement, and checks that it is.
	serializable := func(t *testing.T, c *pgx.Conn, what string) {
		t.Helper()
		if _, err := c.Exec(ctxT(t), "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"); err != nil {
			t.Errorf("%s: SET TRANSACTION: %v", what, err)
			return
		}
		var iso string
		if err := c.QueryRow(ctxT(t), "SELECT current_setting('transaction_isolation')").Scan(&iso); err != nil || iso != "serializable" {
			t.Errorf("%s: the block's isolation %q (%v)", what, iso, err)
		}
	}
	for _, mode := range []string{"simple_protocol", "exec"} {
		c := pooledConn(t, f, "&default_query_exec_mode="+mode+"&options=-c%20fence.token%3D5")
		fxExec(t, c, "BEGIN")
		serializable(t, c, mode+": after BEGIN")
		fxExec(t, c, "ROLLBACK")
		c.Close(ctxT(t))
		dirtyPooledConnection(t, f, "pooled_snap_sneak")
		c = pooledConn(t, f, "&default_query_exec_mode="+mode+"&options=-c%20fence.token%3D5")
		fxExec(t, c, "BEGIN")
		serializable(t, c, mode+", on a connection put back: after BEGIN")
		fxExec(t, c, "ROLLBACK")
		fxExec(t, c, "BEGIN")
		fxExec(t, c, "SELECT 1")
		fxExec(t, c, "COMMIT AND CHAIN")
		serializable(t, c, mode+": after COMMIT AND CHAIN")
		var tok string
		if err := c.QueryRow(ctxT(t), "SELECT current_setting('fence.token')").Scan(&tok); err != nil || tok != "5" {
			t.Errorf("%s: the chained block's token %q (%v)", mode, tok, err)
		}
		fxExec(t, c, "ROLLBACK")
		c.Close(ctxT(t))
	}
	// An extended-protocol batch that only opens a block (Parse BEGIN, Bind, Describe, Execute, Sync), as
	// pgconn's ExecParams sends it, gets the client's values on a clean connection and on one put back. (Its
	// token statement is a SELECT: a SET TRANSACTION right after it fails 25001, a known difference.)
	extendedBegin := func(c *pgx.Conn, what string) {
		t.Helper()
		if _, err := c.PgConn().ExecParams(ctxT(t), "BEGIN", nil, nil, nil, nil).Close(); err != nil {
			t.Fatalf("%s: BEGIN: %v", what, err)
		}
	}
	tokenIs := func(c *pgx.Conn, what, want string) {
		t.Helper()
		var tok string
		if err := c.QueryRow(ctxT(t), "SELECT current_setting('fence.token')").Scan(&tok); err != nil || tok != want {
			t.Errorf("%s: the block's token %q (%v), want %q", what, tok, err, want)
		}
	}
	c := pooledConn(t, f, "&options=-c%20fence.token%3D5")
	extendedBegin(c, "extended")
	tokenIs(c, "extended", "5")
	fxExec(t, c, "ROLLBACK")
	c.Close(ctxT(t))
	dirtyPooledConnection(t, f, "pooled_snap_sneak_ext")
	c = pooledConn(t, f, "&options=-c%20fence.token%3D6")
	extendedBegin(c, "extended, on a connection put back")
	tokenIs(c, "extended, on a connection put back", "6")
	fxExec(t, c, "ROLLBACK")
	c.Close(ctxT(t))

	// With prepared fences on, their verification, due before each transaction that EXECUTEs, goes as a Query
	// of its own, not in front of the BEGIN: the block takes no snapshot there either.
	t.Run("prepared fences", func(t *testing.T) {
		fp := newPooledFencedUpstream(t, 1, "", "  prepared_fences: 64\n")
		fxExec(t, fp.d, "INSERT INTO "+fp.label+" (id, fence_token, balance) VALUES (1, 1, 0)")
		c := pooledConn(t, fp, "&default_query_exec_mode=simple_protocol&options=-c%20fence.token%3D5")
		write := func(isolation bool) {
			t.Helper()
			fxExec(t, c, "BEGIN")
			if isolation {
				serializable(t, c, "prepared fences")
			}
			fxExec(t, c, "UPDATE "+fp.label+" SET balance = balance + 1 WHERE id = 1")
			fxExec(t, c, "COMMIT")
		}
		for range 6 {
			write(false)
		}
		warm := serverExecutions(t, c)
		if warm == 0 {
			t.Fatal("no write ran as EXECUTE of a prepared fence: the case below would not test it")
		}
		write(true) // the prepared fences' verification is due before this BEGIN
		for range 2 {
			write(false)
		}
		if serverExecutions(t, c) <= warm {
			t.Fatal("the prepared fences stopped running after the block with SET TRANSACTION")
		}
		fp.wantToken(t, 1, 5)
	})
}
