package schema

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/tokens"
)

// raiseCeilingSQL raises (never lowers) a store's ceiling in fenceproxy.token_ceiling.
const raiseCeilingSQL = `INSERT INTO fenceproxy.token_ceiling AS tc (store, ceiling) VALUES ($1, $2)
ON CONFLICT (store) DO UPDATE SET ceiling = excluded.ceiling WHERE tc.ceiling OPERATOR(pg_catalog.<) excluded.ceiling`

// RaiseCeiling sets store's ceiling to at least ceiling. The role needs INSERT and UPDATE on
// fenceproxy.token_ceiling (the owner has them; applications must not).
func RaiseCeiling(ctx context.Context, conn *pgx.Conn, store string, ceiling int64) error {
	if _, err := conn.Exec(ctx, raiseCeilingSQL, store, ceiling); err != nil {
		return fmt.Errorf("raise the token ceiling of %s to %d: %w", store, ceiling, err)
	}
	return nil
}

// TokenVerifier is the proxy's verifier (proxy.TokenVerifier): it accepts a token a lock service could have
// issued.
type TokenVerifier interface {
	Check(ctx context.Context, token int64) error
}

// CeilingKeeper is a TokenVerifier that keeps fenceproxy.token_ceiling at or above every token its verifier
// accepts, before it says yes: a session's verified token is never above the ceiling when its writes reach the
// guard, and a token nobody verified (set by a user function, a role default, a session around the proxy) is
// refused by the guard once it is above what the lock service had issued (docs/verification.md).
//
// It writes the verifier's high-water mark (the highest counter plus offset the lock service has shown), not
// only the token asked about, so that later tokens up to it cost no database round trip either: only a token
// above the last value written does. A database that has no fenceproxy schema (no guard, nothing to enforce)
// is not an error; a write that fails otherwise refuses the token (fail closed).
type CeilingKeeper struct {
	verifier TokenVerifier
	store    string
	connect  func(ctx context.Context) (*pgx.Conn, error)

	written atomic.Int64 // the highest ceiling known to be in the table

	mu   sync.Mutex
	conn *pgx.Conn
}

// NewCeilingKeeper wraps v; store names the lock service (the table's key: "etcd", "zookeeper"); connect opens
// the proxy's own connection, as a role that may write the table.
func NewCeilingKeeper(v TokenVerifier, store string, connect func(ctx context.Context) (*pgx.Conn, error)) *CeilingKeeper {
	return &CeilingKeeper{verifier: v, store: store, connect: connect}
}

// highWater is what a verifier reports as the highest token it would accept without asking again.
type highWater interface{ Stats() tokens.VerifierStats }

// Check implements TokenVerifier: the verifier's answer, and the ceiling raised before a yes.
func (k *CeilingKeeper) Check(ctx context.Context, token int64) error {
	if err := k.verifier.Check(ctx, token); err != nil {
		return err
	}
	if token <= k.written.Load() {
		return nil
	}
	if err := k.raise(ctx, token); err != nil {
		return fmt.Errorf("%w: %w", tokens.ErrUnavailable, err)
	}
	return nil
}

// Sync writes the ceiling now, whatever was written before (at start, and after the schema may have been
// reinstalled): the verifier's current bound, asking the lock service for it if it has none yet.
func (k *CeilingKeeper) Sync(ctx context.Context) error {
	if err := k.verifier.Check(ctx, 1); err != nil {
		return fmt.Errorf("token ceiling: ask the lock service: %w", err)
	}
	k.written.Store(0)
	return k.raise(ctx, 1)
}

// raise writes max(token, the verifier's high-water mark).
func (k *CeilingKeeper) raise(ctx context.Context, token int64) error {
	ceiling := token
	if hw, ok := k.verifier.(highWater); ok {
		ceiling = max(ceiling, hw.Stats().HighWater)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if ceiling <= k.written.Load() {
		return nil
	}
	if k.conn == nil || k.conn.IsClosed() {
		c, err := k.connect(ctx)
		if err != nil {
			return fmt.Errorf("token ceiling: connect: %w", err)
		}
		k.conn = c
	}
	err := RaiseCeiling(ctx, k.conn, k.store, ceiling)
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000"):
		// No fenceproxy schema (or one before the ceiling): no guard reads a ceiling there. Not remembered, so
		// the ceiling is written once install has run.
		return nil
	case err != nil:
		if pe == nil {
			k.conn.Close(context.Background())
			k.conn = nil
		}
		return err
	}
	k.written.Store(ceiling)
	return nil
}

// Close closes the keeper's connection.
func (k *CeilingKeeper) Close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.conn != nil {
		k.conn.Close(context.Background())
		k.conn = nil
	}
}
