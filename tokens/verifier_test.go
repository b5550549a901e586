package tokens_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/tokens"
)

func newVerifier(t *testing.T, e *etcdtest.Etcd, offset int64, failOpen bool) *tokens.RevisionVerifier {
	t.Helper()
	v, err := tokens.NewRevisionVerifier(tokens.VerifierConfig{
		Endpoints:   e.Endpoints(),
		TokenOffset: offset,
		FailOpen:    failOpen,
		Timeout:     500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v
}

// currentRevision writes a key so the revision is past the lock tests' noise, and returns it.
func currentRevision(t *testing.T, e *etcdtest.Etcd) int64 {
	t.Helper()
	resp, err := e.Client().Put(context.Background(), "verifier-test", "x")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func TestVerifierAcceptsIssuedTokensOnly(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	rev := currentRevision(t, e)
	v := newVerifier(t, e, 0, false)
	ctx := context.Background()

	if err := v.Check(ctx, rev+1); !errors.Is(err, tokens.ErrTokenNotIssued) {
		t.Fatalf("Check(rev+1) = %v, want ErrTokenNotIssued", err)
	}
	var notIssued *tokens.TokenNotIssuedError
	if err := v.Check(ctx, rev+1000); !errors.As(err, &notIssued) || notIssued.Token != rev+1000 || notIssued.Revision < rev {
		t.Fatalf("Check(rev+1000) = %#v", err)
	}
	if err := v.Check(ctx, rev); err != nil {
		t.Fatalf("Check(rev) = %v", err)
	}
	for _, bad := range []int64{0, -1, -9223372036854775808} {
		if err := v.Check(ctx, bad); !errors.Is(err, tokens.ErrTokenNotIssued) {
			t.Fatalf("Check(%d) = %v, want ErrTokenNotIssued", bad, err)
		}
	}

	// A token granted after the verifier last asked is above its high-water mark: one round trip, accepted.
	before := v.Stats().Lookups
	l := mustAcquire(t, e.Client(), lockName(t))
	if l.Token() <= rev {
		t.Fatalf("lock token %d not above %d", l.Token(), rev)
	}
	if err := v.Check(ctx, l.Token()); err != nil {
		t.Fatalf("Check(fresh lock token %d) = %v", l.Token(), err)
	}
	if got := v.Stats().Lookups; got != before+1 {
		t.Fatalf("%d lookups for a fresh token, want 1", got-before)
	}

	// Concurrent checks of issued tokens: all accepted, none asks etcd again.
	before = v.Stats().Lookups
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			if err := v.Check(ctx, 1+int64(i)%l.Token()); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent Check: %v", err)
	}
	if got := v.Stats().Lookups; got != before {
		t.Fatalf("%d lookups for tokens under the high-water mark, want 0", got-before)
	}
}

func TestVerifierOffset(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	rev := currentRevision(t, e)
	const offset = 5_000_000
	v := newVerifier(t, e, offset, false)
	ctx := context.Background()
	if err := v.Check(ctx, rev+offset+1); !errors.Is(err, tokens.ErrTokenNotIssued) {
		t.Fatalf("Check(rev+offset+1) = %v, want ErrTokenNotIssued", err)
	}
	if err := v.Check(ctx, rev+offset); err != nil {
		t.Fatalf("Check(rev+offset) = %v", err)
	}
	// A lock with the same offset gets a token the verifier accepts.
	l := mustAcquire(t, e.Client(), lockName(t), tokens.WithTokenOffset(offset))
	if err := v.Check(ctx, l.Token()); err != nil {
		t.Fatalf("Check(lock token %d) = %v", l.Token(), err)
	}
	if _, err := tokens.NewRevisionVerifier(tokens.VerifierConfig{Endpoints: e.Endpoints(), TokenOffset: -1}); err == nil {
		t.Fatal("negative offset accepted")
	}
	if _, err := tokens.NewRevisionVerifier(tokens.VerifierConfig{}); err == nil {
		t.Fatal("no endpoints accepted")
	}
}

// TestVerifierWithoutEtcd: below the high-water mark no round trip is needed, so etcd being down doesn't
// matter; above it, the verifier fails closed, or open with the switch.
func TestVerifierWithoutEtcd(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t)
	rev := currentRevision(t, e)
	closed := newVerifier(t, e, 0, false)
	open := newVerifier(t, e, 0, true)
	ctx := context.Background()
	for _, v := range []*tokens.RevisionVerifier{closed, open} {
		if err := v.Check(ctx, rev); err != nil {
			t.Fatalf("Check(rev) = %v", err)
		}
	}
	lookups := closed.Stats().Lookups

	e.Stop()
	for _, tok := range []int64{rev, rev - 1, 1} {
		if err := closed.Check(ctx, tok); err != nil {
			t.Fatalf("etcd down: Check(%d) under the high-water mark = %v", tok, err)
		}
	}
	if got := closed.Stats().Lookups; got != lookups {
		t.Fatalf("%d lookups under the high-water mark", got-lookups)
	}

	err := closed.Check(ctx, rev+1)
	if !errors.Is(err, tokens.ErrEtcdUnavailable) || errors.Is(err, tokens.ErrTokenNotIssued) {
		t.Fatalf("etcd down, fail closed: Check(rev+1) = %v, want ErrEtcdUnavailable", err)
	}
	if err := open.Check(ctx, rev+1); err != nil {
		t.Fatalf("etcd down, fail open: Check(rev+1) = %v", err)
	}
	if got := open.Stats().FailOpenAccepts; got != 1 {
		t.Fatalf("FailOpenAccepts = %d, want 1", got)
	}
	// A cancelled caller is not an etcd outage, even when failing open.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := open.Check(cctx, rev+1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Check = %v", err)
	}

	// etcd back: the same token is judged on its merits again.
	if err := e.StartAgain(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err = closed.Check(ctx, rev+1_000_000)
		if errors.Is(err, tokens.ErrTokenNotIssued) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd back: Check(rev+1000000) = %v, want ErrTokenNotIssued", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
