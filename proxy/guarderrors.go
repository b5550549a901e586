package proxy

import (
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// countGuardRefusal counts a fencing error raised by the in-database guard (fenceproxy install): a real
// 55F0x ErrorResponse, passed to the client unchanged (it needs no marker translation). The guard puts the
// protected table's configured name in the error's table field; other values (a user's own RAISE with such a
// code) are counted as "other", which keeps the label set bounded. The tables protected now decide (a reload
// included): the list of the proxy's start counted a table a reload added as "other".
func (ss *session) countGuardRefusal(body []byte) {
	code := errorField(body, fieldCode)
	if !strings.HasPrefix(code, sqlstateFencingClassPrefix) || len(code) != 5 {
		return
	}
	table := errorField(body, fieldTable)
	known := slices.Contains(ss.srv.protectedTables(), table)
	if !known {
		table = "other"
	}
	ss.srv.metrics.refusal(code, table)
	if m := ss.srv.metrics; m != nil && code == sqlstateStale && known {
		if lock, ok := rewrite.StaleLock(errorField(body, fieldMessage), table); ok {
			m.lockStale.inc(lock)
		}
	}
}

// maxLockLabels bounds the lock label of fenceproxy_lock_stale_rejections_total: the first locks seen get
// their own series, later ones count as "other".
const maxLockLabels = 50

// lockStaleCounter counts lock fences' stale rejections by lock, with a bounded label set.
type lockStaleCounter struct {
	vec  *prometheus.CounterVec
	mu   sync.Mutex
	seen map[string]bool
}

func newLockStaleCounter(reg prometheus.Registerer) *lockStaleCounter {
	c := &lockStaleCounter{
		vec: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fenceproxy_lock_stale_rejections_total",
			Help: "Writes refused because their lock had accepted a newer token (lock fences, 55F01), by lock: the first " +
				"50 locks seen, then \"other\"."}, []string{"lock"}),
		seen: map[string]bool{},
	}
	reg.MustRegister(c.vec)
	return c
}

func (c *lockStaleCounter) inc(lock string) {
	c.mu.Lock()
	if !c.seen[lock] {
		if len(c.seen) >= maxLockLabels {
			lock = "other"
		} else {
			c.seen[lock] = true
		}
	}
	c.mu.Unlock()
	c.vec.WithLabelValues(lock).Inc()
}
