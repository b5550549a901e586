package proxy

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the proxy's Prometheus series. A nil *Metrics records nothing, so tests and embedders need not
// set up a registry.
type Metrics struct {
	sessionsCurrent prometheus.Gauge
	sessionsTotal   prometheus.Counter
	sessionsRefused *prometheus.CounterVec
	refusals        *prometheus.CounterVec
	stale           *prometheus.CounterVec
	lockStale       *lockStaleCounter
	writeHold       *writeHoldMetrics
	rewrites        prometheus.Counter
	upstreamErrors  prometheus.Counter
	protocolErrors  prometheus.Counter
	cacheHits       prometheus.Counter
	cacheMisses     prometheus.Counter
	rewriteLatency  prometheus.Histogram
	messages        [2]prometheus.Counter
	bytes           [2]prometheus.Counter
	reused          prometheus.Counter
	keptIdle        prometheus.Gauge
	preparedExecs   prometheus.Counter
	prepares        *prometheus.CounterVec
	authFailures    *prometheus.CounterVec
	poolPins        *prometheus.CounterVec
	poolLends       prometheus.Counter
	poolDials       prometheus.Counter
	poolWaitTimeout prometheus.Counter
	poolWait        *prometheus.HistogramVec
	pools           *poolCollector
	ha              haMetrics
}

// poolCollector reads the transaction pools' clients and server connections at each scrape (nothing on the
// hot path), added up per (database, user): pools of one database and user that differ in other startup
// parameters are one series.
type poolCollector struct {
	pools   atomic.Pointer[txPools]
	clients *prometheus.Desc
	servers *prometheus.Desc
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.clients
	ch <- c.servers
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	ps := c.pools.Load()
	if ps == nil {
		return
	}
	type key struct{ database, user string }
	sums := map[key]poolCounts{}
	for _, p := range ps.list() {
		k := key{p.database, p.user}
		n, pc := sums[k], p.counts()
		n.clActive += pc.clActive
		n.clWaiting += pc.clWaiting
		n.svActive += pc.svActive
		n.svIdle += pc.svIdle
		n.svLogin += pc.svLogin
		sums[k] = n
	}
	for k, n := range sums {
		for _, v := range []struct {
			state string
			n     int64
		}{{"active", n.clActive}, {"waiting", n.clWaiting}} {
			ch <- prometheus.MustNewConstMetric(c.clients, prometheus.GaugeValue, float64(v.n), k.database, k.user, v.state)
		}
		for _, v := range []struct {
			state string
			n     int64
		}{{"active", n.svActive}, {"idle", n.svIdle}, {"login", n.svLogin}} {
			ch <- prometheus.MustNewConstMetric(c.servers, prometheus.GaugeValue, float64(v.n), k.database, k.user, v.state)
		}
	}
}

// haMetrics are the router's series (upstream.hosts; router.go).
type haMetrics struct {
	hostRole       *prometheus.GaugeVec
	primary        *prometheus.GaugeVec
	primaryChanges prometheus.Counter
	splitBrain     prometheus.Gauge
	barrierRuns    *prometheus.CounterVec
	marksRaised    prometheus.Counter
}

// Directions of forwarded traffic, as metric label values.
const (
	dirClientToServer = 0
	dirServerToClient = 1
)

var directionNames = [2]string{"client_to_server", "server_to_client"}

// NewMetrics creates the proxy's series and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		sessionsCurrent: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fenceproxy_sessions_current", Help: "Client sessions being relayed."}),
		sessionsTotal:   prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_sessions_total", Help: "Client sessions relayed since start."}),
		sessionsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fenceproxy_sessions_refused_total", Help: "Client connections refused before relaying, by reason."}, []string{"reason"}),
		refusals:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fenceproxy_refusals_total", Help: "Statements refused, by SQLSTATE (55F01 stale, 55F02 missing, 55F03 invalid, 55F04 unfenceable) and table."}, []string{"code", "table"}),
		stale:           prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fenceproxy_stale_rejections_total", Help: "Writes refused because a newer lock holder already wrote the row (55F01), by table. Should stay near zero: a rise means leases are shorter than the work they guard."}, []string{"table"}),
		rewrites:        prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_statements_rewritten_total", Help: "Statements rewritten to carry the fence."}),
		upstreamErrors:  prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_upstream_errors_total", Help: "Failed or lost upstream connections."}),
		protocolErrors:  prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_protocol_errors_total", Help: "Connections closed for breaking the wire protocol."}),
	}
	msgs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fenceproxy_messages_forwarded_total", Help: "Protocol messages relayed, by direction."}, []string{"direction"})
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fenceproxy_bytes_forwarded_total", Help: "Bytes of protocol messages relayed, by direction."}, []string{"direction"})
	for d, name := range directionNames {
		m.messages[d] = msgs.WithLabelValues(name)
		m.bytes[d] = bytes.WithLabelValues(name)
	}
	m.cacheHits = prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_rewrite_cache_hits_total", Help: "Statements whose plan came from the rewrite cache."})
	m.cacheMisses = prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_rewrite_cache_misses_total", Help: "Statements parsed and planned (cache misses)."})
	m.rewriteLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fenceproxy_rewrite_seconds",
		Help:    "Time to parse, analyse and rewrite a statement on a cache miss.",
		Buckets: prometheus.ExponentialBuckets(10e-6, 2.5, 10),
	})
	m.authFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fenceproxy_auth_failures_total", Help: "Client logins the proxy refused (auth.type other than passthrough), by reason: password (a wrong password or an unknown user), certificate, malformed, lookup (auth.query failed), upstream (the server refused the proxy's login)."}, []string{"reason"})
	m.reused = prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_upstream_reused_total", Help: "Sessions served by a kept upstream connection of an earlier session (upstream.reuse)."})
	m.keptIdle = prometheus.NewGauge(prometheus.GaugeOpts{Name: "fenceproxy_upstream_idle", Help: "Upstream connections of finished sessions kept for reuse now."})
	reg.MustRegister(m.reused, m.keptIdle, m.authFailures)
	m.preparedExecs = prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_prepared_fence_executions_total", Help: "Fenced statements sent as EXECUTE of a template prepared on the upstream connection (upstream.prepared_fences)."})
	m.prepares = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fenceproxy_prepared_fences_total", Help: "Fenced statement templates the proxy asked an upstream connection to prepare, by outcome (prepared, failed; retried: failed for the moment, a lock not waited for or a cancel)."}, []string{"outcome"})
	reg.MustRegister(m.preparedExecs, m.prepares)
	m.poolPins = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fenceproxy_pool_pins_total", Help: "Clients pinned to their server connection (pool.mode transaction) by session state the pool cannot move, by reason."}, []string{"reason"})
	m.poolLends = prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_pool_lends_total", Help: "Server connections lent to a client for a transaction (pool.mode transaction)."})
	m.poolDials = prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_pool_server_connections_opened_total", Help: "Server connections opened by the transaction pools."})
	m.poolWaitTimeout = prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_pool_wait_timeouts_total", Help: "Clients refused because no server connection became free within pool.max_client_wait."})
	m.poolWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fenceproxy_pool_wait_seconds",
		Help:    "How long clients waited for a server connection of their pool (pool.mode transaction; a full or paused pool), by database and user; a lend that did not wait counts as 0.",
		Buckets: prometheus.ExponentialBuckets(100e-6, 4, 10),
	}, []string{"database", "user"})
	m.pools = &poolCollector{
		clients: prometheus.NewDesc("fenceproxy_pool_clients", "Client sessions of the transaction pools now, by database, user and state: active (holding a server connection or between transactions), waiting (for a server connection of a full or paused pool).", []string{"database", "user", "state"}, nil),
		servers: prometheus.NewDesc("fenceproxy_pool_servers", "Server connections of the transaction pools now, by database, user and state: active (lent to a client), idle (in the pool), login (being opened).", []string{"database", "user", "state"}, nil),
	}
	reg.MustRegister(m.poolPins, m.poolLends, m.poolDials, m.poolWaitTimeout, m.poolWait, m.pools)
	reg.MustRegister(msgs, bytes, m.cacheHits, m.cacheMisses, m.rewriteLatency)
	m.ha = haMetrics{
		hostRole:       prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fenceproxy_upstream_host_role", Help: "1 for each upstream host's role as its last health check found it (primary, read-only, standby, down), 0 for the others."}, []string{"host", "role"}),
		primary:        prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fenceproxy_upstream_primary", Help: "1 for the upstream host the proxy sends read-write sessions to now (published after its failover barrier), 0 for a former one."}, []string{"host"}),
		primaryChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_upstream_primary_changes_total", Help: "Changes of the published primary (a failover or switchover, a primary lost or found)."}),
		splitBrain:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "fenceproxy_upstream_split_brain", Help: "1 while more than one upstream host claims to be primary (fenced writes are refused)."}),
		barrierRuns:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fenceproxy_failover_barrier_runs_total", Help: "Failover barriers run on a new primary before it was published, by outcome (done, failed)."}, []string{"outcome"}),
		marksRaised:    prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceproxy_failover_barrier_marks_raised_total", Help: "Lock marks the failover barriers raised (or created) on new primaries."}),
	}
	reg.MustRegister(m.ha.hostRole, m.ha.primary, m.ha.primaryChanges, m.ha.splitBrain, m.ha.barrierRuns, m.ha.marksRaised)
	m.lockStale = newLockStaleCounter(reg)
	m.writeHold = newWriteHoldMetrics(reg)
	reg.MustRegister(m.sessionsCurrent, m.sessionsTotal, m.sessionsRefused, m.refusals, m.stale, m.rewrites, m.upstreamErrors, m.protocolErrors)
	return m
}

func (m *Metrics) sessionStarted() {
	if m != nil {
		m.sessionsCurrent.Inc()
		m.sessionsTotal.Inc()
	}
}

func (m *Metrics) sessionEnded() {
	if m != nil {
		m.sessionsCurrent.Dec()
	}
}

func (m *Metrics) authFailure(reason string) {
	if m != nil {
		m.authFailures.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) sessionRefused(reason string) {
	if m != nil {
		m.sessionsRefused.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) refusal(code, table string) {
	if m == nil {
		return
	}
	m.refusals.WithLabelValues(code, table).Inc()
	if code == sqlstateStale {
		m.stale.WithLabelValues(table).Inc()
	}
}

func (m *Metrics) rewritten() {
	if m != nil {
		m.rewrites.Inc()
	}
}

func (m *Metrics) preparedExecuted() {
	if m != nil {
		m.preparedExecs.Inc()
	}
}

func (m *Metrics) preparedOutcome(outcome string) {
	if m != nil {
		m.prepares.WithLabelValues(outcome).Inc()
	}
}

func (m *Metrics) upstreamError() {
	if m != nil {
		m.upstreamErrors.Inc()
	}
}

func (m *Metrics) protocolError() {
	if m != nil {
		m.protocolErrors.Inc()
	}
}

// forwarded moves a reader's message and byte counts into the metrics.
func (m *Metrics) forwarded(dir int, r *msgReader) {
	if m != nil && r.msgs > 0 {
		m.messages[dir].Add(float64(r.msgs))
		m.bytes[dir].Add(float64(r.bytes))
	}
	r.msgs, r.bytes = 0, 0
}

// forwardedCount adds counts of relayed messages and bytes (the event loop's way of reporting).
func (m *Metrics) forwardedCount(dir int, msgs, bytes uint64) {
	if m != nil && msgs > 0 {
		m.messages[dir].Add(float64(msgs))
		m.bytes[dir].Add(float64(bytes))
	}
}

// CacheHit counts a rewrite cache hit (rewrite.CacheObserver).
func (m *Metrics) CacheHit() {
	if m != nil {
		m.cacheHits.Inc()
	}
}

// CacheMiss counts a rewrite cache miss and its planning time (rewrite.CacheObserver).
func (m *Metrics) CacheMiss(d time.Duration) {
	if m != nil {
		m.cacheMisses.Inc()
		m.rewriteLatency.Observe(d.Seconds())
	}
}

func (m *Metrics) upstreamReused() {
	if m != nil {
		m.reused.Inc()
	}
}

func (m *Metrics) upstreamIdle(n int) {
	if m != nil {
		m.keptIdle.Set(float64(n))
	}
}

func (m *Metrics) hostRole(host string, role hostRole) {
	if m == nil {
		return
	}
	for r, name := range roleNames[roleDown:] {
		v := 0.0
		if hostRole(r)+roleDown == role {
			v = 1
		}
		m.ha.hostRole.WithLabelValues(host, name).Set(v)
	}
}

func (m *Metrics) primaryChanged(old, now string) {
	if m == nil {
		return
	}
	m.ha.primaryChanges.Inc()
	if old != "" {
		m.ha.primary.WithLabelValues(old).Set(0)
	}
	if now != "" {
		m.ha.primary.WithLabelValues(now).Set(1)
	}
}

func (m *Metrics) splitBrain(on bool) {
	if m == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	m.ha.splitBrain.Set(v)
}

func (m *Metrics) barrierRun(outcome string, raised int) {
	if m == nil {
		return
	}
	m.ha.barrierRuns.WithLabelValues(outcome).Inc()
	m.ha.marksRaised.Add(float64(raised))
}

func (m *Metrics) poolPinned(reason string) {
	if m != nil {
		m.poolPins.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) poolLent() {
	if m != nil {
		m.poolLends.Inc()
	}
}

func (m *Metrics) poolDialed() {
	if m != nil {
		m.poolDials.Inc()
	}
}

// watchPools makes the pool series read ps (a Server's pools).
func (m *Metrics) watchPools(ps *txPools) {
	if m != nil {
		m.pools.pools.Store(ps)
	}
}

// poolWaitTime is the wait-time histogram of a pool's database and user, nil without metrics.
func (m *Metrics) poolWaitTime(database, user string) prometheus.Observer {
	if m == nil {
		return nil
	}
	return m.poolWait.WithLabelValues(database, user)
}

// poolGone drops the wait-time series of a database and user whose last pool was dropped (txPools.dropUnused):
// names a client made up (an unknown database) leave no series behind.
func (m *Metrics) poolGone(database, user string) {
	if m != nil {
		m.poolWait.DeleteLabelValues(database, user)
	}
}

func (m *Metrics) poolTimedOut() {
	if m != nil {
		m.poolWaitTimeout.Inc()
	}
}
