package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fenceproxy/fenceproxy/tokens"

	"github.com/fenceproxy/fenceproxy/setting"
)

// Exit statuses of `fenceproxy lock`. They sit just below the 128+N range, like GNU timeout's and env's, so
// that they are unlikely to be confused with CMD's own statuses:
//
//	CMD's status  CMD exited by itself while the lock was held (0..255)
//	128+N         CMD died of signal N (for instance 143 after a forwarded SIGTERM); also the lock process's
//	              own status when signal N interrupted it while it was waiting for the lock
//	122           the lease was lost while CMD ran; CMD was sent SIGTERM, then SIGKILL after --grace
//	123           the lock could not be acquired: etcd unreachable (--dial-timeout), no quorum, lease lost
//	              while waiting, or another etcd error; CMD was not started
//	124           the lock is held by another session and was not obtained within --wait; CMD was not started
//	125           usage error (bad flags or arguments); CMD was not started
//	126           CMD was found but could not be started
//	127           CMD was not found
const (
	exitLeaseLost   = 122
	exitUnavailable = 123
	exitBusy        = 124
	exitUsage       = 125
	exitCannotRun   = 126
	exitNotFound    = 127
)

// Environment variables set for CMD, replacing inherited values.
const (
	envToken     = "FENCE_TOKEN"
	envLock      = "FENCE_LOCK"
	envPGOptions = "PGOPTIONS"
)

// forwardedSignals are passed on to CMD. SIGINT and SIGHUP from a terminal reach CMD directly too, since CMD
// stays in the lock process's process group (so that stopping the group freezes both); CMD then sees them twice.
var forwardedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

const lockUsage = `usage: fenceproxy lock [--etcd ENDPOINTS | --pg DSN | --zk SERVERS | --redis ADDR] [flags] NAME -- CMD [ARGS...]

Takes the lock NAME, from etcd (the default; key prefix --prefix), PostgreSQL (--pg, or FENCEPROXY_PG_DSN:
leases in the fenceproxy schema, judged by the server's clock), ZooKeeper (--zk, or FENCEPROXY_ZK_SERVERS:
the lock recipe under --prefix, default /fenceproxy/locks; the lease is the session, --ttl its timeout) or
Redis (--redis, or FENCEPROXY_REDIS_ADDR: SET NX PX with an owner value, one shared token counter), runs CMD
with FENCE_TOKEN (the fencing token: etcd's revision at which the lock was granted, the PostgreSQL store's
sequence value, the czxid of the ZooKeeper holder's node, or the Redis counter's value; plus --token-offset), FENCE_LOCK (NAME) and PGOPTIONS (the inherited value plus "-c fence.token=TOKEN
-c fence.lock=NAME") set, keeps the lease alive while CMD runs and releases the lock when CMD exits.
If the lease is lost, CMD gets SIGTERM, then SIGKILL after --grace. SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1
and SIGUSR2 are forwarded to CMD. One structured log line goes to stderr at acquisition, at each renewal
failure and at exit.

Exit status: CMD's status, or 128+N if CMD died of signal N; 122 lease lost while CMD ran; 123 lock service
unreachable or lock not acquired; 124 lock held and not obtained within --wait; 125 usage error;
126 CMD not executable; 127 CMD not found.

Flags:
`

// waitFlag is a duration that is "forever" until set.
type waitFlag struct {
	d   time.Duration
	set bool
}

func (w *waitFlag) String() string {
	if w == nil || !w.set {
		return "forever"
	}
	return w.d.String()
}

func (w *waitFlag) Set(s string) error {
	if s == "forever" {
		w.set = false
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if d < 0 {
		return errors.New("negative duration")
	}
	w.d, w.set = d, true
	return nil
}

// storeFlags are the flags that choose and reach the lock service, shared by `lock` and `locks`. At most one of
// --etcd, --pg, --zk and --redis is given; without any, the environment variables decide (PostgreSQL's, then
// ZooKeeper's, then Redis's, else etcd).
type storeFlags struct {
	fs          *flag.FlagSet
	endpoints   *string
	pgDSN       *string
	zkServers   *string
	redisAddr   *string
	prefix      *string
	dialTimeout *time.Duration
	// sessionTTL is the ZooKeeper session timeout (the lease), set by `lock` from --ttl.
	sessionTTL time.Duration
}

func addStoreFlags(fs *flag.FlagSet) *storeFlags {
	return &storeFlags{
		fs:          fs,
		endpoints:   fs.String("etcd", defaultEndpoints(), "comma-separated etcd `endpoints`; the default is FENCEPROXY_ETCD_ENDPOINTS, else ETCDCTL_ENDPOINTS, if set"),
		pgDSN:       fs.String("pg", "", "use PostgreSQL as the lock service: the `DSN` of the database (directly or through fenceproxy); the default is "+envPGDSN+", if set, unless another store is given"),
		zkServers:   fs.String("zk", "", "use ZooKeeper as the lock service: comma-separated `servers` (host:port); the default is "+envZKServers+", if set"),
		redisAddr:   fs.String("redis", "", "use Redis as the lock service: the primary's `address` (host:port); the default is "+envRedisAddr+", if set"),
		prefix:      fs.String("prefix", "", `key prefix or path of the locks: etcd default `+tokens.DefaultPrefix+` (use "" for the keys of "etcdctl lock NAME"), ZooKeeper default `+tokens.DefaultZKRoot+` (a Curator InterProcessMutex on PREFIX/NAME is the same lock), Redis default `+tokens.DefaultRedisPrefix),
		dialTimeout: fs.Duration("dial-timeout", 5*time.Second, "how long to try to reach the lock service before giving up"),
		sessionTTL:  tokens.DefaultTTL,
	}
}

// Environment variables that name a lock service when no flag does.
const (
	envPGDSN     = "FENCEPROXY_PG_DSN"
	envZKServers = "FENCEPROXY_ZK_SERVERS"
	envRedisAddr = "FENCEPROXY_REDIS_ADDR"
)

func (f *storeFlags) given(name string) bool {
	given := false
	f.fs.Visit(func(fl *flag.Flag) { given = given || fl.Name == name })
	return given
}

// value is a store flag's value, else its environment variable's (read here rather than as the flag's
// default, so that -h never prints a password in a DSN).
func (f *storeFlags) value(name string) string {
	flags := map[string]*string{"etcd": f.endpoints, "pg": f.pgDSN, "zk": f.zkServers, "redis": f.redisAddr}
	if name == "etcd" || f.given(name) {
		return strings.TrimSpace(*flags[name])
	}
	env := map[string]string{"pg": envPGDSN, "zk": envZKServers, "redis": envRedisAddr}
	return strings.TrimSpace(os.Getenv(env[name]))
}

// kind reports which store the flags choose ("etcd", "postgres", "zookeeper" or "redis"), or a usage problem.
func (f *storeFlags) kind() (string, error) {
	flagOf := map[string]string{"etcd": "etcd", "pg": "postgres", "zk": "zookeeper", "redis": "redis"}
	var chosen []string
	for _, fl := range []string{"etcd", "pg", "zk", "redis"} {
		if f.given(fl) {
			chosen = append(chosen, fl)
		}
	}
	switch {
	case len(chosen) > 1:
		return "", fmt.Errorf("--%s and --%s exclude each other", chosen[0], chosen[1])
	case len(chosen) == 1:
		if f.value(chosen[0]) == "" {
			return "", fmt.Errorf("--%s: empty", chosen[0])
		}
		return flagOf[chosen[0]], nil
	}
	for _, fl := range []string{"pg", "zk", "redis"} {
		if f.value(fl) != "" {
			return flagOf[fl], nil
		}
	}
	return "etcd", nil
}

func (f *storeFlags) validate() error {
	if *f.dialTimeout <= 0 {
		return fmt.Errorf("--dial-timeout %v: must be positive", *f.dialTimeout)
	}
	kind, err := f.kind()
	if err != nil {
		return err
	}
	if kind == "etcd" && len(splitEndpoints(*f.endpoints)) == 0 {
		return errors.New("--etcd: no endpoints")
	}
	return nil
}

// where describes the lock service for messages.
func (f *storeFlags) where() string {
	switch kind, _ := f.kind(); kind {
	case "postgres":
		return "PostgreSQL at " + redactDSN(f.value("pg"))
	case "zookeeper":
		return "ZooKeeper at " + strings.Join(splitEndpoints(f.value("zk")), ",")
	case "redis":
		return "Redis at " + f.value("redis")
	}
	return "etcd at " + strings.Join(splitEndpoints(*f.endpoints), ",")
}

// open connects to the chosen lock service within --dial-timeout (checking that it answers). An error means
// it is unreachable or refuses us.
func (f *storeFlags) open(ctx context.Context, log *slog.Logger) (tokens.Store, error) {
	ctx, cancel := context.WithTimeout(ctx, *f.dialTimeout)
	defer cancel()
	switch kind, _ := f.kind(); kind {
	case "postgres":
		return tokens.NewPGStore(ctx, f.value("pg"), tokens.PGStoreOptions{Logger: log, ConnectTimeout: *f.dialTimeout})
	case "zookeeper":
		return tokens.NewZKStore(ctx, splitEndpoints(f.value("zk")), tokens.ZKOptions{Root: *f.prefix, SessionTimeout: f.sessionTTL, ConnectTimeout: *f.dialTimeout})
	case "redis":
		return tokens.NewRedisStore(ctx, f.value("redis"), tokens.RedisOptions{Prefix: *f.prefix, DialTimeout: *f.dialTimeout})
	}
	prefix := tokens.DefaultPrefix
	if f.given("prefix") {
		prefix = *f.prefix
	}
	eps := splitEndpoints(*f.endpoints)
	client, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: *f.dialTimeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	probe := prefix
	if probe == "" {
		probe = tokens.DefaultPrefix
	}
	if _, err := client.Get(ctx, probe, clientv3.WithCountOnly()); err != nil {
		client.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("did not answer within --dial-timeout %v (unreachable or no quorum)", *f.dialTimeout)
		}
		return nil, err
	}
	return tokens.NewEtcdStore(client, prefix), nil
}

// redactDSN hides a password in a DSN (URL or key=value form) for messages.
func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		return u.Redacted()
	}
	return regexp.MustCompile(`(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`).ReplaceAllString(dsn, "${1}xxxxx")
}

// runLock implements `fenceproxy lock`; args are the arguments after "lock". CMD inherits the process's stdin,
// and writes to stdout and stderr (directly when they are files). Cancelling ctx acts like a SIGTERM to the lock
// process; runLock installs its own handlers for the forwarded signals while it runs.
func runLock(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fenceproxy lock", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {} // --help goes to stdout, a mistake gets the usage line on stderr (below)
	sf := addStoreFlags(fs)
	ttl := fs.Duration("ttl", tokens.DefaultTTL, "lease TTL, at least 1s (etcd rounds it up to whole seconds; ZooKeeper's session timeout)")
	var wait waitFlag
	fs.Var(&wait, "wait", "`duration` to wait for the lock while another session holds it; 0 fails at once (default forever)")
	grace := fs.Duration("grace", 10*time.Second, "after the lease is lost, how long CMD has between SIGTERM and SIGKILL")
	offset := fs.Int64("token-offset", 0, "added to the store's token (for a lock service restored from an older backup or snapshot)")
	tokenSetting := fs.String("setting", tokens.DefaultSetting, "PostgreSQL setting that carries the token, in PGOPTIONS")
	lockSetting := fs.String("lock-setting", tokens.DefaultLockSetting, "PostgreSQL setting that carries the lock's name, in PGOPTIONS")
	logFormat := fs.String("log-format", "text", "format of the log lines on stderr: text or json")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, lockUsage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintln(stderr, "usage: fenceproxy lock [flags] NAME -- CMD [ARGS...]  (fenceproxy lock -h for help)")
		return exitUsage
	}
	usageError := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "fenceproxy lock: "+format+"\n", a...)
		fmt.Fprintln(stderr, "usage: fenceproxy lock [flags] NAME -- CMD [ARGS...]  (fenceproxy lock -h for help)")
		return exitUsage
	}
	rest := fs.Args()
	switch {
	case len(rest) == 0:
		return usageError("missing lock NAME")
	case len(rest) == 1 || rest[1] != "--":
		return usageError("expected -- after the lock NAME %q, then CMD (flags go before NAME)", rest[0])
	case len(rest) == 2:
		return usageError("missing CMD after --")
	}
	name, cmdArgs := rest[0], rest[2:]
	switch {
	case name == "":
		return usageError("the lock NAME is empty")
	case *ttl < time.Second:
		return usageError("--ttl %v: must be at least 1s", *ttl)
	case *grace < 0:
		return usageError("--grace %v: must not be negative", *grace)
	case *offset < 0:
		return usageError("--token-offset %d: must not be negative", *offset)
	case setting.Validate(*tokenSetting) != nil:
		return usageError("--setting: %v", setting.Validate(*tokenSetting))
	case setting.Validate(*lockSetting) != nil:
		return usageError("--lock-setting: %v", setting.Validate(*lockSetting))
	case *lockSetting == *tokenSetting:
		return usageError("--lock-setting %q: must differ from --setting", *lockSetting)
	case *logFormat != "text" && *logFormat != "json":
		return usageError("--log-format %q: must be text or json", *logFormat)
	}
	if err := sf.validate(); err != nil {
		return usageError("%v", err)
	}
	sf.sessionTTL = *ttl
	var log *slog.Logger
	if *logFormat == "json" {
		log = slog.New(slog.NewJSONHandler(stderr, nil))
	} else {
		log = slog.New(slog.NewTextHandler(stderr, nil))
	}

	// Find CMD before taking the lock, so that a typo does not cost a lock round.
	path, err := exec.LookPath(cmdArgs[0])
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy lock: %v\n", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, exec.ErrDot) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}

	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwardedSignals...)
	defer signal.Stop(sigs)

	store, err := sf.open(ctx, log)
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy lock: %s: %v; CMD not started\n", sf.where(), err)
		return exitUnavailable
	}
	defer store.Close()

	waitStart := time.Now()
	lock, status := acquireLock(ctx, store, sigs, name, sf.where(), lockParams{
		ttl: *ttl, wait: wait, offset: *offset, dialTimeout: *sf.dialTimeout,
	}, stderr)
	if lock == nil {
		log.Info("lock not acquired", "store", store.Kind(), "lock", name, "waited", time.Since(waitStart).Round(time.Millisecond), "exit", status)
		return status
	}
	heldSince := time.Now()
	log.Info("lock acquired", "store", store.Kind(), "lock", name, "token", lock.Token(), "waited", heldSince.Sub(waitStart).Round(time.Millisecond), "ttl", *ttl)
	outcome := "released"
	code := runHolding(ctx, lock, sigs, path, cmdArgs, name, *tokenSetting, *lockSetting, *grace, stdout, stderr)
	switch code {
	case exitLeaseLost:
		outcome = "lease lost"
	case exitCannotRun:
		outcome = "command not started"
	}
	log.Info("lock exit", "store", store.Kind(), "lock", name, "token", lock.Token(), "held", time.Since(heldSince).Round(time.Millisecond), "outcome", outcome, "exit", code)
	return code
}

// runHolding runs CMD while lock is held and returns the lock process's exit status.
func runHolding(ctx context.Context, lock tokens.Held, sigs <-chan os.Signal, path string, cmdArgs []string, name, tokenSetting, lockSetting string, grace time.Duration, stdout, stderr io.Writer) int {
	token := lock.Token()
	cmd := exec.Command(path, cmdArgs[1:]...)
	cmd.Args[0] = cmdArgs[0]
	cmd.Env = append(filterEnv(os.Environ(), envToken, envLock, envPGOptions),
		envToken+"="+strconv.FormatInt(token, 10),
		envLock+"="+name,
		envPGOptions+"="+tokens.PGOptionsLock(os.Getenv(envPGOptions), tokenSetting, token, lockSetting, name),
	)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.WaitDelay = 2 * time.Second // CMD's children may keep a copied stdout open
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "fenceproxy lock: start %s: %v\n", cmdArgs[0], err)
		releaseLock(lock, 5*time.Second, stderr)
		return exitCannotRun
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	leaseLost := false
	var killTimer <-chan time.Time
	ctxDone, lost := ctx.Done(), lock.Lost()
	for exited := false; !exited; {
		// An exit that is already known wins over a loss noticed at the same moment.
		select {
		case <-done:
			exited = true
			continue
		default:
		}
		select {
		case <-done:
			exited = true
		case sig := <-sigs:
			cmd.Process.Signal(sig)
		case <-ctxDone:
			ctxDone = nil
			cmd.Process.Signal(syscall.SIGTERM)
		case <-lost:
			lost, leaseLost = nil, true
			if grace == 0 {
				fmt.Fprintf(stderr, "fenceproxy lock: %v; killing CMD %s (pid %d) with SIGKILL\n", lock.Err(), cmdArgs[0], cmd.Process.Pid)
				cmd.Process.Kill()
				continue
			}
			fmt.Fprintf(stderr, "fenceproxy lock: %v; sending SIGTERM to CMD %s (pid %d), SIGKILL in %v\n", lock.Err(), cmdArgs[0], cmd.Process.Pid, grace)
			cmd.Process.Signal(syscall.SIGTERM)
			killTimer = time.After(grace)
		case <-killTimer:
			killTimer = nil
			fmt.Fprintf(stderr, "fenceproxy lock: CMD %s (pid %d) still running %v after SIGTERM; sending SIGKILL\n", cmdArgs[0], cmd.Process.Pid, grace)
			cmd.Process.Kill()
		}
	}
	if !leaseLost && lock.Err() != nil {
		// Lost just as CMD exited: CMD may have run past the lease.
		leaseLost = true
		fmt.Fprintf(stderr, "fenceproxy lock: %v\n", lock.Err())
	}
	if leaseLost {
		releaseLock(lock, 2*time.Second, stderr)
		return exitLeaseLost
	}
	releaseLock(lock, 5*time.Second, stderr)
	return exitStatus(cmd.ProcessState)
}

type lockParams struct {
	ttl         time.Duration
	wait        waitFlag
	offset      int64
	dialTimeout time.Duration
}

// acquireLock takes the lock, waiting as --wait says. A forwarded signal or the end of ctx abandons the wait.
// It returns the lock, or nil and the exit status.
func acquireLock(ctx context.Context, store tokens.Store, sigs <-chan os.Signal, name, where string, p lockParams, stderr io.Writer) (tokens.Held, int) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var interrupted os.Signal
	stopWatch := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		select {
		case sig := <-sigs:
			interrupted = sig
			cancel(fmt.Errorf("interrupted by %v", sig))
		case <-stopWatch:
		}
	}()
	stopWatching := sync.OnceFunc(func() {
		close(stopWatch)
		<-watchDone
	})
	defer stopWatching()

	key := name
	if es, ok := store.(*tokens.EtcdStore); ok {
		key = es.Prefix() + name
	}
	o := tokens.AcquireOptions{TTL: p.ttl, TokenOffset: p.offset}
	var lock tokens.Held
	var err error
	switch {
	case !p.wait.set:
		lock, err = store.Acquire(ctx, name, o)
	case p.wait.d == 0:
		tryCtx, tryCancel := context.WithTimeout(ctx, p.dialTimeout)
		o.Try = true
		lock, err = store.Acquire(tryCtx, name, o)
		tryCancel()
	default:
		waitCtx, waitCancel := context.WithTimeoutCause(ctx, p.wait.d, errWaitElapsed)
		lock, err = store.Acquire(waitCtx, name, o)
		waitCancel()
	}
	stopWatching()
	if lock != nil {
		if interrupted == nil {
			return lock, 0
		}
		// The signal came just as the lock was granted: CMD was never started, so stop here.
		releaseLock(lock, 5*time.Second, stderr)
	}
	switch {
	case interrupted != nil:
		fmt.Fprintf(stderr, "fenceproxy lock: interrupted by %v while acquiring lock %q\n", interrupted, key)
		return nil, 128 + int(interrupted.(syscall.Signal))
	case ctx.Err() != nil:
		fmt.Fprintf(stderr, "fenceproxy lock: stopped while acquiring lock %q: %v\n", key, context.Cause(ctx))
		return nil, 128 + int(syscall.SIGTERM)
	case errors.Is(err, tokens.ErrLocked):
		fmt.Fprintf(stderr, "fenceproxy lock: lock %q is held by another session (--wait 0)\n", key)
		return nil, exitBusy
	case errors.Is(err, errWaitElapsed):
		fmt.Fprintf(stderr, "fenceproxy lock: lock %q is held by another session; not obtained within --wait %v (%v)\n", key, p.wait.d, err)
		return nil, exitBusy
	case errors.Is(err, context.DeadlineExceeded):
		fmt.Fprintf(stderr, "fenceproxy lock: %s did not answer within --dial-timeout %v (unreachable or no quorum); CMD not started\n",
			where, p.dialTimeout)
		return nil, exitUnavailable
	default:
		fmt.Fprintf(stderr, "fenceproxy lock: acquiring lock %q from %s: %v\n", key, where, err)
		return nil, exitUnavailable
	}
}

var errWaitElapsed = errors.New("--wait elapsed")

func releaseLock(lock tokens.Held, timeout time.Duration, stderr io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := lock.Release(ctx); err != nil {
		fmt.Fprintf(stderr, "fenceproxy lock: %v\n", err)
	}
}

func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

func defaultEndpoints() string {
	for _, env := range []string{"FENCEPROXY_ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS"} {
		if v := strings.TrimSpace(os.Getenv(env)); v != "" {
			return v
		}
	}
	return "127.0.0.1:2379"
}

func splitEndpoints(s string) []string {
	var eps []string
	for _, ep := range strings.Split(s, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			eps = append(eps, ep)
		}
	}
	return eps
}

// filterEnv returns env without the entries for keys.
func filterEnv(env []string, keys ...string) []string {
	out := make([]string, 0, len(env)+len(keys))
next:
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		for _, drop := range keys {
			if k == drop {
				continue next
			}
		}
		out = append(out, kv)
	}
	return out
}
