package proxy

import (
	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

// NewPlanner builds the rewrite plan cache for a configuration's protected tables, reporting cache hits and
// misses to metrics (nil for none). The serve command calls it at start and on every SIGHUP.
func NewPlanner(cfg *config.Config, metrics *Metrics) (*rewrite.Cache, error) {
	return NewPlannerWithCatalog(cfg, nil, metrics)
}
