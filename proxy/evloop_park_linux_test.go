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
	epfd, wakefd, err := newEpoll()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(wakefd)
	ep := newEpollFile(epfd)
	defer ep.close()
	if ep.conn == nil {
		t.Fatal("the epoll descriptor did not go to the netpoller")
	}
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
	// Signal only once the waiter sits in the netpoller (a goroutine in "IO wait" inside epollFile.wait).
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		stacks := string(buf[:runtime.Stack(buf, true)])
		if parkedInWait(stacks) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter never parked in the netpoller:\n%s", stacks)
		}
		time.Sleep(time.Millisecond)
	}
	signalFD(wakefd)
	r := <-done
	if r.err != nil || r.n != 1 || !r.parked {
		t.Fatalf("after waiting for an event: wait = %d events, parked %v, err %v; want 1, true, nil", r.n, r.parked, r.err)
	}
}

// parkedInWait reports whether a goroutine dump shows one parked in the netpoller inside epollFile.wait.
func parkedInWait(stacks string) bool {
	for _, g := range strings.Split(stacks, "\n\n") {
		if strings.Contains(g, "[IO wait") && strings.Contains(g, "(*epollFile).wait") {
			return true
		}
	}
	return false
}

// TestEpollGateQuietWhileLoopRuns: while the loop is not waiting, messages reaching its sockets must not make
// the descriptor the netpoller watches readable: each such edge woke an idle Go thread for nothing. Only a
// waiting loop arms the gate, and it is disarmed again once the loop runs.
func TestEpollGateQuietWhileLoopRuns(t *testing.T) {
	epfd, wakefd, err := newEpoll()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(wakefd)
	ep := newEpollFile(epfd)
	defer ep.close()
	if ep.conn == nil {
		t.Fatal("the gate did not go to the netpoller")
	}
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
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<20)
	for !parkedInWait(string(buf[:runtime.Stack(buf, true)])) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never parked in the netpoller")
		}
		time.Sleep(time.Millisecond)
	}
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
