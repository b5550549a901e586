//go:build linux

package proxy

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestEpollFileWaitReportsPark: the loop yields to the scheduler only when it has not parked in the netpoller
// for a while (loopYieldAfter), so epollFile.wait must say truly whether it parked: not when an event was
// already waiting, yes when it had to wait for one.
func TestEpollFileWaitReportsPark(t *testing.T) {
	ep, wakefd := newTestEpollFile(t)
	events := make([]unix.EpollEvent, 8)
	var drain [8]byte

	signalFD(wakefd)
	n, parked, err := ep.wait(events)
	if err != nil || n != 1 || parked {
		t.Fatalf("with an event waiting: wait = %d events, parked %v, err %v; want 1, false, nil", n, parked, err)
	}
	if _, err := sysRead(wakefd, drain[:]); err != nil {
		t.Fatal(err)
	}

	type result struct {
		n      int
		parked bool
		err    error
	}
	done := make(chan result, 1)
	go func() {
		n, parked, err := ep.wait(events)
		done <- result{n, parked, err}
	}()
	untilParkedInWait(t) // signal only once the waiter sits in the netpoller
	signalFD(wakefd)
	r := <-done
	if r.err != nil || r.n != 1 || !r.parked {
		t.Fatalf("after waiting for an event: wait = %d events, parked %v, err %v; want 1, true, nil", r.n, r.parked, r.err)
	}
}

// newTestEpollFile is a loop's epoll descriptor with its doorbell (an eventfd) and its epollFile, closed when
// the test ends.
func newTestEpollFile(t *testing.T) (ep *epollFile, wakefd int) {
	t.Helper()
	epfd, wakefd, err := newEpoll()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(wakefd) })
	ep = newEpollFile(epfd)
	t.Cleanup(ep.close)
	if ep.conn == nil {
		t.Fatal("the gate did not go to the netpoller")
	}
	return ep, wakefd
}

// untilParkedInWait waits until a goroutine dump shows the test's own waiter (a goroutine the test function
// started) parked in the netpoller ("IO wait") inside epollFile.wait. Any goroutine in epollFile.wait would not
// do: in a run of the whole package an event loop of another test's proxy may sit there, its sessions not yet
// ended, and the test then signalled before its waiter had polled once (it saw parked false).
func untilParkedInWait(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<20)
	own := "proxy." + t.Name() + ".func" // the waiter's frame: a function literal of the test
	for {
		n := runtime.Stack(buf, true)
		if n == len(buf) { // cut short: the waiter may be in the part left out
			buf = make([]byte, 2*len(buf))
			continue
		}
		stacks := string(buf[:n])
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, "[IO wait") && strings.Contains(g, "(*epollFile).wait") && strings.Contains(g, own) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter never parked in the netpoller:\n%s", stacks)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestEpollGateQuietWhileLoopRuns: while the loop is not waiting, messages reaching its sockets must not make
// the descriptor the netpoller watches readable: each such edge woke an idle Go thread for nothing. Only a
// waiting loop arms the gate, and it is disarmed again once the loop runs.
func TestEpollGateQuietWhileLoopRuns(t *testing.T) {
	ep, wakefd := newTestEpollFile(t)
	events := make([]unix.EpollEvent, 8)
	gateEvents := make([]unix.EpollEvent, 1)
	var drain [8]byte
	gateReady := func() bool {
		t.Helper()
		n, err := pollNow(ep.gate, gateEvents)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	}

	signalFD(wakefd) // the loop is running: not waiting
	if gateReady() {
		t.Fatal("the gate is readable before the loop ever waited")
	}
	if n, _, err := ep.wait(events); err != nil || n != 1 {
		t.Fatalf("wait = %d, %v; want 1 event", n, err)
	}
	if ep.armed {
		t.Fatal("wait returned an event with the gate armed")
	}
	sysRead(wakefd, drain[:])

	// A wait that sleeps arms the gate, and the event that wakes it disarms it again.
	done := make(chan error, 1)
	go func() {
		n, parked, err := ep.wait(events)
		if err == nil && (n != 1 || !parked) {
			err = fmt.Errorf("wait = %d events, parked %v; want 1, true", n, parked)
		}
		done <- err
	}()
	untilParkedInWait(t)
	signalFD(wakefd)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ep.armed {
		t.Fatal("the gate stayed armed after the loop woke")
	}
	sysRead(wakefd, drain[:])
	signalFD(wakefd) // running again: a new message must not reach the netpoller
	if gateReady() {
		t.Fatal("the gate is readable while the loop runs: the netpoller would wake a thread for nothing")
	}
}

// TestEpollGateReportsArmingWhenAlreadyReady: the race the gate must survive. A message reaches the loop after
// its last poll found nothing and before it armed the gate, after an earlier sleep and wake-up: the arming
// itself must reach the netpoller (an edge on the gate), or the loop sleeps for ever with the message waiting.
// The netpoller's view is an outer edge-triggered epoll watching the gate, as the runtime's does.
func TestEpollGateReportsArmingWhenAlreadyReady(t *testing.T) {
	ep, wakefd := newTestEpollFile(t)
	outer, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(outer)
	oev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(ep.gate)}
	if err := unix.EpollCtl(outer, unix.EPOLL_CTL_ADD, ep.gate, &oev); err != nil {
		t.Fatal(err)
	}
	events := make([]unix.EpollEvent, 8)
	outerEvents := make([]unix.EpollEvent, 1)
	var drain [8]byte

	for round := 1; round <= 3; round++ {
		// A sleep and a wake-up, as in the loop, step by step: the gate armed, a message, the netpoller told
		// (it reads the outer epoll while the gate is armed and ready), the loop running again.
		if err := ep.armGate(); err != nil {
			t.Fatal(err)
		}
		signalFD(wakefd)
		if n, err := pollNow(outer, outerEvents); err != nil || n != 1 {
			t.Fatalf("round %d: a message while the gate is armed reached no one (%d events, %v)", round, n, err)
		}
		if err := ep.disarmGate(); err != nil {
			t.Fatal(err)
		}
		if n, err := pollNow(ep.epfd, events); err != nil || n != 1 {
			t.Fatalf("round %d: the loop's poll found %d events, %v; want 1", round, n, err)
		}
		sysRead(wakefd, drain[:])

		// The race: the next message comes while the gate is disarmed, then the loop arms it.
		signalFD(wakefd)
		if err := ep.armGate(); err != nil {
			t.Fatal(err)
		}
		n, err := pollNow(outer, outerEvents)
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("round %d: arming the gate over a waiting message reached no one: the loop would sleep for ever", round)
		}
		if err := ep.disarmGate(); err != nil {
			t.Fatal(err)
		}
		sysRead(wakefd, drain[:])
	}
}

// TestEpollGateNoLostWakeup plays the loop and its sockets against each other through the real netpoller: the
// loop waits, takes the message and says so; the other side waits a varying few microseconds, so that its next
// message lands anywhere in the loop's way back to sleep (its last poll, the arming, the park), and sends it.
// A wake-up lost there leaves the loop asleep with a message waiting, which the watchdog reports.
func TestEpollGateNoLostWakeup(t *testing.T) {
	ep, wakefd := newTestEpollFile(t)
	events := make([]unix.EpollEvent, 8)
	const rounds = 20000
	taken := make(chan struct{})
	failed := make(chan error, 1)
	go func() {
		var drain [8]byte
		for range rounds {
			if _, _, err := ep.wait(events); err != nil {
				failed <- err
				return
			}
			if _, err := sysRead(wakefd, drain[:]); err != nil {
				failed <- err
				return
			}
			taken <- struct{}{}
		}
	}()
	spin := 0
	for i := range rounds {
		for j := 0; j < i%64*8; j++ { // a varying delay, without sleeping
			spin += j
		}
		signalFD(wakefd)
		select {
		case <-taken:
		case err := <-failed:
			t.Fatal(err)
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the loop did not wake for a waiting message: a lost wake-up", i)
		}
	}
	_ = spin
}

// TestLoopStopsAfterACommandForALeftSession: a command posted for a session as it left the loop (a drain from
// Shutdown, a plan from a worker) may land after the session's release and before the loop looked whether it
// is empty; that look then keeps the loop for the command. Once the command is taken the loop must look
// again: it slept for ever with no session instead, a goroutine and two descriptors per occurrence, parked in
// epollFile.wait (where the park tests, which then took any goroutine there for their own waiter, could see it).
func TestLoopStopsAfterACommandForALeftSession(t *testing.T) {
	l := &evLoop{}
	epfd, wakefd, err := newEpoll()
	if err != nil {
		t.Fatal(err)
	}
	// The state of a loop whose last session was released (nsess 0) but which runs on for the command below.
	l.epfd, l.wakefd, l.running = epfd, wakefd, true
	done := make(chan struct{})
	go func() { defer close(done); l.run(epfd, wakefd) }()
	l.post(evCmd{es: &evSession{cfd: -1, ufd: -1}, drain: true}) // its session is in no loop any more
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the loop, with no session, did not stop after taking a command for a session that had left")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running {
		t.Fatal("the loop goroutine returned with running still set")
	}
}
