package proxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/auth"
	"github.com/fenceproxy/fenceproxy/config"
)

// answerDelay is how long the test's client takes to answer a question that needs its contents (a SCRAM proof
// takes a client's key derivation, milliseconds): long enough that a read begun right after the question
// finds nothing, which is what the proxy must not do.
const answerDelay = 100 * time.Millisecond

// askedSession is a session over the proxy's end of a loopback pair, its client socket read and written with raw
// calls as in transaction mode, and the client's end.
func askedSession(t *testing.T) (*session, *rawSocket, net.Conn, *bufio.Reader) {
	t.Helper()
	conn, sock, peer := tcpPair(t)
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	peer.SetDeadline(time.Now().Add(10 * time.Second))
	ss := &session{srv: newTestServer(t, Options{DisableEventLoop: true}), client: conn, clientIO: sock}
	ss.attachClient(ss.srv.bufs.reader(sock))
	return ss, sock, peer, bufio.NewReader(peer)
}

// readMsg reads one backend message on the client's end.
func readMsg(t *testing.T, r *bufio.Reader) (byte, []byte) {
	t.Helper()
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		t.Fatalf("client: reading a message: %v", err)
	}
	body := make([]byte, binary.BigEndian.Uint32(head[1:])-4)
	if _, err := io.ReadFull(r, body); err != nil {
		t.Fatalf("client: reading a message's body: %v", err)
	}
	return head[0], body
}

// TestAuthChallengesSentFromTheRead: a question the client can answer only once it has read it (the salt of an
// md5 request, the nonce and salt of SCRAM's server-first message) goes out from inside the read that waits for
// the answer, so that no read finds nothing first: with a connection per transaction and SCRAM, that empty read
// was one of the proxy's system calls per connection, on top of the wake-up the answer costs anyway.
func TestAuthChallengesSentFromTheRead(t *testing.T) {
	const password = "ask-password"
	t.Run("scram", func(t *testing.T) {
		ss, sock, peer, r := askedSession(t)
		sec, err := auth.NewSCRAMSecret(password, []byte("0123456789abcdef"), 4096)
		if err != nil {
			t.Fatal(err)
		}
		client := auth.NewPasswordClient(password)
		// The SASLInitialResponse is there before the exchange asks for it: only the server-first message is a
		// question whose answer cannot be early.
		first := client.First()
		initial := append([]byte(auth.Mechanism+"\x00"), binary.BigEndian.AppendUint32(nil, uint32(len(first)))...)
		if _, err := peer.Write(appendMessage(nil, msgPassword, initial, first)); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := ss.scramExchange(auth.NewServerExchange(sec, false))
			done <- err
		}()
		if typ, _ := readMsg(t, r); typ != msgAuthentication {
			t.Fatalf("first message %q, want AuthenticationSASL", typ)
		}
		typ, body := readMsg(t, r)
		if typ != msgAuthentication || binary.BigEndian.Uint32(body) != authSASLContinue {
			t.Fatalf("second message %q %v, want AuthenticationSASLContinue", typ, body)
		}
		final, err := client.Final(body[4:])
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(answerDelay)
		if _, err := peer.Write(appendMessage(nil, msgPassword, final)); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("SCRAM exchange: %v", err)
		}
		if sock.emptyReads != 0 {
			t.Fatalf("%d reads of the client found nothing during the SCRAM exchange, want none", sock.emptyReads)
		}
	})
	t.Run("md5", func(t *testing.T) {
		ss, sock, peer, r := askedSession(t)
		const user = "ask-user"
		sec, err := auth.ParseSecret("md5" + auth.MD5Secret(user, password))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- ss.md5Exchange(sec, false) }()
		typ, body := readMsg(t, r)
		if typ != msgAuthentication || binary.BigEndian.Uint32(body) != authMD5 {
			t.Fatalf("message %q %v, want AuthenticationMD5Password", typ, body)
		}
		var salt [4]byte
		copy(salt[:], body[4:])
		time.Sleep(answerDelay)
		answer := auth.MD5Response(auth.MD5Secret(user, password), salt)
		if _, err := peer.Write(appendMessage(nil, msgPassword, []byte(answer+"\x00"))); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("md5 exchange: %v", err)
		}
		if sock.emptyReads != 0 {
			t.Fatalf("%d reads of the client found nothing during the md5 exchange, want none", sock.emptyReads)
		}
	})
}

// TestAuthSSLRefusalSentFromTheRead: in transaction mode the N that refuses an SSLRequest goes out from inside
// the read of the client's next request (the client chooses it by the answer); the last request the proxy takes
// gets its N at once all the same, before the refusal of one more.
func TestAuthSSLRefusalSentFromTheRead(t *testing.T) {
	cfg, err := config.Parse("test.yaml", []byte("listen: 127.0.0.1:0\nupstream:\n  address: 127.0.0.1:1\npool:\n  mode: transaction\nauth:\n  type: trust\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Config: cfg, DisableEventLoop: true})
	if err != nil {
		t.Fatal(err)
	}
	sslRequest := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), codeSSLRequest)
	// A StartupMessage: length, protocol 3.0, user=ask, the closing NUL.
	params := []byte("user\x00ask\x00\x00")
	startup := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, uint32(8+len(params))), 3<<16)
	startup = append(startup, params...)

	t.Run("then startup", func(t *testing.T) {
		conn, _, peer := tcpPair(t)
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		peer.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := peer.Write(sslRequest); err != nil {
			t.Fatal(err)
		}
		ss := &session{srv: srv, client: conn}
		type result struct {
			body []byte
			err  error
		}
		done := make(chan result, 1)
		go func() {
			body, _, err := ss.negotiate(conn)
			done <- result{body, err}
		}()
		var n [1]byte
		if _, err := io.ReadFull(peer, n[:]); err != nil || n[0] != negotiateRefuse {
			t.Fatalf("answer to SSLRequest %q (%v), want N", n, err)
		}
		time.Sleep(answerDelay)
		if _, err := peer.Write(startup); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if res.err != nil || len(res.body) != len(startup)-4 {
			t.Fatalf("negotiate: %d bytes, %v; want the StartupMessage", len(res.body), res.err)
		}
		if sock := ss.clientIO.(*rawSocket); sock.emptyReads != 0 {
			t.Fatalf("%d reads of the client found nothing after the N, want none", sock.emptyReads)
		}
	})
	t.Run("too many", func(t *testing.T) {
		conn, _, peer := tcpPair(t)
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		peer.SetDeadline(time.Now().Add(10 * time.Second))
		ss := &session{srv: srv, client: conn}
		done := make(chan error, 1)
		go func() {
			_, _, err := ss.negotiate(conn)
			done <- err
		}()
		for i := 0; i < 4; i++ {
			if _, err := peer.Write(sslRequest); err != nil {
				t.Fatal(err)
			}
			var n [1]byte
			if _, err := io.ReadFull(peer, n[:]); err != nil || n[0] != negotiateRefuse {
				t.Fatalf("answer to SSLRequest %d: %q (%v), want N", i+1, n, err)
			}
		}
		if err := <-done; !errors.Is(err, errProtocol) {
			t.Fatalf("negotiate after four SSLRequests: %v, want a protocol violation", err)
		}
	})
}
