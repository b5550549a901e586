package proxy

import (
	"net"
	"sync"
	"testing"
	"time"
)

// gatedConn records the read deadline an interrupt sets; while gate is set, a deadline other than none waits
// for gate to close (a raise caught between its reason and its deadline), telling entered first.
type gatedConn struct {
	net.Conn
	mu       sync.Mutex
	deadline time.Time
	gate     chan struct{}
	entered  chan struct{}
}

func (c *gatedConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	gate, entered := c.gate, c.entered
	if !t.IsZero() && gate != nil {
		c.gate, c.entered = nil, nil // only the first such call waits
	}
	c.mu.Unlock()
	if !t.IsZero() && gate != nil {
		close(entered)
		<-gate
	}
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return nil
}

func (c *gatedConn) readDeadline() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline
}

// A reason cleared while its raise is between its reason and its deadline (the parker's sweep raising intrPark
// as the session, at its message boundary, drops it or parks) must not leave the deadline behind with no reason
// pending: the reader's next read then fails with a timeout no interrupt explains, which relayPooled takes for
// the client's failure and ends the session (endClientGone). The reason and its deadline change together.
func TestInterruptClearNeverLeavesADeadlineWithoutReason(t *testing.T) {
	for _, tc := range []struct {
		name  string
		clear func(*interrupt)
	}{
		{"dropPark", (*interrupt).dropPark},
		{"take", func(i *interrupt) { i.take() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &gatedConn{gate: make(chan struct{}), entered: make(chan struct{})}
			gate, entered := c.gate, c.entered
			i := &interrupt{conn: c}
			raised := make(chan struct{})
			go func() {
				i.raise(intrPark)
				close(raised)
			}()
			<-entered // the raise is setting its deadline
			cleared := make(chan struct{})
			go func() {
				tc.clear(i)
				close(cleared)
			}()
			// Without a rule that orders the two, the clear runs to its end now; with one, it waits for the
			// raise, and the gate must open for either to finish.
			select {
			case <-cleared:
			case <-time.After(200 * time.Millisecond):
			}
			close(gate)
			<-raised
			<-cleared
			if r, dl := i.reason(), c.readDeadline(); r == intrNone && !dl.IsZero() {
				t.Fatalf("%s racing with a raise left the read deadline %v set with no reason pending", tc.name, dl)
			}
		})
	}
}
