package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// tcpPair is a connected loopback TCP pair: the proxy's end, wrapped as the pool wraps a server connection
// (rawIO), and the peer's.
func tcpPair(t *testing.T) (proxyEnd net.Conn, sock *rawSocket, peer net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	proxyEnd, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer = <-accepted
	if peer == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { proxyEnd.Close(); peer.Close() })
	rs, ok := rawIO(proxyEnd, nil).(*rawSocket)
	if !ok {
		t.Fatal("rawIO of a TCP connection is not a rawSocket")
	}
	return proxyEnd, rs, peer
}

// echoAfter reads n bytes on peer and then sends them back: a server that answers only what it was sent.
func echoAfter(peer net.Conn, n int) <-chan error {
	done := make(chan error, 1)
	go func() {
		got := make([]byte, n)
		if _, err := io.ReadFull(peer, got); err != nil {
			done <- err
			return
		}
		_, err := peer.Write(got)
		done <- err
	}()
	return done
}

// TestHeldWriteGoesOutWithTheRead: bytes written while holding reach the peer only when the next read starts,
// and that read returns the answer they asked for (it waits for it; it does not return empty or hang).
func TestHeldWriteGoesOutWithTheRead(t *testing.T) {
	conn, s, peer := tcpPair(t)
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	for round := 0; round < 200; round++ {
		msg := []byte{'Q', byte(round), 1, 2, 3}
		s.holdWrites(true)
		if n, err := s.Write(msg); n != len(msg) || err != nil {
			t.Fatalf("held write: %d, %v", n, err)
		}
		s.holdWrites(false)
		if round == 0 {
			// Held, not sent: the peer has nothing yet.
			peer.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			var one [1]byte
			if n, err := peer.Read(one[:]); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the peer read %d bytes (%v) of a held write before any read", n, err)
			}
			peer.SetReadDeadline(time.Time{})
		}
		// The echo starts after that look: a read deadline on peer reaches every read waiting on it, and the
		// echo's own read, woken by it, would never answer (the read below then waited out its deadline).
		done := echoAfter(peer, len(msg))
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(s, got); err != nil {
			t.Fatalf("round %d: read after a held write: %v", round, err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("round %d: read %v, want the echo %v", round, got, msg)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestHeldWriteSentWhenTheReadTimesOut: a read whose deadline passed before it began still sends the held bytes
// (the caller counts the statement as sent, and hands the rest of the answer to another reader).
func TestHeldWriteSentWhenTheReadTimesOut(t *testing.T) {
	conn, s, peer := tcpPair(t)
	msg := []byte("SELECT 1")
	s.holdWrites(true)
	s.Write(msg)
	s.holdWrites(false)
	conn.SetReadDeadline(time.Unix(1, 0))
	var buf [16]byte
	if _, err := s.Read(buf[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past its deadline: %v, want a timeout", err)
	}
	peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(peer, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("the peer got %q (%v), want the held %q", got, err, msg)
	}
}

// TestHeldWriteLargerThanTheSocketTakes: held bytes the socket does not take in one go (the peer reads slowly)
// all arrive, in order, before the answer is read.
func TestHeldWriteLargerThanTheSocketTakes(t *testing.T) {
	conn, s, peer := tcpPair(t)
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	msg := make([]byte, 16<<20)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	done := make(chan error, 1)
	go func() {
		time.Sleep(50 * time.Millisecond) // the socket's buffers fill first
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(peer, got); err != nil {
			done <- err
			return
		}
		if !bytes.Equal(got, msg) {
			done <- errors.New("the peer got the held bytes changed or out of order")
			return
		}
		_, err := peer.Write([]byte("answer"))
		done <- err
	}()
	s.holdWrites(true)
	s.Write(msg)
	s.holdWrites(false)
	got := make([]byte, 6)
	if _, err := io.ReadFull(s, got); err != nil || string(got) != "answer" {
		t.Fatalf("read %q (%v), want the answer", got, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestHeldWriteToAClosedPeer: a held write to a peer that closed fails the read that sends it (no hang).
func TestHeldWriteToAClosedPeer(t *testing.T) {
	conn, s, peer := tcpPair(t)
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	peer.(*net.TCPConn).SetLinger(0)
	peer.Close() // a reset: the proxy's next write or read fails
	time.Sleep(20 * time.Millisecond)
	s.holdWrites(true)
	s.Write([]byte("SELECT 1"))
	s.holdWrites(false)
	var buf [16]byte
	n, err := s.Read(buf[:])
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after a held write to a reset peer: %d bytes, %v; want the connection's error", n, err)
	}
}

// TestHeldWriteNeverOvertaken: a write that comes before the read the held bytes wait for sends them first: the
// peer gets what was written in the order it was (askClient relies on it should a write ever come first).
func TestHeldWriteNeverOvertaken(t *testing.T) {
	_, s, peer := tcpPair(t)
	s.holdWrites(true)
	s.Write([]byte("first "))
	s.holdWrites(false)
	if _, err := s.Write([]byte("second")); err != nil {
		t.Fatal(err)
	}
	peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len("first second"))
	if _, err := io.ReadFull(peer, got); err != nil || string(got) != "first second" {
		t.Fatalf("the peer got %q (%v), want %q", got, err, "first second")
	}
	if len(s.held) != 0 {
		t.Fatalf("%d bytes still held after they were written", len(s.held))
	}
}
