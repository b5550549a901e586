package proxy_test

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/proxy"
)

// TestPlainSessionsRunInTheEventLoop: on Linux a plain-TCP session moves to the event loop after startup, and
// a large COPY OUT and a large query through it arrive whole (back-pressure when the client reads slowly).
func TestPlainSessionsRunInTheEventLoop(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the event loop is Linux only")
	}
	p := startProxy(t, proxytest.Options{})
	c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	ctx := ctxT(t)
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the session to enter the event loop", func() bool { return proxy.SessionsInLoop(p.Server) == 1 })

	var out bytes.Buffer
	tag, err := c.PgConn().CopyTo(ctx, &slowWriter{w: &out}, "COPY (SELECT g, repeat('x', 200) FROM generate_series(1, 30000) g) TO STDOUT")
	if err != nil || tag.RowsAffected() != 30000 {
		t.Fatalf("COPY OUT through the loop: %v %v", tag, err)
	}
	if lines := strings.Count(out.String(), "\n"); lines != 30000 {
		t.Fatalf("COPY OUT delivered %d lines", lines)
	}
	big := strings.Repeat("y", 4<<20)
	var got string
	if err := c.QueryRow(ctx, "SELECT $1::text", big).Scan(&got); err != nil || got != big {
		t.Fatalf("4 MiB round trip through the loop: %d bytes, %v", len(got), err)
	}
}

// slowWriter makes the client read slowly, so the proxy's socket to it fills up.
type slowWriter struct {
	w *bytes.Buffer
	n int
}

func (s *slowWriter) Write(p []byte) (int, error) {
	s.n++
	if s.n%2000 == 0 {
		time.Sleep(time.Millisecond)
	}
	return s.w.Write(p)
}

// TestRelayModeGoroutines: relay.mode: goroutines is the event loop's off switch: sessions stay on their
// goroutines and relay as before.
func TestRelayModeGoroutines(t *testing.T) {
	p := startProxy(t, proxytest.Options{YAML: "relay:\n  mode: goroutines\n"})
	c := connect(t, p.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	ctx := ctxT(t)
	for i := range 50 {
		var got int
		if err := c.QueryRow(ctx, "SELECT $1::int", i).Scan(&got); err != nil || got != i {
			t.Fatalf("round trip %d: %d %v", i, got, err)
		}
	}
	if n := proxy.SessionsInLoop(p.Server); n != 0 {
		t.Fatalf("%d sessions in the event loop with relay.mode goroutines", n)
	}
}
