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
