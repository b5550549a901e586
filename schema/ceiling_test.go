package schema_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/schema"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// boundVerifier accepts tokens up to its bound and reports the bound as its high-water mark, as the lock
// services' verifiers do (a stand-in for the verifier's own edge: etcd is tested in tokens and in the corpus).
type boundVerifier struct{ bound int64 }

var errNotIssued = errors.New("not issued")

func (v *boundVerifier) Check(_ context.Context, token int64) error {
	if token > v.bound {
		return errNotIssued
	}
	return nil
}

func (v *boundVerifier) Stats() tokens.VerifierStats { return tokens.VerifierStats{HighWater: v.bound} }

// TestCeilingKeeper: the keeper writes the verifier's bound before it accepts a token, raises it when the bound
// grows, never lowers it, and takes a database without the schema for one without a guard.
func TestCeilingKeeper(t *testing.T) {
	db := newDB(t)
	su := superConn(t, db)
	ctx := t.Context()
	v := &boundVerifier{bound: 100}
	k := schema.NewCeilingKeeper(v, "etcd", func(ctx context.Context) (*pgx.Conn, error) {
		return pgx.Connect(ctx, pg.DSN(pgtest.SuperUser, "", db))
	})
	t.Cleanup(k.Close)
	// No schema yet: nothing to keep, no error.
	if err := k.Check(ctx, 50); err != nil {
		t.Fatalf("check without the schema: %v", err)
	}
	exec(t, su, "CREATE TABLE t (id int PRIMARY KEY, fence_token bigint)")
	install(t, su, guardConfig(table("t", "fence_token")))
	ceiling := func() int64 {
		return queryInt(t, su, "SELECT ceiling FROM fenceproxy.token_ceiling WHERE store = 'etcd'")
	}
	// The first accepted token after install writes the bound.
	if err := k.Check(ctx, 50); err != nil || ceiling() != 100 {
		t.Fatalf("check: %v, ceiling %d, want 100", err, ceiling())
	}
	if err := k.Check(ctx, 101); !errors.Is(err, errNotIssued) {
		t.Fatalf("check of a token above the bound: %v", err)
	}
	v.bound = 500
	if err := k.Check(ctx, 300); err != nil || ceiling() != 500 {
		t.Fatalf("after the bound grew: %v, ceiling %d, want 500", err, ceiling())
	}
	// Sync writes again (a reinstalled schema): never lower than what is there.
	exec(t, su, "UPDATE fenceproxy.token_ceiling SET ceiling = 900")
	v.bound = 600
	if err := k.Sync(ctx); err != nil || ceiling() != 900 {
		t.Fatalf("sync: %v, ceiling %d, want 900 (never lowered)", err, ceiling())
	}
	exec(t, su, "DELETE FROM fenceproxy.token_ceiling")
	if err := k.Sync(ctx); err != nil || ceiling() != 600 {
		t.Fatalf("sync after the row went: %v, ceiling %d, want 600", err, ceiling())
	}
	// A database that refuses the write refuses the token (fail closed).
	exec(t, su, "ALTER TABLE fenceproxy.token_ceiling ADD CONSTRAINT no_more CHECK (ceiling < 700)")
	v.bound = 800
	if err := k.Check(ctx, 650); !errors.Is(err, tokens.ErrUnavailable) {
		t.Fatalf("check when the ceiling cannot be written: %v, want ErrUnavailable", err)
	}
}
