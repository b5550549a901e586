package tokens

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// EtcdStore is the etcd lock service as a [Store]: [Acquire] and [TryAcquire] under a key prefix. After an
// acquisition it writes the token into the holder's own lock key (under the holder's lease, only if the key
// still exists), so that [EtcdStore.List] and the metrics observer can show it; the value changes nothing for
// the lock itself (etcd's Mutex orders by create revision) nor for `etcdctl lock`.
type EtcdStore struct {
	client *clientv3.Client
	prefix string
}

var _ Store = (*EtcdStore)(nil)

// NewEtcdStore is the etcd store over client, with locks under prefix (normally [DefaultPrefix]; "" gives the
// keys of `etcdctl lock NAME`, but then List cannot tell lock keys from other keys and refuses).
func NewEtcdStore(client *clientv3.Client, prefix string) *EtcdStore {
	return &EtcdStore{client: client, prefix: prefix}
}

// Kind is "etcd".
func (s *EtcdStore) Kind() string { return "etcd" }

// Close closes the etcd client.
func (s *EtcdStore) Close() error { return s.client.Close() }

// Client is the store's etcd client.
func (s *EtcdStore) Client() *clientv3.Client { return s.client }

// Prefix is the key prefix of the store's locks.
func (s *EtcdStore) Prefix() string { return s.prefix }

// Acquire takes the lock with [Acquire] (or [TryAcquire] when o.Try). The TTL is rounded up to whole seconds.
func (s *EtcdStore) Acquire(ctx context.Context, name string, o AcquireOptions) (Held, error) {
	ttl := o.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	opts := []Option{WithTTL(ttl), WithPrefix(s.prefix), WithTokenOffset(o.TokenOffset)}
	var l *Lock
	var err error
	if o.Try {
		l, err = TryAcquire(ctx, s.client, name, opts...)
	} else {
		l, err = Acquire(ctx, s.client, name, opts...)
	}
	if err != nil {
		return nil, err
	}
	// Best effort: a holder whose token could not be recorded is listed with token 0 (unknown). The same
	// transaction records the token as the lock's newest grant (GrantedKey), which outlives the lease: the
	// failover barrier reads it (docs/ha.md). Both only while the holder's key exists, that is while it still
	// holds the lock: grants are recorded in the order etcd made them, so a holder recording late (after its
	// lease ended and a newer holder recorded) records nothing.
	tok := strconv.FormatInt(l.Token(), 10)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	s.client.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(l.Key()), ">", 0)).
		Then(clientv3.OpPut(l.Key(), tok, clientv3.WithLease(l.Lease())), clientv3.OpPut(GrantedKey(s.prefix, name), tok)).
		Commit()
	cancel()
	return l, nil
}

// GrantedKey is the etcd key where the etcd store records the newest token granted for the lock name under
// prefix. It lies outside prefix+name+"/", whose keys are the lock's holder and waiters.
func GrantedKey(prefix, name string) string {
	return strings.TrimSuffix(prefix, "/") + ".granted/" + name
}

// Granted reports, per lock under the store's prefix, the newest token granted for it as far as etcd records
// it: the greater of the recorded grant (GrantedKey) and the token the current holder recorded in its key.
// Holders that record nothing (`etcdctl lock`) are not known here.
func (s *EtcdStore) Granted(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	gp := GrantedKey(s.prefix, "")
	resp, err := s.client.Get(ctx, gp, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcd lock store: read grants under %q: %w", gp, err)
	}
	for _, kv := range resp.Kvs {
		if tok, err := strconv.ParseInt(string(kv.Value), 10, 64); err == nil && tok > 0 {
			name := strings.TrimPrefix(string(kv.Key), gp)
			out[name] = max(out[name], tok)
		}
	}
	if s.prefix == "" {
		return out, nil
	}
	held, err := s.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, li := range held {
		if li.Token > 0 {
			out[li.Name] = max(out[li.Name], li.Token)
		}
	}
	return out, nil
}

// List reads the keys under the prefix: per lock, the holder is the key with the lowest create revision (its
// lease, in hex), the token is what the holder recorded (0 if unknown: a holder such as `etcdctl lock` that
// does not record it), the lease left is the holder lease's TTL by etcd, and the waiters are the other keys.
// HeldFor is unknown (0).
func (s *EtcdStore) List(ctx context.Context) ([]LockInfo, error) {
	if s.prefix == "" {
		return nil, errors.New("etcd lock store: cannot list locks without a key prefix")
	}
	resp, err := s.client.Get(ctx, s.prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcd lock store: list %q: %w", s.prefix, err)
	}
	type entry struct {
		createRev int64
		lease     clientv3.LeaseID
		value     string
	}
	byName := map[string][]entry{}
	for _, kv := range resp.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), s.prefix)
		i := strings.LastIndex(rest, "/")
		if i <= 0 {
			continue
		}
		name := rest[:i]
		byName[name] = append(byName[name], entry{kv.CreateRevision, clientv3.LeaseID(kv.Lease), string(kv.Value)})
	}
	out := make([]LockInfo, 0, len(byName))
	for name, es := range byName {
		sort.Slice(es, func(i, j int) bool { return es[i].createRev < es[j].createRev })
		h := es[0]
		li := LockInfo{Name: name, Holder: fmt.Sprintf("%x", int64(h.lease)), Waiters: len(es) - 1, LeaseLeft: -1}
		li.Token, _ = strconv.ParseInt(h.value, 10, 64)
		if h.lease != clientv3.NoLease {
			// etcd truncates the remaining time to whole seconds, and a lease that ran out but is not yet
			// revoked (the leader revokes asynchronously, late on a busy machine) reads TTL <= 0 with its
			// GrantedTTL still set: that is 0 left, an expiry in progress. TTL -1 with no GrantedTTL is a lease
			// gone between the Get and this call (a release): unknown.
			if ttl, err := s.client.TimeToLive(ctx, h.lease); err == nil {
				switch {
				case ttl.TTL >= 0:
					li.LeaseLeft = time.Duration(ttl.TTL) * time.Second
				case ttl.GrantedTTL > 0:
					li.LeaseLeft = 0
				}
			}
		}
		out = append(out, li)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
