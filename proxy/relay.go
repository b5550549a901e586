package proxy

import (
	"errors"
	"io"
	"net"
	"time"
)

// The goroutine transport: the session goroutine reads the client and writes the upstream (clientToServer), a
// second goroutine reads the upstream and writes the client (serverToClient). Both frame with msgReader, give
// every message to the core (core.go), and stop each other only through the interrupts (interrupt.go). The
// session then ends in one place (end.go), on the session goroutine, once both have stopped.

// relay runs the session until it ends: in the event loop when it is eligible, on goroutines otherwise, moving
// from goroutines to the loop when startup is over.
func (ss *session) relay() {
	for {
		if ss.state.ready.Load() && ss.loopEligible() {
			// A session resumed on a kept connection, or handed over at the end of startup.
			if e, tio, ok := ss.runInLoop(); ok {
				ss.end(e, tio)
				return
			}
			ss.noLoop = true // the loop could not take the sockets: go on here; nothing buffered was lost
		}
		e, handover := ss.relayGoroutines()
		if !handover {
			ss.end(e, &goroutineIO{ss: ss})
			return
		}
	}
}

// relayGoroutines relays on two goroutines until the session ends, or until startup is over and the session
// is to move to the event loop (handover true: both sides stopped at a message boundary, nothing lost).
func (ss *session) relayGoroutines() (e ending, handover bool) {
	s2c := make(chan ending, 1)
	go func() { s2c <- ss.serverToClient() }()
	c := ss.clientToServer()
	if c.why == endHandover {
		<-s2c // it asked for the handover and stopped
		ss.clientIntr.take()
		return ending{}, true
	}
	ss.upstreamIntr.raise(intrStop)
	s := <-s2c
	switch {
	case c.why == endTerminate:
		c.atBoundary = s.why == endNone && s.atBoundary
		return c, false
	case c.why == endProtocol || c.why == endRefused || s.why == endNone:
		return c, false
	default:
		return s, false // the server side ended the session (and stopped the client side), or saw why first
	}
}

// clientToServer relays client messages until the session ends from the client side (Terminate, a protocol
// violation, the client's loss) or an interrupt stops it.
func (ss *session) clientToServer() ending {
	cr := &ss.cr
	for {
		r := ss.clientIntr.reason()
		if r == intrDrain {
			if e, stop := ss.clientDrain(); stop {
				return e
			}
			r = ss.clientIntr.reason() // still intrDrain (read on: decided again at the next boundary), or stronger
		}
		switch r {
		case intrNone, intrDrain:
		case intrHandover:
			if err := ss.sw.Flush(); err != nil {
				return ss.clientEnding(err)
			}
			return ending{why: endHandover}
		default:
			return ending{} // intrPeerEnded: the server side ended the session and says why
		}
		typ, _, err := cr.next()
		if err != nil {
			if ss.clientIntr.caught(err) != intrNone {
				continue // the reason is acted on at the top
			}
			return ss.clientEnding(err)
		}
		box := ss.srv.plannerNow()
		p := box.p
		ss.planGen = box.gen // the generation of p, for what the core keeps of the client's statements (reloadkept.go)
		if ss.clientNeedsBody(typ, p) {
			var body []byte
			if body, err = cr.body(); err == nil {
				err = ss.onClientMsg(typ, body, p, ss.sw)
				cr.release()
			}
		} else if err = ss.onClientMsg(typ, nil, p, ss.sw); err == nil {
			err = cr.forward(ss.sw)
		}
		if err != nil {
			return ss.clientEnding(err)
		}
		if !cr.nextBuffered() {
			ss.countRelayed(dirClientToServer, cr)
			if err := ss.sw.Flush(); err != nil {
				return ss.clientEnding(err)
			}
		}
	}
}

// clientDrain decides a drain at the client side's message boundary, where nothing the client sent can be on its
// way to the server: the session ends (drained) when it is idle and nothing of the client's next message has
// arrived (neither in the reader's buffer nor in the socket's); otherwise the drain stays pending, with the
// read deadline lifted, and is decided again at the next boundary or when the server side asks again (at the
// next ReadyForQuery). Deciding on the server side instead let a statement the client side forwarded meanwhile
// run unanswered, and a message whose body was still being read be cut off.
func (ss *session) clientDrain() (ending, bool) {
	if ss.state.idle() && ss.cr.r.Buffered() == 0 && !inputWaiting(ss.client) {
		return ending{why: endDrained}, true
	}
	ss.clientIntr.lift() // false: a stronger reason came meanwhile, acted on at the top
	return ending{}, false
}

// clientEnding says how the client side ended with err.
func (ss *session) clientEnding(err error) ending {
	switch {
	case err == errTerminated:
		return ending{why: endTerminate}
	case errors.Is(err, errProtocol):
		return ending{why: endProtocol, err: err}
	case errors.As(err, new(*sessionRefused)):
		return ending{why: endRefused, err: err}
	case ss.clientIntr.caught(err) != intrNone:
		return ending{} // stopped mid-message by the server side's end
	default:
		return ending{why: endClientGone, err: err}
	}
}

// serverToClient relays server messages until the upstream closes or fails, the client cannot be written to,
// a drain closes the session, the session moves to the event loop, or the client side stops it.
func (ss *session) serverToClient() ending {
	sr := &ss.sr
	wantLoop := false
	for {
		if ss.upstreamIntr.reason() != intrNone {
			if e, stop := ss.serverInterrupted(); stop {
				return e
			}
		}
		typ, _, err := sr.next()
		if err != nil {
			if ss.upstreamIntr.caught(err) != intrNone {
				continue // the reason is acted on at the top
			}
			return ss.serverEnding(err, true)
		}
		var ev serverEvent
		if ss.serverNeedsBody(typ) {
			var body []byte
			if body, err = sr.body(); err == nil {
				ev, err = ss.onServerMsg(typ, body, ss.cw)
				sr.release()
			}
		} else if ev, err = ss.onServerMsg(typ, nil, ss.cw); err == nil {
			err = sr.forward(ss.cw)
		}
		if err != nil {
			return ss.serverEnding(err, false)
		}
		if ev&evStartupOver != 0 {
			// Startup and authentication are over: lift the startup deadlines.
			ss.client.SetDeadline(time.Time{})
			ss.upstream.SetDeadline(time.Time{})
			wantLoop = ss.loopEligible()
		}
		if ev&evDrainNow != 0 {
			if err := ss.cw.Flush(); err != nil {
				return ss.serverEnding(err, true)
			}
			ss.clientIntr.raise(intrDrain) // the client side decides, at its message boundary (clientDrain)
		}
		if !sr.nextBuffered() {
			ss.countRelayed(dirServerToClient, sr)
			if err := ss.cw.Flush(); err != nil {
				return ss.serverEnding(err, true)
			}
			if wantLoop {
				// Startup is over and everything is flushed: this is a message boundary. Stop the client
				// side at its next one and let relay move the session.
				ss.clientIntr.raise(intrHandover)
				return ending{atBoundary: true}
			}
		}
	}
}

// serverInterrupted acts on the upstream interrupt at a message boundary: it reports stop when the server side
// must stop, with how it ended.
func (ss *session) serverInterrupted() (ending, bool) {
	r := ss.upstreamIntr.reason()
	if r == intrDrain {
		r = ss.upstreamIntr.take() // drain, or a stronger reason raised meanwhile
	}
	switch r {
	case intrDrain:
		if ss.state.idle() {
			ss.clientIntr.raise(intrDrain) // the client side decides, at its message boundary (clientDrain)
		}
		return ending{}, false // else its ReadyForQuery will look again
	case intrStop:
		return ending{atBoundary: true}, true
	}
	return ending{}, false
}

// serverEnding says how the server side ended with err, and stops the client side; atBoundary says the
// failure came between two messages.
func (ss *session) serverEnding(err error, atBoundary bool) ending {
	if ss.upstreamIntr.caught(err) == intrStop {
		return ending{} // stopped mid-message by the client side's end
	}
	ss.clientIntr.raise(intrPeerEnded)
	if ss.clientOut.failed.Load() {
		// The client went away while we wrote to it: the session ends from the client side.
		return ending{why: endClientGone, err: err}
	}
	return ending{why: endUpstreamGone, err: err, atBoundary: atBoundary}
}

// goroutineIO is how the session's end (end.go) reaches the connections of the goroutine transport.
type goroutineIO struct {
	ss    *session
	taken bool // the upstream connection was taken for reuse
}

func (g *goroutineIO) forced() bool { return g.ss.forced() }

func (g *goroutineIO) sendUpstream(b []byte) {
	ss := g.ss
	ss.upstream.SetWriteDeadline(time.Now().Add(farewellTimeout))
	ss.sw.Write(b)
	ss.sw.Flush()
}

func (g *goroutineIO) sendClient(b []byte) {
	ss := g.ss
	ss.client.SetWriteDeadline(time.Now().Add(farewellTimeout))
	ss.cw.Write(b)
	ss.cw.Flush()
}

func (g *goroutineIO) finishClientMessage(deadline time.Time) bool {
	ss := g.ss
	if ss.sr.rest == 0 {
		return true
	}
	ss.upstream.SetReadDeadline(deadline)
	ss.client.SetWriteDeadline(deadline)
	return ss.sr.finishForward(ss.cw) == nil && ss.cw.Flush() == nil
}

func (g *goroutineIO) lingerClient(deadline time.Time) {
	c := g.ss.client
	cw, ok := c.(interface{ CloseWrite() error }) // *net.TCPConn, *tls.Conn
	if !ok || cw.CloseWrite() != nil {
		return
	}
	c.SetReadDeadline(deadline)
	io.Copy(io.Discard, c)
}

func (g *goroutineIO) drainUpstream(deadline time.Time) bool {
	g.ss.upstream.SetReadDeadline(deadline)
	_, err := io.Copy(io.Discard, g.ss.upstream) // what the reader holds is discarded with it
	return err == nil
}

func (g *goroutineIO) keepable() bool { return g.ss.sr.r.Buffered() == 0 }

func (g *goroutineIO) takeUpstream() (net.Conn, error) {
	g.taken = true
	g.ss.upstreamIntr.take()
	g.ss.upstream.SetDeadline(time.Time{})
	return g.ss.upstream, nil
}

func (g *goroutineIO) close() {
	g.ss.client.Close()
	if !g.taken {
		g.ss.upstream.Close()
	}
}
