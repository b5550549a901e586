//go:build !linux

package proxy

import "time"

// The event loop is Linux-only; elsewhere every session stays on the goroutine transport.

type evLoop struct{}

type evSession struct{ loop *evLoop }

func newEvLoops(*Server, int, time.Duration) []*evLoop { return nil }

func (ss *session) loopEligible() bool { return false }

func (ss *session) runInLoop() (ending, sessionIO, bool) { return ending{}, nil, false }

func (es *evSession) shutdownSockets() {}

func (es *evSession) shutdownUpstream() {}

func (es *evSession) lockAnswer(q lockQuestion) (lockQuestion, bool) { return q, false }

func (l *evLoop) post(evCmd) {}

type evCmd struct {
	es    *evSession
	drain bool
}
