package tokens

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// OtherLocks is the lock label of every lock beyond an [Observer]'s first MaxLocks names.
const OtherLocks = "other"

// ObserverOptions configure an [Observer].
type ObserverOptions struct {
	// MaxLocks is how many lock names get a label of their own, in the order they are first seen; later ones
	// are summed under the label "other". Default 50.
	MaxLocks int
	// Interval is how often the store is read. Default 2s. The etcd observer also re-reads at once when the
	// lock prefix changes (watch).
	Interval time.Duration
	Logger   *slog.Logger
	// Marks, when set, reads each lock's accepted token (lock fences' mark, fenceproxy.lock_marks) at every
	// reading, for the gauge fenceproxy_lock_mark{lock} (observe_marks.go). It returns an empty map when the
	// database has no lock fences.
	Marks func(ctx context.Context) (map[string]int64, error)
}

// Observer exports the locks of one store as Prometheus series, labelled by store and lock:
//
//	fenceproxy_lock_held                        1 while the lock is held
//	fenceproxy_lock_token                       the holder's fencing token (0 when free or unknown)
//	fenceproxy_lock_held_seconds                how long the current holder has held it
//	fenceproxy_lock_lease_left_seconds          how long the holder's lease runs without renewal
//	fenceproxy_lock_waiters                     acquirers waiting
//	fenceproxy_lock_acquisitions_total          acquisitions
//	fenceproxy_lock_releases_total              leases released by their holder in time
//	fenceproxy_lock_expirations_total           leases that ended without a timely release (takeover risk)
//	fenceproxy_lock_non_owner_releases_total    releases refused because the lease was no longer the caller's
//	fenceproxy_lock_renewal_failures_total      failed renewals, as holders reported them
//	fenceproxy_lock_acquire_timeouts_total      acquirers that gave up at their deadline
//	fenceproxy_lock_acquire_wait_seconds_total  total time acquirers waited (divide by acquisitions: mean wait)
//
// and, with ObserverOptions.Marks, fenceproxy_lock_mark{lock}: lock fences' accepted token per lock.
//
// The PostgreSQL store counts every event in its lease table, for all processes: the counters are exact
// whatever the polling interval. The etcd observer infers what it can from successive readings of the lock
// prefix: acquisitions (a new holder key), releases and expirations (the holder's key vanished before, or
// after, its last observed lease had run out), waiters and tokens (recorded by fenceproxy's holders in their
// key). It cannot see non-owner releases, renewal failures, acquire timeouts or wait times (they leave no
// trace in etcd): those series stay 0 for etcd, and a holder that comes and goes between two readings is not
// seen at all.
type Observer struct {
	kind string
	list func(ctx context.Context) ([]LockInfo, error)
	// changed, when set, returns a channel that receives when the store changed (etcd: a watch).
	changed func(ctx context.Context) <-chan struct{}
	opts    ObserverOptions
	log     *slog.Logger

	mu      sync.Mutex
	labels  map[string]string // lock name -> label
	nOwn    int
	byName  map[string]*observedLock
	last    map[string]LockInfo // the latest reading per label, aggregated
	counts  map[string]LockCounters
	held    map[string]int // holders per label
	up      bool
	lastErr string           // the last reading's failure, "" after a success: each distinct failure is logged once
	marks   map[string]int64 // lock fences' marks per label (the highest of the names under "other")
	marksOK bool             // the last reading of the marks succeeded
}

// observedLock is what the etcd observer remembers of a lock between readings.
type observedLock struct {
	holder     string
	token      int64
	leaseLeft  time.Duration
	observedAt time.Time
	counters   LockCounters
}

var _ prometheus.Collector = (*Observer)(nil)

// NewPGObserver observes the PostgreSQL store s (which may be made with PGStoreOptions.ReadOnly).
func NewPGObserver(s *PGStore, o ObserverOptions) *Observer {
	return newObserver(s.Kind(), s.ListAll, nil, o)
}

// NewEtcdObserver observes the etcd store s, re-reading when its prefix changes.
func NewEtcdObserver(s *EtcdStore, o ObserverOptions) *Observer {
	changed := func(ctx context.Context) <-chan struct{} {
		ch := make(chan struct{}, 1)
		go func() {
			for resp := range s.client.Watch(clientv3.WithRequireLeader(ctx), s.prefix, clientv3.WithPrefix()) {
				if len(resp.Events) > 0 {
					select {
					case ch <- struct{}{}:
					default:
					}
				}
			}
		}()
		return ch
	}
	return newObserver(s.Kind(), s.List, changed, o)
}

// NewListObserver observes a store by reading its List every interval, inferring events from successive
// readings as the etcd observer does (ZooKeeper, Redis). What such a store cannot show stays 0: non-owner
// releases, renewal failures, acquire timeouts and wait times for both; ZooKeeper shows no lease left, so a
// holder's node that vanishes counts as a release; Redis keeps no queue, so it shows no waiters.
func NewListObserver(s Store, o ObserverOptions) *Observer {
	return newObserver(s.Kind(), s.List, nil, o)
}

func newObserver(kind string, list func(context.Context) ([]LockInfo, error), changed func(context.Context) <-chan struct{}, o ObserverOptions) *Observer {
	if o.MaxLocks <= 0 {
		o.MaxLocks = 50
	}
	if o.Interval <= 0 {
		o.Interval = 2 * time.Second
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Observer{kind: kind, list: list, changed: changed, opts: o, log: log,
		labels: map[string]string{}, byName: map[string]*observedLock{}, last: map[string]LockInfo{}, counts: map[string]LockCounters{}}
}

// Run reads the store until ctx ends.
func (ob *Observer) Run(ctx context.Context) {
	var changed <-chan struct{}
	if ob.changed != nil {
		changed = ob.changed(ctx)
	}
	t := time.NewTicker(ob.opts.Interval)
	defer t.Stop()
	for {
		ob.Poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-changed:
		}
	}
}

// Poll reads the store once and updates the series.
func (ob *Observer) Poll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(ob.opts.Interval, DefaultListTimeout))
	defer cancel()
	locks, err := ob.list(ctx)
	now := time.Now()
	ob.mu.Lock()
	defer ob.mu.Unlock()
	if err != nil {
		// Said once per distinct failure, the first one included (fenceproxy_lock_observer_up 0 from the start
		// needs its reason in the log as much as a store that went away), not at every interval.
		if msg := err.Error(); msg != ob.lastErr {
			ob.log.Warn("lock observer: cannot read the lock store; fenceproxy_lock_observer_up is 0 until it can", "store", ob.kind, "err", err)
			ob.lastErr = msg
		}
		ob.up = false
		return
	}
	if ob.lastErr != "" {
		ob.log.Info("lock observer: reading the lock store again", "store", ob.kind)
		ob.lastErr = ""
	}
	ob.up = true
	seen := map[string]bool{}
	for _, li := range locks {
		seen[li.Name] = true
		if li.Counters == nil {
			ob.infer(li, now)
		}
	}
	if ob.kind != "postgres" {
		// Locks whose keys all vanished since the last reading.
		for name, st := range ob.byName {
			if !seen[name] && st.holder != "" {
				ob.infer(LockInfo{Name: name}, now)
			}
		}
	}
	last := map[string]LockInfo{}
	counts := map[string]LockCounters{}
	held := map[string]int{}
	for _, li := range locks {
		label := ob.label(li.Name)
		agg := last[label]
		agg.Name = label
		if li.Holder != "" {
			agg.Holder = "held"
			held[label]++
			agg.Token = max(agg.Token, li.Token)
			agg.HeldFor = max(agg.HeldFor, li.HeldFor)
			if agg.LeaseLeft == 0 || (li.LeaseLeft >= 0 && li.LeaseLeft < agg.LeaseLeft) {
				agg.LeaseLeft = li.LeaseLeft
			}
		}
		if li.Waiters > 0 {
			agg.Waiters += li.Waiters
		}
		last[label] = agg
		c := li.Counters
		if c == nil {
			c = &ob.byName[li.Name].counters
		}
		counts[label] = addCounters(counts[label], *c)
	}
	for name, st := range ob.byName {
		if !seen[name] {
			label := ob.label(name)
			counts[label] = addCounters(counts[label], st.counters)
			if _, ok := last[label]; !ok {
				last[label] = LockInfo{Name: label}
			}
		}
	}
	ob.last, ob.counts, ob.held = last, counts, held
	ob.readMarks(ctx)
}

// infer updates the etcd observer's counters from a new reading of one lock (Holder "" when it has no keys).
func (ob *Observer) infer(li LockInfo, now time.Time) {
	st := ob.byName[li.Name]
	if st == nil {
		st = &observedLock{}
		ob.byName[li.Name] = st
	}
	if li.Holder != st.holder {
		if st.holder != "" {
			// The previous holder's key vanished: in time if its lease had not run out by what we last saw.
			if st.leaseLeft >= 0 && now.Sub(st.observedAt) >= st.leaseLeft-time.Second {
				st.counters.Expirations++
			} else {
				st.counters.Releases++
			}
		}
		if li.Holder != "" {
			st.counters.Acquisitions++
		}
	}
	if li.Holder != "" && li.Holder == st.holder && li.LeaseLeft < 0 && st.leaseLeft >= 0 {
		// The same holder, its lease's time now unknown: on etcd, a lease revoked between the listing and its
		// TimeToLive (an expiry the leader carried out then, late on a busy machine, or a release). What was last
		// known stands, so that the key's vanishing is judged by it: taking -1 counted every expiry caught in
		// that window as a release.
		st.token = li.Token
		return
	}
	st.holder, st.token, st.leaseLeft, st.observedAt = li.Holder, li.Token, li.LeaseLeft, now
}

func addCounters(a, b LockCounters) LockCounters {
	return LockCounters{
		Acquisitions:       a.Acquisitions + b.Acquisitions,
		Releases:           a.Releases + b.Releases,
		Expirations:        a.Expirations + b.Expirations,
		NonOwnerReleases:   a.NonOwnerReleases + b.NonOwnerReleases,
		RenewalFailures:    a.RenewalFailures + b.RenewalFailures,
		AcquireTimeouts:    a.AcquireTimeouts + b.AcquireTimeouts,
		AcquireWaitSeconds: a.AcquireWaitSeconds + b.AcquireWaitSeconds,
	}
}

// label is the lock's label: its name for the first MaxLocks names, then "other".
func (ob *Observer) label(name string) string {
	if l, ok := ob.labels[name]; ok {
		return l
	}
	l := OtherLocks
	if ob.nOwn < ob.opts.MaxLocks && name != OtherLocks {
		l = name
		ob.nOwn++
	}
	ob.labels[name] = l
	return l
}

var (
	lockLabels           = []string{"store", "lock"}
	descLockHeld         = prometheus.NewDesc("fenceproxy_lock_held", "1 while the lock is held (for the lock label \"other\": how many of those locks are held).", lockLabels, nil)
	descLockToken        = prometheus.NewDesc("fenceproxy_lock_token", "The current holder's fencing token (0 when free or unknown).", lockLabels, nil)
	descLockHeldSeconds  = prometheus.NewDesc("fenceproxy_lock_held_seconds", "How long the current holder has held the lock (0 when free or unknown).", lockLabels, nil)
	descLockLeaseLeft    = prometheus.NewDesc("fenceproxy_lock_lease_left_seconds", "How long the holder's lease runs without renewal (-1 unknown).", lockLabels, nil)
	descLockWaiters      = prometheus.NewDesc("fenceproxy_lock_waiters", "Acquirers waiting for the lock.", lockLabels, nil)
	descLockAcquisitions = prometheus.NewDesc("fenceproxy_lock_acquisitions_total", "Acquisitions of the lock.", lockLabels, nil)
	descLockReleases     = prometheus.NewDesc("fenceproxy_lock_releases_total", "Leases released by their holder before they expired.", lockLabels, nil)
	descLockExpirations  = prometheus.NewDesc("fenceproxy_lock_expirations_total", "Leases that ended without a timely release: a paused or cut-off holder may still write under the old token.", lockLabels, nil)
	descLockNonOwner     = prometheus.NewDesc("fenceproxy_lock_non_owner_releases_total", "Releases refused because the lease was no longer the caller's (PostgreSQL store).", lockLabels, nil)
	descLockRenewalFails = prometheus.NewDesc("fenceproxy_lock_renewal_failures_total", "Lease renewals that failed, as holders reported them (PostgreSQL store).", lockLabels, nil)
	descLockTimeouts     = prometheus.NewDesc("fenceproxy_lock_acquire_timeouts_total", "Acquirers that gave up at their deadline (PostgreSQL store).", lockLabels, nil)
	descLockWaitSeconds  = prometheus.NewDesc("fenceproxy_lock_acquire_wait_seconds_total", "Total time acquirers waited for the lock; divided by acquisitions, the mean acquire latency (PostgreSQL store).", lockLabels, nil)
	descLockObserverUp   = prometheus.NewDesc("fenceproxy_lock_observer_up", "1 when the last reading of the lock store succeeded.", []string{"store"}, nil)
)

// Observers is several observers as one prometheus.Collector (a registry refuses two collectors with the same
// series, so observers of several stores are registered together).
type Observers []*Observer

// Describe implements prometheus.Collector.
func (obs Observers) Describe(ch chan<- *prometheus.Desc) {
	if len(obs) > 0 {
		obs[0].Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (obs Observers) Collect(ch chan<- prometheus.Metric) {
	for _, ob := range obs {
		ob.Collect(ch)
	}
}

// Describe implements prometheus.Collector.
func (ob *Observer) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLockHeld, descLockToken, descLockHeldSeconds, descLockLeaseLeft, descLockWaiters,
		descLockAcquisitions, descLockReleases, descLockExpirations, descLockNonOwner, descLockRenewalFails, descLockTimeouts,
		descLockWaitSeconds, descLockObserverUp, descLockMark} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (ob *Observer) Collect(ch chan<- prometheus.Metric) {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	up := 0.0
	if ob.up {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(descLockObserverUp, prometheus.GaugeValue, up, ob.kind)
	labels := make([]string, 0, len(ob.last))
	for l := range ob.last {
		labels = append(labels, l)
	}
	sort.Strings(labels)
	for _, l := range labels {
		li, c := ob.last[l], ob.counts[l]
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, ob.kind, l)
		}
		k := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, ob.kind, l)
		}
		g(descLockHeld, float64(ob.held[l]))
		g(descLockToken, float64(li.Token))
		g(descLockHeldSeconds, li.HeldFor.Seconds())
		if li.Holder != "" && li.LeaseLeft >= 0 {
			g(descLockLeaseLeft, li.LeaseLeft.Seconds())
		} else if li.Holder != "" {
			g(descLockLeaseLeft, -1)
		} else {
			g(descLockLeaseLeft, 0)
		}
		g(descLockWaiters, float64(li.Waiters))
		k(descLockAcquisitions, float64(c.Acquisitions))
		k(descLockReleases, float64(c.Releases))
		k(descLockExpirations, float64(c.Expirations))
		k(descLockNonOwner, float64(c.NonOwnerReleases))
		k(descLockRenewalFails, float64(c.RenewalFailures))
		k(descLockTimeouts, float64(c.AcquireTimeouts))
		k(descLockWaitSeconds, c.AcquireWaitSeconds)
	}
	ob.collectMarks(ch)
}
