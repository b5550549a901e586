//go:build linux

package proxy

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The event loop relays plain-TCP sessions after startup the way pgbouncer does: one goroutine waits in
// epoll_wait over every such session's two sockets and does the non-blocking reads and writes itself. On a
// machine where waking a thread is expensive this matters: the goroutine transport costs, per round trip, two
// goroutine parks and wake-ups through the runtime's poller and a read that returns EAGAIN on each side.
//
// This file is the loop itself (epoll, commands, polling policy); evsession_linux.go is what it does for one
// session: framing with parseHeader and giving each message to the session core, as the goroutine transport
// does. A statement whose plan is not cached is planned on a worker goroutine while the loop serves the other
// sessions (evsession_linux.go: planning), and a message's lock question is asked the same way (lockquestion.go).
// Sessions end on their own goroutine (end.go): the loop gives the session back (done) with the reason.

// evLoop is one of a Server's event loops. Its goroutine runs while it has sessions and exits when it has none.
type evLoop struct {
	srv  *Server
	spin time.Duration // how long to poll before sleeping (spinPoll); 0: never
	// inTx counts this loop's sessions inside a transaction block (last ReadyForQuery not 'I'). Written by the
	// loop goroutine only; atomic so that tests can read it.
	inTx atomic.Int32

	// epoll is the loop goroutine's way to wait (waitEvents); set when the goroutine starts.
	epoll *epollFile

	mu      sync.Mutex
	running bool
	epfd    int
	wakefd  int // eventfd: commands are waiting
	cmds    []evCmd
	nsess   int
}

// loopYieldEvents is how many socket events the loop handles between looks at the clock to decide whether to
// yield to the scheduler (loopYieldAfter): an event costs a few to tens of microseconds, so the loop looks every
// millisecond or so, and reading the clock per event would cost more than the look.
const loopYieldEvents = 128

// loopYieldAfter is how long the loop runs without parking before it yields: well inside the runtime's 10 ms
// time slice (after which sysmon preempts it with a signal and wakes another thread). A loop that parked in the
// netpoller since has been rescheduled already and does not yield: a yield puts the goroutine on the global run
// queue and wakes another thread, which often takes it while this one goes to sleep, a migration for nothing.
// With 64 select-only clients on two CPUs this made yields 4-5 times rarer and the proxy's CPU per transaction
// a few percent lower (docs/benchmark.md).
const loopYieldAfter = 5 * time.Millisecond

// evCmd is work for the loop from another goroutine: add a session, check whether a drain may close it, or
// go on with it now that a worker planned its statement or asked its lock question.
type evCmd struct {
	es      *evSession
	drain   bool
	planned *planJob
	asked   *lockJob
}

// newEvLoops makes n event loops. A Server has several because one loop is one thread: pgbouncer's single
// thread is its ceiling on a machine with idle cores, and sessions spread over several loops lift it (the
// default is one per two CPUs: relay.event_loops, config.Relay).
func newEvLoops(s *Server, n int, spin time.Duration) []*evLoop {
	loops := make([]*evLoop, max(n, 1))
	for i := range loops {
		loops[i] = &evLoop{srv: s, spin: spin}
	}
	return loops
}

// pickLoop returns the loop with the fewest sessions.
func (s *Server) pickLoop() *evLoop {
	var best *evLoop
	fewest := 0
	for _, l := range s.loops {
		l.mu.Lock()
		n := l.nsess
		l.mu.Unlock()
		if best == nil || n < fewest {
			best, fewest = l, n
		}
	}
	return best
}

// add gives the loop a session, starting the loop goroutine if it is not running.
func (l *evLoop) add(es *evSession) {
	l.mu.Lock()
	l.nsess++
	l.cmds = append(l.cmds, evCmd{es: es})
	if l.running {
		l.mu.Unlock()
		l.wake()
		return
	}
	epfd, wfd, err := newEpoll()
	if err != nil {
		// Without a loop the session cannot be relayed here.
		l.nsess--
		l.cmds = l.cmds[:len(l.cmds)-1]
		l.mu.Unlock()
		es.finish(endRelayFailed, err)
		close(es.done)
		return
	}
	l.epfd, l.wakefd = epfd, wfd
	l.running = true
	signalFD(l.wakefd) // the first command is waiting
	l.mu.Unlock()
	go l.run(epfd, wfd)
}

// newEpoll creates an epoll instance watching a new eventfd, the loop's doorbell.
func newEpoll() (epfd, wakefd int, err error) {
	epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return -1, -1, fmt.Errorf("epoll_create1: %w", err)
	}
	wakefd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return -1, -1, fmt.Errorf("eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wakefd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, &ev); err != nil {
		unix.Close(epfd)
		unix.Close(wakefd)
		return -1, -1, fmt.Errorf("epoll_ctl add eventfd: %w", err)
	}
	return epfd, wakefd, nil
}

// post queues a command for a session already in the loop.
func (l *evLoop) post(c evCmd) {
	l.mu.Lock()
	if !l.running {
		l.mu.Unlock()
		return
	}
	l.cmds = append(l.cmds, c)
	l.mu.Unlock()
	l.wake()
}

func (l *evLoop) wake() {
	l.mu.Lock()
	if l.running {
		signalFD(l.wakefd)
	}
	l.mu.Unlock()
}

// signalFD adds one to an eventfd. It cannot block (the counter would have to reach 2^64-1).
func signalFD(fd int) {
	one := uint64(1)
	unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&one)), 8)
}

func (l *evLoop) run(epfd, wakefd int) {
	l.epoll = newEpollFile(epfd)
	events := make([]unix.EpollEvent, 128)
	byFD := map[int32]*evSession{}
	var cmds []evCmd
	var drain [8]byte
	// busy is true while polls find several sockets ready (many sessions at work): the next poll is then a raw
	// non-blocking one, which under load usually finds more without telling the scheduler. Otherwise the loop
	// blocks directly, so a lone session's round trip costs one epoll_wait per wake-up, as in pgbouncer.
	busy := false
	// Work done since the loop last looked at the clock, and when it last gave the scheduler a chance. The
	// runtime preempts a goroutine that runs for 10 ms without rescheduling (blocking in a system call does not
	// count) with a signal, and wakes other threads to take over; under a steady load this goroutine may never
	// park, so it yields when it has not for loopYieldAfter, which costs far less.
	sinceYield := 0
	lastPark := time.Now()
	var load *loadReader // for spinPoll only
	if l.spin > 0 {
		load = openLoadReader()
		defer load.close()
	}
	for {
		if sinceYield >= loopYieldEvents {
			sinceYield = 0
			if now := time.Now(); now.Sub(lastPark) >= loopYieldAfter {
				runtime.Gosched()
				lastPark = now
			}
		}
		n, err := 0, error(nil)
		if busy {
			n, err = pollNow(epfd, events)
		}
		if n == 0 && err == nil && l.spin > 0 {
			n, err = l.spinPoll(epfd, events, load)
		}
		if n == 0 && err == nil {
			var parked bool
			n, parked, err = l.epoll.wait(events)
			if parked {
				lastPark = time.Now()
			}
			if err == unix.EINTR {
				busy = false
				continue
			}
			busy = n > 1
		} else {
			busy = true
		}
		if err != nil {
			l.fail(epfd, wakefd, byFD, fmt.Errorf("epoll_wait: %w", err))
			return
		}
		sinceYield += n
		// ended: a session left the loop, or commands were taken. Either may have made the loop empty: a
		// command for a session that was leaving (a drain or a plan posted as it ended) can come after that
		// session's release and before the stopIfEmpty that follows it, which then keeps the loop; had no one
		// looked again once the command was taken, the loop would sleep for ever with no session.
		ended := false
		for i := range events[:n] {
			fd := events[i].Fd
			if fd == int32(wakefd) {
				sysRead(wakefd, drain[:])
				l.mu.Lock()
				cmds, l.cmds = l.cmds, cmds[:0]
				l.mu.Unlock()
				for _, c := range cmds {
					in := byFD[int32(c.es.cfd)] == c.es
					switch {
					case c.drain:
						if in {
							c.es.checkDrain()
						}
					case c.planned != nil:
						if in {
							c.es.planned(c.planned, epfd)
						}
					case c.asked != nil:
						if in {
							c.es.lockAnswered(c.asked, epfd)
						}
					default:
						c.es.start(epfd, byFD)
						in = byFD[int32(c.es.cfd)] == c.es
					}
					if c.es.end != endNone && in {
						c.es.release(epfd, byFD)
						ended = true
					}
				}
				ended = ended || len(cmds) > 0
				clear(cmds)
				continue
			}
			es := byFD[fd]
			if es == nil {
				continue
			}
			es.event(fd, events[i].Events, epfd)
			if es.end != endNone {
				es.release(epfd, byFD)
				ended = true
			}
		}
		if ended && l.stopIfEmpty(epfd, wakefd) {
			return
		}
	}
}

// stopIfEmpty ends the loop goroutine when it has no session and no command left; it reports whether it did.
func (l *evLoop) stopIfEmpty(epfd, wakefd int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.nsess != 0 || len(l.cmds) != 0 {
		return false
	}
	l.running = false
	l.epoll.close()
	unix.Close(wakefd)
	return true
}

// fail ends every session of a loop whose epoll instance failed, and the loop with them: each session goes
// back to its goroutine with endRelayFailed, which logs and closes it cleanly. Sessions added meanwhile are
// ended the same way.
func (l *evLoop) fail(epfd, wakefd int, byFD map[int32]*evSession, err error) {
	l.srv.log.Error("event loop failed; closing its sessions", "err", err)
	for _, es := range byFD {
		if byFD[int32(es.cfd)] == es {
			es.finish(endRelayFailed, err)
			es.release(epfd, byFD)
		}
	}
	l.mu.Lock()
	cmds := l.cmds
	l.cmds = nil
	l.running = false
	l.epoll.close()
	unix.Close(wakefd)
	l.mu.Unlock()
	for _, c := range cmds {
		if c.drain || c.planned != nil || c.asked != nil {
			continue // its session was ended above
		}
		c.es.finish(endRelayFailed, err)
		c.es.setInTx(false)
		l.mu.Lock()
		l.nsess--
		l.mu.Unlock()
		close(c.es.done)
	}
}

// pollNow is a non-blocking epoll_wait that does not tell the scheduler (it cannot block). EINTR counts as
// nothing found.
func pollNow(epfd int, events []unix.EpollEvent) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_WAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	switch e {
	case 0:
		return int(r), nil
	case unix.EINTR:
		return 0, nil
	}
	return 0, fmt.Errorf("epoll_wait: %w", e)
}

// sysRead and sysWrite are raw non-blocking socket calls: they never block, so they need not tell the
// scheduler. Writes use send(MSG_NOSIGNAL) so that a vanished peer is an EPIPE, not a signal.
func sysRead(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func sysWrite(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), unix.MSG_NOSIGNAL, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// spinPoll polls the loop's sockets without sleeping, for up to l.spin, and returns the number of events found
// (0: the loop should sleep in epoll_wait).
//
// Sleeping costs a round trip twice: the thread that sends to a sleeping loop has to wake it, and on a virtual
// machine a CPU that went idle takes tens of microseconds to wake up. Between two messages of one session (a
// query on its way to PostgreSQL and the answer coming back, an answer and the client's next query) there are
// often only tens of microseconds, so the loop polls for a while first, as a spinning mutex does. It gives
// the CPU to any other runnable thread between polls (sched_yield), and it polls only while that takes no CPU
// from anyone: while fewer threads are runnable than there are CPUs (/proc/loadavg), or while one of its
// sessions is inside a transaction, because that session's row locks hold other sessions up and the sooner its
// next statement goes through the sooner they proceed. And at most one loop per two CPUs polls at a time (as
// the Go runtime bounds its own spinning threads), so polling loops never hold every CPU. Under a CPU-bound
// load a loop therefore sleeps at once, like pgbouncer; with one busy client it does not sleep between round
// trips, which took select-only pgbench with one client from about 11,500 to 17,300 TPS on a 2-vCPU VM
// (docs/benchmark.md).
func (l *evLoop) spinPoll(epfd int, events []unix.EpollEvent, load *loadReader) (int, error) {
	spinners := &l.srv.spinners
	if spinners.Add(1) > int32(max(1, load.ncpu/2)) {
		spinners.Add(-1)
		return 0, nil
	}
	defer spinners.Add(-1)
	deadline := time.Now().Add(l.spin)
	for {
		if l.inTx.Load() == 0 && !load.cpuFree() {
			return 0, nil
		}
		unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		if n, err := pollNow(epfd, events); n > 0 || err != nil {
			return n, err
		}
		if !time.Now().Before(deadline) {
			return 0, nil
		}
	}
}

// loadReader reads how many threads are runnable from /proc/loadavg, whose fourth field is
// "runnable/total" (the reader itself is one of the runnable).
type loadReader struct {
	fd   int // -1: unavailable, so the CPU never counts as free
	ncpu int
	buf  [128]byte
}

func openLoadReader() *loadReader {
	fd, err := unix.Open("/proc/loadavg", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		fd = -1
	}
	return &loadReader{fd: fd, ncpu: runtime.NumCPU()}
}

func (lr *loadReader) close() {
	if lr.fd >= 0 {
		unix.Close(lr.fd)
		lr.fd = -1
	}
}

// cpuFree reports whether no thread is waiting for a CPU: at most as many runnable threads as CPUs, counting
// the caller.
func (lr *loadReader) cpuFree() bool {
	if lr.fd < 0 {
		return false
	}
	n, err := unix.Pread(lr.fd, lr.buf[:], 0)
	if err != nil {
		return false
	}
	r, ok := runnableThreads(lr.buf[:n])
	return ok && r <= lr.ncpu
}

// runnableThreads parses the runnable count out of /proc/loadavg's text ("0.52 0.58 0.59 3/185 12345").
func runnableThreads(b []byte) (int, bool) {
	fields := 0
	i := 0
	for ; i < len(b) && fields < 3; i++ {
		if b[i] == ' ' {
			fields++
		}
	}
	r, digits := 0, 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9' && digits < 9; i++ {
		r = r*10 + int(b[i]-'0')
		digits++
	}
	if digits == 0 || i >= len(b) || b[i] != '/' {
		return 0, false
	}
	return r, true
}

// epollFile is how the loop goroutine sleeps: parked in Go's own netpoller, rather than blocked in epoll_wait
// inside a system call. A goroutine blocked in a system call keeps its thread and P; the runtime's monitor
// (sysmon) takes the P back after 20 µs and then keeps polling every 20 µs, which measured as about a seventh of
// the proxy's CPU time under a light load. A parked goroutine holds nothing, and the netpoller wakes it as it
// wakes every network read.
//
// The netpoller does not watch the loop's epoll descriptor itself but a gate: a second epoll descriptor whose
// one entry is the loop's, armed one-shot only while the loop sleeps. The netpoller's interest is
// edge-triggered, and an epoll descriptor has an edge each time one of its sockets gets something, so watching
// the loop's directly woke an idle Go thread for nearly every message while the loop was busy reading them
// itself: the thread found nothing to do and slept again. With 64 select-only clients that was 0.8 wake-ups
// and context switches per transaction, about half of all the proxy's (pgbouncer's single thread has 0.35).
// The gate costs three system calls per sleep, and under load the loop seldom sleeps.
type epollFile struct {
	epfd  int
	gate  int             // epoll descriptor holding epfd (EPOLLONESHOT); -1: plain epoll_wait
	file  *os.File        // owns gate when the netpoller took it
	conn  syscall.RawConn // file's
	armed bool            // epfd's entry in gate is armed: the loop is about to sleep or sleeps
}

// newEpollFile makes the gate and hands it to the netpoller; if that fails, wait falls back to a blocking
// epoll_wait.
func newEpollFile(epfd int) *epollFile {
	e := &epollFile{epfd: epfd, gate: -1}
	gate, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return e
	}
	// Added disarmed (no event but the one-shot bit): armGate arms it before each sleep.
	ev := unix.EpollEvent{Events: unix.EPOLLONESHOT, Fd: int32(epfd)}
	if err := unix.EpollCtl(gate, unix.EPOLL_CTL_ADD, epfd, &ev); err != nil {
		unix.Close(gate)
		return e
	}
	if err := unix.SetNonblock(gate, true); err != nil {
		unix.Close(gate)
		return e
	}
	f := os.NewFile(uintptr(gate), "epoll gate")
	conn, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return e
	}
	e.gate, e.file, e.conn = gate, f, conn
	return e
}

// armGate arms epfd's entry in the gate (EPOLLIN, one-shot) before the loop sleeps. Arming an entry whose
// descriptor has events already reports it at once, so a message that came between the loop's last poll and
// the arming still wakes it; disarmGate makes sure the kernel does not take the entry for reported already.
func (e *epollFile) armGate() error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(e.epfd)}
	if err := unix.EpollCtl(e.gate, unix.EPOLL_CTL_MOD, e.epfd, &ev); err != nil {
		return fmt.Errorf("epoll_ctl arming the loop's gate: %w", err)
	}
	e.armed = true
	return nil
}

// disarmGate disarms the gate once the loop runs again: it turns the entry's interest off, then reads the gate,
// which takes the entry off the gate's ready list without reporting it. An entry left on that list would
// swallow the next arming's report (the kernel reports an entry that becomes ready on arming only when it is
// not on the list yet), and the loop would sleep for ever with a message waiting: the first version of the gate
// hung a 64-client run within minutes that way. The order is what makes it sure: once the interest is off, no
// message can put the entry back on the list, so reading first and disarming second would leave a window where
// a message lands between the two.
func (e *epollFile) disarmGate() error {
	ev := [1]unix.EpollEvent{{Events: unix.EPOLLONESHOT, Fd: int32(e.epfd)}}
	if err := unix.EpollCtl(e.gate, unix.EPOLL_CTL_MOD, e.epfd, &ev[0]); err != nil {
		return fmt.Errorf("epoll_ctl disarming the loop's gate: %w", err)
	}
	if _, err := pollNow(e.gate, ev[:]); err != nil {
		return fmt.Errorf("reading the loop's gate: %w", err)
	}
	e.armed = false
	return nil
}

// wait returns the ready events, waiting until there is at least one; parked says whether the goroutine
// parked in the netpoller meanwhile, which reschedules it (blocking in epoll_wait does not).
func (e *epollFile) wait(events []unix.EpollEvent) (n int, parked bool, err error) {
	if e.conn == nil {
		n, err = unix.EpollWait(e.epfd, events, -1)
		return n, false, err
	}
	var perr error
	polls := 0
	err = e.conn.Read(func(uintptr) bool {
		// Called first without waiting, and again each time the netpoller says the gate is readable.
		polls++
		if e.armed {
			if perr = e.disarmGate(); perr != nil {
				return true
			}
		}
		if n, perr = pollNow(e.epfd, events); n > 0 || perr != nil {
			return true
		}
		perr = e.armGate() // nothing yet: sleep until epfd has something
		return perr != nil
	})
	if err != nil {
		return 0, polls > 1, fmt.Errorf("waiting in the netpoller: %w", err)
	}
	return n, polls > 1, perr
}

// close closes the gate, through its os.File (which must close it: the file's finalizer would otherwise close
// the number later, whatever it then belongs to), and the epoll descriptor.
func (e *epollFile) close() {
	if e.file != nil {
		e.file.Close()
	}
	unix.Close(e.epfd)
}
