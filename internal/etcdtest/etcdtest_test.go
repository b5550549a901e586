package etcdtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
)

func TestPutGet(t *testing.T) {
	e := etcdtest.Start(t)
	c := e.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	put, err := c.Put(ctx, "k", "v1")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := e.Client().Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v1" || resp.Kvs[0].ModRevision != put.Header.Revision {
		t.Fatalf("Get = %v, want v1 at revision %d", resp.Kvs, put.Header.Revision)
	}
}

func TestStopAndRestart(t *testing.T) {
	e := etcdtest.Start(t)
	c := e.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put, err := c.Put(ctx, "k", "before")
	if err != nil {
		t.Fatal(err)
	}
	endpoints := e.Endpoints()[0]

	e.Stop()
	if e.Running() {
		t.Fatal("Running() after Stop")
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.Get(short, "k")
	cancelShort()
	if err == nil {
		t.Fatal("Get succeeded while etcd was stopped")
	}

	if err := e.StartAgain(); err != nil {
		t.Fatal(err)
	}
	if got := e.Endpoints()[0]; got != endpoints {
		t.Errorf("endpoint changed from %s to %s", endpoints, got)
	}
	// The same client reconnects and the data survived.
	resp, err := c.Get(ctx, "k")
	if err != nil {
		t.Fatalf("Get after StartAgain: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "before" {
		t.Fatalf("Get after StartAgain = %v, want before", resp.Kvs)
	}
	if resp.Header.Revision < put.Header.Revision {
		t.Errorf("revision went back from %d to %d", put.Header.Revision, resp.Header.Revision)
	}

	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	put2, err := c.Put(ctx, "k", "after")
	if err != nil {
		t.Fatalf("Put after Restart: %v", err)
	}
	if put2.Header.Revision <= put.Header.Revision {
		t.Errorf("revision after Restart %d not above %d", put2.Header.Revision, put.Header.Revision)
	}
}

func TestNewAndClose(t *testing.T) {
	e, err := etcdtest.New()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.Client().Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
}
