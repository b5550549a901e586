// Command demo replays the accident fenceproxy exists for, with real parts on one machine: a throwaway
// PostgreSQL (from the local server binaries), an embedded etcd, fenceproxy in-process, and two settlement
// workers that share the etcd lock "settlement".
//
// Worker A takes the lock, reads the pending batch and freezes (a GC pause: its etcd client goes silent, so
// its lease is no longer renewed). The lease expires; worker B gets the lock with a higher token, settles the
// batch and commits. A wakes up, still believing it holds the lock, and writes its stale settlement through
// the proxy: PostgreSQL refuses it with 55F01 and B's result stands. A then tries to record its bank transfers
// as new rows, which no row B wrote can fence: the lock fence refuses them too (55F01 naming the lock), because
// the demo runs `fenceproxy install` on its database and both workers name the lock in fence.lock. The same
// late write sent straight to PostgreSQL, on a copy of the table, succeeds silently.
//
//	go run ./examples/demo     (or: make demo)
//
// It exits non-zero if the story does not happen as told. Everything it starts is stopped on exit, Ctrl-C
// included.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/proxy"
	"github.com/fenceproxy/fenceproxy/rewrite"
	fenceschema "github.com/fenceproxy/fenceproxy/schema"
	"github.com/fenceproxy/fenceproxy/tokens"
)

const (
	lockName = "settlement"
	lockTTL  = 2 * time.Second
	batch    = "2024-06-01"
	// timeout bounds the whole demo, so that a broken part fails it instead of hanging it.
	timeout = 60 * time.Second
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := runContext(ctx, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

// run is the whole demo: it returns nil only if the story happened exactly as told.
func run(w io.Writer) error { return runContext(context.Background(), w) }

func runContext(ctx context.Context, w io.Writer) (err error) {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("demo did not finish within %v", timeout))
	defer cancel()
	defer func() {
		if err != nil && ctx.Err() != nil && errors.Is(context.Cause(ctx), context.Canceled) {
			err = fmt.Errorf("interrupted: %w", err)
		}
	}()

	fmt.Fprintln(w, "fenceproxy demo: two settlement workers, one etcd lock, one worker frozen past its lease")
	fmt.Fprintln(w)

	// The parts: PostgreSQL, etcd, fenceproxy.
	pg, err := pgtest.Start(pgtest.Options{})
	if err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	defer pg.Stop()
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	etcd, err := etcdtest.New()
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	defer etcd.Close()
	if err := pg.Exec(schema); err != nil {
		return err
	}
	px, err := startProxy(pg.Addr())
	if err != nil {
		return err
	}
	// fenceproxy install: the guard on the protected tables, and lock fences (fenceproxy.lock_marks).
	if err := install(ctx, pg, px.cfg); err != nil {
		px.stop()
		return err
	}
	defer func() {
		if err != nil && px.logs.String() != "" {
			fmt.Fprintf(w, "\nproxy log:\n%s", px.logs.String())
		}
	}()
	defer px.stop()
	fmt.Fprintf(w, "PostgreSQL %s (throwaway cluster)   etcd %s (embedded)\n", pg.Addr(), strings.Join(etcd.Endpoints(), ","))
	fmt.Fprintf(w, "fenceproxy %s -> %s, protecting public.payouts and public.transfers (token column fence_token)\n", px.addr, pg.Addr())
	fmt.Fprintf(w, "fenceproxy install: the guard and lock fences in the database; both workers name lock %q in fence.lock\n", lockName)
	fmt.Fprintf(w, "batch %s: 3 pending payouts; lock %q, lease TTL %v\n\n", batch, lockName, lockTTL)

	tl := newTimeline(w)
	d := &demo{
		ctx:       ctx,
		tl:        tl,
		etcd:      etcd,
		proxyDSN:  fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", pgtest.SuperUser, px.addr, pgtest.TestDB),
		aHolds:    make(chan struct{}),
		bQueued:   make(chan struct{}),
		bSettled:  make(chan struct{}),
		prefixKey: tokens.DefaultPrefix + lockName,
	}
	var wg sync.WaitGroup
	var errA, errB error
	wctx, stopWorkers := context.WithCancelCause(ctx)
	defer stopWorkers(nil)
	d.ctx = wctx
	wg.Add(2)
	go func() {
		defer wg.Done()
		if errA = d.workerA(); errA != nil {
			stopWorkers(fmt.Errorf("worker A: %w", errA))
		}
	}()
	go func() {
		defer wg.Done()
		if errB = d.workerB(); errB != nil {
			stopWorkers(fmt.Errorf("worker B: %w", errB))
		}
	}()
	wg.Wait()
	if errA != nil || errB != nil {
		if errA != nil && errB != nil && errors.Is(context.Cause(wctx), errA) {
			errB = nil // B only stopped because A failed
		}
		return errors.Join(prefixErr("worker A", errA), prefixErr("worker B", errB))
	}

	// Judge the outcome from the database itself, not from what the workers believe.
	return d.verdict(pg, w)
}

func prefixErr(who string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", who, err)
}

const schema = `
CREATE TABLE payouts (
	id          int PRIMARY KEY,
	batch       text NOT NULL,
	merchant    text NOT NULL,
	amount      numeric(12, 2) NOT NULL,
	status      text NOT NULL DEFAULT 'pending',
	settled_by  text,
	transfer_id text,
	fence_token bigint
);
INSERT INTO payouts (id, batch, merchant, amount) VALUES
	(1, '2024-06-01', 'acme',    120.00),
	(2, '2024-06-01', 'globex',   75.50),
	(3, '2024-06-01', 'initech', 310.25);
CREATE TABLE transfers (
	transfer_id text PRIMARY KEY,
	payout_id   int NOT NULL,
	amount      numeric(12, 2) NOT NULL,
	fence_token bigint
);
`

// transfersSQL is a worker's record of the bank transfers it sent: new rows, which no earlier write touched.
const transfersSQL = `INSERT INTO transfers (transfer_id, payout_id, amount)
SELECT 'TR-' || $1::text || '-' || id, id, amount FROM payouts WHERE batch = $2 AND id = ANY($3)`

// install runs `fenceproxy install` for the proxy's configuration on the demo's database.
func install(ctx context.Context, pg *pgtest.Cluster, cfg *config.Config) error {
	conn, err := connect(ctx, pg.SuperDSN(), "fenceproxy-install")
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if err := fenceschema.Install(ctx, conn, fenceschema.FromConfig(cfg)); err != nil {
		return fmt.Errorf("fenceproxy install: %w", err)
	}
	return nil
}

// setTokenAndLock gives a worker's session its token and the lock it belongs to, as `fenceproxy lock` does.
func setTokenAndLock(ctx context.Context, conn *pgx.Conn, token int64) error {
	if err := tokens.SetToken(ctx, conn, token, ""); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "SET "+tokens.DefaultLockSetting+" = "+quoteLiteral(lockName), pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("set the lock's name: %w", err)
	}
	return nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// settleSQL is a worker's settlement of the rows it read: it records its own bank transfers. %s is the table.
const settleSQL = `UPDATE %s SET status = 'settled', settled_by = 'worker-' || $1::text, transfer_id = 'TR-' || $1::text || '-' || id
WHERE batch = $2 AND id = ANY($3)`

type demo struct {
	ctx      context.Context
	tl       *timeline
	etcd     *etcdtest.Etcd
	proxyDSN string

	aHolds, bQueued, bSettled chan struct{}
	prefixKey                 string

	// Results, written by the workers before they return.
	tokenA, tokenB int64
	leaseA         clientv3.LeaseID
	idsA           []int32
	lateWriteErr   error // A's late write through the proxy
	lateInsertErr  error // A's late INSERT of new rows through the proxy
}

// workerA takes the lock, reads the batch, freezes past its lease and, once B has settled, writes its stale
// settlement.
func (d *demo) workerA() error {
	ctx := d.ctx
	client := d.etcd.Client() // A's own etcd client: its keep-alives are A's alone
	lock, err := tokens.Acquire(ctx, client, lockName, tokens.WithTTL(lockTTL))
	if err != nil {
		return err
	}
	d.tokenA, d.leaseA = lock.Token(), lock.Lease()
	d.tl.add("A", fmt.Sprintf("takes lock %q (TTL %v)", lockName, lockTTL), lock.Token(), "granted")
	close(d.aHolds)

	conn, err := connect(ctx, d.proxyDSN, "worker-A")
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if err := setTokenAndLock(ctx, conn, lock.Token()); err != nil {
		return err
	}
	d.tl.add("A", "sets its token and lock on its connection", lock.Token(), fmt.Sprintf("fence.token = %d, fence.lock = %s", lock.Token(), lockName))
	ids, total, err := readPending(ctx, conn)
	if err != nil {
		return err
	}
	d.idsA = ids
	d.tl.add("A", "reads the batch", lock.Token(), fmt.Sprintf("%d pending payouts, %s total", len(ids), total))

	// The pause. Wait until B is really queued on the lock, so the hand-over below is etcd's doing.
	select {
	case <-d.bQueued:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	// A frozen process sends nothing: closing A's etcd client stops its keep-alives without revoking the lease,
	// which then expires on the server after its TTL, exactly as for a stalled process.
	client.Close()
	frozeAt := time.Now()
	d.tl.add("A", "freezes (GC pause): stops renewing its lease", lock.Token(), "lease left to expire")
	select {
	case <-d.bSettled: // the pause outlasts the lease and B's whole settlement
	case <-ctx.Done():
		return context.Cause(ctx)
	}

	d.tl.add("A", "wakes up, still believes it holds the lock", lock.Token(),
		fmt.Sprintf("paused %.1fs, longer than its %v lease", time.Since(frozeAt).Seconds(), lockTTL))
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	_, err = tx.Exec(ctx, fmt.Sprintf(settleSQL, "payouts"), "A", batch, ids)
	d.lateWriteErr = err
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe):
		d.tl.add("A", "writes its stale settlement via fenceproxy", lock.Token(), pe.Code+" "+pe.Message)
	case err != nil:
		return fmt.Errorf("late write: %w", err)
	default:
		d.tl.add("A", "writes its stale settlement via fenceproxy", lock.Token(), "ACCEPTED (the fence failed)")
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		return nil
	}
	if err := tx.Rollback(ctx); err != nil {
		return err
	}
	d.tl.add("A", "rolls back", lock.Token(), "nothing of A's written")

	// New rows: no row B wrote is involved, so only the lock's mark (B's token) can refuse them.
	_, err = conn.Exec(ctx, transfersSQL, "A", batch, ids)
	d.lateInsertErr = err
	switch {
	case errors.As(err, &pe):
		d.tl.add("A", "inserts its transfers as new rows", lock.Token(), pe.Code+" "+pe.Message)
	case err != nil:
		return fmt.Errorf("late insert: %w", err)
	default:
		d.tl.add("A", "inserts its transfers as new rows", lock.Token(), "ACCEPTED (the lock fence failed)")
	}
	return nil
}

// workerB waits for the lock while A holds it, gets it when A's lease expires, and settles the batch.
func (d *demo) workerB() error {
	ctx := d.ctx
	select {
	case <-d.aHolds:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	client := d.etcd.Client()
	type result struct {
		lock *tokens.Lock
		err  error
	}
	acquired := make(chan result, 1)
	go func() {
		l, err := tokens.Acquire(ctx, client, lockName, tokens.WithTTL(lockTTL))
		acquired <- result{l, err}
	}()
	// B is queued once its key is under the lock's prefix beside A's.
	if err := poll(ctx, 10*time.Second, "B queued on the lock", func() (bool, error) {
		resp, err := client.Get(ctx, d.prefixKey+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 2, nil
	}); err != nil {
		return err
	}
	d.tl.add("B", fmt.Sprintf("waits for lock %q", lockName), 0, "queued behind A")
	close(d.bQueued)

	var r result
	select {
	case r = <-acquired:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	if r.err != nil {
		return r.err
	}
	lock := r.lock
	defer lock.Release(context.Background())
	d.tokenB = lock.Token()
	// A never released the lock: it passed to B because A's lease expired on the server.
	ttl, err := client.TimeToLive(ctx, d.leaseA)
	if err != nil {
		return err
	}
	if ttl.TTL != -1 {
		return fmt.Errorf("B got the lock while A's lease %x is still alive (TTL %ds)", int64(d.leaseA), ttl.TTL)
	}
	d.tl.add("etcd", "A's lease expired; the lock passes to B", 0, fmt.Sprintf("lease %x gone, never released", int64(d.leaseA)))
	d.tl.add("B", fmt.Sprintf("takes lock %q", lockName), lock.Token(), fmt.Sprintf("granted, token %d > %d", lock.Token(), d.tokenA))

	conn, err := connect(ctx, d.proxyDSN, "worker-B")
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if err := setTokenAndLock(ctx, conn, lock.Token()); err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	ids, total, err := readPending(ctx, tx)
	if err != nil {
		return err
	}
	d.tl.add("B", "reads the batch", lock.Token(), fmt.Sprintf("%d pending payouts, %s total", len(ids), total))
	tag, err := tx.Exec(ctx, fmt.Sprintf(settleSQL, "payouts"), "B", batch, ids)
	if err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	d.tl.add("B", "settles the batch via fenceproxy, commits", lock.Token(), fmt.Sprintf("%s, transfers TR-B-*", tag))
	if err := lock.Release(ctx); err != nil {
		return err
	}
	d.tl.add("B", fmt.Sprintf("releases lock %q", lockName), lock.Token(), "done")
	close(d.bSettled)
	return nil
}

// verdict checks the database against the story, prints the outcome and the contrast without fenceproxy.
func (d *demo) verdict(pg *pgtest.Cluster, w io.Writer) error {
	ctx := d.ctx
	direct, err := connect(ctx, pg.SuperDSN(), "demo-verdict")
	if err != nil {
		return err
	}
	defer direct.Close(context.Background())

	var problems []string
	if d.tokenB <= d.tokenA {
		problems = append(problems, fmt.Sprintf("B's token %d is not above A's %d", d.tokenB, d.tokenA))
	}
	var pe *pgconn.PgError
	if !errors.As(d.lateWriteErr, &pe) || pe.Code != "55F01" || !strings.HasPrefix(pe.Message, "stale fencing token") {
		problems = append(problems, fmt.Sprintf("A's late write was not refused with 55F01 stale fencing token: %v", d.lateWriteErr))
	}
	var lockErr *pgconn.PgError
	wantLock := fmt.Sprintf("stale fencing token: lock %s has accepted a newer token", lockName)
	if !errors.As(d.lateInsertErr, &lockErr) || lockErr.Code != "55F01" || !strings.HasPrefix(lockErr.Message, wantLock) {
		problems = append(problems, fmt.Sprintf("A's late INSERT of new rows was not refused with 55F01 %s: %v", wantLock, d.lateInsertErr))
	}
	var transfersA int
	if err := direct.QueryRow(ctx, "SELECT count(*) FROM transfers WHERE transfer_id LIKE 'TR-A-%'").Scan(&transfersA); err != nil {
		return err
	}
	if transfersA != 0 {
		problems = append(problems, fmt.Sprintf("%d transfers of A's are in the ledger", transfersA))
	}
	var settled, total int
	err = direct.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'settled' AND settled_by = 'worker-B'
	AND transfer_id = 'TR-B-' || id AND fence_token = $2), count(*) FROM payouts WHERE batch = $1`, batch, d.tokenB).Scan(&settled, &total)
	if err != nil {
		return err
	}
	if total != 3 || settled != total {
		problems = append(problems, fmt.Sprintf("%d of %d payouts hold B's settlement with token %d", settled, total, d.tokenB))
	}

	// Without fenceproxy: A's same late write, sent straight to PostgreSQL, on a copy of the settled batch.
	if _, err := direct.Exec(ctx, "CREATE TABLE payouts_unfenced AS SELECT * FROM payouts"); err != nil {
		return err
	}
	tag, err := direct.Exec(ctx, fmt.Sprintf(settleSQL, "payouts_unfenced"), "A", batch, d.idsA)
	if err != nil {
		problems = append(problems, fmt.Sprintf("A's late write straight to PostgreSQL failed: %v", err))
	}
	var overwritten int
	if err := direct.QueryRow(ctx, "SELECT count(*) FROM payouts_unfenced WHERE settled_by = 'worker-A' AND transfer_id = 'TR-A-' || id").Scan(&overwritten); err != nil {
		return err
	}
	if overwritten != 3 {
		problems = append(problems, fmt.Sprintf("without the proxy A's late write overwrote %d rows, want 3", overwritten))
	}

	fmt.Fprintln(w)
	if len(problems) > 0 {
		fmt.Fprintf(w, "OUTCOME: the story did not happen as told:\n  - %s\n", strings.Join(problems, "\n  - "))
		return errors.New(strings.Join(problems, "; "))
	}
	fmt.Fprintf(w, "A's error: %s %s\n", pe.Code, pe.Message)
	if pe.Detail != "" {
		fmt.Fprintf(w, "  DETAIL: %s\n", pe.Detail)
	}
	if pe.Hint != "" {
		fmt.Fprintf(w, "  HINT:   %s\n", pe.Hint)
	}
	fmt.Fprintf(w, "A's INSERT of new rows: %s %s\n", lockErr.Code, lockErr.Message)
	if lockErr.Detail != "" {
		fmt.Fprintf(w, "  DETAIL: %s\n", lockErr.Detail)
	}
	fmt.Fprintf(w, "\nOUTCOME: A refused with 55F01 stale fencing token (A's token %d, the rows' %d); the batch holds B's result (token %d):\n",
		d.tokenA, d.tokenB, d.tokenB)
	fmt.Fprintf(w, "         %d/%d payouts settled by worker-B with transfers TR-B-1..3, fence_token %d\n", settled, total, d.tokenB)
	fmt.Fprintf(w, "         A's transfers as new rows refused too: lock %q has accepted token %d; no TR-A-* in the ledger\n", lockName, d.tokenB)
	fmt.Fprintf(w, "without fenceproxy: the same late write of A straight to PostgreSQL (copy table payouts_unfenced) succeeded silently\n")
	fmt.Fprintf(w, "         (%s): the ledger now names A's transfers TR-A-1..3, and B's, already sent, are paid twice\n", tag)
	return nil
}

// querier is what reading the batch needs: a connection or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// readPending returns the batch's pending payouts and their total (added up by PostgreSQL: no money in floats).
func readPending(ctx context.Context, q querier) ([]int32, string, error) {
	rows, err := q.Query(ctx, `SELECT id, (sum(amount) OVER ())::text FROM payouts
WHERE batch = $1 AND status = 'pending' ORDER BY id`, batch)
	if err != nil {
		return nil, "", fmt.Errorf("read batch: %w", err)
	}
	var ids []int32
	var total string
	for rows.Next() {
		var id int32
		if err := rows.Scan(&id, &total); err != nil {
			return nil, "", err
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("read batch: %w", err)
	}
	return ids, total, nil
}

func connect(ctx context.Context, dsn, app string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = app
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: connect: %w", app, err)
	}
	return c, nil
}

// poll checks cond every 20ms until it holds, ctx ends or within passes.
func poll(ctx context.Context, within time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(within)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", within, what)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// runningProxy is fenceproxy in-process, as `fenceproxy serve` runs it.
type runningProxy struct {
	addr string
	cfg  *config.Config
	srv  *proxy.Server
	done chan error
	logs *syncBuffer
}

func startProxy(upstream string) (*runningProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	yaml := fmt.Sprintf(`listen: %s
upstream:
  address: %s
tables:
  - name: public.payouts
    token_column: fence_token
  - name: public.transfers
    token_column: fence_token
`, ln.Addr(), upstream)
	cfg, err := config.Parse("demo.yaml", []byte(yaml))
	if err != nil {
		ln.Close()
		return nil, err
	}
	tables := make([]rewrite.Table, len(cfg.Tables))
	for i, t := range cfg.Tables {
		tables[i] = rewrite.Table{Schema: t.Schema, Name: t.Relation, TokenColumn: t.TokenColumn}
	}
	rw, err := rewrite.New(rewrite.Config{Tables: tables, TokenSetting: cfg.Token.Setting, LockSetting: cfg.Token.LockSetting})
	if err != nil {
		ln.Close()
		return nil, err
	}
	planner := rewrite.NewCache(rw, cfg.Limits.RewriteCacheSize)
	logs := &syncBuffer{}
	srv, err := proxy.New(proxy.Options{
		Config:  cfg,
		Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Planner: planner,
	})
	if err != nil {
		ln.Close()
		return nil, err
	}
	p := &runningProxy{addr: ln.Addr().String(), cfg: cfg, srv: srv, done: make(chan error, 1), logs: logs}
	go func() { p.done <- srv.Serve(ln) }()
	return p, nil
}

func (p *runningProxy) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p.srv.Shutdown(ctx)
	<-p.done
}

// timeline prints events as they happen, as rows of a table.
type timeline struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func newTimeline(w io.Writer) *timeline {
	fmt.Fprintf(w, "%-8s  %-5s  %-45s  %-5s  %s\n", "time", "actor", "event", "token", "outcome")
	fmt.Fprintf(w, "%s\n", strings.Repeat("-", 110))
	return &timeline{w: w, start: time.Now()}
}

func (t *timeline) add(actor, event string, token int64, outcome string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tok := ""
	if token > 0 {
		tok = fmt.Sprint(token)
	}
	fmt.Fprintf(t.w, "%-8s  %-5s  %-45s  %-5s  %s\n", fmt.Sprintf("+%.2fs", time.Since(t.start).Seconds()), actor, event, tok, outcome)
}

// syncBuffer collects the proxy's log, shown when the demo fails.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
