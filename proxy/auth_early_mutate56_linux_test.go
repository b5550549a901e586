package proxy

import (
	"errors"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/auth"
)

// A client that answers the md5 question before it was asked (a guess at the salt, sent with no question read)
// fails, and the question still goes out before the exchange returns: askClient holds a question for the read of
// its answer only when no bytes of the client's are there yet; with the answer already read (buffered), the read
// that would send the held question never touches the socket, and the question stayed held behind an answer
// already judged (mutation pass mutate56: askClient holding whatever was buffered).
func TestAuthEarlyAnswerFailsAndTheQuestionGoesOut(t *testing.T) {
	const user, password = "early-user", "early-password"
	ss, _, peer, r := askedSession(t)
	sec, err := auth.ParseSecret("md5" + auth.MD5Secret(user, password))
	if err != nil {
		t.Fatal(err)
	}
	guess := auth.MD5Response(auth.MD5Secret(user, password), [4]byte{})
	if _, err := peer.Write(appendMessage(nil, msgPassword, []byte(guess+"\x00"))); err != nil {
		t.Fatal(err)
	}
	if _, err := ss.cr.r.Peek(1); err != nil { // the early answer is read before the question is written
		t.Fatal(err)
	}
	if err := ss.md5Exchange(sec, false); !errors.Is(err, auth.ErrFailed) {
		t.Fatalf("md5 exchange with an answer sent before the question: %v, want it failed", err)
	}
	peer.SetReadDeadline(time.Now().Add(2 * time.Second))
	typ, body := readMsg(t, r)
	if typ != msgAuthentication || len(body) != 8 {
		t.Fatalf("the client got %q (%d bytes), want AuthenticationMD5Password", typ, len(body))
	}
}
