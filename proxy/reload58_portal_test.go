package proxy_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// A named portal bound before a reload and executed after it, inside one transaction block (the portal lives
// until the block ends): the portal holds the statement as the old list fenced it, here not at all. Under the
// new list, which protects the table, its Execute must not write the row unfenced: the session's token 5 is
// older than the row's 9. Both pool modes, and in session mode both transports; also when a Bind of the
// portal's name after the reload fails and a ROLLBACK TO SAVEPOINT keeps the portal of before, and when the
// transaction bound more portals before it than the pool follows by name.
func TestReload58PortalBoundBeforeTheReload(t *testing.T) {
	d := direct(t)
	name := fxName(t, "rp")
	fxCreateTable(t, d, "public."+name)
	fxExec(t, d, fmt.Sprintf("INSERT INTO public.%s (id, balance, fence_token) VALUES (1, 0, 9)", name))
	upd := fmt.Sprintf("UPDATE public.%s SET balance = balance + 1 WHERE id = $1", name)
	pooled := "pool:\n  mode: transaction\n  size: 2\nauth:\n  type: trust\n"
	for _, mode := range []struct {
		name, yaml   string
		goroutines   bool
		failedRebind bool
		fillers      int // portals bound before it in its transaction
	}{
		{"transaction", pooled, false, false, 0},
		{"transaction/a failed Bind of its name between", pooled, false, true, 0},
		{"transaction/after a hundred other portals", pooled, false, false, 100},
		{"session/event loop", "", false, false, 0},
		{"session/goroutines", "", true, false, 0},
		{"session/a failed Bind of its name between", "", false, true, 0},
	} {
		t.Run(mode.name, func(t *testing.T) {
			fxExec(t, d, fmt.Sprintf("UPDATE public.%s SET balance = 0, fence_token = 9 WHERE id = 1", name))
			f := &fenced{p: startProxy(t, proxytest.Options{YAML: fxTables("public."+name+"_other") + mode.yaml, DisableEventLoop: mode.goroutines}),
				d: d, name: name, label: "public." + name}
			fe := reload58Hijacked(t, f)
			fe.Send(&pgproto3.Query{String: "BEGIN"})
			fe.Send(&pgproto3.Parse{Name: "s", Query: upd})
			if mode.fillers > 0 {
				fe.Send(&pgproto3.Parse{Name: "one", Query: "SELECT 1"})
			}
			for i := range mode.fillers {
				fe.Send(&pgproto3.Bind{DestinationPortal: fmt.Sprintf("f%d", i), PreparedStatement: "one"})
			}
			fe.Send(&pgproto3.Bind{DestinationPortal: "p", PreparedStatement: "s", Parameters: [][]byte{[]byte("1")}})
			fe.Send(&pgproto3.Sync{})
			fe.Send(&pgproto3.Query{String: "SAVEPOINT sp"}) // after the Bind: ROLLBACK TO it keeps the portal
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if _, code, _ := reload58UntilReady(t, fe); code != "" {
					t.Fatalf("before the reload: error %s", code)
				}
			}
			// Another client bound and ran a portal before the reload, and is idle: it holds no portal, and a
			// statement it binds after the reload runs.
			other := reload58Hijacked(t, f)
			other.Send(&pgproto3.Parse{Name: "r", Query: fmt.Sprintf("SELECT count(*) FROM public.%s WHERE id = $1", name)})
			other.Send(&pgproto3.Bind{PreparedStatement: "r", Parameters: [][]byte{[]byte("1")}})
			other.Send(&pgproto3.Execute{})
			other.Send(&pgproto3.Sync{})
			if err := other.Flush(); err != nil {
				t.Fatal(err)
			}
			if _, code, _ := reload58UntilReady(t, other); code != "" {
				t.Fatalf("the other client before the reload: error %s", code)
			}
			reloadTables(t, f, "public."+name+"_other", "public."+name)
			other.Send(&pgproto3.Bind{PreparedStatement: "r", Parameters: [][]byte{[]byte("1")}})
			other.Send(&pgproto3.Execute{})
			other.Send(&pgproto3.Sync{})
			if err := other.Flush(); err != nil {
				t.Fatal(err)
			}
			if tags, code, _ := reload58UntilReady(t, other); code != "" || len(tags) != 1 {
				t.Fatalf("a client idle at the reload, binding after it: tags %v, error %q, want one SELECT", tags, code)
			}
			if mode.failedRebind {
				// A Bind of the portal's name after the reload that fails (no such statement) leaves the portal
				// of before, which the ROLLBACK TO SAVEPOINT keeps: the Execute after runs that one.
				fe.Send(&pgproto3.Bind{DestinationPortal: "p", PreparedStatement: "none", Parameters: [][]byte{[]byte("1")}})
				fe.Send(&pgproto3.Sync{})
				fe.Send(&pgproto3.Query{String: "ROLLBACK TO SAVEPOINT sp"})
				if err := fe.Flush(); err != nil {
					t.Fatal(err)
				}
				if _, code, _ := reload58UntilReady(t, fe); code != "26000" {
					t.Fatalf("the Bind of a statement that does not exist: error %q, want 26000", code)
				}
				if _, code, _ := reload58UntilReady(t, fe); code != "" {
					t.Fatalf("ROLLBACK TO SAVEPOINT: error %s", code)
				}
			}
			fe.Send(&pgproto3.Execute{Portal: "p"})
			fe.Send(&pgproto3.Sync{})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			tags, code, ended := reload58UntilReady(t, fe)
			if code != "" && code != "55F01" && code != "55F04" {
				t.Fatalf("the portal bound before the reload: error %s, want 55F01 or 55F04", code)
			}
			if !ended {
				fe.Send(&pgproto3.Query{String: "COMMIT"})
				if err := fe.Flush(); err != nil {
					t.Fatal(err)
				}
				reload58UntilReady(t, fe)
			}
			if got := f.snapshot(t); code == "" || got != "1:0:9" {
				t.Fatalf("the portal bound before the reload, executed after it: tags %v, error %q; rows after COMMIT %s, want 55F01 or 55F04 and 1:0:9", tags, code, got)
			}
		})
	}
}

// reload58UntilReady reads up to a ReadyForQuery: the command tags, the first error's SQLSTATE, and whether the
// session ended instead (an error, then the connection closed).
func reload58UntilReady(t *testing.T, fe *pgproto3.Frontend) (tags []string, code string, ended bool) {
	t.Helper()
	for {
		m, err := fe.Receive()
		if err != nil {
			if code != "" {
				return tags, code, true
			}
			t.Fatalf("read: %v (tags %v)", err, tags)
		}
		switch m := m.(type) {
		case *pgproto3.CommandComplete:
			tags = append(tags, string(m.CommandTag))
		case *pgproto3.ErrorResponse:
			if code == "" {
				code = m.Code
			}
			if m.Severity == "FATAL" {
				return tags, code, true
			}
		case *pgproto3.ReadyForQuery:
			return tags, code, false
		}
	}
}

// reload58Hijacked is a client of f's proxy with the token 5, spoken to message by message.
func reload58Hijacked(t *testing.T, f *fenced) *pgproto3.Frontend {
	t.Helper()
	pc, err := pgconn.Connect(ctxT(t), f.p.DSN(pgtest.SuperUser, "", pgtest.TestDB)+"&options=-c%20fence.token%3D5")
	if err != nil {
		t.Fatal(err)
	}
	hj, err := pc.Hijack()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hj.Conn.Close() })
	return hj.Frontend
}
