package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
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

var settingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)+$`)

const lockUsage = `usage: fenceproxy lock [flags] NAME -- CMD [ARGS...]

Takes the etcd lock NAME (key prefix --prefix), runs CMD with FENCE_TOKEN (the fencing token: the etcd revision
at which the lock was granted, plus --token-offset), FENCE_LOCK (NAME) and PGOPTIONS (the inherited value plus
"-c fence.token=TOKEN -c fence.lock=NAME") set, keeps the lease alive while CMD runs and releases the lock when CMD exits.
If the lease is lost, CMD gets SIGTERM, then SIGKILL after --grace. SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1
and SIGUSR2 are forwarded to CMD.

Exit status: CMD's status, or 128+N if CMD died of signal N; 122 lease lost while CMD ran; 123 etcd
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

// runLock implements `fenceproxy lock`; args are the arguments after "lock". CMD inherits the process's stdin,
// and writes to stdout and stderr (directly when they are files). Cancelling ctx acts like a SIGTERM to the lock
// process; runLock installs its own handlers for the forwarded signals while it runs.
func runLock(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fenceproxy lock", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), lockUsage)
		fs.PrintDefaults()
	}
	endpoints := fs.String("etcd", defaultEndpoints(), "comma-separated etcd `endpoints`; the default is FENCEPROXY_ETCD_ENDPOINTS, else ETCDCTL_ENDPOINTS, if set")
	ttl := fs.Duration("ttl", tokens.DefaultTTL, "lease TTL, rounded up to whole seconds, at least 1s")
	prefix := fs.String("prefix", tokens.DefaultPrefix, `key prefix; the lock's keys are PREFIX+NAME+"/"+LEASE (use "" for the keys of "etcdctl lock NAME")`)
	var wait waitFlag
	fs.Var(&wait, "wait", "`duration` to wait for the lock while another session holds it; 0 fails at once (default forever)")
	grace := fs.Duration("grace", 10*time.Second, "after the lease is lost, how long CMD has between SIGTERM and SIGKILL")
	offset := fs.Int64("token-offset", 0, "added to the etcd revision to form the token (for an etcd restored from a snapshot)")
	setting := fs.String("setting", tokens.DefaultSetting, "PostgreSQL setting that carries the token, in PGOPTIONS")
	lockSetting := fs.String("lock-setting", "fence.lock", "PostgreSQL setting that names the lock (lock fences), in PGOPTIONS")
	dialTimeout := fs.Duration("dial-timeout", 5*time.Second, "how long to try to reach etcd before giving up")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
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
	case !settingName.MatchString(*setting):
		return usageError("--setting %q: not a qualified setting name such as fence.token", *setting)
	case *dialTimeout <= 0:
		return usageError("--dial-timeout %v: must be positive", *dialTimeout)
	}
	eps := splitEndpoints(*endpoints)
	if len(eps) == 0 {
		return usageError("--etcd: no endpoints")
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

	client, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: *dialTimeout,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		fmt.Fprintf(stderr, "fenceproxy lock: etcd client for %s: %v\n", strings.Join(eps, ","), err)
		return exitUnavailable
	}
	defer client.Close()

	lock, status := acquireLock(ctx, client, sigs, name, eps, lockParams{
		ttl: *ttl, prefix: *prefix, wait: wait, offset: *offset, dialTimeout: *dialTimeout,
	}, stderr)
	if lock == nil {
		return status
	}

	token := lock.Token()
	cmd := exec.Command(path, cmdArgs[1:]...)
	cmd.Args[0] = cmdArgs[0]
	cmd.Env = append(filterEnv(os.Environ(), envToken, envLock, envPGOptions),
		envToken+"="+strconv.FormatInt(token, 10),
		envLock+"="+name,
		envPGOptions+"="+tokens.PGOptions(os.Getenv(envPGOptions), *setting, token)+lockOption(*lockSetting, name),
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
			if *grace == 0 {
				fmt.Fprintf(stderr, "fenceproxy lock: %v; killing CMD %s (pid %d) with SIGKILL\n", lock.Err(), cmdArgs[0], cmd.Process.Pid)
				cmd.Process.Kill()
				continue
			}
			fmt.Fprintf(stderr, "fenceproxy lock: %v; sending SIGTERM to CMD %s (pid %d), SIGKILL in %v\n", lock.Err(), cmdArgs[0], cmd.Process.Pid, *grace)
			cmd.Process.Signal(syscall.SIGTERM)
			killTimer = time.After(*grace)
		case <-killTimer:
			killTimer = nil
			fmt.Fprintf(stderr, "fenceproxy lock: CMD %s (pid %d) still running %v after SIGTERM; sending SIGKILL\n", cmdArgs[0], cmd.Process.Pid, *grace)
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
	prefix      string
	wait        waitFlag
	offset      int64
	dialTimeout time.Duration
}

// acquireLock checks that etcd answers within the dial timeout, then takes the lock, waiting as --wait says.
// A forwarded signal or the end of ctx abandons the wait. It returns the lock, or nil and the exit status.
func acquireLock(ctx context.Context, client *clientv3.Client, sigs <-chan os.Signal, name string, eps []string, p lockParams, stderr io.Writer) (*tokens.Lock, int) {
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

	key := p.prefix + name
	probeCtx, probeCancel := context.WithTimeout(ctx, p.dialTimeout)
	_, err := client.Get(probeCtx, key, clientv3.WithCountOnly())
	probeCancel()
	var lock *tokens.Lock
	if err == nil {
		opts := []tokens.Option{tokens.WithTTL(p.ttl), tokens.WithPrefix(p.prefix), tokens.WithTokenOffset(p.offset)}
		switch {
		case !p.wait.set:
			lock, err = tokens.Acquire(ctx, client, name, opts...)
		case p.wait.d == 0:
			tryCtx, tryCancel := context.WithTimeout(ctx, p.dialTimeout)
			lock, err = tokens.TryAcquire(tryCtx, client, name, opts...)
			tryCancel()
		default:
			waitCtx, waitCancel := context.WithTimeoutCause(ctx, p.wait.d, errWaitElapsed)
			lock, err = tokens.Acquire(waitCtx, client, name, opts...)
			waitCancel()
		}
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
		fmt.Fprintf(stderr, "fenceproxy lock: lock %q is held by another session; not obtained within --wait %v\n", key, p.wait.d)
		return nil, exitBusy
	case errors.Is(err, context.DeadlineExceeded):
		fmt.Fprintf(stderr, "fenceproxy lock: etcd at %s did not answer within --dial-timeout %v (unreachable or no quorum); CMD not started\n",
			strings.Join(eps, ","), p.dialTimeout)
		return nil, exitUnavailable
	default:
		fmt.Fprintf(stderr, "fenceproxy lock: acquiring lock %q from etcd at %s: %v\n", key, strings.Join(eps, ","), err)
		return nil, exitUnavailable
	}
}

var errWaitElapsed = errors.New("--wait elapsed")

func releaseLock(lock *tokens.Lock, timeout time.Duration, stderr io.Writer) {
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
