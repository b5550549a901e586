package tokens

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// DefaultVerifyTimeout bounds one round trip of [RevisionVerifier.Check] to etcd.
const DefaultVerifyTimeout = 2 * time.Second

// ErrTokenNotIssued is matched (errors.Is) by the error [RevisionVerifier.Check] returns for a token etcd never
// issued. The proxy answers it with SQLSTATE 55F03.
var ErrTokenNotIssued = errors.New("fencing token was never issued by etcd")

// ErrUnavailable is matched (errors.Is) by the error a verifier's Check returns when it had to ask the lock
// service and could not (fail closed).
var ErrUnavailable = errors.New("lock service unavailable to verify fencing token")

// ErrEtcdUnavailable is ErrUnavailable for etcd: [RevisionVerifier.Check]'s errors match both.
var ErrEtcdUnavailable = fmt.Errorf("etcd unavailable to verify fencing token: %w", ErrUnavailable)

// TokenNotIssuedError says a token is larger than any token the lock service has issued so far.
type TokenNotIssuedError struct {
	Token    int64 // the token presented
	Revision int64 // the service's current revision (etcd) or zxid (ZooKeeper) when asked (0 if not asked)
	Offset   int64 // the configured token offset
	// Service names the lock service and its counter: "" is etcd and its revision.
	Service, Counter string
}

func (e *TokenNotIssuedError) Error() string {
	service, counter := e.Service, e.Counter
	if service == "" {
		service, counter = "etcd", "revision"
	}
	if e.Token < 1 {
		return fmt.Sprintf("fencing token %d was never issued by %s: tokens start at 1", e.Token, service)
	}
	return fmt.Sprintf("fencing token %d was never issued by %s: it exceeds %s's current %s %d plus token offset %d",
		e.Token, service, service, counter, e.Revision, e.Offset)
}

// Is makes errors.Is(err, ErrTokenNotIssued) true.
func (e *TokenNotIssuedError) Is(target error) bool { return target == ErrTokenNotIssued }

// VerifierConfig configures a [RevisionVerifier].
type VerifierConfig struct {
	// Endpoints of the etcd cluster that issues the tokens.
	Endpoints []string
	// TokenOffset is the offset writers add to revisions ([WithTokenOffset]); >= 0.
	TokenOffset int64
	// FailOpen accepts a token that needs checking when etcd cannot be reached. The default (false) refuses it.
	FailOpen bool
	// Timeout bounds each round trip to etcd; default [DefaultVerifyTimeout].
	Timeout time.Duration
	// ProbeKey is the key read (count only) to learn etcd's current revision; default [DefaultPrefix]. With
	// etcd authentication the user needs read access to it.
	ProbeKey string
	// TLS, Username and Password are passed to the etcd client as they are.
	TLS      *tls.Config
	Username string
	Password string
	// Logger for the etcd client; default none.
	Logger *zap.Logger
}

// RevisionVerifier refuses fencing tokens larger than any etcd could have issued, so that a client cannot
// present a forged huge token and lock every other writer out of the rows it touches.
//
// A token is acceptable if it is at most etcd's current revision plus the token offset. The highest such bound
// seen so far is kept, so a token at or below it is accepted without a round trip; only a token above it costs
// one linearizable read. RevisionVerifier is safe for concurrent use.
type RevisionVerifier struct {
	ceilingVerifier
	client   *clientv3.Client
	probeKey string
}

// ceilingVerifier is the rule every verifier applies, whatever the lock service: a token is acceptable if it
// is at most the service's current counter (etcd's revision, ZooKeeper's zxid) plus the token offset. The highest
// such bound seen so far is kept, so a token at or below it costs no round trip.
type ceilingVerifier struct {
	service, counter string // for errors: "etcd", "revision"
	current          func(ctx context.Context) (int64, error)
	offset           int64
	failOpen         bool
	timeout          time.Duration

	highWater       atomic.Int64 // highest counter+offset seen
	lookups         atomic.Uint64
	failOpenAccepts atomic.Uint64
}

// VerifierStats are counters for metrics.
type VerifierStats struct {
	Lookups         uint64 // round trips to etcd
	FailOpenAccepts uint64 // tokens accepted unverified because etcd was unreachable and FailOpen is set
	HighWater       int64  // highest revision plus offset seen
}

// NewRevisionVerifier creates a verifier with its own etcd client. It does not contact etcd: an unreachable
// etcd shows up in [RevisionVerifier.Check].
func NewRevisionVerifier(cfg VerifierConfig) (*RevisionVerifier, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("revision verifier: no etcd endpoints")
	}
	if cfg.TokenOffset < 0 {
		return nil, fmt.Errorf("revision verifier: token offset %d is negative", cfg.TokenOffset)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultVerifyTimeout
	}
	if cfg.ProbeKey == "" {
		cfg.ProbeKey = DefaultPrefix
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: cfg.Timeout,
		TLS:         cfg.TLS,
		Username:    cfg.Username,
		Password:    cfg.Password,
		Logger:      cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("revision verifier: etcd client: %w", err)
	}
	v := &RevisionVerifier{client: client, probeKey: cfg.ProbeKey}
	v.ceilingVerifier = ceilingVerifier{service: "etcd", counter: "revision", current: v.currentRevision,
		offset: cfg.TokenOffset, failOpen: cfg.FailOpen, timeout: cfg.Timeout}
	return v, nil
}

// Check returns nil if etcd could have issued token, that is if token <= etcd's current revision + offset.
// Otherwise it returns a *[TokenNotIssuedError] (errors.Is [ErrTokenNotIssued]); a token below 1 gets one
// too. If etcd must be asked and cannot answer within the timeout, Check returns an error matching
// [ErrEtcdUnavailable], or nil when FailOpen is set. If ctx ends first, Check returns ctx's error.
func (v *RevisionVerifier) Check(ctx context.Context, token int64) error { return v.check(ctx, token) }

func (v *ceilingVerifier) check(ctx context.Context, token int64) error {
	notIssued := func(current int64) error {
		e := &TokenNotIssuedError{Token: token, Revision: current, Offset: v.offset}
		if v.service != "etcd" {
			e.Service, e.Counter = v.service, v.counter
		}
		return e
	}
	if token < 1 {
		return notIssued(0)
	}
	if token <= v.highWater.Load() {
		return nil
	}
	v.lookups.Add(1)
	cctx, cancel := context.WithTimeout(ctx, v.timeout)
	cur, err := v.current(cctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("verify fencing token %d: %w", token, context.Cause(ctx))
		}
		if v.failOpen {
			v.failOpenAccepts.Add(1)
			return nil
		}
		if v.service == "etcd" {
			return fmt.Errorf("verify fencing token %d: %w: %w", token, ErrEtcdUnavailable, err)
		}
		return fmt.Errorf("verify fencing token %d: %w (%s unavailable): %w", token, ErrUnavailable, v.service, err)
	}
	limit := int64(math.MaxInt64)
	if cur <= math.MaxInt64-v.offset {
		limit = cur + v.offset
	}
	v.raise(limit)
	if token <= limit {
		return nil
	}
	return notIssued(cur)
}

// Stats returns the verifier's counters.
func (v *ceilingVerifier) Stats() VerifierStats {
	return VerifierStats{
		Lookups:         v.lookups.Load(),
		FailOpenAccepts: v.failOpenAccepts.Load(),
		HighWater:       v.highWater.Load(),
	}
}

// Close closes the verifier's etcd client.
func (v *RevisionVerifier) Close() error { return v.client.Close() }

// currentRevision asks etcd for its current revision with a linearizable read, so that it is at least the
// revision of every lock granted before the call (a serializable read from a lagging member might not be).
func (v *RevisionVerifier) currentRevision(ctx context.Context) (int64, error) {
	resp, err := v.client.Get(ctx, v.probeKey, clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

func (v *ceilingVerifier) raise(limit int64) {
	for {
		cur := v.highWater.Load()
		if limit <= cur || v.highWater.CompareAndSwap(cur, limit) {
			return
		}
	}
}
