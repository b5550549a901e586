package tokens

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The PostgreSQL lock store keeps leases in a table of the `fenceproxy` schema and takes every token from one
// sequence. Everything it relies on is judged by the server: a lease's expiry is a server timestamp
// (clock_timestamp()), compared with the server's clock in the very statement that takes or renews the lease;
// the client's clock only decides when the holder stops trusting its lease, always earlier than the server
// could let it expire.
//
// Statements, each one atomic:
//
//   - acquire: INSERT ... ON CONFLICT (name) DO UPDATE ... WHERE the lease is free or has expired by the
//     server's clock, with the token nextval(fenceproxy.lock_token_seq) + offset taken after the row is locked
//     and the condition re-checked (the SET list of ON CONFLICT DO UPDATE is evaluated only then);
//   - renew: UPDATE ... SET expires_at = clock_timestamp() + ttl WHERE name = $1 AND owner = $2 AND expires_at >
//     clock_timestamp(): a lease that expired is never revived, even if nobody took it;
//   - release: UPDATE ... SET owner = NULL WHERE name = $1 AND owner = $2, with pg_notify to wake waiters; a
//     release whose owner no longer matches changes nothing but the non_owner_releases counter.
//
// Tokens strictly increase across holders and server restarts: a holder's token is a sequence value taken while
// it holds the row lock of a lease that every earlier holder's token was written to, the sequence never cycles
// and is not cached per session (CACHE 1: with a cache, sessions hand out values out of order), and every
// statement runs with synchronous_commit on, so an acquisition the client saw commit survives a crash together
// with the sequence's advance. What can make tokens smaller: restoring the database from a backup older than
// the newest token issued (or failing over to a replica that had not received it). The sequence then restarts
// below tokens already written to fenced rows, and new holders are refused (55F01) until their tokens catch
// up: fail safe, but stuck. The cure is an offset larger than the highest token ever issued, given to every
// writer's lock (`fenceproxy lock --token-offset`, [AcquireOptions.TokenOffset], `token.offset` in the proxy's
// configuration), or advancing the sequence past it with setval.

// PGStoreSchemaSQL is the DDL of the PostgreSQL lock store: ordered statements, each idempotent, for
// `fenceproxy install` to run as one migration step (in one transaction). [NewPGStore] runs them itself when
// the lease table is missing.
var PGStoreSchemaSQL = []string{
	`CREATE SCHEMA IF NOT EXISTS fenceproxy`,
	// One sequence for every lock, so tokens are comparable across locks. CACHE 1 keeps values in the order
	// they are handed out across sessions; NO CYCLE keeps them from wrapping.
	`CREATE SEQUENCE IF NOT EXISTS fenceproxy.lock_token_seq AS bigint MINVALUE 1 NO CYCLE CACHE 1`,
	`ALTER SEQUENCE fenceproxy.lock_token_seq NO CYCLE CACHE 1`,
	// One row per lock name, kept after release (owner NULL) so that the lock's counters live with it.
	`CREATE TABLE IF NOT EXISTS fenceproxy.lock_leases (
	name text PRIMARY KEY,
	owner text,                                   -- the holder's random identity; NULL when free
	holder text NOT NULL DEFAULT '',              -- who holds it, for people: host and pid
	token bigint NOT NULL DEFAULT 0,              -- the holder's fencing token
	acquired_at timestamptz,                      -- server time of the acquisition
	expires_at timestamptz,                       -- server time the lease ends unless renewed; NULL when free
	acquisitions bigint NOT NULL DEFAULT 0,
	releases bigint NOT NULL DEFAULT 0,           -- released by the owner before expiry
	expirations bigint NOT NULL DEFAULT 0,        -- leases that ended without a timely release
	non_owner_releases bigint NOT NULL DEFAULT 0, -- releases refused: the lease was no longer the caller's
	renewal_failures bigint NOT NULL DEFAULT 0,   -- renewals that failed (reported by holders when they can)
	acquire_timeouts bigint NOT NULL DEFAULT 0,   -- waiters that gave up at their deadline
	acquire_wait_seconds double precision NOT NULL DEFAULT 0 -- total time acquirers waited
)`,
	// Waiters announce themselves with a short lease of their own, refreshed while they wait.
	`CREATE TABLE IF NOT EXISTS fenceproxy.lock_waiters (
	name text NOT NULL,
	waiter text NOT NULL,
	holder text NOT NULL DEFAULT '',
	since timestamptz NOT NULL DEFAULT clock_timestamp(),
	expires_at timestamptz NOT NULL,
	PRIMARY KEY (name, waiter)
)`,
}

// PGNotifyChannel is the LISTEN/NOTIFY channel on which a release announces the lock's name.
const PGNotifyChannel = "fenceproxy_locks"

const (
	pgAcquireSQL = `INSERT INTO fenceproxy.lock_leases AS l
	(name, owner, holder, token, acquired_at, expires_at, acquisitions, acquire_wait_seconds)
VALUES ($1::text, $2::text, $3::text, nextval('fenceproxy.lock_token_seq') + $4::bigint, clock_timestamp(),
	clock_timestamp() + $5::bigint * interval '1 microsecond', 1, $6::float8)
ON CONFLICT (name) DO UPDATE SET
	owner = excluded.owner,
	holder = excluded.holder,
	token = nextval('fenceproxy.lock_token_seq') + $4::bigint,
	acquired_at = clock_timestamp(),
	expires_at = clock_timestamp() + $5::bigint * interval '1 microsecond',
	acquisitions = l.acquisitions + 1,
	acquire_wait_seconds = l.acquire_wait_seconds + $6::float8,
	expirations = l.expirations + CASE WHEN l.owner IS NULL THEN 0 ELSE 1 END
WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
RETURNING token`

	// pgWaitSQL announces a waiter (and forgets waiters of this lock that stopped announcing themselves) and
	// returns how long the holder's lease runs by the server's clock.
	pgWaitSQL = `WITH gc AS (
	DELETE FROM fenceproxy.lock_waiters WHERE name = $1::text AND waiter <> $2::text AND expires_at < clock_timestamp()
), w AS (
	INSERT INTO fenceproxy.lock_waiters (name, waiter, holder, expires_at)
	VALUES ($1::text, $2::text, $3::text, clock_timestamp() + $4::bigint * interval '1 microsecond')
	ON CONFLICT (name, waiter) DO UPDATE SET expires_at = excluded.expires_at
)
SELECT coalesce((SELECT extract(epoch FROM expires_at - clock_timestamp())::float8
	FROM fenceproxy.lock_leases WHERE name = $1::text AND owner IS NOT NULL), 0)`

	pgUnwaitSQL = `DELETE FROM fenceproxy.lock_waiters WHERE name = $1::text AND waiter = $2::text`

	pgTimeoutSQL = `WITH w AS (
	DELETE FROM fenceproxy.lock_waiters WHERE name = $1::text AND waiter = $2::text
)
UPDATE fenceproxy.lock_leases SET acquire_timeouts = acquire_timeouts + 1 WHERE name = $1::text`

	pgRenewSQL = `UPDATE fenceproxy.lock_leases
SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond', renewal_failures = renewal_failures + $4::bigint
WHERE name = $1::text AND owner = $2::text AND expires_at > clock_timestamp()`

	// pgReleaseSQL frees the lease if it is still the caller's (counting a release, or an expiration when the
	// lease had run out first) and wakes the waiters; otherwise it counts a non-owner release and changes
	// nothing else. The two updates exclude each other: owner = $2 or not.
	pgReleaseSQL = `WITH rel AS (
	UPDATE fenceproxy.lock_leases l SET owner = NULL, holder = '', expires_at = NULL,
		releases = l.releases + CASE WHEN l.expires_at > clock_timestamp() THEN 1 ELSE 0 END,
		expirations = l.expirations + CASE WHEN l.expires_at > clock_timestamp() THEN 0 ELSE 1 END,
		renewal_failures = l.renewal_failures + $3::bigint
	FROM fenceproxy.lock_leases o
	WHERE o.name = l.name AND l.name = $1::text AND l.owner = $2::text
	RETURNING o.expires_at > clock_timestamp() AS in_time, pg_notify('` + PGNotifyChannel + `', $1::text) AS notified
), other AS (
	UPDATE fenceproxy.lock_leases SET non_owner_releases = non_owner_releases + 1,
		renewal_failures = renewal_failures + $3::bigint
	WHERE name = $1::text AND owner IS DISTINCT FROM $2::text
	RETURNING 1
)
SELECT (SELECT in_time FROM rel), (SELECT count(*) FROM other)`

	pgListSQL = `SELECT l.name, l.owner IS NOT NULL, l.holder, l.token,
	coalesce(extract(epoch FROM l.expires_at - clock_timestamp())::float8, 0),
	coalesce(extract(epoch FROM clock_timestamp() - l.acquired_at)::float8, 0),
	(SELECT count(*) FROM fenceproxy.lock_waiters w WHERE w.name = l.name AND w.expires_at > clock_timestamp()),
	l.acquisitions, l.releases, l.expirations, l.non_owner_releases, l.renewal_failures, l.acquire_timeouts,
	l.acquire_wait_seconds
FROM fenceproxy.lock_leases l ORDER BY l.name`
)

// PGStoreOptions configure a [PGStore].
type PGStoreOptions struct {
	// Logger receives one line per renewal failure and per lost lease; nil discards them.
	Logger *slog.Logger
	// ConnectTimeout bounds each connection attempt; 0 means 5s.
	ConnectTimeout time.Duration
	// PollMin and PollMax bound the waiters' polling interval, which doubles from PollMin to PollMax (with
	// jitter) while a lock stays held; a release wakes waiters at once through LISTEN/NOTIFY. Defaults 50ms
	// and 1s.
	PollMin, PollMax time.Duration
	// Holder describes the acquirer in the lease table and in `fenceproxy locks`; "" means host:pid.
	Holder string
	// ReadOnly makes NewPGStore neither connect nor create the schema: for an observer that only lists, with
	// a role that may not create anything, and that must start while the database is down.
	ReadOnly bool
}

// PGStore is the PostgreSQL lock store: leases in fenceproxy.lock_leases, tokens from
// fenceproxy.lock_token_seq. Each held lock uses a connection of its own, to keep the lease alive.
// The DSN may point at PostgreSQL directly or through fenceproxy (the lock's tables are not protected tables);
// not through a transaction pooler, whose clients cannot LISTEN (waiters then only poll).
type PGStore struct {
	config *pgx.ConnConfig
	opts   PGStoreOptions
	log    *slog.Logger
}

var _ Store = (*PGStore)(nil)

// NewPGStore connects to the database at dsn (within ctx), creates the store's schema if it is missing
// ([PGStoreSchemaSQL]), and returns the store.
func NewPGStore(ctx context.Context, dsn string, o PGStoreOptions) (*PGStore, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres lock store: %w", err)
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 5 * time.Second
	}
	if o.PollMin <= 0 {
		o.PollMin = 50 * time.Millisecond
	}
	if o.PollMax < o.PollMin {
		o.PollMax = max(time.Second, o.PollMin)
	}
	if o.Holder == "" {
		host, _ := os.Hostname()
		o.Holder = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	cfg.ConnectTimeout = o.ConnectTimeout
	// An acquisition the client saw commit must survive a crash with the sequence's advance, whatever the
	// database's default: otherwise a token could be handed out twice.
	cfg.RuntimeParams["synchronous_commit"] = "on"
	// The statements are written for READ COMMITTED (ON CONFLICT and UPDATE re-check the newest row version);
	// a database whose default is SERIALIZABLE would turn contention into serialization failures.
	cfg.RuntimeParams["default_transaction_isolation"] = "read committed"
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "fenceproxy lock"
	}
	s := &PGStore{config: cfg, opts: o, log: o.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if o.ReadOnly {
		return s, nil
	}
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	if err := ensurePGSchema(ctx, conn); err != nil {
		return nil, err
	}
	return s, nil
}

// ensurePGSchema creates the store's schema when the lease table is missing, under an advisory lock so that
// concurrent first users do not trip over each other's CREATE.
func ensurePGSchema(ctx context.Context, conn *pgx.Conn) error {
	var present bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('fenceproxy.lock_leases') IS NOT NULL AND to_regclass('fenceproxy.lock_waiters') IS NOT NULL`).Scan(&present); err != nil {
		return fmt.Errorf("postgres lock store: look for the lease table: %w", err)
	}
	if present {
		return nil
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('fenceproxy lock store schema'))`); err != nil {
			return err
		}
		for _, stmt := range PGStoreSchemaSQL {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("%s: %w", firstLine(stmt), err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("postgres lock store: create schema fenceproxy (run `fenceproxy install`, or grant CREATE): %w", err)
	}
	return nil
}

func firstLine(s string) string {
	for i, r := range s {
		if r == '\n' {
			return s[:i]
		}
	}
	return s
}

// Kind is "postgres".
func (s *PGStore) Kind() string { return "postgres" }

// Close does nothing: every held lock has its own connection, closed when it is released or lost.
func (s *PGStore) Close() error { return nil }

func (s *PGStore) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, s.config)
	if err != nil {
		return nil, fmt.Errorf("postgres lock store: connect to %s:%d: %w", s.config.Host, s.config.Port, err)
	}
	return conn, nil
}

// newOwner is a fresh identity for one acquisition (of any store that needs one): 128 random bits.
func newOwner() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Acquire takes the lock name. Waiting costs no busy polling: the waiter LISTENs for releases and otherwise
// polls (to notice expiries) at intervals that double from PollMin to PollMax, with jitter, never later than
// the holder's lease ends by the server's clock. Connection errors while waiting are retried until ctx ends.
// If ctx ends first, the error wraps ctx's cause; with o.Try, an error wrapping [ErrLocked] when the lock is
// held.
func (s *PGStore) Acquire(ctx context.Context, name string, o AcquireOptions) (Held, error) {
	if name == "" {
		return nil, errors.New("lock name is empty")
	}
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	if o.TTL < 10*time.Millisecond {
		return nil, fmt.Errorf("lock %q: TTL %v is too short", name, o.TTL)
	}
	if o.TokenOffset < 0 {
		return nil, fmt.Errorf("lock %q: token offset %d is negative", name, o.TokenOffset)
	}
	owner := newOwner()
	start := time.Now()
	ttlMicros := o.TTL.Microseconds()
	waiterTTL := (3*s.opts.PollMax + 2*time.Second).Microseconds()

	var conn *pgx.Conn
	closeConn := func() {
		if conn != nil {
			conn.Close(context.Background())
			conn = nil
		}
	}
	waiting := false // a waiter row was written
	giveUp := func(err error) (Held, error) {
		if waiting {
			s.forgetWaiter(name, owner, errors.Is(context.Cause(ctx), context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded))
		}
		closeConn()
		return nil, err
	}
	backoff := s.opts.PollMin
	var lastErr error
	for {
		if ctx.Err() != nil {
			if lastErr != nil {
				return giveUp(fmt.Errorf("lock %q: %w (last error: %v)", name, context.Cause(ctx), lastErr))
			}
			return giveUp(fmt.Errorf("lock %q: %w", name, context.Cause(ctx)))
		}
		if conn == nil {
			c, err := s.connect(ctx)
			if err != nil {
				if o.Try {
					return giveUp(fmt.Errorf("lock %q: %w", name, err))
				}
				lastErr = err
				s.sleep(ctx, &backoff)
				continue
			}
			conn = c
			if !o.Try {
				// LISTEN before trying, so that a release between a failed try and the wait still wakes us.
				if _, err := conn.Exec(ctx, "LISTEN "+PGNotifyChannel); err != nil {
					lastErr = fmt.Errorf("listen: %w", err)
					closeConn()
					s.sleep(ctx, &backoff)
					continue
				}
			}
		}
		sent := time.Now()
		var token int64
		err := conn.QueryRow(ctx, pgAcquireSQL, name, owner, s.opts.Holder, o.TokenOffset, ttlMicros, time.Since(start).Seconds()).Scan(&token)
		switch {
		case err == nil:
			if waiting {
				if _, err := conn.Exec(ctx, pgUnwaitSQL, name, owner); err != nil {
					s.log.Debug("lock acquired; could not withdraw the waiter row (it expires by itself)", "lock", name, "err", err)
				}
			}
			if !o.Try {
				conn.Exec(ctx, "UNLISTEN *")
			}
			h := newPGHeld(s, conn, name, owner, token, o.TTL, sent)
			s.log.Debug("lock acquired", "store", s.Kind(), "lock", name, "token", token, "waited", time.Since(start))
			return h, nil
		case errors.Is(err, pgx.ErrNoRows):
			if o.Try {
				return giveUp(fmt.Errorf("lock %q: %w", name, ErrLocked))
			}
		default:
			if ctx.Err() != nil {
				// The statement was interrupted because ctx ended: report why ctx ended (the caller's cause).
				return giveUp(fmt.Errorf("lock %q: %w (%v)", name, context.Cause(ctx), err))
			}
			if o.Try {
				return giveUp(fmt.Errorf("lock %q: %w", name, err))
			}
			lastErr = err
			closeConn()
			s.sleep(ctx, &backoff)
			continue
		}
		// Held by another: announce ourselves, learn when the holder's lease ends, and wait for a release.
		var left float64
		waiting = true // from now on the row may exist, even if the answer is lost
		if err := conn.QueryRow(ctx, pgWaitSQL, name, owner, s.opts.Holder, waiterTTL).Scan(&left); err != nil {
			lastErr = err
			closeConn()
			s.sleep(ctx, &backoff)
			continue
		}
		lastErr = nil
		delay := jitter(backoff)
		if until := time.Duration(left*float64(time.Second)) + 5*time.Millisecond; until < delay {
			delay = max(until, 0)
		}
		backoff = min(2*backoff, s.opts.PollMax)
		if s.waitRelease(ctx, conn, name, delay) {
			backoff = s.opts.PollMin
		}
	}
}

// jitter spreads d over [d/2, d) so that waiters do not poll in step.
func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(mrand.Int64N(int64(d/2)+1))
}

// sleep waits a backoff interval for a retry after an error, or until ctx ends, and doubles the backoff.
func (s *PGStore) sleep(ctx context.Context, backoff *time.Duration) {
	t := time.NewTimer(jitter(*backoff))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	*backoff = min(2**backoff, s.opts.PollMax)
}

// waitRelease waits up to d for a release of lock name to be announced; it reports whether one was.
func (s *PGStore) waitRelease(ctx context.Context, conn *pgx.Conn, name string, d time.Duration) bool {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			return false
		}
		if n.Payload == name {
			return true
		}
	}
}

// forgetWaiter removes a waiter that gives up, counting a timeout when its deadline passed. Best effort.
func (s *PGStore) forgetWaiter(name, owner string, timedOut bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := s.connect(ctx)
	if err != nil {
		return
	}
	defer conn.Close(context.Background())
	if timedOut {
		conn.Exec(ctx, pgTimeoutSQL, name, owner)
	} else {
		conn.Exec(ctx, pgUnwaitSQL, name, owner)
	}
}

// List describes the locks that are held, or were held and expired without release, or are waited for.
// LeaseLeft is judged by the server's clock (0 for an expired lease nobody took over yet).
func (s *PGStore) List(ctx context.Context) ([]LockInfo, error) {
	locks, err := s.list(ctx, false)
	return locks, err
}

// ListAll is List including free locks, with every lock's counters: what the metrics observer reads.
func (s *PGStore) ListAll(ctx context.Context) ([]LockInfo, error) { return s.list(ctx, true) }

func (s *PGStore) list(ctx context.Context, all bool) ([]LockInfo, error) {
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, pgListSQL)
	if err != nil {
		return nil, listError(err)
	}
	var out []LockInfo
	for rows.Next() {
		var li LockInfo
		var held bool
		var left, heldFor float64
		var waiters int64
		c := &LockCounters{}
		if err := rows.Scan(&li.Name, &held, &li.Holder, &li.Token, &left, &heldFor, &waiters,
			&c.Acquisitions, &c.Releases, &c.Expirations, &c.NonOwnerReleases, &c.RenewalFailures, &c.AcquireTimeouts,
			&c.AcquireWaitSeconds); err != nil {
			return nil, fmt.Errorf("postgres lock store: list: %w", err)
		}
		li.Waiters = int(waiters)
		li.Counters = c
		if held {
			li.LeaseLeft = max(time.Duration(left*float64(time.Second)), 0)
			li.HeldFor = time.Duration(heldFor * float64(time.Second))
		} else {
			li.Holder, li.Token = "", 0
		}
		if all || held || li.Waiters > 0 {
			out = append(out, li)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, listError(err)
	}
	return out, nil
}

// listError says why listing failed; a database without the lock tables (42P01) is the usual first stumble of
// a read-only observer, which does not create them.
func listError(err error) error {
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "42P01" {
		return fmt.Errorf("postgres lock store: list: no lock tables in this database yet (fenceproxy install, or the first fenceproxy lock --pg, creates them): %w", err)
	}
	return fmt.Errorf("postgres lock store: list: %w", err)
}

// pgHeld is a lease held in the PostgreSQL store, kept alive by a leaseKeeper.
type pgHeld struct {
	store *PGStore
	name  string
	owner string
	token int64
	ttl   time.Duration
	lease *leaseKeeper

	mu       sync.Mutex // guards conn, failures and the statements on conn
	conn     *pgx.Conn
	failures int64 // renewal failures not yet recorded in the lease table

	releaseOnce sync.Once
	releaseErr  error
}

func newPGHeld(s *PGStore, conn *pgx.Conn, name, owner string, token int64, ttl time.Duration, sent time.Time) *pgHeld {
	h := &pgHeld{store: s, name: name, owner: owner, token: token, ttl: ttl, conn: conn}
	h.lease = newLeaseKeeper(fmt.Sprintf("lock %q", name), ttl, sent, h.renew, leaseEvents{
		renewalFailed: func(err error) {
			s.log.Warn("lock renewal failed", "store", s.Kind(), "lock", name, "token", token, "err", err)
		},
		lost: func(err error) {
			s.log.Warn("lock lease lost", "store", s.Kind(), "lock", name, "token", token, "err", err)
		},
	})
	return h
}

// renew extends the lease by the TTL from the server's now. ok is false when the lease is no longer this
// holder's or had expired; err is set when the database could not be asked (a failure the lease table counts
// at the next renewal or release that reaches it).
func (h *pgHeld) renew(ctx context.Context) (ok bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lease.Err() != nil {
		return false, nil
	}
	// A renewal cut short by a release (which cancels ctx) is not a failure of the lease's renewal.
	failed := func() {
		if !errors.Is(h.lease.Err(), ErrReleased) {
			h.failures++
		}
	}
	if h.conn == nil {
		c, err := h.store.connect(ctx)
		if err != nil {
			failed()
			return false, err
		}
		h.conn = c
	}
	tag, err := h.conn.Exec(ctx, pgRenewSQL, h.name, h.owner, h.ttl.Microseconds(), h.failures)
	if err != nil {
		failed()
		h.conn.Close(context.Background())
		h.conn = nil
		return false, fmt.Errorf("renew lease: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return false, nil
	}
	h.failures = 0
	return true, nil
}

// Name is the lock's name.
func (h *pgHeld) Name() string { return h.name }

// Token is the sequence value taken at acquisition, plus the token offset.
func (h *pgHeld) Token() int64 { return h.token }

// Lost is closed when the lease was found expired or taken over, could not be renewed before its local
// deadline (a fraction of the TTL after the last renewal was sent), or was released.
func (h *pgHeld) Lost() <-chan struct{} { return h.lease.lost.Done() }

// Err is nil while the lock is held; then an error wrapping [ErrLeaseLost] or [ErrReleased].
func (h *pgHeld) Err() error { return h.lease.Err() }

// Release frees the lease if it is still this holder's and wakes the waiters. A lease that was already lost
// and taken over is not touched; that attempt is counted in the lease table (non_owner_releases) and
// reported as an error wrapping [ErrLeaseLost]. Idempotent.
func (h *pgHeld) Release(ctx context.Context) error {
	h.releaseOnce.Do(func() {
		wasLost := h.Err()
		h.lease.close(ErrReleased)
		h.mu.Lock()
		defer h.mu.Unlock()
		conn := h.conn
		h.conn = nil
		if conn == nil {
			c, err := h.store.connect(ctx)
			if err != nil {
				h.releaseErr = fmt.Errorf("lock %q: release: %w (the lease expires by itself within its TTL)", h.name, err)
				return
			}
			conn = c
		}
		defer conn.Close(context.Background())
		var inTime *bool
		var others int64
		if err := conn.QueryRow(ctx, pgReleaseSQL, h.name, h.owner, h.failures).Scan(&inTime, &others); err != nil {
			h.releaseErr = fmt.Errorf("lock %q: release: %w (the lease expires by itself within its TTL)", h.name, err)
			return
		}
		switch {
		case inTime == nil && others > 0:
			h.releaseErr = fmt.Errorf("lock %q: release refused: %w (the lease is no longer ours: it expired and was taken over, or was released)", h.name, ErrLeaseLost)
		case inTime == nil:
			h.releaseErr = fmt.Errorf("lock %q: release: %w (no lease row)", h.name, ErrLeaseLost)
		case !*inTime && wasLost == nil:
			h.releaseErr = fmt.Errorf("lock %q: release: %w (the lease had expired before the release)", h.name, ErrLeaseLost)
		}
	})
	return h.releaseErr
}
