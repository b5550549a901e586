package tokens

import (
	"context"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// descLockMark is lock fences' mark: the newest token each lock has accepted (docs/lock-fences.md). It is a
// property of the fenced database, not of a lock store, so it has no store label. Its lock labels are the
// observer's (the first MaxLocks names, then "other", whose value is the highest mark among those locks).
var descLockMark = prometheus.NewDesc("fenceproxy_lock_mark",
	"The newest fencing token the lock has accepted (lock fences: fenceproxy.lock_marks); writes with an older token are refused with 55F01.",
	[]string{"lock"}, nil)

// readMarks reads the marks with ObserverOptions.Marks, when set. ob.mu is held. A failed reading keeps the
// previous one (the gauge of a mark only goes stale, never wrong), and is logged once until a reading succeeds.
func (ob *Observer) readMarks(ctx context.Context) {
	if ob.opts.Marks == nil {
		return
	}
	marks, err := ob.opts.Marks(ctx)
	if err != nil {
		if ob.marksOK {
			ob.log.Warn("lock observer: cannot read the lock fences' marks", "store", ob.kind, "err", err)
		}
		ob.marksOK = false
		return
	}
	ob.marksOK = true
	byLabel := make(map[string]int64, len(marks))
	names := make([]string, 0, len(marks))
	for name := range marks {
		names = append(names, name)
	}
	// Names first seen here get their labels in a stable order.
	sort.Strings(names)
	for _, name := range names {
		label := ob.label(name)
		if m, ok := byLabel[label]; !ok || marks[name] > m {
			byLabel[label] = marks[name]
		}
	}
	ob.marks = byLabel
}

// collectMarks sends the mark gauges. ob.mu is held.
func (ob *Observer) collectMarks(ch chan<- prometheus.Metric) {
	labels := make([]string, 0, len(ob.marks))
	for l := range ob.marks {
		labels = append(labels, l)
	}
	sort.Strings(labels)
	for _, l := range labels {
		ch <- prometheus.MustNewConstMetric(descLockMark, prometheus.GaugeValue, float64(ob.marks[l]), l)
	}
}
