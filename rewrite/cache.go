package rewrite

import (
	"hash/maphash"
	"sync"
	"time"
)

// maxCachedSQL bounds the length of texts kept in a Cache: longer ones (bulk
// INSERTs with literal values) are planned each time, as they rarely repeat.
const maxCachedSQL = 64 << 10

// Cache is a bounded LRU of plans keyed by SQL text, safe for concurrent use.
// It belongs to one Rewriter (a reloaded configuration needs a new Cache). A
// hit does not allocate.
type Cache struct {
	r      *Rewriter
	obs    CacheObserver
	seed   maphash.Seed
	shards []cacheShard
	mask   uint64
}

type cacheShard struct {
	mu    sync.Mutex
	m     map[cacheKey]*cacheEntry
	head  cacheEntry // sentinel: head.next is the most recently used
	limit int
	_     [40]byte // keep shards' locks on separate cache lines
}

// cacheKey is a text and the settings it is read under: a text means
// different things under different settings, and a plan (its refusals, the
// encoding of a rewrite) is a function of both.
type cacheKey struct {
	sql string
	set Settings
}

type cacheEntry struct {
	key  cacheKey
	plan Plan
	// tmpl is set for the entry of a statement shape (key.sql is a shape
	// key, which holds NUL bytes) and nil for the entry of a text.
	tmpl       *shapeTemplate
	prev, next *cacheEntry
}

// CacheObserver is told about every lookup of a text the prefilter let through, for metrics. Its methods must
// be cheap and safe for concurrent use.
type CacheObserver interface {
	CacheHit()
	CacheMiss(planning time.Duration)
}

// NewCacheObserved is NewCache with an observer (nil for none).
func NewCacheObserved(r *Rewriter, size int, obs CacheObserver) *Cache {
	c := NewCache(r, size)
	c.obs = obs
	return c
}

// NewCache returns a cache of at most size plans (at least 1).
func NewCache(r *Rewriter, size int) *Cache {
	if size < 1 {
		size = 1
	}
	n := 1
	for n < 16 && size/(n*2) >= 64 { // shards only when each keeps a useful share
		n *= 2
	}
	c := &Cache{r: r, seed: maphash.MakeSeed(), shards: make([]cacheShard, n), mask: uint64(n - 1)}
	for i := range c.shards {
		s := &c.shards[i]
		s.m = make(map[cacheKey]*cacheEntry)
		s.head.next, s.head.prev = &s.head, &s.head
		s.limit = size / n
		if i < size%n {
			s.limit++
		}
	}
	return c
}

// Plan is Rewriter.PlanWith through the cache. Texts the raw prefilter rules
// out (rawMayTouch: no write keyword, DO, set_config or token setting in the
// bytes) return Plan{Action: Pass} without touching the cache; texts decided
// without parsing are not cached; the plans of parsed texts are, and a hit
// neither decodes nor lexes the text.
func (c *Cache) Plan(sql []byte, set Settings) Plan {
	p, _ := c.plan(sql, set, true)
	return p
}

// SessionEffects is the Rewriter's SessionEffects (not cached: the transaction pooler keeps it per text).
func (c *Cache) SessionEffects(sql []byte, set Settings) SessionEffects {
	return c.r.SessionEffects(sql, set)
}

// TryPlan is Plan when the plan costs no parse: the prefilter rules the text
// out, the text or its shape is cached, or the text is decided without
// parsing. Otherwise (a miss, which parses and deparses: a fraction of a
// millisecond) it returns false having changed nothing and counted nothing,
// so that a caller that must not wait (an event loop) can call Plan
// elsewhere.
func (c *Cache) TryPlan(sql []byte, set Settings) (Plan, bool) {
	return c.plan(sql, set, false)
}

// plan is Plan, or TryPlan when miss is false.
func (c *Cache) plan(sql []byte, set Settings, miss bool) (Plan, bool) {
	if !c.r.rawMayTouch(sql) {
		return Plan{Action: Pass}, true
	}
	s := &c.shards[maphash.Bytes(c.seed, sql)&c.mask]
	s.mu.Lock()
	if e, ok := s.m[cacheKey{string(sql), set}]; ok && e.tmpl == nil {
		s.unlink(e)
		s.pushFront(e)
		p := e.plan
		s.mu.Unlock()
		if c.obs != nil {
			c.obs.CacheHit()
		}
		return p, true
	}
	s.mu.Unlock()

	start := time.Now()
	rd := c.r.readText(sql, set)
	if p, done := c.r.early(sql, rd); done {
		// Decided without parsing (the token prefilter rules it out, or it
		// cannot be read): not cached, so that reads whose literals hold a
		// keyword do not push plans out of the cache; but a passed text of
		// no constants (fixedText: a write of an unprotected table as the
		// extended protocol sends it) comes back as it is, and is kept
		// rather than lexed again each time.
		if p.Action == Pass && len(sql) <= maxCachedSQL && fixedText(sql) {
			c.put(cacheKey{string(sql), set}, p, nil)
		}
		return p, true
	}
	if len(sql) > maxCachedSQL {
		if !miss {
			return Plan{}, false
		}
		p := c.r.planReading(rd)
		c.missed(start)
		return p, true
	}
	p, shapeHit, planned, shaped := c.planShape(rd, set, start, miss)
	if shapeHit || !planned {
		return p, shapeHit
	}
	c.missed(start)
	if !shaped || p.Action != Rewrite {
		// A rewrite of a shape is not cached as a text: the same text
		// again reaches the shape's template, which the server can
		// prepare (prepared.go), where a text entry would send the whole
		// fence to be parsed every time.
		c.put(cacheKey{string(sql), set}, p, nil)
	}
	return p, true
}

func (c *Cache) missed(start time.Time) {
	if c.obs != nil {
		c.obs.CacheMiss(time.Since(start))
	}
}

// planShape plans a readable text through the shape cache: a hit fills the
// template of the text's shape with the text's constants (hit true); a
// miss plans the text in full and, the second time its shape is seen,
// builds the shape's template (shape.go). Building costs about two plans,
// so shapes seen once (a VALUES list of a new length) do not pay it. With
// miss false, a miss plans nothing and changes nothing (planned false).
func (c *Cache) planShape(rd reading, set Settings, start time.Time, miss bool) (p Plan, hit, planned, shaped bool) {
	text := rd.text
	if rd.normalise {
		text = []byte(rd.sql())
	}
	sh, ok := c.r.shapeOf(text)
	if !ok {
		if !miss {
			return Plan{}, false, false, false
		}
		return c.r.planReading(rd), false, true, false
	}
	s := &c.shards[maphash.Bytes(c.seed, sh.key)&c.mask]
	s.mu.Lock()
	e, found := s.m[cacheKey{string(sh.key), set}] // no copy of the key for a lookup
	if !found || e.tmpl == nil {
		s.mu.Unlock()
		if !miss {
			return Plan{}, false, false, true
		}
		c.put(cacheKey{string(sh.key), set}, Plan{}, &shapeTemplate{pending: true})
		return c.r.planReading(rd), false, true, true
	}
	if !e.tmpl.ok && !miss {
		s.mu.Unlock()
		return Plan{}, false, false, true
	}
	s.unlink(e)
	s.pushFront(e)
	t := e.tmpl
	s.mu.Unlock()
	switch {
	case t.ok:
		if c.obs != nil {
			c.obs.CacheHit()
		}
		return c.r.planShaped(t, text, sh.spans, rd), true, true, true
	case !t.pending:
		return c.r.planReading(rd), false, true, false // a shape planned in full: its texts are cached as texts
	}
	full := c.r.plan(string(text), rd.scsOff, rd.inline)
	c.put(cacheKey{string(sh.key), set}, Plan{}, c.r.buildTemplate(text, sh, rd.scsOff, rd.inline, full))
	return c.r.forClient(full, rd), false, true, true
}

// fixedText reports whether a text holds no constant that could vary between
// its runs: no quote (string literals in every form, dollar quotes), no digit
// but a parameter's ($1). Conservative: an identifier with a digit says no.
func fixedText(sql []byte) bool {
	for i := 0; i < len(sql); i++ {
		switch c := sql[i]; {
		case c == '\'' || isDigit(c):
			return false
		case c == '$':
			j := i + 1
			for j < len(sql) && isDigit(sql[j]) {
				j++
			}
			if j == i+1 {
				return false // a dollar quote
			}
			i = j - 1
		}
	}
	return true
}

// put stores the plan of a text (tmpl nil) or the template of a shape.
func (c *Cache) put(key cacheKey, p Plan, tmpl *shapeTemplate) {
	s := &c.shards[maphash.String(c.seed, key.sql)&c.mask]
	s.mu.Lock()
	if e, ok := s.m[key]; ok { // planned concurrently
		e.plan, e.tmpl = p, tmpl
		s.unlink(e)
		s.pushFront(e)
	} else {
		e := &cacheEntry{key: key, plan: p, tmpl: tmpl}
		s.m[key] = e
		s.pushFront(e)
		for len(s.m) > s.limit {
			old := s.head.prev
			s.unlink(old)
			delete(s.m, old.key)
		}
	}
	s.mu.Unlock()
}

// Len is the number of cached plans.
func (c *Cache) Len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

func (s *cacheShard) unlink(e *cacheEntry) {
	e.prev.next = e.next
	e.next.prev = e.prev
}

func (s *cacheShard) pushFront(e *cacheEntry) {
	e.prev = &s.head
	e.next = s.head.next
	s.head.next.prev = e
	s.head.next = e
}
