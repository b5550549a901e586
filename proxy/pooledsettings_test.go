package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// settingsShown are the settings the oracle compares (SHOW) after every statement.
var settingsShown = []string{"search_path", "application_name", "TimeZone", "DateStyle", "IntervalStyle", "statement_timeout",
	"standard_conforming_strings", "extra_float_digits", "work_mem", "bytea_output"}

// reportedShown are the ParameterStatus values the oracle compares: what the client was told.
var reportedShown = []string{"application_name", "TimeZone", "DateStyle", "IntervalStyle", "standard_conforming_strings",
	"client_encoding", "integer_datetimes", "is_superuser", "session_authorization"}

// The same scripts run on a direct connection and through a pool of one server connection, which another client
// with settings of its own uses between every two statements: every setting reads the same (SHOW), the client
// was told the same (ParameterStatus), and the other client keeps its own. PostgreSQL is the judge of what SET,
// SET LOCAL, RESET, RESET ALL, DISCARD ALL, set_config (literal and bound), a rollback, a SET in a failed
// transaction and savepoints leave.
func TestPooledSettingsOracle(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	scripts := [][]string{
		{"SET search_path = pg_catalog, public", "SET application_name = 'app one'", "SET TimeZone = 'Asia/Tokyo'", "SET DateStyle = 'SQL, DMY'",
			"SET statement_timeout = '5s'", "SET IntervalStyle = 'iso_8601'", "SET extra_float_digits = 2", "SET work_mem = '8MB'"},
		{"SET search_path = pg_catalog", "BEGIN", "SET search_path = public, pg_catalog", "SET application_name = 'rolled back'", "ROLLBACK"},
		{"SET TimeZone = 'UTC'", "BEGIN", "SET LOCAL TimeZone = 'Europe/Paris'", "SET LOCAL application_name = 'local'", "COMMIT"},
		{"SET search_path = pg_catalog", "BEGIN", "SELECT 1/0", "SET search_path = public", "ROLLBACK"},
		{"SET DateStyle = 'German'", "BEGIN", "SAVEPOINT a", "SET DateStyle = 'ISO, YMD'", "ROLLBACK TO SAVEPOINT a", "SET bytea_output = 'escape'", "RELEASE a", "COMMIT"},
		{"SET application_name = 'x'", "SET search_path = pg_catalog", "RESET search_path", "RESET application_name"},
		{"SET application_name = 'x'", "SET TimeZone = 'Asia/Tokyo'", "RESET ALL"},
		{"SET application_name = 'x'", "SET work_mem = '9MB'", "SET standard_conforming_strings = off", "DISCARD ALL", "SET work_mem TO DEFAULT"},
		{"SELECT set_config('search_path', 'pg_catalog, public', false)", "SELECT set_config('TimeZone', 'America/New_York', true)",
			"SELECT set_config('application_name', 'via set_config', false)"},
		{"SET standard_conforming_strings = off", "SELECT 'a\\'b'", "SET standard_conforming_strings = on"},
		{"SET search_path = pg_catalog; SET LOCAL TimeZone = 'Asia/Tokyo'; SELECT 1", "BEGIN; SET application_name = 'a'; COMMIT; SET TimeZone = 'UTC'"},
		{"SET SCHEMA 'pg_catalog'", "SET TIME ZONE 'Europe/Paris'", "SET SESSION statement_timeout = 1234"},
		{"SET myapp.tenant = '5'", "SELECT set_config('MyApp.User', 'u', false)", "BEGIN", "SET myapp.tenant = '6'", "ROLLBACK", "RESET myapp.user"},
		{"SET myapp.tenant = '5'", "BEGIN", "SET LOCAL myapp.tenant = '7'", "SET myapp.user = 'x'", "COMMIT", "RESET ALL"},
		{"SET SESSION myapp.tenant = '5'", "SET myapp.user TO 'y'", "DISCARD ALL"},
		{`SET application_name = 'a "q" \ b, {c} NULL'`, `SET search_path = "we""ird\x,", public`, "SET myapp.tenant = '{\\\"}'", "SET myapp.user = 'NULL'"},
	}
	ctx := ctxT(t)
	state := func(c *pgx.Conn) string {
		var b strings.Builder
		var sql []string
		for _, name := range settingsShown {
			sql = append(sql, "'"+name+"=' || current_setting('"+name+"')")
		}
		for _, name := range []string{"myapp.tenant", "myapp.user"} {
			// NULL (never set on the connection) and '' (reset) both mean none (docs/pooling.md)
			sql = append(sql, "'"+name+"=' || coalesce(current_setting('"+name+"', true), '')")
		}
		res, err := c.PgConn().Exec(ctx, "SELECT "+strings.Join(sql, " || ' ' || ")).ReadAll()
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "25P02" {
				return "aborted"
			}
			t.Fatal(err)
		}
		b.WriteString(string(res[0].Rows[0][0]) + " ")
		for _, name := range reportedShown {
			b.WriteString("reported " + name + "=" + c.PgConn().ParameterStatus(name) + " ")
		}
		return b.String()
	}
	noise := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	fxExec(t, noise, "SET search_path = public, pg_catalog")
	fxExec(t, noise, "SET application_name = 'noise'")
	fxExec(t, noise, "SET TimeZone = 'Pacific/Auckland'")
	fxExec(t, noise, "SET standard_conforming_strings = off")
	fxExec(t, noise, "SET myapp.tenant = 'noise'")
	noiseState := state(noise)
	for i, script := range scripts {
		for _, mode := range []string{"simple_protocol", "exec"} {
			q := "&default_query_exec_mode=" + mode
			d := connect(t, pg.SuperDSN()+q)
			p := pooledConn(t, f, q)
			if sd, sp := state(d), state(p); sd != sp {
				t.Fatalf("script %d (%s) at the start:\ndirect %s\npooled %s", i, mode, sd, sp)
			}
			for _, stmt := range script {
				errD, errP := oracleExec(ctx, d, mode, stmt), oracleExec(ctx, p, mode, stmt)
				if (errD == nil) != (errP == nil) {
					t.Fatalf("script %d (%s) %q: direct error %v, pooled error %v", i, mode, stmt, errD, errP)
				}
				if p.PgConn().TxStatus() == 'I' {
					fxExec(t, noise, "SELECT 1") // the pool's one server connection serves the other client
				}
				if sd, sp := state(d), state(p); sd != sp {
					t.Fatalf("script %d (%s) after %q:\ndirect %s\npooled %s", i, mode, stmt, sd, sp)
				}
			}
			if got := state(noise); got != noiseState {
				t.Fatalf("script %d (%s): the other client's settings became\n%s\nwant\n%s", i, mode, got, noiseState)
			}
			d.Close(ctx)
			p.Close(ctx)
		}
	}
	if n := fxCounter(t, f.p.Registry, "fenceproxy_pool_pins_total", nil); n != 0 {
		t.Fatalf("%v clients pinned: the settings should have moved", n)
	}
}

// A client's search_path never reaches another client of its server connection: A's path finds a trap table
// that shadows public's; B, on the same server connection before and after A, reads public's, in both
// protocols, and A keeps its own across transactions. The same for a custom setting (an RLS tenant), which
// pg_settings does not show.
func TestPooledSettingsDoNotLeak(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	for _, sql := range []string{
		"DROP SCHEMA IF EXISTS pooledtrap CASCADE", "CREATE SCHEMA pooledtrap",
		"DROP TABLE IF EXISTS public.pooledwhich", "CREATE TABLE public.pooledwhich (v text)", "INSERT INTO public.pooledwhich VALUES ('public')",
		"CREATE TABLE pooledtrap.pooledwhich (v text)", "INSERT INTO pooledtrap.pooledwhich VALUES ('trap')",
	} {
		fxExec(t, f.d, sql)
	}
	t.Cleanup(func() {
		f.d.Exec(context.Background(), "DROP SCHEMA IF EXISTS pooledtrap CASCADE")
		f.d.Exec(context.Background(), "DROP TABLE IF EXISTS public.pooledwhich")
	})
	which := func(c *pgx.Conn) string {
		t.Helper()
		var v string
		if err := c.QueryRow(ctxT(t), "SELECT v FROM pooledwhich").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	tenant := func(c *pgx.Conn) string {
		t.Helper()
		var v string
		if err := c.QueryRow(ctxT(t), "SELECT coalesce(current_setting('myapp.tenant', true), '')").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, mode := range []string{"simple_protocol", "exec"} {
		q := "&default_query_exec_mode=" + mode
		a := pooledConn(t, f, q)
		b := pooledConn(t, f, q)
		fxExec(t, a, "SET search_path = pooledtrap, public")
		fxExec(t, a, "SET myapp.tenant = 'a'")
		for i := 0; i < 3; i++ {
			if got := which(b); got != "public" {
				t.Fatalf("%s: client B reads the %s table: A's search_path reached it", mode, got)
			}
			if got := tenant(b); got != "" {
				t.Fatalf("%s: client B's myapp.tenant is A's %q", mode, got)
			}
			if got := which(a); got != "trap" {
				t.Fatalf("%s: client A reads the %s table: its search_path was lost", mode, got)
			}
			if got := tenant(a); got != "a" {
				t.Fatalf("%s: client A's myapp.tenant became %q", mode, got)
			}
		}
		if backendPID(t, a) != backendPID(t, b) {
			t.Fatal("the two clients did not share the server connection")
		}
	}
}

// SET ROLE and SET SESSION AUTHORIZATION (in any spelling: set_config too) are never replayed: they pin the
// client, so another client never runs as that role, and pool.on_session_state counts them as "role".
func TestPooledRoleDoesNotLeak(t *testing.T) {
	for _, tc := range []struct{ name, sql string }{
		{"set_role", "SET ROLE pooled_role"},
		{"set_config", "SELECT set_config('role', 'pooled_role', false)"},
		{"session_authorization", "SET SESSION AUTHORIZATION pooled_role"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newPooledFenced(t, 2, "")
			f.d.Exec(ctxT(t), "CREATE ROLE pooled_role")
			q := "&default_query_exec_mode=simple_protocol"
			a := pooledConn(t, f, q)
			fxExec(t, a, tc.sql)
			pid := backendPID(t, a)
			b := pooledConn(t, f, q)
			for i := 0; i < 3; i++ {
				var user, sessionUser string
				if err := b.QueryRow(ctxT(t), "SELECT current_user::text, session_user::text").Scan(&user, &sessionUser); err != nil {
					t.Fatal(err)
				}
				if user != pgtest.SuperUser || sessionUser != pgtest.SuperUser {
					t.Fatalf("another client runs as %s (session %s)", user, sessionUser)
				}
				if err := a.QueryRow(ctxT(t), "SELECT current_user::text").Scan(&user); err != nil || user != "pooled_role" {
					t.Fatalf("the client's own role became %q (%v)", user, err)
				}
			}
			if backendPID(t, a) != pid {
				t.Fatal("the client with a role moved to another server connection")
			}
			if n := fxCounter(t, f.p.Registry, "fenceproxy_pool_pins_total", map[string]string{"reason": "role"}); n != 1 {
				t.Fatalf("pins{reason=role} = %v, want 1", n)
			}
		})
	}
}

// A client sees the ParameterStatus messages a connection of its own would show, and no others: none for
// another client's settings or for the server connection being given its own, one for each change it makes.
func TestPooledSettingsParameterStatus(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	a := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
	b := dialRaw(t, f.p.Addr, pgtest.SuperUser, pgtest.TestDB, map[string]string{"application_name": "bee"})
	reports := func(q string) []string {
		t.Helper()
		b.fe.Send(&pgproto3.Query{String: q})
		if err := b.fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			m, err := b.fe.Receive()
			if err != nil {
				t.Fatal(err)
			}
			switch m := m.(type) {
			case *pgproto3.ParameterStatus:
				got = append(got, m.Name+"="+m.Value)
			case *pgproto3.ErrorResponse:
				t.Fatalf("%s: %s", q, m.Message)
			case *pgproto3.ReadyForQuery:
				sort.Strings(got) // the server reports changes in an order of its own
				return got
			}
		}
	}
	for i := 0; i < 2; i++ {
		fxExec(t, a, "SET application_name = 'ay'")
		fxExec(t, a, "SET TimeZone = 'Asia/Tokyo'")
		if got := reports("SELECT 1"); len(got) != 0 {
			t.Fatalf("round %d: B was shown %v after A's settings", i, got)
		}
		var app string
		if err := a.QueryRow(ctxT(t), "SHOW application_name").Scan(&app); err != nil || app != "ay" {
			t.Fatalf("A's application_name is %q (%v)", app, err)
		}
	}
	if got := strings.Join(reports("SET TimeZone = 'Asia/Tokyo'; SET application_name = 'ay'"), " "); got != "TimeZone=Asia/Tokyo application_name=ay" {
		t.Fatalf("B's own SETs showed %q", got)
	}
	if got := strings.Join(reports("SET application_name = 'bee'; SELECT 1"), " "); got != "application_name=bee" {
		t.Fatalf("B's own SET back showed %q", got)
	}
	if got := reports("SHOW application_name"); len(got) != 0 {
		t.Fatalf("B was shown %v", got)
	}
}

// A role a function sets at session level never runs another client's transaction. Three logins:
//   - a superuser: a change to a role that is not one turns is_superuser off, and a SET SESSION AUTHORIZATION
//     shows in session_authorization; the server reports both, and the connection is closed when the
//     transaction that did it ends (the next client gets another backend);
//   - the same login changed to another superuser role, which the server does not report: a checked
//     transaction, a lone BEGIN and a statement that gets no token statement have the login role put back
//     first, in a transaction of their own (putBackFirst, checkFirst), so no rollback of the
//     client's brings it back;
//   - a login that is a member of a role that is not a superuser (an unreported change): its plain transactions
//     set the role back themselves.
func TestPooledRoleByFunction(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	for _, sql := range []string{
		"DROP ROLE IF EXISTS pooled_superrole", "CREATE ROLE pooled_superrole SUPERUSER",
		// A run before (-test.count) left the grant, which keeps the role from being dropped.
		"DO $$ BEGIN IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pooled_member') THEN REVOKE ALL ON pg_catalog.pg_stat_activity FROM pooled_member; END IF; END $$",
		"DROP ROLE IF EXISTS pooled_member", "DROP ROLE IF EXISTS pooled_plainrole",
		"CREATE ROLE pooled_plainrole", "CREATE ROLE pooled_member LOGIN IN ROLE pooled_plainrole",
		"CREATE OR REPLACE FUNCTION pooled_become(r text) RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config('role', r, false) $$",
		"CREATE OR REPLACE FUNCTION pooled_become_session(r text) RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config('session_authorization', r, false) $$",
		"GRANT SELECT ON pg_catalog.pg_stat_activity TO pooled_member",
	} {
		fxExec(t, f.d, sql)
	}
	t.Cleanup(func() {
		f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_become(text)")
		f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS pooled_become_session(text)")
	})
	backend := func(c *pgx.Conn) (user string, pid int) {
		t.Helper()
		if err := c.QueryRow(ctxT(t), "SELECT current_user::text, pg_backend_pid()").Scan(&user, &pid); err != nil {
			t.Fatal(err)
		}
		return user, pid
	}
	for _, mode := range []string{"simple_protocol", "exec"} {
		q := "&default_query_exec_mode=" + mode
		for _, become := range []string{"pooled_become('pooled_plainrole')", "pooled_become_session('pooled_plainrole')"} {
			a := pooledConn(t, f, q)
			_, before := backend(a)
			fxExec(t, a, "SELECT "+become)
			b := pooledConn(t, f, q)
			if user, pid := backend(b); user != pgtest.SuperUser || pid == before {
				t.Fatalf("%s, %s: the next client runs as %q on backend %d (the changed one was %d)", mode, become, user, pid, before)
			}
		}

		a := pooledConn(t, f, q)
		become := func() uint32 {
			t.Helper()
			fxExec(t, a, "SELECT pooled_become('pooled_superrole')")
			return backendPID(t, a)
		}
		pid := become()
		// A checked transaction puts the login role back in its first statement and runs as it.
		b := pooledConn(t, f, q)
		var user, app string
		if err := b.QueryRow(ctxT(t), "SELECT current_user::text, pg_catalog.set_config('application_name', 'b', false)").Scan(&user, &app); err != nil || user != pgtest.SuperUser {
			t.Fatalf("%s: the checked transaction after the change runs as %q (%v)", mode, user, err)
		}
		if got := backendPID(t, b); got != pid {
			t.Fatalf("%s: the connection the checked transaction cleaned was closed", mode)
		}
		// A statement that gets no token statement has it put back as a unit of its own first: the database
		// it creates is the login role's.
		become()
		c := pooledConn(t, f, q)
		t.Cleanup(func() { f.d.Exec(context.Background(), "DROP DATABASE IF EXISTS pooled_role_db") })
		fxExec(t, c, "CREATE DATABASE pooled_role_db")
		var owner string
		if err := f.d.QueryRow(ctxT(t), "SELECT pg_catalog.pg_get_userbyid(datdba)::text FROM pg_catalog.pg_database WHERE datname = 'pooled_role_db'").Scan(&owner); err != nil || owner != pgtest.SuperUser {
			t.Fatalf("%s: CREATE DATABASE after the change ran as %q (%v)", mode, owner, err)
		}
		fxExec(t, f.d, "DROP DATABASE pooled_role_db")
		d := pooledConn(t, f, q)
		if user, _ := backend(d); user != pgtest.SuperUser {
			t.Fatalf("%s: the next client runs as %q", mode, user)
		}
		if err := d.Ping(ctxT(t)); err != nil { // a text of no statement: nothing to check, nothing waits
			t.Fatal(err)
		}
		// A lone BEGIN reads the role and puts it back in the same statement: the block runs as the login role.
		become()
		e := pooledConn(t, f, q)
		tx, err := e.Begin(ctxT(t))
		if err != nil {
			t.Fatalf("%s: BEGIN after the change: %v", mode, err)
		}
		if err := tx.QueryRow(ctxT(t), "SELECT current_user::text").Scan(&user); err != nil || user != pgtest.SuperUser {
			t.Fatalf("%s: the block runs as %q (%v)", mode, user, err)
		}
		if err := tx.Commit(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		// Put back first, in a transaction of its own: the client's own rollback, or its own error, does not
		// bring the role back, and its session goes on as the login role.
		become()
		g := pooledConn(t, f, q)
		fxExec(t, g, "BEGIN; SET application_name = 'g'; ROLLBACK")
		_, err = g.Exec(ctxT(t), "SET application_name = 'g'; SELECT 1/0")
		wantPgErr(t, err, "22012", "")
		if user, _ := backend(g); user != pgtest.SuperUser {
			t.Fatalf("%s: after its rollback the client runs as %q", mode, user)
		}
		if err := g.QueryRow(ctxT(t), "SELECT current_user::text, pg_catalog.set_config('application_name', 'g', false)").Scan(&user, &app); err != nil || user != pgtest.SuperUser {
			t.Fatalf("%s: the client's next checked transaction runs as %q (%v)", mode, user, err)
		}

		member := f.p.DSN("pooled_member", "", pgtest.TestDB) + q
		a = connect(t, member)
		_, before := backend(a)
		fxExec(t, a, "SELECT pooled_become('pooled_plainrole')")
		b = connect(t, member)
		if user, pid := backend(b); user != "pooled_member" || pid != before {
			t.Fatalf("%s: the next client of a member login runs as %q on backend %d (the changed one was %d, kept)", mode, user, pid, before)
		}
	}
}

// The proxy's own SQL on a pooled server connection (the probe, the token and settings statements) means the
// same under any client's search_path: a client that puts a schema of its own with operators = and <> on text
// (both always false) before pg_catalog cannot hide its settings from the probe, so its search_path never
// reaches the next client of the connection.
func TestPooledProbeIgnoresClientOperators(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	for _, sql := range []string{
		"DROP SCHEMA IF EXISTS pooledevil CASCADE", "CREATE SCHEMA pooledevil",
		"CREATE FUNCTION pooledevil.never(text, text) RETURNS bool LANGUAGE sql AS 'SELECT false'",
		"CREATE OPERATOR pooledevil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = pooledevil.never)",
		"CREATE OPERATOR pooledevil.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = pooledevil.never)",
		"CREATE OPERATOR pooledevil.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = pooledevil.never)",
	} {
		fxExec(t, f.d, sql)
	}
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP SCHEMA IF EXISTS pooledevil CASCADE") })
	for _, mode := range []string{"simple_protocol", "exec"} {
		q := "&default_query_exec_mode=" + mode
		a := pooledConn(t, f, q)
		fxExec(t, a, "SET search_path = pooledevil, pg_catalog, public")
		fxExec(t, a, "SET application_name = 'evil'")
		b := pooledConn(t, f, q)
		var path, app string
		if err := b.QueryRow(ctxT(t), "SELECT current_setting('search_path'), current_setting('application_name')").Scan(&path, &app); err != nil {
			t.Fatal(err)
		}
		if path != `"$user", public` || app != "" {
			t.Fatalf("%s: the next client has search_path %q and application_name %q", mode, path, app)
		}
		if err := a.QueryRow(ctxT(t), "SELECT current_setting('search_path')").Scan(&path); err != nil || path != "pooledevil, pg_catalog, public" {
			t.Fatalf("%s: the client's own search_path became %q (%v)", mode, path, err)
		}
	}
}

// No setting leaks under load: 40 clients on a pool of 4 server connections, half in the simple protocol and
// half in the extended one, each with values tagged with its own number (search_path, application_name, a
// custom setting), run a random mix of SET, SET LOCAL, RESET, RESET ALL, DISCARD ALL, set_config (literal and
// bound value), a SET rolled back and multi-statement Queries. Whatever PostgreSQL's rules give a client at any
// moment, it can only be its own tag or the default: every read of the three settings, and the
// application_name the client was last told (ParameterStatus), is checked. Most server connections serve
// several clients.
func TestPooledSettingsNoLeakUnderLoad(t *testing.T) {
	const clients, poolSize, txPerClient = 40, 4, 150
	f := newPooledFenced(t, poolSize, "  max_client_wait: 60s\n")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	var pidsMu sync.Mutex
	clientsOf := map[uint32]map[int]bool{}
	for c := 1; c <= clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			if err := settingsLoadClient(ctx, f, c, txPerClient, func(pid uint32) {
				pidsMu.Lock()
				defer pidsMu.Unlock()
				if clientsOf[pid] == nil {
					clientsOf[pid] = map[int]bool{}
				}
				clientsOf[pid][c] = true
			}); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("client %d: %w", c, err)
				cancel()
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	shared := 0
	for _, cs := range clientsOf {
		if len(cs) > 1 {
			shared++
		}
	}
	if len(clientsOf) == 0 || shared*2 <= len(clientsOf) {
		t.Fatalf("want most server connections to serve several clients: %d of %d did", shared, len(clientsOf))
	}
	if n := fxCounter(t, f.p.Registry, "fenceproxy_pool_pins_total", nil); n != 0 {
		t.Fatalf("%v clients pinned", n)
	}
}

// settingsLoadClient runs one client of TestPooledSettingsNoLeakUnderLoad; sawPID is told each backend it ran on.
func settingsLoadClient(ctx context.Context, f *fenced, c, txs int, sawPID func(uint32)) error {
	rng := rand.New(rand.NewSource(int64(c)))
	mode := "simple_protocol"
	if c%2 == 0 {
		mode = "exec"
	}
	conn, err := pgx.Connect(ctx, f.dsn()+"&default_query_exec_mode="+mode)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	tag := fmt.Sprintf("c%d", c)
	own := func(v string) bool {
		// Own values are tag or tag_N; defaults are '' (custom, application_name) and "$user", public.
		return v == "" || v == `"$user", public` || v == tag || strings.HasPrefix(v, tag+"_") || v == `"`+tag+`"` || strings.HasPrefix(v, `"`+tag+"_")
	}
	val := func() string { return fmt.Sprintf("%s_%d", tag, rng.Intn(5)) }
	for i := 0; i < txs; i++ {
		var stmts []string
		switch rng.Intn(11) {
		case 0:
			stmts = []string{"SET search_path = " + val()}
		case 1:
			stmts = []string{"SET application_name = '" + val() + "'"}
		case 2:
			stmts = []string{"SET myapp.client = '" + val() + "'"}
		case 3:
			stmts = []string{"BEGIN", "SET search_path = " + val(), "SET myapp.client = '" + val() + "'", "ROLLBACK"}
		case 4:
			stmts = []string{"BEGIN", "SET LOCAL application_name = '" + val() + "'", "SET LOCAL myapp.client = '" + val() + "'", "COMMIT"}
		case 5:
			stmts = []string{"RESET " + []string{"search_path", "application_name", "myapp.client"}[rng.Intn(3)]}
		case 6:
			stmts = []string{[]string{"RESET ALL", "DISCARD ALL"}[rng.Intn(2)]}
		case 7:
			if _, err := conn.Exec(ctx, "SELECT set_config('myapp.client', $1, false)", val()); err != nil {
				return err
			}
		case 8:
			stmts = []string{"SELECT set_config('application_name', '" + val() + "', " + []string{"false", "true"}[rng.Intn(2)] + ")"}
		case 9:
			if mode == "simple_protocol" {
				stmts = []string{"SET search_path = " + val() + "; SET LOCAL myapp.client = '" + val() + "'; SELECT 1"}
			}
		default:
		}
		for _, s := range stmts {
			if _, err := conn.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		var path, app, custom string
		var pid uint32
		if err := conn.QueryRow(ctx, "SELECT current_setting('search_path'), current_setting('application_name'), coalesce(current_setting('myapp.client', true), ''), pg_backend_pid()").Scan(&path, &app, &custom, &pid); err != nil {
			return err
		}
		sawPID(pid)
		for _, v := range []string{path, app, custom, conn.PgConn().ParameterStatus("application_name")} {
			if !own(v) {
				return fmt.Errorf("transaction %d reads another client's setting: search_path %q, application_name %q (told %q), myapp.client %q",
					i, path, app, conn.PgConn().ParameterStatus("application_name"), custom)
			}
		}
	}
	return nil
}

// The transaction characteristics set for one transaction (SET TRANSACTION after BEGIN, as Rails does for an
// isolated transaction; SET transaction_isolation; BEGIN ISOLATION LEVEL) reach no later transaction, so they
// neither move nor pin: on a pool of one, another client is served right after, and the client's next
// transaction has the default characteristics, as directly. Until 2026-12-04 pg_settings' "session" source for
// them pinned the client for good.
func TestPooledTransactionCharacteristicsDoNotPin(t *testing.T) {
	f := newPooledFenced(t, 1, "  max_client_wait: 5s\n")
	ctx := ctxT(t)
	scripts := [][]string{
		{"BEGIN", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", "SHOW transaction_isolation", "COMMIT", "SHOW transaction_isolation"},
		{"BEGIN", "SET TRANSACTION READ ONLY, DEFERRABLE", "SHOW transaction_read_only", "ROLLBACK", "SHOW transaction_read_only"},
		{"BEGIN", "SET transaction_isolation = 'repeatable read'", "SHOW transaction_isolation", "COMMIT", "SHOW transaction_isolation"},
		{"BEGIN ISOLATION LEVEL REPEATABLE READ; SHOW transaction_isolation; COMMIT", "SHOW transaction_isolation"},
		{"SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE", "SHOW transaction_isolation", "RESET default_transaction_isolation"},
	}
	for i, script := range scripts {
		d := connect(t, pg.SuperDSN()+"&default_query_exec_mode=simple_protocol")
		p := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
		for _, stmt := range script {
			var got [2]string
			for j, c := range []*pgx.Conn{d, p} {
				rows, err := c.Query(ctx, stmt)
				if err != nil {
					t.Fatalf("script %d %q: %v", i, stmt, err)
				}
				for rows.Next() {
					rows.Scan(&got[j])
				}
				if rows.Close(); rows.Err() != nil {
					t.Fatalf("script %d %q: %v", i, stmt, rows.Err())
				}
			}
			if got[0] != got[1] {
				t.Fatalf("script %d %q: direct %q, pooled %q", i, stmt, got[0], got[1])
			}
			if p.PgConn().TxStatus() == 'I' {
				other := pooledConn(t, f, "&default_query_exec_mode=simple_protocol")
				fxExec(t, other, "SELECT 1") // the pool's one server connection is not pinned
				other.Close(ctx)
			}
		}
		d.Close(ctx)
		p.Close(ctx)
	}
	if v, _, _ := gathered(t, f.p.Registry, "fenceproxy_pool_pins_total", map[string]string{"reason": "set"}); v != 0 {
		t.Fatalf("fenceproxy_pool_pins_total{reason=set} = %v, want 0", v)
	}
}

// oracleExec runs stmt for the oracles in pgx's query mode mode. pgx sends a statement without arguments as a
// simple Query in every mode: in exec mode a text of one statement goes by the extended protocol (Parse, Bind,
// Execute, Sync) instead.
func oracleExec(ctx context.Context, c *pgx.Conn, mode, stmt string) error {
	if mode == "exec" && !strings.Contains(stmt, ";") {
		return c.PgConn().ExecParams(ctx, stmt, nil, nil, nil, nil).Read().Err
	}
	_, err := c.Exec(ctx, stmt)
	return err
}
