package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// positionSteps are fenced statements that fail, or warn, at a position (%[1]s: the protected table): a bad
// literal in INSERT ... VALUES, a type error in UPDATE ... SET, an unknown column in DELETE ... WHERE, the
// second statement of a Query after non-ASCII text, ON CONFLICT DO UPDATE, a warning (22023, at the type), a
// text with an SQL-level PREPARE (whose name a pool maps: pooledsqlprep.go).
var positionSteps = []string{
	"INSERT INTO %[1]s (id, note) VALUES ('x', 'a')",
	"UPDATE %[1]s SET balance = now() WHERE id = 1",
	"DELETE FROM %[1]s WHERE nosuch = 1",
	"SELECT 'é☃' AS a;\n  UPDATE %[1]s SET note = 'ü', balance = 'y' WHERE id = 1",
	"INSERT INTO %[1]s (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET balance = 'q'",
	"UPDATE %[1]s SET note = now()::timestamptz(7)::text WHERE id = -1",
	"SELECT nosuch FROM %[1]s; DELETE FROM %[1]s WHERE id = 1",
	"PREPARE pq AS SELECT 1; UPDATE %[1]s SET balance = 'w' WHERE id = 1",
}

// positionsOf runs positionSteps on table through dsn, each as a Query and then as a Parse (extended protocol),
// and returns, per step, the code and position (P) of each error and notice.
func positionsOf(t *testing.T, dsn, table string) []string {
	t.Helper()
	ctx := ctxT(t)
	pc, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(context.Background())
	var got []string
	for _, step := range positionSteps {
		sql := fmt.Sprintf(step, table)
		for _, extended := range []bool{false, true} {
			if extended && strings.Contains(sql, ";") {
				continue // one statement a Parse
			}
			fe := pc.Frontend()
			if extended {
				fe.Send(&pgproto3.Parse{Query: sql})
				fe.Send(&pgproto3.Bind{})
				fe.Send(&pgproto3.Execute{})
				fe.Send(&pgproto3.Sync{})
			} else {
				fe.Send(&pgproto3.Query{String: sql})
			}
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			var seen []string
			for {
				m, err := fe.Receive()
				if err != nil {
					t.Fatal(err)
				}
				switch m := m.(type) {
				case *pgproto3.ErrorResponse:
					seen = append(seen, fmt.Sprintf("E %s at %d", m.Code, m.Position))
				case *pgproto3.NoticeResponse:
					seen = append(seen, fmt.Sprintf("N %s at %d", m.Code, m.Position))
				}
				if _, ok := m.(*pgproto3.ReadyForQuery); ok {
					break
				}
			}
			got = append(got, fmt.Sprintf("%s (extended %v): %s", sql, extended, strings.Join(seen, ", ")))
		}
	}
	return got
}

// An error's or a notice's position points into the client's own text, through a rewrite, as directly: in
// session mode and in transaction mode (past the token statement in front, then through the rewrite). Until
// 2026-12-05 it counted characters of the deparsed fenced text (a warning at 50 arrived at 379).
func TestRewrittenPositions(t *testing.T) {
	const token = "&options=-c%20fence.token%3D12345"
	for _, mode := range []struct {
		name string
		f    func(*testing.T) *fenced
	}{
		{"session", newFenced},
		{"transaction", func(t *testing.T) *fenced { return newPooledFenced(t, 1, "") }},
	} {
		t.Run(mode.name, func(t *testing.T) {
			f := mode.f(t)
			want := positionsOf(t, pg.SuperDSN(), f.name)
			got := positionsOf(t, f.dsn()+token, f.name)
			for i := range want {
				if !strings.Contains(want[i], " at ") {
					t.Fatalf("direct: no position: %s", want[i])
				}
				if got[i] != want[i] {
					t.Errorf("through the proxy:\n%s\nwant (directly):\n%s", got[i], want[i])
				}
			}
		})
	}
}

// Pipelined Queries: the answers of a rewritten Query and the next are not told apart, so its error's position
// is dropped (0), never left counting in the fenced text (or mapped, when the answer came before the proxy read
// the next Query).
func TestRewrittenPositionsPipelined(t *testing.T) {
	f := newFenced(t)
	ctx := ctxT(t)
	pc, err := pgconn.Connect(ctx, f.dsn()+"&options=-c%20fence.token%3D12345")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(context.Background())
	fe := pc.Frontend()
	sql := "UPDATE " + f.name + " SET balance = 'x' WHERE id = 1"
	fe.Send(&pgproto3.Query{String: sql})
	fe.Send(&pgproto3.Query{String: "SELECT 1"})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	got := errorPositions(t, fe, 2)
	dropped, mapped := "[22P02 at 0]", fmt.Sprintf("[22P02 at %d]", strings.Index(sql, "'x'")+1)
	if s := fmt.Sprint(got); s != dropped && s != mapped {
		t.Fatalf("errors %s, want %s or %s", s, dropped, mapped)
	}
}

// A Bind, Execute and Sync pipelined after a rewritten Query are another unit of answers: an error of theirs
// with a position (here a named statement planned again after its column was dropped) must keep it, or lose
// it, never have it mapped through the Query's rewrite. Until 2026-12-05 only a Query or a Parse told the
// proxy that another unit was in flight, and the Bind's error got a position in the UPDATE's text.
func TestRewrittenPositionsThenBind(t *testing.T) {
	t.Run("event loop", func(t *testing.T) { rewrittenPositionsThenBind(t, newFenced(t)) })
	t.Run("goroutines", func(t *testing.T) {
		d := direct(t)
		name := fxName(t, "fg")
		fxCreateTable(t, d, "public."+name)
		p := startProxy(t, proxytest.Options{YAML: fxTables("public." + name), DisableEventLoop: true})
		rewrittenPositionsThenBind(t, &fenced{p: p, d: d, name: name, label: "public." + name})
	})
}

func rewrittenPositionsThenBind(t *testing.T, f *fenced) {
	ctx := ctxT(t)
	pc, err := pgconn.Connect(ctx, f.dsn()+"&options=-c%20fence.token%3D12345")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(context.Background())
	scratch := f.name + "_rp"
	if err := pc.Exec(ctx, "CREATE TABLE "+scratch+" (a int, b int)").Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.Prepare(ctx, "rp1", "SELECT b FROM "+scratch, nil); err != nil {
		t.Fatal(err)
	}
	if err := pc.Exec(ctx, "ALTER TABLE "+scratch+" DROP COLUMN b").Close(); err != nil {
		t.Fatal(err)
	}
	fe := pc.Frontend()
	fe.Send(&pgproto3.Query{String: "UPDATE " + f.name + " SET note = 'n' WHERE id = -1 AND pg_sleep(0.3) IS NOT NULL"})
	fe.Send(&pgproto3.Bind{PreparedStatement: "rp1"})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	got := errorPositions(t, fe, 2)
	if s := fmt.Sprint(got); s != "[42703 at 8]" && s != "[42703 at 0]" {
		t.Fatalf("errors %s, want [42703 at 8] (directly) or [42703 at 0]", s)
	}
}

// A SQL_ASCII database counts a position in bytes. Through the proxy an error of the first statement of a
// Query after non-ASCII text was read in characters, landed in the rewritten second statement, and came back
// at that statement's start. It keeps the server's own count (or is dropped).
func TestRewrittenPositionsSQLASCII(t *testing.T) {
	f := newFenced(t)
	ctx := ctxT(t)
	db := strings.ToLower(f.name) + "_a"
	admin := direct(t)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+db+" ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)") })
	sql := "SELECT 'ééééééééééééééééééééééééééééééééééééééé☃', nosuch; UPDATE " + f.name + " SET note = 'n' WHERE id = 1"
	positionIn := func(dsn string, create bool) string {
		pc, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close(context.Background())
		if create {
			if err := pc.Exec(ctx, fmt.Sprintf(fxTableDDL, "public."+f.name)).Close(); err != nil {
				t.Fatal(err)
			}
		}
		_, err = pc.Exec(ctx, sql).ReadAll()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			t.Fatalf("%s: %v", dsn, err)
		}
		return fmt.Sprintf("%s at %d", pe.Code, pe.Position)
	}
	want := positionIn(pg.DSN(pgtest.SuperUser, "", db), true)
	if want != fmt.Sprintf("42703 at %d", strings.Index(sql, "nosuch")+1) {
		t.Fatalf("directly: %s, want the byte count of nosuch", want)
	}
	if got := positionIn(f.p.DSN(pgtest.SuperUser, "", db)+"&options=-c%20fence.token%3D12345", false); got != want && got != "42703 at 0" {
		t.Fatalf("through the proxy: %s, want %s (directly) or dropped", got, want)
	}
}

// errorPositions reads answers until the n-th ReadyForQuery and gives each error as its code and position.
func errorPositions(t *testing.T, fe *pgproto3.Frontend, n int) []string {
	t.Helper()
	var got []string
	ready := 0
	err := exchange(fe, nil, func(m pgproto3.BackendMessage) bool {
		switch m := m.(type) {
		case *pgproto3.ErrorResponse:
			got = append(got, fmt.Sprintf("%s at %d", m.Code, m.Position))
		case *pgproto3.ReadyForQuery:
			ready++
		}
		return ready == n
	})
	if err != nil {
		t.Fatalf("after %v: %v", got, err)
	}
	return got
}
