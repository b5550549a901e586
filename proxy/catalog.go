package proxy

import (
	"fmt"
	"reflect"
	"sync"

	"github.com/fenceproxy/fenceproxy/catalog"
	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

// ConfiguredTables are the rewriter tables of a configuration.
func ConfiguredTables(cfg *config.Config) []rewrite.Table {
	tables := make([]rewrite.Table, len(cfg.Tables))
	for i, t := range cfg.Tables {
		tables[i] = rewrite.Table{Schema: t.Schema, Name: t.Relation, TokenColumn: t.TokenColumn,
			RefuseTokenColumnWrites: t.TokenColumnWrites == config.TokenColumnRefuse, RequireLock: t.RequireLock}
	}
	return tables
}

// rewriteConfig is the rewriter's configuration for a proxy configuration: the one place that maps one to the
// other (NewPlanner and NewPlannerWithCatalog both use it).
func rewriteConfig(cfg *config.Config) rewrite.Config {
	return rewrite.Config{Tables: ConfiguredTables(cfg), TokenSetting: cfg.Token.Setting, LockSetting: cfg.Token.LockSetting,
		SynchronousCommit: cfg.Fence.SynchronousCommitLevel()}
}

// NewPlannerWithCatalog is NewPlanner for a configuration and a catalog snapshot (nil: name-only
// protection): the configured tables, the relations the snapshot protects because of them, and its refusals.
func NewPlannerWithCatalog(cfg *config.Config, snap *catalog.Snapshot, metrics *Metrics) (*rewrite.Cache, error) {
	rc := rewriteConfig(cfg)
	if snap != nil {
		rc.Tables = append(rc.Tables, snap.Tables()...)
		rc.Refused = snap.Refused
	}
	r, err := rewrite.New(rc)
	if err != nil {
		return nil, fmt.Errorf("tables: %w", err)
	}
	var obs rewrite.CacheObserver
	if metrics != nil {
		obs = metrics
	}
	return rewrite.NewCacheObserved(r, cfg.Limits.RewriteCacheSize, obs), nil
}

// PlannerSet keeps a Server's planner in step with the configuration (SIGHUP) and the catalog snapshot
// (refreshes): each change builds a new planner, with an empty cache, from both.
type PlannerSet struct {
	srv     *Server
	metrics *Metrics

	mu   sync.Mutex
	cfg  *config.Config
	snap *catalog.Snapshot
}

// NewPlannerSet starts from the configuration and snapshot the server's current planner was built from.
func NewPlannerSet(srv *Server, cfg *config.Config, snap *catalog.Snapshot, metrics *Metrics) *PlannerSet {
	return &PlannerSet{srv: srv, metrics: metrics, cfg: cfg, snap: snap}
}

// SetConfig applies a reloaded configuration's tables. One whose rewriter configuration is the one in force keeps
// the planner, its cache and its generation (plannerBox): a SIGHUP that changes no table changes nothing, and
// what clients prepared is not analysed again (nor refused, where it cannot be: a pinned client's own
// statements, pooledsqlprep.go).
func (p *PlannerSet) SetConfig(cfg *config.Config) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg != nil && p.cfg.Limits.RewriteCacheSize == cfg.Limits.RewriteCacheSize && reflect.DeepEqual(rewriteConfig(p.cfg), rewriteConfig(cfg)) {
		p.cfg = cfg
		return nil
	}
	snap := derivedFor(p.snap, cfg)
	planner, err := NewPlannerWithCatalog(cfg, snap, p.metrics)
	if err != nil {
		return err
	}
	p.cfg, p.snap = cfg, snap
	p.srv.SetPlanner(planner)
	return nil
}

// SetSnapshot applies a new catalog snapshot, derived again for the table list in force (derivedFor). One that
// then protects and refuses what the one in force does keeps the planner, its cache and its generation.
func (p *PlannerSet) SetSnapshot(snap *catalog.Snapshot) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	snap = derivedFor(snap, p.cfg)
	if p.snap != nil && snap.SameRules(p.snap) {
		p.snap = snap
		return nil
	}
	planner, err := NewPlannerWithCatalog(p.cfg, snap, p.metrics)
	if err != nil {
		return err
	}
	p.snap = snap
	p.srv.SetPlanner(planner)
	return nil
}

// derivedFor is snap derived again, from the catalog facts it was read from, for cfg's tables. A snapshot is
// derived for the table list its reader was given, and the list changes at a reload: the snapshot in force when
// the reload applies the new list, or one a refresh read before it and publishes after, protects the
// partitions, children, views and cascades of the old list. Until 2026-12-06 the planner used it as it was until
// the next refresh that read the new list (forever, if those failed): a partition of a table the reload added
// was written unfenced, and one of a table made require_lock written without a lock. Deriving is a pure
// function of the facts and the list (catalog.Derive), so the planner always protects what the list in force
// makes of the facts last read. A snapshot without its facts (nil: name-only protection) is used as it is.
func derivedFor(snap *catalog.Snapshot, cfg *config.Config) *catalog.Snapshot {
	if snap == nil || snap.Catalog == nil {
		return snap
	}
	return catalog.Derive(snap.Catalog, ConfiguredTables(cfg))
}

// Tables are the configured tables now.
func (p *PlannerSet) Tables() []rewrite.Table {
	p.mu.Lock()
	defer p.mu.Unlock()
	return ConfiguredTables(p.cfg)
}
