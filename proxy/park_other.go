//go:build !linux

package proxy

import (
	"io"
	"time"
)

// parker parks idle transaction-mode clients on Linux only (park_linux.go); elsewhere every session keeps its
// goroutine.
type parker struct{}

func newParker(*Server, time.Duration) *parker { return nil }

func (*parker) park(*session, int) bool { return false }
func (*parker) count() int              { return 0 }
func (*parker) close()                  {}

func parkableSocket(io.ReadWriter) (int, bool) { return -1, false }
