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
	// Best effort: a holder whose token could not be recorded is listed with token 0 (unknown).
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	s.client.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(l.Key()), ">", 0)).
		Then(clientv3.OpPut(l.Key(), strconv.FormatInt(l.Token(), 10), clientv3.WithLease(l.Lease()))).
		Commit()
	cancel()
	return l, nil
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
			if ttl, err := s.client.TimeToLive(ctx, h.lease); err == nil && ttl.TTL >= 0 {
				li.LeaseLeft = time.Duration(ttl.TTL) * time.Second
			}
		}
		out = append(out, li)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
