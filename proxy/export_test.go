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

// InlineWatching reports whether the watch of inline reads runs (pooled.go: watchInline).
func InlineWatching(s *Server) bool { return s.pools != nil && s.pools.inlineWatching.Load() }

// OptionSetting is optionSetting: the value a startup options string gives a setting, as the proxy reads it.
func OptionSetting(options, name string) (string, bool) { return optionSetting(options, name) }
