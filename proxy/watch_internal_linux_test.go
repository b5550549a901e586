package proxy

import (
	"net"
	"testing"
	"time"
)

// watchPair is a loopback TCP connection: the proxy's side (c) and the client's (peer), closed when tb ends.
func watchPair(tb testing.TB) (c, peer *net.TCPConn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	p, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		p.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { a.Close(); p.Close() })
	return a.(*net.TCPConn), p.(*net.TCPConn)
}

// newTestWatcher is a client watcher that arms a watch after armAfter, closed when tb ends.
func newTestWatcher(tb testing.TB, armAfter time.Duration) *clientWatcher {
	tb.Helper()
	cw := newClientWatcher()
	if cw == nil {
		tb.Fatal("no epoll instance for the client watcher")
	}
	cw.armAfter = armAfter
	tb.Cleanup(cw.close)
	return cw
}

// watchedSession is a pooled session of client c, on a Server whose client watcher is cw (nil: waits poll).
func watchedSession(c net.Conn, cw *clientWatcher) *session {
	return &session{client: c, srv: &Server{pools: &txPools{clientWatcher: cw}}, pooled: &pooledState{}}
}

// BenchmarkWatchClient is the cost of one watch of the client (watchClient, then end) around a wait: "short"
// ends before the watch arms (as most waits do), "armed" joins the epoll set and leaves it (a long wait's),
// "poll" is a look every waitCheck (other systems; before 2026-12-05, every wait).
func BenchmarkWatchClient(b *testing.B) {
	c, _ := watchPair(b)
	cw, armed := newTestWatcher(b, watchArmAfter), newTestWatcher(b, 0)
	for _, bc := range []struct {
		name string
		cw   *clientWatcher
	}{{"short", cw}, {"armed", armed}, {"poll", nil}} {
		b.Run(bc.name, func(b *testing.B) {
			ss := watchedSession(c, bc.cw)
			b.ReportAllocs()
			for b.Loop() {
				ss.watchClient(func() {}, 0).end()
			}
		})
	}
}

// watchFor starts a watch of ss's client whose wake sends on the returned channel.
func watchFor(ss *session) (*clientWatch, chan struct{}) {
	woke := make(chan struct{}, 1)
	return ss.watchClient(func() { woke <- struct{}{} }, 0), woke
}

// awaitWake fails tb unless the watch w was woken and is gone.
func awaitWake(tb testing.TB, what string, w *clientWatch, woke chan struct{}) {
	tb.Helper()
	select {
	case <-woke:
	case <-time.After(10 * time.Second):
		tb.Fatalf("%s: the watch was not woken in 10 s", what)
	}
	if !w.gone.Load() {
		tb.Fatalf("%s: woken, but not gone", what)
	}
}

// The client watcher wakes a wait once its client's socket ends, by the socket's end itself (the epoll set; no
// look every waitCheck), whatever the client pipelined before, and only then: its FIN, a reset, an end that
// came before the watch armed; the session forced out (forceClose, whose close of the socket the set cannot
// see) wakes it too, as does a socket closed on this side before the watch armed.
func TestClientWatchWakesAtTheSocketsEnd(t *testing.T) {
	t.Run("FIN", func(t *testing.T) {
		cw := newTestWatcher(t, 0)
		c, peer := watchPair(t)
		w, woke := watchFor(watchedSession(c, cw))
		defer w.end()
		peer.CloseWrite()
		awaitWake(t, "FIN", w, woke)
		if n := cw.woken.Load(); n != 1 {
			t.Fatalf("%d wake-ups from the epoll set, want 1", n)
		}
	})
	t.Run("FIN within a grace", func(t *testing.T) {
		// A wait with a grace (the settle after a Terminate, the probe: leaveGrace) is woken by its client's
		// end only once it has lasted the grace: a client that says goodbye and closes at once must not cost
		// its server connection for a wait that was about to end.
		cw := newTestWatcher(t, 0)
		c, peer := watchPair(t)
		woke := make(chan struct{}, 1)
		const grace = 300 * time.Millisecond
		start := time.Now()
		w := watchedSession(c, cw).watchClient(func() { woke <- struct{}{} }, grace)
		defer w.end()
		peer.CloseWrite()
		awaitWake(t, "FIN within a grace", w, woke)
		if took := time.Since(start); took < grace {
			t.Fatalf("woken %v after the wait began, within its grace of %v", took, grace)
		}
	})
	t.Run("reset", func(t *testing.T) {
		cw := newTestWatcher(t, 0)
		c, peer := watchPair(t)
		w, woke := watchFor(watchedSession(c, cw))
		defer w.end()
		peer.SetLinger(0)
		peer.Close()
		awaitWake(t, "reset", w, woke)
		if n := cw.woken.Load(); n != 1 {
			t.Fatalf("%d wake-ups from the epoll set, want 1", n)
		}
	})
	t.Run("pipelined bytes", func(t *testing.T) {
		// Bytes that wait unread when the watch arms wake nothing (no EPOLLIN): the set would report them at
		// once, before the other socket's end, added after, which comes through the same set.
		cw := newTestWatcher(t, 0)
		c, peer := watchPair(t)
		if _, err := peer.Write([]byte("Q\x00\x00\x00\x0dSELECT 1\x00")); err != nil {
			t.Fatal(err)
		}
		a, aWoke := watchFor(watchedSession(c, cw))
		defer a.end()
		c2, peer2 := watchPair(t)
		b, bWoke := watchFor(watchedSession(c2, cw))
		defer b.end()
		peer2.CloseWrite()
		awaitWake(t, "the other socket's FIN", b, bWoke)
		if n := cw.woken.Load(); n != 1 || a.gone.Load() {
			t.Fatalf("bytes pipelined: %d wake-ups from the epoll set (want 1), watch gone: %v", n, a.gone.Load())
		}
		peer.CloseWrite()
		awaitWake(t, "FIN after bytes", a, aWoke)
	})
	t.Run("ended before it armed", func(t *testing.T) {
		cw := newTestWatcher(t, time.Hour)
		c, peer := watchPair(t)
		w, woke := watchFor(watchedSession(c, cw))
		defer w.end()
		peer.CloseWrite()
		w.mu.Lock()
		cw.arm(w) // what the timer does after watchArmAfter
		w.mu.Unlock()
		awaitWake(t, "FIN before the watch armed", w, woke)
	})
	t.Run("forced out", func(t *testing.T) {
		cw := newTestWatcher(t, 0)
		c, _ := watchPair(t)
		ss := watchedSession(c, cw)
		w, woke := watchFor(ss)
		defer w.end()
		ss.forcedOut.Store(true) // as forceClose does, then
		ss.pooled.wakeWatches()
		awaitWake(t, "forced out during the wait", w, woke)
		w2, woke2 := watchFor(ss)
		defer w2.end()
		awaitWake(t, "forced out before the wait", w2, woke2)
		if n := cw.woken.Load(); n != 0 {
			t.Fatalf("%d wake-ups from the epoll set, want 0 (nothing ended there)", n)
		}
	})
	t.Run("closed on this side before it armed", func(t *testing.T) {
		cw := newTestWatcher(t, time.Hour)
		c, _ := watchPair(t)
		w, woke := watchFor(watchedSession(c, cw))
		defer w.end()
		c.Close()
		w.mu.Lock()
		cw.arm(w)
		w.mu.Unlock()
		awaitWake(t, "closed on this side", w, woke)
	})
	t.Run("descriptor reused", func(t *testing.T) {
		// forceClose closes the socket of a session whose watch is armed; the number goes to a new connection,
		// watched too. The first watch's end must not take the new socket out of the set.
		cw := newTestWatcher(t, 0)
		fdOf := func(c net.Conn) int {
			n := -1
			socketOf(c).Control(func(f uintptr) { n = int(f) })
			return n
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0") // before the close: it must not take the number
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c, _ := watchPair(t)
		old, _ := watchFor(watchedSession(c, cw))
		fd := fdOf(c)
		c.Close()
		// The lowest free number is taken: by one of the next pair's sockets (either end will do), unless
		// another test's socket took it.
		var peer net.Conn
		for range 100 {
			a, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			b, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if fdOf(b) == fd {
				a, b = b, a
			}
			if fdOf(a) != fd {
				continue
			}
			peer = b
			w, woke := watchFor(watchedSession(a, cw))
			defer w.end()
			old.end()
			peer.(*net.TCPConn).CloseWrite()
			awaitWake(t, "the socket that reused the number", w, woke)
			break
		}
		if peer == nil {
			t.Fatalf("descriptor %d was not reused in 100 connections", fd)
		}
	})
	t.Run("two watches of one session", func(t *testing.T) {
		// A probe's watch may overlap the session goroutine's: one place in the set for both (a socket cannot be
		// added twice), both woken by its end, and a watch that arms after the end was reported is gone at once.
		cw := newTestWatcher(t, 0)
		c, peer := watchPair(t)
		ss := watchedSession(c, cw)
		a, aWoke := watchFor(ss)
		defer a.end()
		b, bWoke := watchFor(ss)
		defer b.end()
		if r := cw.bySession[ss]; r == nil || r.armed != 2 || len(cw.byID) != 1 {
			t.Fatalf("two watches armed: the session's place in the set %+v, %d places", r, len(cw.byID))
		}
		peer.CloseWrite()
		awaitWake(t, "the first watch", a, aWoke)
		awaitWake(t, "the second watch", b, bWoke)
		c2, c2Woke := watchFor(ss)
		defer c2.end()
		awaitWake(t, "a watch armed after the end", c2, c2Woke)
		if n := cw.woken.Load(); n != 1 {
			t.Fatalf("%d ends reported by the epoll set, want 1", n)
		}
	})
	t.Run("end leaves the set", func(t *testing.T) {
		cw := newTestWatcher(t, 0)
		c, _ := watchPair(t)
		ss := watchedSession(c, cw)
		w, _ := watchFor(ss)
		w2, _ := watchFor(ss)
		if r := cw.bySession[ss]; r == nil || r.armed != 2 || ss.pooled.watches != w2 || w2.next != w {
			t.Fatalf("under way: the session's place in the set %+v, want 2 armed, and both in the session", r)
		}
		w.end()
		if r := cw.bySession[ss]; r == nil || r.armed != 1 || ss.pooled.watches != w2 || w2.next != nil {
			t.Fatalf("one ended: the session's place in the set %+v, want 1 armed, and the other alone in the session", r)
		}
		w2.end()
		if len(cw.bySession) != 0 || len(cw.byID) != 0 || ss.pooled.watches != nil {
			t.Fatalf("ended: %d places in the set, want none, and none in the session", len(cw.byID))
		}
	})
}
