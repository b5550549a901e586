// Command idlemem measures fenceproxy's resident memory per idle session: it starts a throwaway PostgreSQL
// (max_connections above the session count), runs the fenceproxy binary in front of it, opens N idle sessions
// through the proxy and reports the growth of the proxy's VmRSS divided by N.
//
//	go run ./bench/idlemem -n 2000
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

func main() {
	n := flag.Int("n", 2000, "idle sessions to open")
	flag.Parse()
	if err := run(*n); err != nil {
		fmt.Fprintln(os.Stderr, "idlemem:", err)
		os.Exit(1)
	}
}

func run(n int) error {
	pg, err := pgtest.Start(pgtest.Options{MaxConnections: n + 50, ExtraConf: map[string]string{"shared_buffers": "128MB"}})
	if err != nil {
		return err
	}
	defer pg.Stop()
	dir, err := os.MkdirTemp("", "fenceproxy-idlemem")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := filepath.Join(dir, "fenceproxy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/fenceproxy")
	build.Dir, build.Stderr = root, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	cfg := filepath.Join(dir, "fenceproxy.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("listen: %s\nupstream:\n  address: %s\ntables:\n  - name: accounts\n    token_column: fence_token\nlimits:\n  max_client_connections: %d\nlog:\n  level: warn\n", addr, pg.Addr(), n+10)), 0o644)
	proxy := exec.Command(bin, "serve", "--config", cfg)
	proxy.Stderr = os.Stderr
	if err := proxy.Start(); err != nil {
		return err
	}
	defer func() { proxy.Process.Kill(); proxy.Wait() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dsn := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", pgtest.SuperUser, addr, pgtest.TestDB)
	var first *pgconn.PgConn
	for deadline := time.Now().Add(20 * time.Second); ; {
		first, err = pgconn.Connect(ctx, dsn)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
	conns := []*pgconn.PgConn{first}
	before, err := rss(proxy.Process.Pid)
	if err != nil {
		return err
	}
	start := time.Now()
	for len(conns) < n+1 {
		c, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			return fmt.Errorf("session %d: %w", len(conns), err)
		}
		conns = append(conns, c)
	}
	// Every session has run a statement, so its buffers exist, and then sits idle.
	for _, c := range conns {
		if err := c.Exec(ctx, "SELECT 1").Close(); err != nil {
			return err
		}
	}
	time.Sleep(2 * time.Second) // let the runtime settle; this is a measurement, not a test
	after, err := rss(proxy.Process.Pid)
	if err != nil {
		return err
	}
	fmt.Printf("sessions: %d (opened in %v)\nproxy RSS: %d KiB with 1 session, %d KiB with %d\nper idle session: %.1f KiB\n",
		n, time.Since(start).Round(time.Millisecond), before, after, n+1, float64(after-before)/float64(n))
	for _, c := range conns {
		c.Close(ctx)
	}
	return nil
}

// rss reads VmRSS (KiB) of a process.
func rss(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}
