package proxy

import (
	"fmt"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

// NewPlanner builds the rewrite plan cache for a configuration's protected tables, reporting cache hits and
// misses to metrics (nil for none). The serve command calls it at start and on every SIGHUP.
func NewPlanner(cfg *config.Config, metrics *Metrics) (*rewrite.Cache, error) {
	tables := make([]rewrite.Table, len(cfg.Tables))
	for i, t := range cfg.Tables {
		tables[i] = rewrite.Table{Schema: t.Schema, Name: t.Relation, TokenColumn: t.TokenColumn, RequireLock: t.RequireLock}
	}
	r, err := rewrite.New(rewrite.Config{Tables: tables, TokenSetting: cfg.Token.Setting, LockSetting: cfg.Token.LockSetting})
	if err != nil {
		return nil, fmt.Errorf("tables: %w", err)
	}
	var obs rewrite.CacheObserver
	if metrics != nil {
		obs = metrics
	}
	return rewrite.NewCacheObserved(r, cfg.Limits.RewriteCacheSize, obs), nil
}
