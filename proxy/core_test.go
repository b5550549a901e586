package proxy

import (
	"bytes"
	"errors"
	"testing"

	"github.com/fenceproxy/fenceproxy/config"
)

func newCoreSession(t *testing.T) *session {
	t.Helper()
	return &session{srv: newTestServer(t, Options{DisableEventLoop: true}), prep: &prepState{}}
}

// newTestServer is a Server for internal tests (o with its Config set), whose upstream address nothing listens on.
func newTestServer(t *testing.T, o Options) *Server {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte("listen: 127.0.0.1:0\nupstream:\n  address: 127.0.0.1:1\n"))
	if err != nil {
		t.Fatal(err)
	}
	o.Config = cfg
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCoreState: the core's typed state follows the messages both ways, as both transports feed them: a
// session is ready at its first ReadyForQuery, Query, Sync and FunctionCall are pending until answered,
// extended-protocol messages are unsynced until Sync, the transaction status is the last ReadyForQuery's, and
// a drain may close the session only when all of that says idle.
func TestCoreState(t *testing.T) {
	ss := newCoreSession(t)
	st := &ss.state
	var out outBuf
	server := func(typ byte, body []byte) serverEvent {
		t.Helper()
		ev, err := ss.onServerMsg(typ, body, &out)
		if err != nil {
			t.Fatalf("onServerMsg(%q): %v", typ, err)
		}
		return ev
	}
	client := func(typ byte) {
		t.Helper()
		if err := ss.onClientMsg(typ, nil, nil, &out); err != nil {
			t.Fatalf("onClientMsg(%q): %v", typ, err)
		}
	}
	if st.ready.Load() || st.idle() {
		t.Fatal("ready before any ReadyForQuery")
	}
	if ev := server(msgReadyForQuery, []byte{txIdle}); ev != evStartupOver || !st.ready.Load() || !st.idle() {
		t.Fatalf("first ReadyForQuery: event %v, ready %v, idle %v", ev, st.ready.Load(), st.idle())
	}
	client(msgQuery)
	if st.pending.Load() != 1 || st.idle() || !st.running() {
		t.Fatalf("after a Query: pending %d, idle %v", st.pending.Load(), st.idle())
	}
	if ev := server(msgReadyForQuery, []byte{txBlock}); ev != 0 || st.pending.Load() != 0 || !st.inTx() || st.idle() {
		t.Fatalf("answered inside a transaction block: event %v, pending %d, inTx %v", ev, st.pending.Load(), st.inTx())
	}
	for _, typ := range []byte{msgParse, msgBind, msgExecute} {
		client(typ)
	}
	if !st.unsynced.Load() || !st.running() {
		t.Fatal("extended-protocol messages before Sync are not unsynced")
	}
	client(msgSync)
	if st.unsynced.Load() || st.pending.Load() != 1 {
		t.Fatalf("after Sync: unsynced %v, pending %d", st.unsynced.Load(), st.pending.Load())
	}
	server(msgReadyForQuery, []byte{txIdle})
	if !st.idle() || st.running() {
		t.Fatal("not idle after the Sync's ReadyForQuery outside a transaction")
	}
	// An extra ReadyForQuery never drives pending below zero.
	server(msgReadyForQuery, []byte{txIdle})
	if st.pending.Load() != 0 {
		t.Fatalf("pending %d", st.pending.Load())
	}
	// Draining: the ReadyForQuery that makes the session idle says so.
	ss.srv.draining.Store(true)
	client(msgQuery)
	if ev := server(msgReadyForQuery, []byte{txIdle}); ev != evDrainNow {
		t.Fatalf("idle while draining: event %v, want evDrainNow", ev)
	}
	// Every ReadyForQuery went to the client as it came.
	want := []byte{}
	for _, status := range []byte{txIdle, txBlock, txIdle, txIdle, txIdle} {
		want = append(want, msgReadyForQuery, 0, 0, 0, 5, status)
	}
	if !bytes.Equal(out.b, want) {
		t.Fatalf("forwarded %q, want %q", out.b, want)
	}
	if _, err := ss.onServerMsg(msgReadyForQuery, []byte{txIdle, txIdle}, &out); err == nil {
		t.Fatal("a ReadyForQuery of 2 bytes was accepted")
	}
	if err := ss.onClientMsg(msgTerminate, nil, nil, &out); err != errTerminated {
		t.Fatalf("Terminate: %v", err)
	}
	if err := ss.onClientMsg('!', nil, nil, &out); !errors.Is(err, errProtocol) {
		t.Fatalf("unknown message type: %v", err)
	}
}

// TestCoreServerMessages: BackendKeyData reaches the client with the backend's PID and the proxy's own secret;
// ParameterStatus is noted (the reading settings among them); a TLS client is never offered
// SCRAM-SHA-256-PLUS; a request for a password marks the connection as not reusable; a FATAL from the server is
// remembered, so the session's end sends no second one.
func TestCoreServerMessages(t *testing.T) {
	ss := newCoreSession(t)
	var out outBuf
	key := []byte{0, 0, 0x30, 0x39, 1, 2, 3, 4}
	if _, err := ss.onServerMsg(msgBackendKeyData, key, &out); err != nil {
		t.Fatal(err)
	}
	got := out.b[headerLen:]
	if !bytes.Equal(got[:4], key[:4]) || bytes.Equal(got[4:], key[4:]) || !bytes.Equal(ss.cancelKey, key) {
		t.Fatalf("BackendKeyData to the client %x (backend's %x)", got, key)
	}
	if _, err := ss.onServerMsg(msgBackendKeyData, key[:6], &out); err == nil {
		t.Fatal("a short BackendKeyData was accepted")
	}

	out.b = out.b[:0]
	ss.onServerMsg(msgParameterStatus, []byte("standard_conforming_strings\x00off\x00"), &out)
	ss.onServerMsg(msgParameterStatus, []byte("client_encoding\x00LATIN1\x00"), &out)
	if set := ss.readingSettings(); set.StandardConformingStrings || set.ClientEncoding != "LATIN1" {
		t.Fatalf("reading settings after ParameterStatus: %+v", set)
	}
	if len(ss.state.serverParams) != 2 {
		t.Fatalf("server parameters %v", ss.state.serverParams)
	}

	out.b = out.b[:0]
	ss.clientTLS = true
	sasl := append([]byte{0, 0, 0, authSASL}, "SCRAM-SHA-256-PLUS\x00SCRAM-SHA-256\x00\x00"...)
	ss.onServerMsg(msgAuthentication, sasl, &out)
	if want := append([]byte{0, 0, 0, authSASL}, "SCRAM-SHA-256\x00\x00"...); !bytes.Equal(out.b[headerLen:], want) {
		t.Fatalf("SASL mechanisms offered to a TLS client: %q", out.b[headerLen:])
	}
	if !ss.state.authAsked {
		t.Fatal("a SASL request did not mark the connection as asked for authentication")
	}

	if ss.state.serverFatal {
		t.Fatal("serverFatal before any error")
	}
	ss.onServerMsg(msgErrorResponse, []byte("SFATAL\x00VFATAL\x00C57P01\x00Mbye\x00\x00"), &out)
	if !ss.state.serverFatal {
		t.Fatal("a FATAL from the server was not remembered")
	}
}

// TestCoreMessageTypes: the session core refuses as a protocol violation every message type outside
// PostgreSQL's list after login (frontendType, the pool's list too), except PasswordMessage, which a
// passthrough login relays; it takes the COPY messages as they are.
func TestCoreMessageTypes(t *testing.T) {
	var out outBuf
	for typ := 0; typ < 256; typ++ {
		b := byte(typ)
		if frontendType(b) || b == msgPassword {
			continue
		}
		if err := newCoreSession(t).onClientMsg(b, nil, nil, &out); !errors.Is(err, errProtocol) {
			t.Errorf("message type %q: %v, want a protocol violation", b, err)
		}
	}
	for _, b := range []byte{msgPassword, msgCopyData, msgCopyDone, msgCopyFail} {
		if err := newCoreSession(t).onClientMsg(b, nil, nil, &out); err != nil {
			t.Errorf("message type %q: %v", b, err)
		}
	}
}
