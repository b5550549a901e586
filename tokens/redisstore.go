package tokens

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisStore keeps locks in one Redis server (the primary): SET NX PX with a fresh random owner value per
// acquisition, renewal and release only by that owner, all as Lua scripts that Redis runs atomically. The token
// comes from ONE counter shared by every lock of the store (INCR in the same script as the acquisition), so
// tokens are comparable across locks, as the proxy's row fencing needs when several locks write the same rows.
//
// What Redis cannot guarantee (README "Locks"): replication is asynchronous, so a failover can lose the
// counter's latest increments and the lock key itself. A new holder may then get the lock while the old one
// still runs (two holders, which is why the database checks tokens), and a token that is not above the last
// one the database accepted: the database refuses it (55F01, fail safe), `fenceproxy check` shows rows with
// tokens above the counter, and token.offset (--token-offset) lifts new tokens above the old ones. Redlock
// over several independent masters is out of scope: its tokens are not ordered across masters, so it gives
// no fencing token at all.
//
// Keys share the hash tag {fenceproxy} (KeyPrefix) so that a script's keys live in one slot of a Redis Cluster.
type RedisStore struct {
	client *redis.Client
	prefix string
}

// DefaultRedisPrefix is the prefix of every key a RedisStore uses.
const DefaultRedisPrefix = "{fenceproxy}:"

// RedisOptions configure a RedisStore.
type RedisOptions struct {
	// Prefix of every key; default DefaultRedisPrefix. Keep a {hash tag} in it for Redis Cluster.
	Prefix string
	// Password, Username and DB are passed to the client.
	Username, Password string
	DB                 int
	// DialTimeout bounds connecting and each command; default 5s.
	DialTimeout time.Duration
}

// NewRedisStore connects to the Redis server at addr (host:port) and checks it answers.
func NewRedisStore(ctx context.Context, addr string, o RedisOptions) (*RedisStore, error) {
	if o.Prefix == "" {
		o.Prefix = DefaultRedisPrefix
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	client := redis.NewClient(&redis.Options{
		Addr: addr, Username: o.Username, Password: o.Password, DB: o.DB,
		DialTimeout: o.DialTimeout, ReadTimeout: o.DialTimeout, WriteTimeout: o.DialTimeout,
		MaxRetries: -1, // a retried script could run twice; callers decide
	})
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		return nil, fmt.Errorf("redis %s: %w", addr, err)
	}
	return &RedisStore{client: client, prefix: o.Prefix}, nil
}

// Kind is "redis".
func (s *RedisStore) Kind() string { return "redis" }

// Close closes the connections; held locks expire with their TTL.
func (s *RedisStore) Close() error { return s.client.Close() }

func (s *RedisStore) lockKey(name string) string { return s.prefix + "lock:" + name }
func (s *RedisStore) counterKey() string         { return s.prefix + "token" }

// grantedKey is the hash that records, per lock name, the newest token granted for it (the failover barrier
// reads it: docs/ha.md). Unlike the lock key it has no TTL, so it outlives the holder.
func (s *RedisStore) grantedKey() string { return s.prefix + "granted" }

// The lock key's value is "<owner> <token>".
var (
	// KEYS[1] lock, KEYS[2] counter; ARGV[1] owner, ARGV[2] TTL in ms. Returns the token, or the negated
	// remaining TTL in ms (at most -1) when the lock is held.
	redisAcquire = redis.NewScript(`
local ttl = redis.call('PTTL', KEYS[1])
if ttl ~= -2 then
  if ttl < 1 then ttl = 1 end
  return -ttl
end
local t = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. t, 'NX', 'PX', ARGV[2])
return t`)
	// KEYS[1] lock; ARGV[1] owner, ARGV[2] TTL in ms. 1 if renewed, 0 if the lock is not ours.
	redisRenew = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. ' ' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0`)
	// KEYS[1] lock, KEYS[2] grants hash; ARGV[1] owner, ARGV[2] lock name, ARGV[3] token (decimal, no leading
	// zero). Records the token as the lock's newest grant unless a higher one is recorded, and only while the
	// lock is this owner's. 1 if the grant is recorded (now or already higher), 0 if the lock is not ours.
	// Tokens are compared as decimal strings (longer is greater, then byte order): Lua's numbers are doubles
	// and would round tokens above 2^53.
	redisRecordGrant = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not (v and string.sub(v, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. ' ') then
  return 0
end
local cur = redis.call('HGET', KEYS[2], ARGV[2])
if cur and (string.len(cur) > string.len(ARGV[3]) or (string.len(cur) == string.len(ARGV[3]) and cur >= ARGV[3])) then
  return 1
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1`)
	// KEYS[1] lock; ARGV[1] owner. 1 if released, 0 if the lock is not ours (nothing changes).
	redisRelease = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. ' ' then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0`)
)

// ErrNotOwner is returned by a release of a lock that another holder owns now (the lease had expired): nothing
// is changed.
var ErrNotOwner = errors.New("the lock is held by someone else: release by a non-owner changed nothing")

// Acquire takes the lock, polling with a bounded exponential backoff (never longer than the holder's remaining
// TTL) while another holder has it.
func (s *RedisStore) Acquire(ctx context.Context, name string, o AcquireOptions) (Held, error) {
	if name == "" {
		return nil, errors.New("lock name is empty")
	}
	ttl := o.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if ttl < time.Millisecond*30 {
		return nil, fmt.Errorf("lock TTL %v is too short", ttl)
	}
	if o.TokenOffset < 0 {
		return nil, fmt.Errorf("token offset %d is negative", o.TokenOffset)
	}
	owner := newOwner()
	key := s.lockKey(name)
	keys := []string{key, s.counterKey()}
	wait := newBackoff(500 * time.Millisecond)
	for {
		sent := time.Now()
		res, err := redisAcquire.Run(ctx, s.client, keys, owner, ttl.Milliseconds()).Int64()
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("lock %q: %w", key, context.Cause(ctx))
			}
			// The script may have run (the answer was lost): release whatever we may hold, then report.
			s.releaseQuietly(key, owner)
			return nil, fmt.Errorf("lock %q: redis: %w", key, err)
		}
		if res > 0 {
			if res > math.MaxInt64-o.TokenOffset {
				s.releaseQuietly(key, owner)
				return nil, fmt.Errorf("lock %q: counter %d plus offset %d overflows a token", key, res, o.TokenOffset)
			}
			token := res + o.TokenOffset
			if err := s.recordGrant(ctx, name, owner, token); err != nil {
				// Fail closed: a token the barrier cannot know of is not handed out.
				s.releaseQuietly(key, owner)
				return nil, fmt.Errorf("lock %q: %w", key, err)
			}
			h := &redisHeld{s: s, name: name, key: key, owner: owner, token: token}
			h.lease = newLeaseKeeper(fmt.Sprintf("lock %q", key), ttl, sent, func(ctx context.Context) (bool, error) {
				n, err := redisRenew.Run(ctx, s.client, []string{key}, owner, ttl.Milliseconds()).Int64()
				return n == 1, err
			}, leaseEvents{})
			return h, nil
		}
		if o.Try {
			return nil, fmt.Errorf("lock %q: %w", key, ErrLocked)
		}
		if err := wait.wait(ctx, time.Duration(-res)*time.Millisecond); err != nil {
			return nil, fmt.Errorf("lock %q: %w", key, err)
		}
	}
}

// recordGrant records token as the newest grant of the lock name, held by owner, before the token is handed
// out: a holder whose grant is recorded nowhere could write after a lossy failover of PostgreSQL under a token
// the failover barrier does not know of.
func (s *RedisStore) recordGrant(ctx context.Context, name, owner string, token int64) error {
	n, err := redisRecordGrant.Run(ctx, s.client, []string{s.lockKey(name), s.grantedKey()}, owner, name, strconv.FormatInt(token, 10)).Int64()
	switch {
	case err != nil:
		return fmt.Errorf("record grant %d: redis: %w", token, err)
	case n != 1:
		return fmt.Errorf("record grant %d: %w: the lease ended before the grant was recorded", token, ErrLeaseLost)
	}
	return nil
}

// Granted reports, per lock, the newest token granted for it as recorded in the grants hash (grantedKey) at
// acquisition, and the token of the lock's current holder where that is higher. A record that is not a
// positive token is an error: the barrier cannot tell what it should raise the lock's mark to.
func (s *RedisStore) Granted(ctx context.Context) (map[string]int64, error) {
	recs, err := s.client.HGetAll(ctx, s.grantedKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("redis lock store: read grants %q: %w", s.grantedKey(), err)
	}
	out := make(map[string]int64, len(recs))
	for name, v := range recs {
		tok, err := strconv.ParseInt(v, 10, 64)
		if err != nil || tok <= 0 {
			return nil, fmt.Errorf("redis lock store: grant of lock %q in %q is %q, not a token", name, s.grantedKey(), v)
		}
		out[name] = tok
	}
	held, err := s.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("redis lock store: list holders: %w", err)
	}
	for _, li := range held {
		if li.Token > 0 {
			out[li.Name] = max(out[li.Name], li.Token)
		}
	}
	return out, nil
}

func (s *RedisStore) releaseQuietly(key, owner string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	redisRelease.Run(ctx, s.client, []string{key}, owner)
}

// List reports every lock key of the store. Redis keeps no queue, so waiters are unknown (-1).
func (s *RedisStore) List(ctx context.Context) ([]LockInfo, error) {
	var out []LockInfo
	lockPrefix := s.prefix + "lock:"
	iter := s.client.Scan(ctx, 0, escapeGlob(lockPrefix)+"*", 100).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		v, err := s.client.Get(ctx, key).Result()
		if errors.Is(err, redis.Nil) {
			continue // expired meanwhile
		}
		if err != nil {
			return nil, err
		}
		left, err := s.client.PTTL(ctx, key).Result()
		if err != nil {
			return nil, err
		}
		owner, tok, _ := strings.Cut(v, " ")
		token, _ := strconv.ParseInt(tok, 10, 64)
		out = append(out, LockInfo{Name: strings.TrimPrefix(key, lockPrefix), Holder: owner, Token: token, LeaseLeft: left, Waiters: -1})
	}
	return out, iter.Err()
}

// escapeGlob escapes the characters SCAN's MATCH pattern treats specially.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

type redisHeld struct {
	s     *RedisStore
	name  string
	key   string
	owner string
	token int64
	lease *leaseKeeper

	releaseOnce sync.Once
	releaseErr  error
}

func (h *redisHeld) Name() string          { return h.name }
func (h *redisHeld) Token() int64          { return h.token }
func (h *redisHeld) Lost() <-chan struct{} { return h.lease.lost.Done() }

func (h *redisHeld) Err() error { return h.lease.Err() }

// Release deletes the lock key if it is still this holder's; a lock that expired and went to someone else is
// left alone and ErrNotOwner returned.
func (h *redisHeld) Release(ctx context.Context) error {
	h.releaseOnce.Do(func() {
		h.lease.close(ErrReleased)
		n, err := redisRelease.Run(ctx, h.s.client, []string{h.key}, h.owner).Int64()
		switch {
		case err != nil:
			h.releaseErr = fmt.Errorf("lock %q: release: %w (the lease expires by itself within its TTL)", h.key, err)
		case n == 0:
			h.releaseErr = fmt.Errorf("lock %q: %w", h.key, ErrNotOwner)
		}
	})
	return h.releaseErr
}
