package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestParseHeader: the one framing rule both transports apply: a length word under 4 and a body over the cap
// are protocol errors; anything else gives the type and the body length.
func TestParseHeader(t *testing.T) {
	for _, c := range []struct {
		name    string
		hdr     []byte
		max     int
		typ     byte
		n       int
		wantErr bool
	}{
		{"empty body", []byte{'S', 0, 0, 0, 4}, 0, 'S', 0, false},
		{"body at the cap", []byte{'Q', 0, 0, 0, 14}, 10, 'Q', 10, false},
		{"body over the cap", []byte{'Q', 0, 0, 0, 15}, 10, 0, 0, true},
		{"no cap", []byte{'d', 0x40, 0, 0, 0}, 0, 'd', 0x40000000 - 4, false},
		{"length under 4", []byte{'Q', 0, 0, 0, 3}, 0, 0, 0, true},
		{"negative length", []byte{'Q', 0xff, 0xff, 0xff, 0xff}, 0, 0, 0, true},
	} {
		typ, n, err := parseHeader(c.hdr, c.max)
		if c.wantErr {
			if !errors.Is(err, errProtocol) {
				t.Errorf("%s: err %v, want a protocol error", c.name, err)
			}
			continue
		}
		if err != nil || typ != c.typ || n != c.n {
			t.Errorf("%s: %q %d %v, want %q %d", c.name, typ, n, err, c.typ, c.n)
		}
	}
}

// TestInterruptWaitsForBoundaryOrStops: an interrupt that waits for the message boundary (drain, handover)
// lets a body being read arrive whole and stays pending for the reader; a stop fails the read at once; take
// clears the interrupt so the next read blocks normally.
func TestInterruptWaitsForBoundaryOrStops(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	var intr interrupt
	intr.conn = server
	m := msgReader{r: bufio.NewReader(server), intr: &intr}

	go client.Write([]byte{'Q', 0, 0, 0, 10, 'a'})
	if typ, n, err := m.next(); err != nil || typ != 'Q' || n != 6 {
		t.Fatalf("next: %q %d %v", typ, n, err)
	}
	got := make(chan error, 1)
	go func() {
		body, err := m.body()
		if err == nil && string(body) != "abcde\x00" {
			err = errors.New("body " + string(body))
		}
		got <- err
	}()
	// The read of the body's rest is blocked; a drain interrupts it, and it goes on.
	waitBlocked(t, got)
	intr.raise(intrDrain)
	waitBlocked(t, got)
	client.Write([]byte("bcde\x00"))
	if err := <-got; err != nil {
		t.Fatalf("body across a drain interrupt: %v", err)
	}
	if intr.reason() != intrDrain {
		t.Fatalf("the drain is not pending at the boundary: %v", intr.reason())
	}
	if r := intr.take(); r != intrDrain || intr.reason() != intrNone {
		t.Fatalf("take: %v, then %v", r, intr.reason())
	}

	// A stop fails a read in the middle of a message.
	go client.Write([]byte{'Q', 0, 0, 0, 10, 'a'})
	if _, _, err := m.next(); err != nil {
		t.Fatal(err)
	}
	go func() { _, err := m.body(); got <- err }()
	waitBlocked(t, got)
	intr.raise(intrStop)
	if err := <-got; intr.caught(err) != intrStop {
		t.Fatalf("body across a stop: %v (reason %v)", err, intr.caught(err))
	}
	// A weaker reason does not replace a stronger one.
	intr.raise(intrDrain)
	if intr.reason() != intrStop {
		t.Fatalf("a drain replaced a stop: %v", intr.reason())
	}
	intr.take()
	go client.Write([]byte("bcde\x00"))
	if _, err := io.ReadFull(m.r, make([]byte, 5)); err != nil {
		t.Fatalf("a read after take: %v", err)
	}
}

// waitBlocked fails if the reader has already returned; it gives the reader time to block first (a reader
// that has not blocked yet only makes the test weaker, never wrong).
func waitBlocked(t *testing.T, got chan error) {
	t.Helper()
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("the read returned early: %v", err)
	default:
	}
}
