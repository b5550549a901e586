package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenceproxy/fenceproxy/config"
)

// The write hold. The router refuses fenced writes on a host it no longer trusts (writeRefusal), and the rules
// of fence.go and unplanned.go keep the writes the proxy sees, or can ask about, from committing there. What they
// cannot see commits inside one message: a unit sent with no transaction block open whose function writes a
// protected table, a cursor WITH HOLD that server code declares, whose query runs at the COMMIT (docs/ha.md).
// So the router also holds every protected table of such a host against writes inside the database, whoever
// writes: while it refuses a host that still claims to be a primary (a split brain: every host that claims it;
// a withdrawn primary that is still not in recovery, read-only or not), it opens, per database of the host (the
// databases that allow connections, as the barrier lists them, and any database a session of the proxy uses
// there later), a connection of the health role, and in one transaction LOCKs every table the planner protects
// there IN SHARE MODE (LOCK recurses to partitions and inheritance children by itself), and keeps that
// transaction open. SHARE conflicts with ROW EXCLUSIVE and every stronger mode, so a write to those tables there
// (an INSERT, UPDATE, DELETE, MERGE, TRUNCATE, a cursor's query at the COMMIT, a deferred trigger's) waits for
// the hold instead of committing; reads go on, and SHARE locks do not conflict with each other. When the router
// trusts the host again (the split brain ends with this host kept) the hold is rolled back and what waited
// goes on, on the primary the router trusts; a host demoted to a standby ends the hold's connection itself.
//
// Taking it: a transaction holding a conflicting lock blocks the LOCK. The proxy's own sessions in such a
// transaction end at the router's change (fencedHostsRefused, unplannedWritersRefused), so the LOCK waits
// first, under lock_timeout = health_timeout; when it times out, the backends still holding a conflicting lock
// on those tables are terminated (pg_terminate_backend, where the role may: a superuser, or a member of
// pg_signal_backend for a non-superuser's backends) and the LOCK is tried again. A prepared transaction
// (PREPARE TRANSACTION) that wrote a protected table holds its locks with no backend to terminate: a LOCK would
// wait for it forever, and each lock_timeout would let the writers queued behind the LOCK through, so none is
// tried while one holds such a lock (pg_locks shows no PID for it). Until the hold of a database is in place,
// the proxy's own sessions there are refused whatever they send (fail closed, writeHoldRefusal): a message
// that runs something waits for the hold's first attempt (up to its bound, holdAttempt; off the event loop, as
// a lock question), then ends the session with FATAL 55F04 unless the hold is in place. The databases of a
// host are taken at once (holdAll), so a writer blocking one does not keep the others waiting. Every failure is logged (error) and counted
// (fenceproxy_upstream_write_hold_failures_total{reason}), and tried again every health_interval, doubling up
// to 8 intervals, while the host is refused.
//
// What waits behind the hold: a session of the proxy's whose backend waits for a lock the hold holds is ended
// (endHeldBack), so that its client is not left waiting on a host whose writes will never be trusted: FATAL
// 55F04, the write not committed (the hold is still in place when the wait is cancelled, and stays until the
// backend no longer waits). Other clients' writes wait, until the hold is rolled back or the host demoted.
//
// The fast path does nothing: with no upstream.hosts there is no router, and on the host the router trusts
// (router.trusts: an atomic load) no session looks at holds.

// heldTables names, in farewells, the tables a write held back by the hold, or refused for want of one, was to.
const heldTables = "protected tables"

// writeHoldMetrics are the hold's series.
type writeHoldMetrics struct {
	databases  *prometheus.GaugeVec
	failures   *prometheus.CounterVec
	terminated prometheus.Counter
	ended      prometheus.Counter
}

func newWriteHoldMetrics(reg prometheus.Registerer) *writeHoldMetrics {
	m := &writeHoldMetrics{
		databases: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fenceproxy_upstream_write_hold_databases",
			Help: "Databases of an upstream host the router refuses fenced writes on whose protected tables it holds against writes now (LOCK ... IN SHARE MODE), by host and state (held, missing: wanted and not held yet)."}, []string{"host", "state"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fenceproxy_upstream_write_hold_failures_total",
			Help: "Attempts to hold a database's protected tables against writes on a refused host that failed, by reason (privilege, prepared: a prepared transaction holds a write's lock, timeout, terminate: a blocker could not be terminated, error)."}, []string{"reason"}),
		terminated: prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_upstream_write_hold_blockers_terminated_total",
			Help: "Backends terminated on a refused host because they held a write's lock on a protected table that kept the write hold from being taken."}),
		ended: prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_upstream_write_hold_sessions_ended_total",
			Help: "Sessions of the proxy's ended (55F04) because their write waited behind the write hold on a refused host."}),
	}
	reg.MustRegister(m.databases, m.failures, m.terminated, m.ended)
	return m
}

func (m *Metrics) writeHoldFailed(reason string) {
	if m != nil {
		m.writeHold.failures.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) writeHoldDatabases(host string, held, missing int) {
	if m != nil {
		m.writeHold.databases.WithLabelValues(host, "held").Set(float64(held))
		m.writeHold.databases.WithLabelValues(host, "missing").Set(float64(missing))
	}
}

func (m *Metrics) writeHoldTerminated(n int) {
	if m != nil {
		m.writeHold.terminated.Add(float64(n))
	}
}

func (m *Metrics) writeHoldEnded(n int) {
	if m != nil {
		m.writeHold.ended.Add(float64(n))
	}
}

// writeHolds are the router's holds, one per host it holds (hostHold).
type writeHolds struct {
	r   *router
	srv *Server
	mu  sync.Mutex
	// hosts are the hosts held now; a host released is removed at once (its goroutine rolls back after).
	hosts map[string]*hostHold
}

// hostHold is the hold of one host: its goroutine (run) takes and keeps a dbHold per database until stop.
type hostHold struct {
	host string
	stop chan struct{}
	wake chan struct{} // capacity 1: a session asks for a database not held yet
	mu   sync.Mutex
	dbs  map[string]*dbHold
}

// dbHold is the hold of one database of a host. Fields under hostHold.mu, but conn and pid, which only the
// host's goroutine touches.
type dbHold struct {
	settled chan struct{} // closed when the first attempt has an outcome
	inPlace bool
	why     string // why not in place, after an attempt
	next    time.Time
	backoff time.Duration
	conn    *pgx.Conn // the connection whose transaction holds the locks; nil when none
	pid     uint32
}

func newWriteHolds(r *router, srv *Server) *writeHolds {
	return &writeHolds{r: r, srv: srv, hosts: map[string]*hostHold{}}
}

// hostRefusal is writeRefusal for a session dialled to host now (in the current epoch).
func (r *router) hostRefusal(host string) string {
	r.mu.Lock()
	epoch := r.epoch
	r.mu.Unlock()
	return r.writeRefusal(host, epoch)
}

// trusts says, without the router's lock, whether h is the published primary in its epoch with no split brain:
// the host writeRefusal refuses nothing on (the fast path). false says nothing: writeRefusal decides.
func (r *router) trusts(h upstreamHost) bool {
	t := r.trusted.Load()
	return t != nil && *t == h
}

// trustLocked sets what trusts reads from the router's state (r.mu held).
func (r *router) trustLocked() {
	if len(r.splitBrain) > 1 || r.primary == "" {
		r.trusted.Store(nil)
		return
	}
	r.trusted.Store(&upstreamHost{addr: r.primary, epoch: r.epoch})
}

// heldHostsLocked lists the hosts to hold (r.mu held): those that claim to be a primary, or are a withdrawn
// one not in recovery (read-only), that writeRefusal refuses now. A sole primary, with no split brain, is the
// published one or the one about to be published after its barrier: not held (the barrier writes there).
func (r *router) heldHostsLocked() map[string]bool {
	want := map[string]bool{}
	split := len(r.splitBrain) > 1
	for _, h := range r.hosts {
		switch r.roles[h] {
		case rolePrimary:
			if split {
				want[h] = true
			}
		case roleReadOnly:
			if split || r.target == config.TargetReadWrite && h != r.primary {
				want[h] = true
			}
		}
	}
	return want
}

// reconcile takes the holds the router's state asks for and rolls back those it no longer does; called by the
// coordinator after each change (nil: no router). A host whose check fails (down, unknown) keeps its hold: it
// may still run, unseen, and its hold's connection tells by itself whether it does.
func (w *writeHolds) reconcile() {
	if w == nil {
		return
	}
	w.r.mu.Lock()
	want := w.r.heldHostsLocked()
	roles := make(map[string]hostRole, len(w.r.roles))
	for h, role := range w.r.roles {
		roles[h] = role
	}
	w.r.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	for host, hh := range w.hosts {
		if !want[host] && roles[host] != roleDown && roles[host] != roleUnknown {
			delete(w.hosts, host)
			close(hh.stop)
			w.r.log.Info("write hold released", "host", host, "role", roles[host].String())
		}
	}
	for host := range want {
		if w.hosts[host] == nil {
			hh := &hostHold{host: host, stop: make(chan struct{}), wake: make(chan struct{}, 1), dbs: map[string]*dbHold{}}
			w.hosts[host] = hh
			w.r.log.Warn("write hold: holding the protected tables of a refused host against writes", "host", host)
			go w.run(hh)
		}
	}
}

// close releases every hold (the router stops).
func (w *writeHolds) close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for host, hh := range w.hosts {
		delete(w.hosts, host)
		close(hh.stop)
	}
}

// inPlace says whether the hold of database db on host is in place; when it is not, it asks for it (the host's
// goroutine takes it) and returns what to wait on for its first outcome (nil: the host is not held at all).
func (w *writeHolds) inPlace(host, db string) (bool, <-chan struct{}) {
	if w == nil {
		return true, nil // a router of its own (tests): nothing holds, nothing waits for it
	}
	w.mu.Lock()
	hh := w.hosts[host]
	w.mu.Unlock()
	if hh == nil {
		return false, nil
	}
	hh.mu.Lock()
	defer hh.mu.Unlock()
	d := hh.dbs[db]
	if d == nil {
		d = &dbHold{settled: make(chan struct{})}
		hh.dbs[db] = d
		select {
		case hh.wake <- struct{}{}:
		default:
		}
	}
	return d.inPlace, d.settled
}

// writeHoldRefusal is the fail-closed rule for a session whose host the router refuses fenced writes on (why):
// a message that runs something goes only once the hold of the session's database there is in place. It waits
// for the hold's first outcome, up to the attempt's own bound (holdAttempt; with the event loop off the loop,
// as a lock question: errLockQuestionAsked, the message coming again with the answer); nil when the hold is
// in place, else the session's farewell (FATAL 55F04).
func (ss *session) writeHoldRefusal(why string) error {
	r := ss.srv.router
	db := ss.sessionDatabase()
	held, settled := r.holds.inPlace(ss.host.addr, db)
	if held {
		return nil
	}
	if settled != nil {
		// Waited for as a lock question is (lockquestion.go): off the event loop, whose other sessions go on.
		if _, ok := ss.lockAnswer(lockQuestion{host: ss.host.addr, db: db, hold: settled}); !ok {
			return errLockQuestionAsked
		}
		if held, _ = r.holds.inPlace(ss.host.addr, db); held {
			return nil
		}
	}
	return &sessionRefused{code: sqlstateUnfenceable,
		msg:    fmt.Sprintf("unfenceable write to %s: %s, and fenceproxy could not hold the protected tables of database %s there against writes", heldTables, why, db),
		detail: "Nothing of this message reached the server. fenceproxy refuses every message that runs something on that host until its write hold is in place (docs/ha.md, the write hold).",
		hint:   "Connect again: once the hold is in place, or the router trusts a primary, sessions go on."}
}

// run keeps the hold of hh's host until stop: every database of the host and every one a session asked for is
// held (hold), each hold's connection is checked, and the proxy's sessions waiting behind a hold are ended
// (endHeldBack), every health_interval or when a session asks for a database.
func (w *writeHolds) run(hh *hostHold) {
	r := w.r
	defer func() {
		hh.mu.Lock()
		for _, d := range hh.dbs {
			if d.conn != nil {
				ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
				d.conn.Exec(ctx, "ROLLBACK") //nolint:errcheck // the close rolls back as well
				d.conn.Close(ctx)
				cancel()
				d.conn, d.inPlace = nil, false
			}
		}
		hh.mu.Unlock()
		w.mu.Lock()
		again := w.hosts[hh.host] != nil // held again since (a second change): its own goroutine counts it
		w.mu.Unlock()
		if !again {
			r.metrics.writeHoldDatabases(hh.host, 0, 0)
		}
	}()
	var listed time.Time
	var scratch *pgx.Conn // the health database, for what may fail: never the hold's transaction
	defer func() {
		if scratch != nil {
			scratch.Close(context.Background())
		}
	}()
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		if scratch == nil || scratch.IsClosed() {
			scratch = nil
			if c, err := w.connect(hh.host, ""); err != nil {
				r.log.Error("write hold: could not connect to a refused host", "host", hh.host, "error", err)
			} else {
				scratch = c
			}
		}
		if scratch != nil && time.Since(listed) >= r.interval {
			if dbs, err := w.databases(scratch); err != nil {
				r.log.Error("write hold: could not list the databases of a refused host", "host", hh.host, "error", err)
				scratch.Close(context.Background())
				scratch = nil
			} else {
				listed = time.Now()
				hh.mu.Lock()
				for _, db := range dbs {
					if hh.dbs[db] == nil {
						hh.dbs[db] = &dbHold{settled: make(chan struct{})}
					}
				}
				hh.mu.Unlock()
			}
		}
		w.holdAll(hh)
		if scratch != nil {
			w.endHeldBack(hh, scratch)
		}
		select {
		case <-hh.stop:
			return
		case <-hh.wake:
		case <-t.C:
		}
	}
}

// holdAll takes the holds of hh's databases that are not in place and due, and checks those that are. The
// databases are taken at once, each on a goroutine of its own: one whose LOCK waits for a writer (up to two
// lock_timeouts) must not keep the others' holds, and the sessions waiting for them, waiting as long
// (TestWriteHoldWaitLeavesItsEventLoopFree: a read in another database was refused after health_timeout).
func (w *writeHolds) holdAll(hh *hostHold) {
	r := w.r
	hh.mu.Lock()
	names := make([]string, 0, len(hh.dbs))
	for db := range hh.dbs {
		names = append(names, db)
	}
	hh.mu.Unlock()
	var wg sync.WaitGroup
	for _, db := range names {
		select {
		case <-hh.stop:
			wg.Wait()
			return
		default:
		}
		hh.mu.Lock()
		d := hh.dbs[db]
		inPlace, due := d.inPlace, time.Now().After(d.next)
		hh.mu.Unlock()
		if inPlace && d.conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
			_, err := d.conn.Exec(ctx, "SELECT 1")
			cancel()
			if err != nil {
				r.log.Error("write hold: the connection holding a database of a refused host was lost; taking it again", "host", hh.host, "database", db, "error", err)
				d.conn.Close(context.Background())
				hh.mu.Lock()
				d.conn, d.inPlace, d.why, due = nil, false, err.Error(), true
				hh.mu.Unlock()
			}
		}
		hh.mu.Lock()
		inPlace = d.inPlace
		hh.mu.Unlock()
		if !inPlace && due {
			wg.Go(func() {
				err := w.hold(hh, db, d)
				hh.mu.Lock()
				defer hh.mu.Unlock()
				if err != nil {
					d.why = err.Error()
					d.backoff = min(max(2*d.backoff, r.interval), 8*r.interval)
					d.next = time.Now().Add(d.backoff)
				} else {
					d.inPlace, d.why, d.backoff = true, "", 0
				}
				select {
				case <-d.settled:
				default:
					close(d.settled)
				}
			})
		}
	}
	wg.Wait()
	held, missing := 0, 0
	hh.mu.Lock()
	for _, db := range names {
		if d := hh.dbs[db]; d != nil && d.inPlace {
			held++
		} else {
			missing++
		}
	}
	hh.mu.Unlock()
	r.metrics.writeHoldDatabases(hh.host, held, missing)
}

// holdFailure is a failed attempt to hold a database, with the reason it is counted by.
type holdFailure struct {
	reason string
	err    error
}

func (e *holdFailure) Error() string { return e.err.Error() }

// hold takes the hold of database db on hh's host into d: logged and counted when it fails.
func (w *writeHolds) hold(hh *hostHold, db string, d *dbHold) error {
	err := w.take(hh, db, d)
	if err != nil {
		reason := "error"
		var f *holdFailure
		if errors.As(err, &f) {
			reason = f.reason
		}
		w.r.metrics.writeHoldFailed(reason)
		w.r.log.Error("write hold: could not hold the protected tables of a refused host against writes; the proxy's sessions in that database there are refused until it is in place",
			"host", hh.host, "database", db, "reason", reason, "error", err)
		return err
	}
	return nil
}

// holdersSQL lists the backends holding, in the current database, a lock on one of the relations $1 or their
// inheritance children or partitions (what LOCK recurses to) that conflicts with SHARE: a write's. A prepared
// transaction's locks show no PID (NULL).
const holdersSQL = `WITH RECURSIVE rel(oid) AS (
	SELECT pg_catalog.unnest($1::pg_catalog.oid[])
	UNION
	SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN rel ON i.inhparent = rel.oid
)
SELECT DISTINCT l.pid FROM pg_catalog.pg_locks l JOIN rel ON l.relation = rel.oid
WHERE l.locktype = 'relation' AND l.granted
	AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
	AND l.mode IN ('RowExclusiveLock', 'ShareUpdateExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
	AND l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()`

// tablesSQL lists the tables of the current database a write may go to (ordinary and partitioned, not another
// session's temporary ones), as schema, name and OID; the planner says which it protects.
const tablesSQL = `SELECT n.nspname::text, c.relname::text, c.oid FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND c.relpersistence <> 't'
	AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_toast%'`

// take opens d's connection when needed and LOCKs the protected tables of db in a transaction it leaves open.
func (w *writeHolds) take(hh *hostHold, db string, d *dbHold) error {
	r := w.r
	ctx, cancel := context.WithTimeout(context.Background(), r.holdAttempt())
	defer cancel()
	if d.conn == nil || d.conn.IsClosed() {
		c, err := w.connect(hh.host, db)
		if err != nil {
			return &holdFailure{"error", err}
		}
		d.conn, d.pid = c, c.PgConn().PID()
	}
	conn := d.conn
	fail := func(reason string, err error) error {
		conn.Close(context.Background())
		d.conn = nil
		return &holdFailure{reason, err}
	}
	rows, err := conn.Query(ctx, tablesSQL)
	if err != nil {
		return fail("error", fmt.Errorf("list the tables of database %s: %w", db, err))
	}
	var names []string
	var oids []uint32
	for rows.Next() {
		var rel [2]string
		var oid uint32
		if err := rows.Scan(&rel[0], &rel[1], &oid); err != nil {
			rows.Close()
			return fail("error", fmt.Errorf("list the tables of database %s: %w", db, err))
		}
		if w.srv.protectedOf([][2]string{rel}) != "" {
			names = append(names, pgx.Identifier{rel[0], rel[1]}.Sanitize())
			oids = append(oids, oid)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail("error", fmt.Errorf("list the tables of database %s: %w", db, err))
	}
	if len(names) == 0 {
		conn.Close(context.Background()) // nothing to hold: no connection kept
		d.conn = nil
		return nil
	}
	lock := "LOCK TABLE " + strings.Join(names, ", ") + " IN SHARE MODE"
	for try := 0; ; try++ {
		var holders []*int32
		rows, err := conn.Query(ctx, holdersSQL, oids)
		if err == nil {
			holders, err = pgx.CollectRows(rows, pgx.RowTo[*int32])
		}
		if err != nil {
			return fail("error", fmt.Errorf("read the locks on the protected tables of database %s: %w", db, err))
		}
		for _, pid := range holders {
			if pid == nil {
				// No LOCK while a prepared transaction holds a write's lock: it would wait for it forever, and each
				// lock_timeout would let the writers queued behind the LOCK through.
				return fail("prepared", fmt.Errorf("a prepared transaction holds a write's lock on a protected table of database %s (pg_prepared_xacts): it must be committed or rolled back on the primary kept, and rolled back here", db))
			}
		}
		// The proxy's own sessions among them end as a session whose transaction wrote a protected table on a
		// refused host does (55F04, or 08007 with a statement running): a pooled one is judged only at its next
		// message, which may never come. The others are terminated once the LOCK has waited for them.
		own := w.srv.endHeldBack(hh.host, pidSet(holders), w.r.hostRefusal(hh.host), false)
		if try > 0 {
			if err := w.terminate(ctx, conn, holders, own); err != nil {
				return fail("terminate", fmt.Errorf("terminate the backends %v holding a write's lock on a protected table of database %s: %w", derefPIDs(holders), db, err))
			}
		}
		err = w.lockIn(ctx, conn, lock)
		if err == nil {
			w.r.log.Warn("write hold in place: the protected tables of a refused host wait for the router to trust it again", "host", hh.host, "database", db, "tables", len(names))
			return nil
		}
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == sqlstateInsufficientPrivilege:
			return fail("privilege", fmt.Errorf("%s in database %s: %w (the health role needs UPDATE, DELETE or TRUNCATE on each protected table)", lock, db, err))
		case errors.As(err, &pgErr) && pgErr.Code == sqlstateLockNotAvailable && try == 0:
			continue // the blockers are terminated, then the LOCK is tried again
		case errors.As(err, &pgErr) && pgErr.Code == sqlstateLockNotAvailable:
			return fail("timeout", fmt.Errorf("%s in database %s: %w", lock, db, err))
		}
		return fail("error", fmt.Errorf("%s in database %s: %w", lock, db, err))
	}
}

// holdAttempt bounds one attempt to hold a database (take): a connection, two LOCKs of lock_timeout
// (health_timeout) with the terminations between them. A session waiting for the attempt's outcome
// (writeHoldRefusal) waits as long, so that it is refused only when the hold failed, not while it is being
// taken.
func (r *router) holdAttempt() time.Duration { return 4 * r.timeout }

// sqlstateLockNotAvailable is lock_timeout's error.
const sqlstateLockNotAvailable = "55P03"

// lockIn runs lock in a transaction of conn left open when it succeeds (rolled back when it fails). READ WRITE
// explicitly: a withdrawn primary may be read-only by default_transaction_read_only, and PostgreSQL refuses a
// LOCK stronger than ROW EXCLUSIVE in a read-only transaction.
func (w *writeHolds) lockIn(ctx context.Context, conn *pgx.Conn, lock string) error {
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE"); err != nil {
		return err
	}
	timeout := fmt.Sprintf("SET LOCAL lock_timeout = %d", max(w.r.timeout.Milliseconds(), 1))
	if _, err := conn.Exec(ctx, timeout); err != nil {
		conn.Exec(ctx, "ROLLBACK") //nolint:errcheck // the error said what failed
		return err
	}
	if _, err := conn.Exec(ctx, lock); err != nil {
		conn.Exec(ctx, "ROLLBACK") //nolint:errcheck // the error said what failed
		return err
	}
	return nil
}

// terminate ends the backends pids (a write's lock holders; a prepared transaction's is none of them) but the
// proxy's own sessions' (own), ended already.
func (w *writeHolds) terminate(ctx context.Context, conn *pgx.Conn, pids []*int32, own []uint32) error {
	n := 0
	defer func() { w.r.metrics.writeHoldTerminated(n) }()
	for _, pid := range pids {
		if pid == nil || slices.Contains(own, uint32(*pid)) {
			continue
		}
		var done bool
		if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_terminate_backend($1, $2)", *pid, w.r.timeout.Milliseconds()).Scan(&done); err != nil {
			return err
		}
		if done {
			n++
		}
	}
	if n > 0 {
		w.r.log.Warn("write hold: terminated backends holding a write's lock on a protected table of a refused host", "terminated", n)
	}
	return nil
}

// pidSet is the PIDs of pids, NULL left out.
func pidSet(pids []*int32) map[uint32]bool {
	set := make(map[uint32]bool, len(pids))
	for _, p := range pids {
		if p != nil {
			set[uint32(*p)] = true
		}
	}
	return set
}

func derefPIDs(pids []*int32) []int32 {
	out := make([]int32, 0, len(pids))
	for _, p := range pids {
		if p != nil {
			out = append(out, *p)
		}
	}
	return out
}

// databases lists, over conn, the databases of its host that allow connections, as the barrier does.
func (w *writeHolds) databases(conn *pgx.Conn) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), w.r.timeout)
	defer cancel()
	rows, err := conn.Query(ctx, "SELECT datname FROM pg_catalog.pg_database WHERE datallowconn AND NOT datistemplate ORDER BY 1")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// connect opens a connection of the health role to database db of host ("": the health database), as the
// router's other connections log in (search_path pinned), with the timeouts that would end a transaction left
// open turned off for it.
func (w *writeHolds) connect(host, db string) (*pgx.Conn, error) {
	cc, err := w.r.login(host)
	if err != nil {
		return nil, err
	}
	if db != "" {
		cc.Database = db
	}
	cc.RuntimeParams["application_name"] = "fenceproxy: write hold"
	cc.RuntimeParams["idle_in_transaction_session_timeout"] = "0"
	cc.RuntimeParams["statement_timeout"] = "0"
	ctx, cancel := context.WithTimeout(context.Background(), w.r.timeout)
	defer cancel()
	conn, err := connectOwnRole(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("connect to %s, database %s: %w", host, cc.Database, err)
	}
	return conn, nil
}

// heldBackSQL lists the backends that wait for a lock one of the PIDs $1 (the holds' backends) holds or waits
// ahead of them for.
const heldBackSQL = `SELECT a.pid FROM pg_catalog.pg_stat_activity a
WHERE a.wait_event_type = 'Lock' AND pg_catalog.pg_blocking_pids(a.pid) OPERATOR(pg_catalog.&&) $1::pg_catalog.int4[]`

// endHeldBack ends the proxy's sessions whose backend on hh's host waits behind one of its holds: their write
// did not and will not commit there while the router refuses the host. Each is ended as a session whose
// transaction wrote a protected table is (its upstream shut, then what runs cancelled), told FATAL 55F04 (not
// 08007: what it waited to write has not committed), and the hold stays until its backend no longer waits
// (bounded by health_timeout), so that a release cannot let the write through after the client was told it did
// not commit.
func (w *writeHolds) endHeldBack(hh *hostHold, scratch *pgx.Conn) {
	r := w.r
	hh.mu.Lock()
	var holds []int32
	for _, d := range hh.dbs {
		if d.inPlace && d.conn != nil {
			holds = append(holds, int32(d.pid))
		}
	}
	hh.mu.Unlock()
	if len(holds) == 0 {
		return
	}
	waiting := func() map[uint32]bool {
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
		defer cancel()
		rows, err := scratch.Query(ctx, heldBackSQL, holds)
		if err != nil {
			r.log.Warn("write hold: could not list the backends waiting behind the hold", "host", hh.host, "error", err)
			return nil
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return nil
		}
		set := map[uint32]bool{}
		for _, p := range pids {
			set[uint32(p)] = true
		}
		return set
	}
	pids := waiting()
	if len(pids) == 0 {
		return
	}
	why := r.hostRefusal(hh.host)
	if why == "" {
		return // trusted again: the hold is about to be rolled back, and the write goes on
	}
	ended := w.srv.endHeldBack(hh.host, pids, why, true)
	if len(ended) == 0 {
		return
	}
	r.metrics.writeHoldEnded(len(ended))
	deadline := time.Now().Add(r.timeout)
	for time.Now().Before(deadline) {
		still := waiting()
		n := 0
		for _, pid := range ended {
			if still[pid] {
				n++
			}
		}
		if n == 0 {
			return
		}
		select {
		case <-hh.stop:
			// Released meanwhile: the router trusts the host again, where the write may go on.
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	r.log.Warn("write hold: a session of the proxy's ended behind the hold still waits there", "host", hh.host, "pids", ended)
}

// endHeldBack ends the proxy's sessions on host whose backend's PID is in pids and returns those PIDs: a
// session-mode session's upstream, a pooled session's lent server connection, as endFencedTx does (the
// connection shut, then what runs there cancelled). heldBack: their backends wait behind the hold
// (writeHolds.endHeldBack), so nothing they sent commits (55F04 even with an answer owed); else they hold a
// write's lock the hold waits for (take): 08007 when a statement's answer is owed, as for any transaction that
// wrote a protected table there.
func (s *Server) endHeldBack(host string, pids map[uint32]bool, why string, heldBack bool) []uint32 {
	if why == "" || len(pids) == 0 {
		return nil // trusted again, or nothing to end
	}
	var ended []uint32
	var sessions []*session
	s.mu.Lock()
	for ss := range s.sessions {
		// ready before cancelKey: the server side writes the key before it publishes ready.
		if ss.pooled == nil && ss.host.addr == host && ss.state.ready.Load() && len(ss.cancelKey) >= 4 && pids[binary.BigEndian.Uint32(ss.cancelKey)] {
			sessions = append(sessions, ss)
		}
	}
	s.mu.Unlock()
	for _, ss := range sessions {
		ended = append(ended, binary.BigEndian.Uint32(ss.cancelKey))
		ss.endedUncommitted.Store(heldBack)
		ss.endFencedTx(why, heldTables)
	}
	if s.pools == nil {
		return ended
	}
	for _, p := range s.pools.list() {
		var lent []*serverConn
		p.mu.Lock()
		for sc := range p.live {
			if sc.host.addr == host && len(sc.key) >= 4 && pids[binary.BigEndian.Uint32(sc.key)] {
				lent = append(lent, sc)
			}
		}
		p.mu.Unlock()
		for _, sc := range lent {
			ended = append(ended, binary.BigEndian.Uint32(sc.key))
			ss := sc.lentBy.Load()
			if ss != nil {
				ss.endedUncommitted.Store(heldBack)
				ss.fencedTxEnded.Store(&[2]string{why, heldTables})
			}
			sc.closeUnderRelay()
			s.cancelUpstream(sc.key, sc.host.addr)
			// Read after the close: a message counted pending before it may have reached the server; one counted
			// after never does. The client is told its next message was not answered (08007) only in the first case.
			if ss != nil && ss.state.pending.Load() == 0 {
				ss.endedUncommitted.Store(true)
			}
		}
	}
	return ended
}
