package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/schema"
)

// The router knows which of upstream.hosts is the primary (docs/ha.md). One goroutine per host checks it every
// health_interval over one connection of its own (pg_is_in_recovery, default_transaction_read_only, and on the
// primary the lock marks, which are the marks the proxy saw accepted); sessions tell it sooner when their own
// connection to the primary reports in_hot_standby on (ParameterStatus, PostgreSQL 14+: a primary restarted as a
// standby). One
// goroutine, the coordinator, decides from what the checks found, so a primary change is one event, in this
// order (the old primary, no longer claiming to be one, is withdrawn first: no fenced write and no new
// read-write session goes to it while the barrier runs):
//
//  1. the barrier runs on the new primary: every lock's mark is raised to at least the newest token the lock
//     service granted for it and the highest mark the proxy saw accepted (schema.RaiseMarks);
//  2. only then is the new primary published: new read-write sessions are dialled to it (dialUpstream) and
//     none before, so no write reaches it before the barrier;
//  3. sessions on the old primary, and sessions opened on the new one before it was published, end (57P01
//     naming the new primary, or 08007 when a statement's answer was lost). Connections kept for reuse in an
//     earlier epoch were closed already, at the withdrawal as at the publication (epochMoved): none is ever
//     taken again.
//
// A barrier that fails publishes nothing: read-write sessions wait for a primary (up to their connect
// deadline) and the barrier is tried again at the next check. Two hosts that both claim to be primary (split
// brain) keep the published primary, if any, but every fenced write is refused (55F04 naming both) until one
// of them is demoted.

// hostRole is what a host's last check found.
type hostRole uint8

const (
	roleUnknown  hostRole = iota // not checked yet
	roleDown                     // the check failed
	rolePrimary                  // not in recovery, default_transaction_read_only off
	roleReadOnly                 // not in recovery, default_transaction_read_only on
	roleStandby                  // in recovery (hot standby)
)

var roleNames = [...]string{"unknown", "down", "primary", "read-only", "standby"}

func (r hostRole) String() string { return roleNames[r] }

// GrantSource is the lock service the barrier asks, per lock, for the newest token it granted
// (tokens.EtcdStore.Granted).
type GrantSource interface {
	Granted(ctx context.Context) (map[string]int64, error)
}

// router follows the primary among upstream.hosts.
type router struct {
	hosts    []string
	target   string
	interval time.Duration
	timeout  time.Duration
	login    func(host string) (*pgx.ConnConfig, error)
	grants   GrantSource // nil: the barrier raises marks to what the proxy saw only
	log      *slog.Logger
	metrics  *Metrics
	// changed is called by the coordinator after a primary change is published (step 3 above).
	changed func(old, now string, epoch uint64)
	// epochMoved is called by the coordinator at every change of the epoch, a withdrawal too, before changed:
	// what was dialled in an earlier epoch is never dialled again (upstreamPool.dropBefore).
	epochMoved func(epoch uint64)
	// refusing is called by the coordinator, outside mu, after a change that may make writeRefusal refuse a host
	// it trusted before: a split brain begins, or a primary is withdrawn or replaced.
	refusing func()
	// holds hold the protected tables of the hosts writeRefusal refuses against writes (writehold.go); trusted is
	// the host it refuses nothing on, for the sessions' fast path (trusts).
	holds   *writeHolds
	trusted atomic.Pointer[upstreamHost]

	kick chan struct{} // wakes the coordinator; capacity 1
	stop chan struct{}
	wg   sync.WaitGroup

	mu         sync.Mutex
	roles      map[string]hostRole
	lastErr    map[string]error
	primary    string        // the published primary, "" when none
	former     string        // the last primary published before it, whose sessions end at the next one
	epoch      uint64        // increases at every publication or withdrawal of a primary
	published  chan struct{} // closed (and replaced) at every change of primary
	splitBrain []string      // the hosts that both claim to be primary, when more than one does
	seenMarks  map[string]int64
}

func newRouter(cfg *config.Config, tlsFor func(host string) *tls.Config, grants GrantSource, log *slog.Logger, m *Metrics) (*router, error) {
	u := cfg.Upstream
	password := ""
	if u.Health.PasswordFile != "" {
		b, err := os.ReadFile(u.Health.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("upstream.health.password_file: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	r := &router{
		hosts:     slices.Clone(u.HostList()),
		target:    u.Target,
		interval:  u.HealthInterval,
		timeout:   u.HealthTimeout,
		grants:    grants,
		log:       log,
		metrics:   m,
		kick:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		roles:     map[string]hostRole{},
		lastErr:   map[string]error{},
		published: make(chan struct{}),
		seenMarks: map[string]int64{},
	}
	r.login = func(host string) (*pgx.ConnConfig, error) {
		h, port, err := net.SplitHostPort(host)
		if err != nil {
			return nil, err
		}
		cc, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%s sslmode=disable", h, port))
		if err != nil {
			return nil, err
		}
		cc.User, cc.Database, cc.Password = u.Health.User, u.Health.Database, password
		cc.ConnectTimeout = u.HealthTimeout
		// search_path pinned, as for the auth query: what these connections ask (the lock question of
		// unplanned.go above all) runs in a client's database, whose settings (ALTER DATABASE or ROLE ... SET
		// search_path) could otherwise put a user's operator or function before pg_catalog's and change the
		// answer. A startup parameter overrides those settings.
		cc.RuntimeParams = map[string]string{"application_name": "fenceproxy: health check", "search_path": "pg_catalog"}
		cc.TLSConfig = tlsFor(host)
		return cc, nil
	}
	return r, nil
}

// start runs the checks and the coordinator until close.
func (r *router) start() {
	for _, h := range r.hosts {
		r.wg.Add(1)
		go r.checkLoop(h)
	}
	r.wg.Add(1)
	go r.coordinate()
}

func (r *router) close() {
	close(r.stop)
	r.wg.Wait()
	r.holds.close()
}

// pick returns the host a new session with the router's target goes to, and the epoch it was chosen in,
// waiting (as long as ctx allows) while there is none.
func (r *router) pick(ctx context.Context) (string, uint64, error) {
	for {
		r.mu.Lock()
		host, epoch, wait := r.choose(), r.epoch, r.published
		r.mu.Unlock()
		if host != "" {
			return host, epoch, nil
		}
		select {
		case <-wait:
		case <-time.After(r.interval): // a standby's role may change without a change of primary
		case <-ctx.Done():
			return "", 0, fmt.Errorf("no upstream host is %s (%s): %w", r.target, r.describe(), ctx.Err())
		}
	}
}

// choose is pick's choice now, "" when no host fits; under mu.
func (r *router) choose() string {
	switch r.target {
	case config.TargetReadWrite:
		return r.primary
	case config.TargetReadOnly:
		return r.first(roleStandby, roleReadOnly)
	case config.TargetPreferStandby:
		if h := r.first(roleStandby); h != "" {
			return h
		}
		return r.first(rolePrimary, roleReadOnly)
	}
	// any: the first host that is up, but a primary only once published (after its barrier).
	for _, h := range r.hosts {
		if role := r.roles[h]; role == roleStandby || role == roleReadOnly || role == rolePrimary && h == r.primary {
			return h
		}
	}
	return ""
}

// first is the first host, in configuration order, with one of roles; under mu. A primary counts only once
// published.
func (r *router) first(roles ...hostRole) string {
	for _, h := range r.hosts {
		role := r.roles[h]
		if slices.Contains(roles, role) && (role != rolePrimary || h == r.primary) {
			return h
		}
	}
	return ""
}

// describe lists each host's role, for messages.
func (r *router) describe() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	parts := make([]string, 0, len(r.hosts))
	for _, h := range r.hosts {
		s := h + " " + r.roles[h].String()
		if err := r.lastErr[h]; err != nil && r.roles[h] == roleDown {
			s += ": " + err.Error()
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// writeRefusal says why a fenced write by a session on host, dialled in epoch, must be refused now (""
// when it may go): two hosts claim to be primary, or the session's host is no longer the published primary
// (its session is being ended). Only read-write sessions write through the router's guarantees.
func (r *router) writeRefusal(host string, epoch uint64) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case len(r.splitBrain) > 1:
		return fmt.Sprintf("two hosts claim to be primary (%s); writes to protected tables are refused until one is demoted", strings.Join(r.splitBrain, " and "))
	case r.target == config.TargetReadWrite && !r.isPublishedPrimary(upstreamHost{addr: host, epoch: epoch}):
		now := r.primary
		if now == "" {
			now = "none yet"
		}
		return fmt.Sprintf("the session's host %s is no longer the primary (now %s)", host, now)
	}
	return ""
}

// superseded reports whether a session dialled to h must end because a primary change published since
// concerns its host (as primaryChanged decides for the sessions registered then), and the new primary.
func (r *router) superseded(h upstreamHost) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.primary, r.supersededLocked(h)
}

// supersededLocked is superseded's rule (r.mu held): a primary published since h was dialled, h being the
// former primary or the new one dialled in an older epoch.
func (r *router) supersededLocked(h upstreamHost) bool {
	return r.primary != "" && h.epoch < r.epoch && (h.addr == r.former || h.addr == r.primary)
}

// isPublishedPrimary reports whether h is the published primary in the epoch it was published in (r.mu held):
// what a read-write session or pooled connection must be dialled to, for a fenced write (writeRefusal) and for
// a pooled transaction (stale).
func (r *router) isPublishedPrimary(h upstreamHost) bool {
	return h.addr == r.primary && h.epoch == r.epoch
}

// stale reports whether a pooled server connection dialled to h must serve no further transaction. A pooled
// client between transactions is bound to no host, so each transaction goes where a new session would: for
// read-write, only a connection dialled to the published primary in the epoch it was published in serves
// one, and none while no primary is published (the lend dials, and waits for the next primary as a new
// session does); a connection left on a withdrawn primary would run the transaction on a host the router no
// longer trusts. For the other targets, the connections a published change of primary left behind
// (superseded).
func (r *router) stale(h upstreamHost) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.target == config.TargetReadWrite {
		return !r.isPublishedPrimary(h)
	}
	return r.supersededLocked(h)
}

// observe is told a ParameterStatus a session's upstream connection on host reported: in_hot_standby on, from
// the published primary, makes it a standby and the coordinator decide now, before the next check.
// default_transaction_read_only is not taken from sessions: a client may SET it in its own session, and that
// must not move the primary; the health check reads the server's own value.
func (r *router) observe(host, name, value string) {
	if name != "in_hot_standby" || value != "on" {
		return
	}
	r.mu.Lock()
	primary := host == r.primary
	if primary {
		r.roles[host] = roleStandby
	}
	r.mu.Unlock()
	if primary {
		r.wake()
	}
}

func (r *router) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// checkLoop checks host every interval until the router stops.
func (r *router) checkLoop(host string) {
	defer r.wg.Done()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
		role, marks, err := r.check(ctx, host, &conn)
		cancel()
		r.mu.Lock()
		old := r.roles[host]
		r.roles[host], r.lastErr[host] = role, err
		if role == rolePrimary && host == r.primary {
			for name, m := range marks {
				r.seenMarks[name] = max(r.seenMarks[name], m)
			}
		}
		r.mu.Unlock()
		r.metrics.hostRole(host, role)
		if old != role {
			r.log.Info("upstream host role", "host", host, "role", role.String(), "was", old.String(), "err", err)
			r.wake()
		}
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
	}
}

// check finds host's role over *conn (connecting when needed), and on a primary its lock marks.
func (r *router) check(ctx context.Context, host string, conn **pgx.Conn) (hostRole, map[string]int64, error) {
	if *conn == nil || (*conn).IsClosed() {
		cc, err := r.login(host)
		if err != nil {
			return roleDown, nil, err
		}
		c, err := connectOwnRole(ctx, cc)
		if err != nil {
			return roleDown, nil, err
		}
		*conn = c
	}
	c := *conn
	var recovery bool
	var readOnly string
	err := c.QueryRow(ctx, "SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('default_transaction_read_only')").Scan(&recovery, &readOnly)
	if err != nil {
		c.Close(context.Background())
		*conn = nil
		return roleDown, nil, err
	}
	switch {
	case recovery:
		return roleStandby, nil, nil
	case readOnly == "on":
		return roleReadOnly, nil, nil
	}
	marks, err := schema.Marks(ctx, c)
	if err != nil {
		// The role is known; the marks are read again at the next check.
		r.log.Warn("could not read the primary's lock marks", "host", host, "err", err)
		return rolePrimary, nil, nil
	}
	return rolePrimary, marks, nil
}

// coordinate decides primary changes, one at a time, whenever a check or a session wakes it.
func (r *router) coordinate() {
	defer r.wg.Done()
	for {
		select {
		case <-r.stop:
			return
		case <-r.kick:
		}
		r.decide()
	}
}

// decide acts on the hosts' roles now.
func (r *router) decide() {
	defer r.holds.reconcile() // a split brain over, a host demoted: the holds no longer wanted are rolled back
	r.mu.Lock()
	var primaries []string
	for _, h := range r.hosts {
		if r.roles[h] == rolePrimary {
			primaries = append(primaries, h)
		}
	}
	cur := r.primary
	if len(primaries) > 1 {
		begins := !slices.Equal(primaries, r.splitBrain)
		if begins {
			r.log.Error("split brain: several hosts claim to be primary; fenced writes are refused", "hosts", primaries)
			r.metrics.splitBrain(true)
		}
		r.splitBrain = primaries
		r.trustLocked()
		r.mu.Unlock()
		r.holds.reconcile()
		if begins && r.refusing != nil {
			r.refusing()
		}
		return
	}
	if r.splitBrain != nil {
		r.log.Info("split brain over", "primaries", primaries)
		r.metrics.splitBrain(false)
	}
	r.splitBrain = nil
	r.trustLocked()
	r.mu.Unlock()

	switch {
	case len(primaries) == 1 && primaries[0] == cur:
		return
	case len(primaries) == 1:
		next := primaries[0]
		if cur != "" {
			// The published primary stopped claiming to be one (down, read-only, a standby) while another
			// does: it is withdrawn before the barrier runs, not after. The barrier may take up to
			// 4*health_timeout, and a fenced write relayed to the old host meanwhile (a transaction opened
			// READ WRITE there, or one whose bytes wait in a frozen server's socket) commits where the new
			// primary never sees it. Withdrawn, the old host gets no fenced write (writeRefusal) and no new
			// read-write session; its sessions still end when next is published, naming it (former).
			r.publish(cur, "")
		}
		raised, err := r.barrier(next)
		if err != nil {
			r.metrics.barrierRun("failed", 0)
			r.log.Error("failover barrier failed; no primary is published until it succeeds", "host", next, "err", err)
			time.AfterFunc(r.interval, r.wake)
			return
		}
		r.metrics.barrierRun("done", raised)
		r.publish("", next)
	case cur != "":
		r.publish(cur, "")
	}
}

// publish makes now the primary in place of old (either may be "": none). Withdrawing a primary stops new
// read-write sessions and fenced writes (writeRefusal) at once; the sessions on the former primary end when the
// next one is published, so that their farewell can name it.
func (r *router) publish(old, now string) {
	r.mu.Lock()
	if r.primary != old || old == now {
		r.mu.Unlock()
		return
	}
	if old != "" {
		r.former = old
	}
	former := r.former
	r.primary = now
	r.epoch++
	epoch := r.epoch
	close(r.published)
	r.published = make(chan struct{})
	r.trustLocked()
	r.mu.Unlock()
	r.metrics.primaryChanged(old, now)
	r.log.Warn("primary changed", "from", old, "to", now, "epoch", epoch)
	if r.epochMoved != nil {
		r.epochMoved(epoch)
	}
	r.holds.reconcile()
	if old != "" && r.refusing != nil {
		r.refusing() // the old primary is refused fenced writes from now
	}
	if now != "" && r.changed != nil {
		r.changed(former, now, epoch)
	}
}

// barrier raises the lock marks on host, the primary about to be published, to the newest grants of the lock
// service and the highest marks the proxy saw accepted, and reports how many it raised.
func (r *router) barrier(host string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*r.timeout)
	defer cancel()
	r.mu.Lock()
	want := make(map[string]int64, len(r.seenMarks))
	for name, m := range r.seenMarks {
		want[name] = m
	}
	r.mu.Unlock()
	if r.grants != nil {
		granted, err := r.grants.Granted(ctx)
		if err != nil {
			return 0, fmt.Errorf("read the lock service's grants: %w", err)
		}
		for name, tok := range granted {
			want[name] = max(want[name], tok)
		}
	}
	// Lock marks live in each database that has the fenceproxy schema; a lock's tokens come from the one lock
	// service, so each such database gets the marks raised.
	cc, err := r.login(host)
	if err != nil {
		return 0, err
	}
	conn, err := connectOwnRole(ctx, cc)
	if err != nil {
		return 0, fmt.Errorf("connect to %s: %w", host, err)
	}
	defer conn.Close(context.Background())
	var recovery bool
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_is_in_recovery()").Scan(&recovery); err != nil {
		return 0, err
	}
	if recovery {
		return 0, errors.New(host + " is in recovery again")
	}
	rows, err := conn.Query(ctx, "SELECT datname FROM pg_catalog.pg_database WHERE datallowconn AND NOT datistemplate ORDER BY 1")
	if err != nil {
		return 0, fmt.Errorf("list the databases of %s: %w", host, err)
	}
	dbs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("list the databases of %s: %w", host, err)
	}
	raised := 0
	for _, db := range dbs {
		n, err := r.raiseIn(ctx, host, db, want)
		if err != nil {
			return raised, fmt.Errorf("database %s: %w", db, err)
		}
		raised += n
	}
	r.log.Info("failover barrier done", "host", host, "locks", len(want), "databases", len(dbs), "raised", raised)
	return raised, nil
}

// raiseIn raises the lock marks of database db on host (nothing where the schema is not installed).
func (r *router) raiseIn(ctx context.Context, host, db string, want map[string]int64) (int, error) {
	cc, err := r.login(host)
	if err != nil {
		return 0, err
	}
	cc.Database = db
	conn, err := connectOwnRole(ctx, cc)
	if err != nil {
		return 0, fmt.Errorf("connect to %s: %w", host, err)
	}
	defer conn.Close(context.Background())
	return schema.RaiseMarks(ctx, conn, want)
}
