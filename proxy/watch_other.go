//go:build !linux

package proxy

// clientWatcher wakes waits from the client socket's end on Linux only (watch_linux.go); elsewhere every watch
// looks at the socket every waitCheck (clientWatch.poll).
type clientWatcher struct{}

// sockWatch: a watch has no part of the platform's here.
type sockWatch struct{}

func newClientWatcher() *clientWatcher { return nil }

func (*clientWatcher) start(w *clientWatch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.poll()
}

func (*clientWatcher) close() {}

func (*clientWatch) unwatch() {}
