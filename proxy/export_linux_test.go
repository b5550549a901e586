package proxy

// LoopSessions returns, for each event loop, how many sessions it relays and how many of them are inside a
// transaction block.
func LoopSessions(s *Server) (sessions, inTx []int) {
	for _, l := range s.loops {
		l.mu.Lock()
		sessions = append(sessions, l.nsess)
		l.mu.Unlock()
		inTx = append(inTx, int(l.inTx.Load()))
	}
	return sessions, inTx
}

// RunnableThreads exposes the /proc/loadavg parser.
var RunnableThreads = runnableThreads
