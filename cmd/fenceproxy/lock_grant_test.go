package main

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// grantWatch tells a waiter's grant revision apart from its key's create revision in tests that share one
// etcd with other parallel tests: the grant is at or after the revision that deleted the holder's key, while
// the waiter's key was created before that.
type grantWatch struct {
	deleted <-chan int64
	key     string
}

// watchHolderDelete starts watching key (the holder's queue key) for its deletion.
func watchHolderDelete(t *testing.T, c *clientv3.Client, key string) grantWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	resp, err := c.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("holder key %q: %v (%d keys)", key, err, len(resp.Kvs))
	}
	wch := c.Watch(ctx, key, clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterPut())
	ch := make(chan int64, 1)
	go func() {
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					ch <- ev.Kv.ModRevision
					return
				}
			}
		}
	}()
	return grantWatch{deleted: ch, key: key}
}

// deletedAt waits for the holder's key to be deleted and returns that revision.
func (g grantWatch) deletedAt(t *testing.T) int64 {
	t.Helper()
	select {
	case rev := <-g.deleted:
		return rev
	case <-time.After(20 * time.Second):
		t.Fatalf("holder key %q not deleted within 20s", g.key)
		return 0
	}
}

// waiterCreateRevision returns the create revision of the one key under prefix+"/" whose lease is not holder's.
func waiterCreateRevision(t *testing.T, c *clientv3.Client, prefix string, holder clientv3.LeaseID) int64 {
	t.Helper()
	resp, err := c.Get(context.Background(), prefix+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var revs []int64
	for _, kv := range resp.Kvs {
		if clientv3.LeaseID(kv.Lease) != holder {
			revs = append(revs, kv.CreateRevision)
		}
	}
	if len(revs) != 1 {
		t.Fatalf("%d waiters' keys under %q, want 1", len(revs), prefix+"/")
	}
	return revs[0]
}

// currentRevision is etcd's revision now.
func currentRevision(t *testing.T, c *clientv3.Client) int64 {
	t.Helper()
	resp, err := c.Get(context.Background(), "grant-watch-probe", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// wantGrantToken checks that FENCE_TOKEN is the waiter's grant revision: not below the revision that deleted the
// holder's key (so not the waiter's own, earlier, create revision), and not above etcd's revision after the
// lock process ended.
func wantGrantToken(t *testing.T, token, holderDeleted, waiterCreate, after int64) {
	t.Helper()
	if waiterCreate >= holderDeleted {
		t.Fatalf("the waiter's key (revision %d) was created after the holder's was deleted (%d): the test does not tell the definitions apart", waiterCreate, holderDeleted)
	}
	if token < holderDeleted || token > after {
		t.Fatalf("FENCE_TOKEN %d after waiting: want the grant revision, in [%d, %d] (the holder's key deleted .. after); the waiter's key was created at %d",
			token, holderDeleted, after, waiterCreate)
	}
}
