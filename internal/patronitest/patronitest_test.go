package patronitest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/patronitest"
)

// A two-node cluster elects a leader; when the leader's host dies, the other node takes over.
func TestLeaderKilledFailsOver(t *testing.T) {
	e := etcdtest.Start(t)
	c := patronitest.Start(t, e.ClientAddr(), 2)
	leader, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, err := pgx.Connect(ctx, leader.DSN("postgres")); err == nil {
		c.Close(ctx)
		t.Fatalf("the killed leader's PostgreSQL %s still accepts connections", leader.Addr())
	}
	next, err := c.WaitLeader(90 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if next == leader {
		t.Fatalf("%s is still the leader after it was killed", leader.Name)
	}
}
