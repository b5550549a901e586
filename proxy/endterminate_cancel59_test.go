package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

// The termination the proxy sends at the router's change (terminateStopped) names a backend by its PID, which
// PostgreSQL gives to another backend once it ends: it ends the backend only while the PID is still the one its
// connection from the proxy's local port reached (terminateSQL), so that a backend that ended by itself before the
// question came (after the cancel, reading the end of its connection) never costs another session its own.
// From cancel59 (2026-12-06).
func TestTerminationSparesAnotherConnectionsBackend(t *testing.T) {
	srv := pgtest.MustStart(t, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	victim, err := pgx.Connect(ctx, srv.SuperDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close(context.Background())
	var pid int32
	if err := victim.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	port := localPort(victim.PgConn().Conn())
	if port == 0 {
		t.Fatal("the test's connection has no local TCP port")
	}
	r := &router{login: func(string) (*pgx.ConnConfig, error) { return pgx.ParseConfig(srv.SuperDSN()) }}

	// The PID's backend now serves a connection from another port: it is spared.
	ended, err := r.terminateBackend(ctx, srv.Addr(), uint32(pid), port+1)
	if err != nil || ended {
		t.Fatalf("terminating PID %d named with another connection's port: ended %v, err %v; want spared", pid, ended, err)
	}
	if _, err := victim.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("a backend the termination was not meant for was ended: %v", err)
	}

	// Named with its own port, it ends.
	ended, err = r.terminateBackend(ctx, srv.Addr(), uint32(pid), port)
	if err != nil || !ended {
		t.Fatalf("terminating PID %d from its own port: ended %v, err %v; want ended", pid, ended, err)
	}
	if _, err := victim.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("the backend terminated still answers")
	}
}
