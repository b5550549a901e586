package auth

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

// Made by PostgreSQL 15: SET password_encryption = 'scram-sha-256'; CREATE ROLE v1 LOGIN PASSWORD 'pencil';
// then with md5 for v2; SELECT rolpassword FROM pg_authid.
const (
	pgSCRAMSecret = "SCRAM-SHA-256$4096:Cc8OwHl12bBmuSuYjFrjsg==$17c/iP6Ny2w74xSkNmvAQkIRfrU03Gze59Wf6ZkZdeo=:+UF6soTCHktahxdo7lRR7r7SSKaqqZRipTNY7nzClXU="
	pgMD5Secret   = "md5bd4fa3474ee1a319b1d6a57289b214cf"
)

func TestPostgreSQLSecrets(t *testing.T) {
	sec, err := ParseSecret(pgSCRAMSecret)
	if err != nil {
		t.Fatal(err)
	}
	if sec.String() != pgSCRAMSecret {
		t.Fatalf("round trip: %s", sec)
	}
	mine, err := NewSCRAMSecret("pencil", sec.Salt, sec.Iterations)
	if err != nil {
		t.Fatal(err)
	}
	if mine.String() != pgSCRAMSecret {
		t.Fatalf("PostgreSQL's secret of 'pencil' is\n%s, derived\n%s", pgSCRAMSecret, mine)
	}
	if got := "md5" + MD5Secret("v2", "pencil"); got != pgMD5Secret {
		t.Fatalf("md5 secret %s, PostgreSQL's %s", got, pgMD5Secret)
	}
	md5sec, err := ParseSecret(pgMD5Secret)
	if err != nil || md5sec.Kind != KindMD5 {
		t.Fatalf("md5 secret: %+v %v", md5sec, err)
	}
	salt := [4]byte{1, 2, 3, 4}
	if !VerifyMD5(md5sec, salt, []byte(MD5Response(MD5Secret("v2", "pencil"), salt))) {
		t.Fatal("md5 answer of the right password refused")
	}
	if VerifyMD5(md5sec, salt, []byte(MD5Response(MD5Secret("v2", "pencil!"), salt))) {
		t.Fatal("md5 answer of a wrong password accepted")
	}
	for _, plain := range []string{"pencil", "md5short", "SCRAM-SHA-256"} {
		if _, err := ParseSecret(plain); err == nil {
			t.Errorf("%q parsed as a secret", plain)
		}
	}
}

// TestRFC7677Vector runs the server side on RFC 7677's example exchange (user "user", password "pencil").
func TestRFC7677Vector(t *testing.T) {
	salt, _ := base64.StdEncoding.DecodeString("W22ZaJ0SNY7soEsUEjb6gQ==")
	sec, err := NewSCRAMSecret("pencil", salt, 4096)
	if err != nil {
		t.Fatal(err)
	}
	e := NewServerExchange(sec, false)
	e.serverNonce = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
	first, err := e.First([]byte("n,,n=user,r=rOprNGfwEbeRWgbNEkqO"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"; string(first) != want {
		t.Fatalf("server-first %s, want %s", first, want)
	}
	final, key, err := e.Final([]byte("c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="))
	if err != nil {
		t.Fatal(err)
	}
	if want := "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="; string(final) != want {
		t.Fatalf("server-final %s, want %s", final, want)
	}
	ck, _, _ := SCRAMKeys("pencil", salt, 4096)
	if key != ck {
		t.Fatal("recovered ClientKey is not the password's")
	}
}

// exchange runs a client against a server exchange, returning the recovered ClientKey.
func exchange(t *testing.T, c *ClientExchange, s *ServerExchange) ([sha256.Size]byte, error) {
	t.Helper()
	sf, err := s.First(c.First())
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	cf, err := c.Final(sf)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	fin, key, err := s.Final(cf)
	if err != nil {
		return key, err
	}
	return key, c.Verify(fin)
}

func TestSCRAMExchanges(t *testing.T) {
	sec, _ := ParseSecret(pgSCRAMSecret)
	key, err := exchange(t, NewPasswordClient("pencil"), NewServerExchange(sec, false))
	if err != nil {
		t.Fatalf("right password: %v", err)
	}
	if _, err := exchange(t, NewPasswordClient("pencil2"), NewServerExchange(sec, false)); !errors.Is(err, ErrFailed) {
		t.Fatalf("wrong password: %v", err)
	}
	// The recovered ClientKey logs in where the secret is the same: what the proxy does upstream.
	if _, err := exchange(t, NewKeyClient(key, sec), NewServerExchange(sec, false)); err != nil {
		t.Fatalf("login with the recovered ClientKey: %v", err)
	}
	// Not where the password is the same but salted differently: the key is of the other salt.
	other, _ := NewSCRAMSecret("pencil", []byte("another salt"), 4096)
	if _, err := exchange(t, NewKeyClient(key, sec), NewServerExchange(other, false)); !errors.Is(err, ErrOtherSecret) {
		t.Fatalf("key client against another salt: %v", err)
	}
	// With a configured password, the exchange the key began goes on with the password where the salt differs.
	kc := NewKeyClient(key, sec)
	srv := NewServerExchange(other, false)
	sf, err := srv.First(kc.First())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kc.Final(sf); !errors.Is(err, ErrOtherSecret) {
		t.Fatalf("key client against another salt: %v", err)
	}
	pc := kc.WithPassword("pencil")
	cf, err := pc.Final(sf)
	if err != nil {
		t.Fatal(err)
	}
	if fin, _, err := srv.Final(cf); err != nil || pc.Verify(fin) != nil {
		t.Fatalf("password after the key's first message: %v", err)
	}
	// A mock exchange fails even for the right password, after the same steps.
	if _, err := exchange(t, NewPasswordClient("pencil"), NewServerExchange(sec, true)); !errors.Is(err, ErrFailed) {
		t.Fatalf("mock exchange: %v", err)
	}
	// An md5 secret cannot answer SCRAM: the exchange runs and fails.
	md5sec, _ := ParseSecret(pgMD5Secret)
	mockKey := []byte("per-process key")
	if _, err := exchange(t, NewPasswordClient("pencil"), NewLoginExchange(mockKey, 0, "v2", md5sec, true)); !errors.Is(err, ErrFailed) {
		t.Fatalf("SCRAM against an md5 secret: %v", err)
	}
	if _, err := exchange(t, NewPasswordClient("pencil"), NewLoginExchange(mockKey, 0, "nobody", Secret{}, false)); !errors.Is(err, ErrFailed) {
		t.Fatalf("SCRAM of an unknown user: %v", err)
	}
	if _, err := exchange(t, NewPasswordClient("pencil"), NewLoginExchange(mockKey, 0, "v1", sec, true)); err != nil {
		t.Fatalf("SCRAM of a known user: %v", err)
	}
	// A server that does not know the secret is caught by the client's check of its signature.
	c := NewKeyClient(key, sec)
	s := NewServerExchange(sec, false)
	sf, _ = s.First(c.First())
	if _, err := c.Final(sf); err != nil {
		t.Fatal(err)
	}
	if err := c.Verify([]byte("v=" + base64.StdEncoding.EncodeToString(make([]byte, 32)))); err == nil {
		t.Fatal("forged server signature accepted")
	}
}

func TestMockSecret(t *testing.T) {
	k := []byte("per-process key")
	a1, a2, b := MockSecret(k, "alice", 0), MockSecret(k, "alice", 0), MockSecret(k, "bob", 0)
	if a1.String() != a2.String() {
		t.Fatal("mock secret of a user changes")
	}
	if string(a1.Salt) == string(b.Salt) {
		t.Fatal("two users share a mock salt")
	}
	if string(MockSecret([]byte("other process"), "alice", 0).Salt) == string(a1.Salt) {
		t.Fatal("mock salt does not depend on the process key")
	}
	if a1.Iterations != MockIterations || len(a1.Salt) != 16 {
		t.Fatalf("mock secret %s does not look like PostgreSQL's", a1)
	}
}

func TestChannelBindingFlags(t *testing.T) {
	sec, _ := ParseSecret(pgSCRAMSecret)
	// 'y': the client could bind but believes the server cannot; accepted when -PLUS is not offered.
	s := NewServerExchange(sec, false)
	sf, err := s.First([]byte("y,,n=,r=abc"))
	if err != nil {
		t.Fatalf("'y' refused: %v", err)
	}
	c := NewPasswordClient("pencil")
	c.nonce = "abc"
	cf, err := c.Final(sf)
	if err != nil {
		t.Fatal(err)
	}
	// The client's final message says c=biws ("n,,"), not the "y,," it started with: a downgrade, refused.
	if _, _, err := s.Final(cf); !errors.Is(err, ErrMalformed) {
		t.Fatalf("c= differing from the gs2 header: %v", err)
	}
	s = NewServerExchange(sec, false)
	sf, _ = s.First([]byte("y,,n=,r=abc"))
	cf, _ = NewPasswordClientWithFixedNonce("pencil", "abc").Final(sf)
	cf = []byte(strings.Replace(string(cf), "c=biws", "c="+base64.StdEncoding.EncodeToString([]byte("y,,")), 1))
	if _, _, err := s.Final(cf); !errors.Is(err, ErrFailed) {
		// the proof was computed over c=biws, so it cannot match once c= is right: a failed login, not a malformed one
		t.Fatalf("'y' exchange with a proof over another message: %v", err)
	}
	for _, first := range []string{"p=tls-server-end-point,,n=,r=abc", "n,a=admin,n=,r=abc", "x,,n=,r=abc", "n,,m=ext,n=,r=abc", "n,,n=,r=", "n,,n=", ""} {
		if _, err := NewServerExchange(sec, false).First([]byte(first)); !errors.Is(err, ErrMalformed) {
			t.Errorf("client-first %q: %v", first, err)
		}
	}
}

// NewPasswordClientWithFixedNonce is NewPasswordClient with a known nonce.
func NewPasswordClientWithFixedNonce(password, nonce string) *ClientExchange {
	c := NewPasswordClient(password)
	c.nonce = nonce
	c.clientFirstBare = "n=,r=" + nonce
	return c
}

func TestParseUserlist(t *testing.T) {
	in := `; a comment
# another
"alice" "` + pgSCRAMSecret + `" trailing ignored
  "bo""b" "` + pgMD5Secret + `"

"carol" "md5` + strings.Repeat("0", 32) + `"
"carol" "` + pgMD5Secret + `"
`
	users, err := ParseUserlist(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(users) != 3 || users["alice"].Kind != KindSCRAM || users[`bo"b`].Kind != KindMD5 || users["carol"].String() != pgMD5Secret {
		t.Fatalf("parsed %v", users)
	}
	for name, bad := range map[string]string{
		"plaintext":       `"dave" "hunter2"`,
		"unterminated":    `"dave" "md5`,
		"no secret":       `"dave"`,
		"unquoted secret": `"dave" md5bd4fa3474ee1a319b1d6a57289b214cf`,
		"bad scram":       `"dave" "SCRAM-SHA-256$4096:c2FsdA==$AAAA:BBBB"`,
	} {
		if _, err := ParseUserlist(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%s: %v", name, err)
		}
	}
	_, err = ParseUserlist(strings.NewReader(`"dave" "hunter2"`))
	if !errors.Is(err, ErrPlaintext) || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("plaintext entry: %v (must be refused without echoing the password)", err)
	}
}
