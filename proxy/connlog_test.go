package proxy_test

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

var logField = regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S*)`)

// logLines parses the proxy's slog text lines whose msg is msg into their fields.
func logLines(logs, msg string) []map[string]string {
	var out []map[string]string
	for _, line := range strings.Split(logs, "\n") {
		f := map[string]string{}
		for _, m := range logField.FindAllStringSubmatch(line, -1) {
			v := m[2]
			if uq, err := strconv.Unquote(v); err == nil {
				v = uq
			}
			f[m[1]] = v
		}
		if f["msg"] == msg {
			out = append(out, f)
		}
	}
	return out
}

// connLine waits for the "connection ended" (or started) line of the session with this application_name.
func connLine(t *testing.T, p *proxytest.Proxy, msg, app string) map[string]string {
	t.Helper()
	var found map[string]string
	eventually(t, 10*time.Second, msg+" line for "+app, func() bool {
		for _, f := range logLines(p.Logs.String(), msg) {
			if f["application_name"] == app {
				found = f
				return true
			}
		}
		return false
	})
	return found
}

func withApp(dsn, app string) string { return dsn + "&application_name=" + app }

// Every connection gets a line when it starts and one when it ends, at the level log.connections says, with the
// client's address, user, database, application_name, and at the end the duration, bytes each way and how it
// ended.
func TestConnectionLogLines(t *testing.T) {
	for _, level := range []string{"", "info", "debug"} {
		t.Run("level="+level, func(t *testing.T) {
			o := proxytest.Options{}
			if level != "" {
				o.YAML = "log:\n  connections: " + level + "\n"
			}
			p := startProxy(t, o)
			want := map[string]string{"": "INFO", "info": "INFO", "debug": "DEBUG"}[level]
			app := "connlog-" + strings.ToLower(want)
			ctx := ctxT(t)
			c, err := pgx.Connect(ctx, withApp(p.DSN(pgtest.SuperUser, "", pgtest.TestDB), app))
			if err != nil {
				t.Fatal(err)
			}
			var pid int
			if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			local := c.PgConn().Conn().LocalAddr().String()
			c.Close(ctx)

			start := connLine(t, p, "connection started", app)
			end := connLine(t, p, "connection ended", app)
			for _, f := range []map[string]string{start, end} {
				if f["level"] != want || f["client"] != local || f["user"] != pgtest.SuperUser || f["database"] != pgtest.TestDB {
					t.Errorf("%s line: level %q client %q user %q database %q; want %s %s %s %s", f["msg"], f["level"], f["client"], f["user"], f["database"], want, local, pgtest.SuperUser, pgtest.TestDB)
				}
			}
			if _, err := time.ParseDuration(end["duration"]); err != nil {
				t.Errorf("duration %q: %v", end["duration"], err)
			}
			for _, k := range []string{"bytes_in", "bytes_out"} {
				// At least the startup packet's answer, a query and its result went each way.
				if n, err := strconv.Atoi(end[k]); err != nil || n < 20 {
					t.Errorf("%s = %q, want a count of bytes", k, end[k])
				}
			}
			if end["outcome"] != "client terminated" || end["backend_pid"] != strconv.Itoa(pid) {
				t.Errorf("outcome %q backend_pid %q, want client terminated and %d", end["outcome"], end["backend_pid"], pid)
			}
		})
	}
}

func TestConnectionLogLinesOff(t *testing.T) {
	p := startProxy(t, proxytest.Options{YAML: "log:\n  connections: off\n"})
	c := connect(t, withApp(p.DSN(pgtest.SuperUser, "", pgtest.TestDB), "connlog-off"))
	if _, err := c.Exec(ctxT(t), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	c.Close(ctxT(t))
	// The session's end is visible in the metrics; by then its line would have been written.
	eventually(t, 10*time.Second, "the session to end", func() bool { return p.Server.ActiveSessions() == 0 })
	if strings.Contains(p.Logs.String(), "connection started") || strings.Contains(p.Logs.String(), "connection ended") {
		t.Fatalf("log.connections: off, yet:\n%s", p.Logs.String())
	}
}

// How a session ended is in its last line: the client vanishing, the server ending it, a failed login.
func TestConnectionLogOutcomes(t *testing.T) {
	p := startProxy(t, proxytest.Options{})
	ctx := ctxT(t)

	gone, err := pgx.Connect(ctx, withApp(p.DSN(pgtest.SuperUser, "", pgtest.TestDB), "connlog-vanish"))
	if err != nil {
		t.Fatal(err)
	}
	gone.PgConn().Conn().Close() // no Terminate
	if got := connLine(t, p, "connection ended", "connlog-vanish")["outcome"]; got != "client disconnected" {
		t.Errorf("client vanished: outcome %q", got)
	}

	killed := connect(t, withApp(p.DSN(pgtest.SuperUser, "", pgtest.TestDB), "connlog-killed"))
	if _, err := direct(t).Exec(ctx, "SELECT pg_terminate_backend($1)", killed.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	if got := connLine(t, p, "connection ended", "connlog-killed")["outcome"]; got != "server closed" {
		t.Errorf("backend terminated: outcome %q", got)
	}

	_, err = pgx.Connect(ctx, withApp(p.DSN(pgtest.ScramUser, "Wr0ng-Secret-123", pgtest.TestDB), "connlog-badpass"))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
		t.Fatalf("wrong password: want 28P01, got %v", err)
	}
	if f := connLine(t, p, "connection ended", "connlog-badpass"); f["outcome"] != "closed during startup" || f["user"] != pgtest.ScramUser {
		t.Errorf("failed login: outcome %q user %q", f["outcome"], f["user"])
	}

	// Last, as it stops the proxy: an idle session closed by the drain.
	connect(t, withApp(p.DSN(pgtest.SuperUser, "", pgtest.TestDB), "connlog-drained"))
	if err := p.Server.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := connLine(t, p, "connection ended", "connlog-drained")["outcome"]; got != "proxy shutting down" {
		t.Errorf("drained: outcome %q", got)
	}
}

// The connection lines carry no password, whatever the authentication method and the level.
func TestConnectionLogNeverHasPasswords(t *testing.T) {
	p := startProxy(t, proxytest.Options{YAML: "log:\n  connections: debug\n"})
	ctx := ctxT(t)
	secrets := []string{pgtest.MD5Password, pgtest.ScramPassword, pgtest.PasswordPassword, "Wr0ng-Secret-456"}
	for _, u := range []struct{ user, pass string }{
		{pgtest.MD5User, pgtest.MD5Password},
		{pgtest.ScramUser, pgtest.ScramPassword},
		{pgtest.PasswordUser, pgtest.PasswordPassword},
		{pgtest.PasswordUser, "Wr0ng-Secret-456"},
	} {
		app := "connlog-pw-" + u.user
		c, err := pgx.Connect(ctx, withApp(p.DSN(u.user, u.pass, pgtest.TestDB), app))
		if err == nil {
			c.Close(ctx)
		}
		connLine(t, p, "connection ended", app)
	}
	logs := p.Logs.String()
	for _, s := range secrets {
		if strings.Contains(logs, s) {
			t.Fatalf("password %q reached the logs:\n%s", s, logs)
		}
	}
}
