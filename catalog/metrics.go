package catalog

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the catalog reader's Prometheus series; a nil *Metrics records nothing. A refresh that keeps
// failing leaves the proxy on an old snapshot: alert on fenceproxy_catalog_last_success_seconds.
type Metrics struct {
	refreshes   *prometheus.CounterVec
	lastSuccess prometheus.Gauge
	protected   prometheus.Gauge
	refused     prometheus.Gauge
}

// NewMetrics creates the series and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		refreshes:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fenceproxy_catalog_reads_total", Help: "Catalog reads (at start, every catalog.refresh, on SIGHUP), by result (ok, error)."}, []string{"result"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fenceproxy_catalog_last_success_seconds", Help: "Unix time of the last successful catalog read; the snapshot in force is at least this old."}),
		protected:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "fenceproxy_catalog_protected_relations", Help: "Relations protected because of the catalog (partitions, children, parents, views), beyond the configured names."}),
		refused:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "fenceproxy_catalog_refused_relations", Help: "Catalog-derived refusals (views without the token column, parents without it, foreign-key cascades)."}),
	}
	reg.MustRegister(m.refreshes, m.lastSuccess, m.protected, m.refused)
	return m
}

// Observe records one read.
func (m *Metrics) Observe(snap *Snapshot, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.refreshes.WithLabelValues("error").Inc()
		return
	}
	m.refreshes.WithLabelValues("ok").Inc()
	m.lastSuccess.Set(float64(time.Now().UnixNano()) / 1e9)
	m.protected.Set(float64(len(snap.Protected)))
	m.refused.Set(float64(len(snap.Refused)))
}

// Reads is the counter of reads with result (ok, error), for tests.
func (m *Metrics) Reads(result string) prometheus.Counter { return m.refreshes.WithLabelValues(result) }
