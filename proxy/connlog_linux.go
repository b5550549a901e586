package proxy

// loopOutcome says how a session relayed by an event loop ended, for the "connection ended" line.
func loopOutcome(es *evSession) string {
	switch {
	case es.forced.Load():
		return outcomeShutdown
	case es.end == endTerminate:
		return outcomeTerminated
	case es.end == endProtocol:
		return outcomeProtocol
	case es.end == endDrained:
		return outcomeShutdown
	case es.end == endUpstreamGone:
		return outcomeServerClosed
	default:
		return outcomeClientGone
	}
}
