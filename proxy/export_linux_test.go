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

// ParkedClients is how many transaction-mode sessions wait in the parker (park_linux.go), and Sweeps how many
// sweeps it made.
func ParkedClients(s *Server) int {
	if s.pools == nil || s.pools.parker == nil {
		return -1
	}
	return s.pools.parker.count()
}

func Sweeps(s *Server) int64 {
	if s.pools == nil || s.pools.parker == nil {
		return -1
	}
	return s.pools.parker.sweeps.Load()
}

// ClientWatchWakes is how many waits on the server side the client watcher woke because their client's socket
// ended (watch_linux.go); -1 when the Server has none.
func ClientWatchWakes(s *Server) int64 {
	if s.pools == nil || s.pools.clientWatcher == nil {
		return -1
	}
	return s.pools.clientWatcher.woken.Load()
}
