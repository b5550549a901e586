package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/jackc/pgx/v5"
)

// A backend the proxy stops at the router's change (endFencedTx; cancelLent in transaction pooling) is sent a
// CancelRequest, which PostgreSQL ignores when it finds the backend waiting for a command: a statement the
// proxy flushed just before, still unread in the backend's socket when the cancel arrives (a backend not
// scheduled for a while, the cancel's own connection being faster than usual), is read after it and runs; a
// lone UPDATE waiting for a row lock then commits on the host the router no longer trusts once the lock is
// released, and in transaction pooling the client is told UPDATE 1
// (TestWriteUnreadWhenTheCancelComesOnAWithdrawnPrimary). Neither the connection's shutdown nor a reset stops
// it: the server's kernel hands the backend what was sent before the end, and a backend waiting for a lock
// does not look at its socket. A termination does: PostgreSQL acts on it also while the backend waits for a
// command, so the backend ends before it reads another one, and a statement it runs fails with its
// transaction. The router's own role asks for it (pg_terminate_backend): a superuser, or a member of
// pg_signal_backend for backends of roles other than superusers. The cancel still goes first: it needs no
// privilege and no login.

// terminateSQL ends backend $1 if it is still the one the proxy's connection from local port $2 reached: by the
// time the question arrives the backend may have ended and its PID been given to another. 0 (not a TCP
// connection), or a row the role may not see the port of, is judged by the PID alone.
const terminateSQL = `SELECT pg_catalog.pg_terminate_backend(a.pid) FROM pg_catalog.pg_stat_activity a
WHERE a.pid = $1::pg_catalog.int4 AND ($2::pg_catalog.int4 = 0 OR a.client_port IS NULL OR a.client_port = $2::pg_catalog.int4)`

// terminateStopped ends, on host, the backend pid that the proxy's connection from local port port reached
// (terminateSQL), over a connection of the router's own role, within the router's health_timeout, and reports
// whether PostgreSQL signalled it. Failures are logged: the cancel sent before is all that stops the backend
// then.
func (s *Server) terminateStopped(host string, pid uint32, port int) bool {
	r := s.router
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	ended, err := r.terminateBackend(ctx, host, pid, port)
	switch {
	case err != nil:
		s.log.Warn("could not terminate a backend stopped on a host the router no longer trusts; a statement it reads after the cancel may still run there", "host", host, "backend_pid", pid, "err", err)
	case !ended:
		s.log.Debug("a backend stopped on a host the router no longer trusts had ended already", "host", host, "backend_pid", pid)
	}
	return ended
}

// terminateBackend asks host, over a connection of the router's own role, to terminate backend pid if it is
// still the one reached from local port port (terminateSQL); it reports whether PostgreSQL signalled it.
func (r *router) terminateBackend(ctx context.Context, host string, pid uint32, port int) (bool, error) {
	cc, err := r.login(host)
	if err != nil {
		return false, err
	}
	conn, err := connectOwnRole(ctx, cc)
	if err != nil {
		return false, fmt.Errorf("connect to %s: %w", host, err)
	}
	defer conn.Close(context.Background())
	var ended bool
	err = conn.QueryRow(ctx, terminateSQL, int32(pid), int32(port)).Scan(&ended)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil // the backend has ended, and its PID is no other backend's of the proxy's connection
	}
	if err != nil {
		return false, fmt.Errorf("terminate backend %d on %s: %w", pid, host, err)
	}
	return ended, nil
}

// localPort is c's local TCP port, the client_port its backend shows in pg_stat_activity; 0 when c is no TCP
// connection.
func localPort(c net.Conn) int {
	if c == nil {
		return 0
	}
	if a, ok := c.LocalAddr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}
