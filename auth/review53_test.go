package auth

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

// TestSCRAMProtocolAbuse: the client-final-message of a hostile client. A proof replayed from another exchange
// (its nonce has the other server nonce), a nonce that does not carry the server's, a channel-binding attribute
// that switches from the gs2 header's "n" to "y" or to binding, a final message without its proof or with
// attributes missing: each is refused, and the key is never handed out. A client-first whose n= names another
// user proves nothing for that user: the proof is checked against the secret the startup's user chose.
func TestSCRAMProtocolAbuse(t *testing.T) {
	sec, _ := ParseSecret(pgSCRAMSecret)
	// An honest exchange, recorded.
	c1 := NewPasswordClient("pencil")
	s1 := NewServerExchange(sec, false)
	sf1, err := s1.First(c1.First())
	if err != nil {
		t.Fatal(err)
	}
	cf1, err := c1.Final(sf1)
	if err != nil {
		t.Fatal(err)
	}
	// Replayed on a new exchange with the same client-first: the server nonce differs, so the nonce does not.
	s2 := NewServerExchange(sec, false)
	if _, err := s2.First(c1.First()); err != nil {
		t.Fatal(err)
	}
	if _, key, err := s2.Final(cf1); !errors.Is(err, ErrMalformed) || key != ([32]byte{}) {
		t.Fatalf("replayed client-final: %v", err)
	}
	// A nonce of the client's alone, without the server's part.
	s3 := NewServerExchange(sec, false)
	if _, err := s3.First([]byte("n,,n=,r=clientonly")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s3.Final([]byte("c=biws,r=clientonly,p=" + base64.StdEncoding.EncodeToString(make([]byte, 32)))); !errors.Is(err, ErrMalformed) {
		t.Fatalf("nonce without the server's part: %v", err)
	}
	// Switching the channel-binding flag in the final message, both ways.
	for _, tc := range []struct{ first, c string }{
		{"n,,", "y,,"}, {"n,,", "p=tls-server-end-point,,"}, {"y,,", "n,,"}, {"y,,", "p=tls-server-end-point,,"},
	} {
		s := NewServerExchange(sec, false)
		sf, err := s.First([]byte(tc.first + "n=,r=abc"))
		if err != nil {
			t.Fatal(err)
		}
		nonce := strings.TrimPrefix(strings.Split(string(sf), ",")[0], "r=")
		final := "c=" + base64.StdEncoding.EncodeToString([]byte(tc.c)) + ",r=" + nonce + ",p=" + base64.StdEncoding.EncodeToString(make([]byte, 32))
		if _, _, err := s.Final([]byte(final)); !errors.Is(err, ErrMalformed) {
			t.Errorf("gs2 %q then c= %q: %v", tc.first, tc.c, err)
		}
	}
	// Missing attributes and a proof of the wrong size.
	s4 := NewServerExchange(sec, false)
	sf4, _ := s4.First([]byte("n,,n=,r=abc"))
	nonce := strings.TrimPrefix(strings.Split(string(sf4), ",")[0], "r=")
	for _, final := range []string{"", "c=biws,r=" + nonce, "r=" + nonce + ",p=AAAA", "c=biws,p=" + base64.StdEncoding.EncodeToString(make([]byte, 32)),
		"c=biws,r=" + nonce + ",p=" + base64.StdEncoding.EncodeToString(make([]byte, 31)), "c=biws,r=" + nonce + ",p=!!"} {
		if _, _, err := s4.Final([]byte(final)); !errors.Is(err, ErrMalformed) {
			t.Errorf("client-final %q: %v", final, err)
		}
	}
	// n= naming another user changes nothing: the right password for the secret logs in, a wrong one does not.
	c5 := NewPasswordClient("pencil")
	c5.nonce = "abc"
	s5 := NewServerExchange(sec, false)
	sf5, err := s5.First([]byte("n,,n=postgres,r=abc"))
	if err != nil {
		t.Fatal(err)
	}
	c5.clientFirstBare = "n=postgres,r=abc"
	cf5, err := c5.Final(sf5)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s5.Final(cf5); err != nil {
		t.Fatalf("n= of another user, the secret's password: %v", err)
	}
}
