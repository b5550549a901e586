package proxy

// SessionsInLoop counts the sessions the event loop is relaying (for tests of the handover).
func SessionsInLoop(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for ss := range s.sessions {
		ss.evMu.Lock()
		if ss.ev != nil {
			n++
		}
		ss.evMu.Unlock()
	}
	return n
}

// DrainsAsked counts the sessions of the goroutine transport whose client side has been asked to end a drained
// session at its next message boundary (clientDrain).
func DrainsAsked(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for ss := range s.sessions {
		if ss.clientIntr.reason() == intrDrain {
			n++
		}
	}
	return n
}

// InlineWatching reports whether the watch of inline reads is armed (pooled.go: inlineBegins).
func InlineWatching(s *Server) bool {
	if s.pools == nil {
		return false
	}
	s.pools.watchMu.Lock()
	defer s.pools.watchMu.Unlock()
	return s.pools.watchArmed
}

// InlineLooks is how many looks the watch of inline reads made (pooled.go: inlineLook).
func InlineLooks(s *Server) int64 {
	if s.pools == nil {
		return 0
	}
	return s.pools.watchLooks.Load()
}

// OptionSetting is optionSetting: the value a startup options string gives a setting, as the proxy reads it.
func OptionSetting(options, name string) (string, bool) { return optionSetting(options, name) }

// HoldPutBack makes every put-back of a pooled server connection (txPool.release) of the Server built from o
// call hold first, after the checks made before the pool's lock. Set before New: the proxy reads it without
// synchronization.
func HoldPutBack(o *Options, hold func()) { o.hooks.beforePutBack = hold }

// HoldKeep makes every keeping of a session-mode upstream connection for reuse (upstreamPool.put) of the Server
// built from o call hold first, before the pool's lock is taken. Set before New, as HoldPutBack.
func HoldKeep(o *Options, hold func()) { o.hooks.beforePut = hold }

// HoldFencedJudgement makes the Server built from o call hold after each fenced write it judged allowed on its
// host (router.writeRefusal), before the write is sent. Set before New, as HoldPutBack.
func HoldFencedJudgement(o *Options, hold func()) { o.hooks.fencedJudged = hold }

// AfterFencedScan makes the Server built from o call f each time the router's change has made it choose the
// sessions in a fenced transaction it acts on (fencedHostsRefused), before it acts. Set before New.
func AfterFencedScan(o *Options, f func()) { o.hooks.fencedScanned = f }
