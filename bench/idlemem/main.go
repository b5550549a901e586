// Command idlemem measures fenceproxy's resident memory per idle client: it starts a throwaway PostgreSQL
// (max_connections above the client count), runs the fenceproxy binary in front of it, opens N clients through
// the proxy, runs a statement on each and lets them sit idle, and reports the growth of the proxy's VmRSS
// divided by N. In session mode each client holds a server connection; with -mode transaction the clients share
// a pool of -pool-size server connections, as pgbouncer's clients do, and -pgbouncer measures pgbouncer (the
// same pool mode and size) beside it, in the same run.
//
//	go run ./bench/idlemem -n 2000
//	go run ./bench/idlemem -n 2000 -mode transaction -pgbouncer
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
)

func main() {
	n := flag.Int("n", 2000, "idle clients to open")
	mode := flag.String("mode", "session", "pool.mode of the proxy: session or transaction")
	poolSize := flag.Int("pool-size", 8, "server connections of the transaction pool (pool.size, default_pool_size)")
	bouncer := flag.Bool("pgbouncer", false, "measure pgbouncer too, in the same pool mode")
	pprof := flag.String("pprof", "", "serve the proxy's metrics and Go profiles on this address (metrics.pprof) and keep its clients open for -hold")
	settle := flag.Duration("settle", 2*time.Second, "how long the clients sit idle before the memory is read")
	hold := flag.Duration("hold", time.Minute, "with -pprof: how long the idle clients stay open after the measurement, to take profiles")
	flag.Parse()
	if *mode != "session" && *mode != "transaction" {
		fmt.Fprintln(os.Stderr, "idlemem: -mode is session or transaction")
		os.Exit(2)
	}
	if err := run(*n, *mode, *poolSize, *bouncer, *pprof, *settle, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "idlemem:", err)
		os.Exit(1)
	}
}

func run(n int, mode string, poolSize int, bouncer bool, pprof string, settle, hold time.Duration) error {
	serverConns := n + 50
	if mode == "transaction" {
		serverConns = 4*poolSize + 50
	}
	pg, err := pgtest.Start(pgtest.Options{MaxConnections: serverConns, ExtraConf: map[string]string{"shared_buffers": "128MB"}})
	if err != nil {
		return err
	}
	defer pg.Stop()
	dir, err := os.MkdirTemp("", "fenceproxy-idlemem")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil { // pgbouncer runs as the postgres OS user under root
		return err
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := filepath.Join(dir, "fenceproxy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/fenceproxy")
	build.Dir, build.Stderr = root, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	addr := freeAddr()
	pool := ""
	if mode == "transaction" {
		pool = fmt.Sprintf("auth:\n  type: trust\npool:\n  mode: transaction\n  size: %d\n  max_clients: %d\n", poolSize, n+10)
	}
	if pprof != "" {
		pool += fmt.Sprintf("metrics:\n  listen: %s\n  pprof: true\n", pprof)
	} else {
		hold = 0
	}
	cfg := filepath.Join(dir, "fenceproxy.yaml")
	conf := fmt.Sprintf("listen: %s\nupstream:\n  address: %s\ntables:\n  - name: accounts\n    token_column: fence_token\n%slimits:\n  max_client_connections: %d\nlog:\n  level: warn\n", addr, pg.Addr(), pool, n+10)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return err
	}
	proxy := exec.Command(bin, "serve", "--config", cfg)
	proxy.Stderr = os.Stderr
	if err := proxy.Start(); err != nil {
		return err
	}
	defer func() { proxy.Process.Kill(); proxy.Wait() }()
	if err := measure("fenceproxy "+mode, addr, proxy.Process.Pid, n, settle, hold); err != nil {
		return err
	}
	if !bouncer {
		return nil
	}
	bouncerAddr := freeAddr()
	host, port, _ := net.SplitHostPort(bouncerAddr)
	pgHost, pgPort, _ := net.SplitHostPort(pg.Addr())
	ini := fmt.Sprintf("[databases]\n%s = host=%s port=%s dbname=%s\n\n[pgbouncer]\nlisten_addr = %s\nlisten_port = %s\nunix_socket_dir =\nauth_type = trust\nauth_file = %s\npool_mode = %s\nmax_client_conn = %d\ndefault_pool_size = %d\nlogfile = %s\n",
		pgtest.TestDB, pgHost, pgPort, pgtest.TestDB, host, port, filepath.Join(dir, "userlist.txt"), mode, n+100, poolSize, filepath.Join(dir, "pgbouncer.log"))
	if mode == "session" {
		ini = strings.Replace(ini, fmt.Sprintf("default_pool_size = %d", poolSize), fmt.Sprintf("default_pool_size = %d", n+10), 1)
	}
	for name, text := range map[string]string{"pgbouncer.ini": ini, "userlist.txt": fmt.Sprintf("%q \"\"\n", pgtest.SuperUser)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	path := "pgbouncer"
	if os.Geteuid() == 0 { // pgbouncer refuses to run as root
		args = append([]string{"--reuid=postgres", "--regid=postgres", "--init-groups", "--", "pgbouncer"}, args...)
		path = "setpriv"
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("pgbouncer runs as the postgres OS user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil { // its log file
			return err
		}
	}
	pgb := exec.Command(path, args...)
	if err := pgb.Start(); err != nil {
		return fmt.Errorf("pgbouncer: %w", err)
	}
	defer func() { pgb.Process.Kill(); pgb.Wait() }()
	return measure("pgbouncer "+mode, bouncerAddr, pgb.Process.Pid, n, settle, 0)
}

// freeAddr is a loopback address with a port nobody listened on a moment ago.
func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// measure opens one client through the middlebox at addr (process pid), reads its VmRSS, opens n more, runs a
// statement on each, lets them sit idle for settle and reads it again; then keeps them open for hold.
func measure(name, addr string, pid, n int, settle, hold time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dsn := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", pgtest.SuperUser, addr, pgtest.TestDB)
	var first *pgconn.PgConn
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; {
		first, err = pgconn.Connect(ctx, dsn)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %w", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := first.Exec(ctx, "SELECT 1").Close(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	conns := []*pgconn.PgConn{first}
	defer func() {
		for _, c := range conns {
			c.Close(ctx)
		}
	}()
	time.Sleep(time.Second) // let the runtime settle; this is a measurement, not a test
	before, err := rss(pid)
	if err != nil {
		return err
	}
	start := time.Now()
	for len(conns) < n+1 {
		c, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			return fmt.Errorf("%s: client %d: %w", name, len(conns), err)
		}
		conns = append(conns, c)
	}
	// Every client has run a statement, so its buffers exist, and then sits idle.
	for _, c := range conns {
		if err := c.Exec(ctx, "SELECT 1").Close(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	time.Sleep(settle)
	after, err := rss(pid)
	if err != nil {
		return err
	}
	fmt.Printf("%s: %d clients (opened in %v); RSS %d KiB with 1 client, %d KiB with %d; per idle client: %.1f KiB\n",
		name, n, time.Since(start).Round(time.Millisecond), before, after, n+1, float64(after-before)/float64(n))
	if hold > 0 {
		fmt.Printf("%s: clients held open for %v\n", name, hold)
		time.Sleep(hold)
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
