package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Mechanism is the one SASL mechanism the proxy offers its clients. SCRAM-SHA-256-PLUS (channel binding) is not
// offered: a client that insists on it (gs2 flag 'p') is refused, one that could have used it ('y') is accepted,
// as PostgreSQL does when it does not offer it.
const Mechanism = "SCRAM-SHA-256"

// ErrMalformed marks a SCRAM message that breaks the protocol (08P01); any other failure is a failed login.
var ErrMalformed = errors.New("malformed SCRAM message")

// ErrFailed is a SCRAM exchange whose proof does not match (28P01), or the exchange of an unknown user.
var ErrFailed = errors.New("SCRAM proof does not match")

// MockIterations is the iteration count shown to users without a SCRAM secret when no real secret says
// otherwise (MostCounted): PostgreSQL's default.
const MockIterations = 4096

// IterationCounts counts the SCRAM secrets of users by iteration count.
func IterationCounts(users Userlist) map[int]int {
	counts := map[int]int{}
	for _, sec := range users {
		if sec.Kind == KindSCRAM {
			counts[sec.Iterations]++
		}
	}
	return counts
}

// MostCounted is the iteration count counted most (the higher one of a tie), or MockIterations when none is:
// what a mock secret shows, so that a count PostgreSQL was configured to use (scram_iterations) does not tell a
// real user from an unknown one.
func MostCounted(counts map[int]int) int {
	most, n := MockIterations, 0
	for it, c := range counts {
		if c > n || c == n && it > most {
			most, n = it, c
		}
	}
	return most
}

// MockMD5Secret is the md5 secret an unknown user is challenged with where md5 is the method: random-looking, no
// password matches it, and the exchange is failed regardless (the caller's mock flag).
func MockMD5Secret(key []byte, user string) Secret {
	return Secret{Kind: KindMD5, MD5: hex.EncodeToString(hmacSHA256(key, []byte("md5\x00"+user))[:16])}
}

// MockSecret is the secret an unknown user (or one without a SCRAM secret) is challenged with: deterministic for a
// user and a per-process key, so that asking twice shows the same salt and nothing tells a missing user from an
// existing one (PostgreSQL's mock authentication does the same with its mock nonce). Its keys are random-looking
// and no password matches them; the exchange is failed regardless (ServerExchange's mock flag).
func MockSecret(key []byte, user string, iterations int) Secret {
	if iterations <= 0 {
		iterations = MockIterations
	}
	sec := Secret{Kind: KindSCRAM, Iterations: iterations, Salt: hmacSHA256(key, []byte("salt\x00"+user))[:16]}
	copy(sec.StoredKey[:], hmacSHA256(key, []byte("stored\x00"+user)))
	copy(sec.ServerKey[:], hmacSHA256(key, []byte("server\x00"+user)))
	return sec
}

// NewLoginExchange starts the exchange for a client logging in as user: against its secret when it has a SCRAM
// one (found), and a mock exchange otherwise (an unknown user, or an md5 secret, which cannot answer SCRAM), which
// looks the same to the client and fails. mockKey is the per-process key of MockSecret, and mockIterations the
// iteration count it shows (MostCounted of the real secrets, so that a mock one does not stand out).
func NewLoginExchange(mockKey []byte, mockIterations int, user string, sec Secret, found bool) *ServerExchange {
	if !found || sec.Kind != KindSCRAM {
		return NewServerExchange(MockSecret(mockKey, user, mockIterations), true)
	}
	return NewServerExchange(sec, false)
}

// ServerExchange is the server side of one SCRAM-SHA-256 exchange: the proxy checking a client.
type ServerExchange struct {
	secret          Secret
	mock            bool
	gs2Header       string
	clientFirstBare string
	serverFirst     string
	nonce           string // client nonce + server nonce
	serverNonce     string // drawn at First; set beforehand only by tests (RFC 7677's vector)
}

// NewServerExchange starts an exchange against sec. mock makes it fail whatever the client proves, after the
// same work as a real one: use it with MockSecret for unknown users.
func NewServerExchange(sec Secret, mock bool) *ServerExchange {
	return &ServerExchange{secret: sec, mock: mock || sec.Kind != KindSCRAM}
}

// First reads the client-first-message and returns the server-first-message.
func (e *ServerExchange) First(clientFirst []byte) ([]byte, error) {
	msg := string(clientFirst)
	// gs2-header: cbind-flag "," [authzid] ","
	flag, rest, ok := strings.Cut(msg, ",")
	if !ok {
		return nil, fmt.Errorf("%w: no gs2 header", ErrMalformed)
	}
	switch {
	case flag == "n" || flag == "y":
	case strings.HasPrefix(flag, "p="):
		return nil, fmt.Errorf("%w: the client requires channel binding, which fenceproxy does not offer", ErrMalformed)
	default:
		return nil, fmt.Errorf("%w: unexpected channel-binding flag %q", ErrMalformed, flag)
	}
	authzid, bare, ok := strings.Cut(rest, ",")
	if !ok {
		return nil, fmt.Errorf("%w: no gs2 header", ErrMalformed)
	}
	if authzid != "" {
		return nil, fmt.Errorf("%w: an authorization identity is not supported", ErrMalformed)
	}
	e.gs2Header = flag + "," + authzid + ","
	// client-first-message-bare: [reserved-mext ","] username "," nonce ["," extensions]. PostgreSQL ignores
	// the user name here (the startup packet's counts) and so does the proxy.
	attrs := strings.Split(bare, ",")
	if len(attrs) < 2 || !strings.HasPrefix(attrs[0], "n=") {
		if len(attrs) > 0 && strings.HasPrefix(attrs[0], "m=") {
			return nil, fmt.Errorf("%w: mandatory extensions are not supported", ErrMalformed)
		}
		return nil, fmt.Errorf("%w: no user name attribute", ErrMalformed)
	}
	clientNonce, ok := strings.CutPrefix(attrs[1], "r=")
	if !ok || clientNonce == "" || !printable(clientNonce) {
		return nil, fmt.Errorf("%w: bad client nonce", ErrMalformed)
	}
	if e.serverNonce == "" {
		e.serverNonce = randomNonce()
	}
	e.clientFirstBare = bare
	e.nonce = clientNonce + e.serverNonce
	e.serverFirst = "r=" + e.nonce + ",s=" + base64.StdEncoding.EncodeToString(e.secret.Salt) + ",i=" + strconv.Itoa(e.secret.Iterations)
	return []byte(e.serverFirst), nil
}

// Final reads the client-final-message, checks the proof and returns the server-final-message and the client's
// ClientKey (proof XOR ClientSignature), which can log in upstream where the secret is the same.
func (e *ServerExchange) Final(clientFinal []byte) (serverFinal []byte, clientKey [sha256.Size]byte, err error) {
	msg := string(clientFinal)
	i := strings.LastIndex(msg, ",p=")
	if i < 0 {
		return nil, clientKey, fmt.Errorf("%w: no proof", ErrMalformed)
	}
	withoutProof, proofText := msg[:i], msg[i+3:]
	attrs := strings.Split(withoutProof, ",")
	if len(attrs) < 2 {
		return nil, clientKey, fmt.Errorf("%w: client-final-message", ErrMalformed)
	}
	cb, ok := strings.CutPrefix(attrs[0], "c=")
	if !ok {
		return nil, clientKey, fmt.Errorf("%w: no channel binding attribute", ErrMalformed)
	}
	// Without channel binding, c= is exactly the gs2 header the client sent first: a client cannot switch.
	if cb != base64.StdEncoding.EncodeToString([]byte(e.gs2Header)) {
		return nil, clientKey, fmt.Errorf("%w: channel binding attribute does not match the gs2 header", ErrMalformed)
	}
	if nonce, ok := strings.CutPrefix(attrs[1], "r="); !ok || nonce != e.nonce {
		return nil, clientKey, fmt.Errorf("%w: nonce does not match", ErrMalformed)
	}
	proof, err := base64.StdEncoding.DecodeString(proofText)
	if err != nil || len(proof) != sha256.Size {
		return nil, clientKey, fmt.Errorf("%w: bad proof", ErrMalformed)
	}
	authMessage := []byte(e.clientFirstBare + "," + e.serverFirst + "," + withoutProof)
	sig := hmacSHA256(e.secret.StoredKey[:], authMessage)
	for k := range clientKey {
		clientKey[k] = proof[k] ^ sig[k]
	}
	stored := sha256.Sum256(clientKey[:])
	match := subtle.ConstantTimeCompare(stored[:], e.secret.StoredKey[:]) == 1
	serverSig := hmacSHA256(e.secret.ServerKey[:], authMessage)
	if !match || e.mock {
		return nil, [sha256.Size]byte{}, ErrFailed
	}
	return []byte("v=" + base64.StdEncoding.EncodeToString(serverSig)), clientKey, nil
}

// randomNonce draws 18 random bytes, in base64.
func randomNonce() string {
	var raw [18]byte
	rand.Read(raw[:])
	return base64.StdEncoding.EncodeToString(raw[:])
}

// printable: RFC 5802's printable characters, without ','.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e || s[i] == ',' {
			return false
		}
	}
	return true
}

// ClientExchange is the client side of a SCRAM-SHA-256 exchange: the proxy logging in upstream, with a client's
// ClientKey and the secret it was proved against (no password), or with a configured password.
type ClientExchange struct {
	password   string // empty when logging in with keys
	clientKey  [sha256.Size]byte
	serverKey  [sha256.Size]byte
	salt       []byte
	iterations int

	clientFirstBare string
	nonce           string
	serverSig       []byte
}

// NewKeyClient logs in with a ClientKey recovered from a client's proof against sec. It can answer only a
// server whose secret has the same salt and iterations (the same secret, for a password never changed).
func NewKeyClient(clientKey [sha256.Size]byte, sec Secret) *ClientExchange {
	return &ClientExchange{clientKey: clientKey, serverKey: sec.ServerKey, salt: sec.Salt, iterations: sec.Iterations}
}

// NewPasswordClient logs in with a password.
func NewPasswordClient(password string) *ClientExchange {
	return &ClientExchange{password: password}
}

// First returns the client-first-message (gs2 header "n,,": no channel binding, and an empty user name, which
// PostgreSQL ignores in favour of the startup packet's).
func (c *ClientExchange) First() []byte {
	if c.nonce == "" { // set beforehand only by tests (RFC 7677's vector)
		c.nonce = randomNonce()
	}
	c.clientFirstBare = "n=,r=" + c.nonce
	return []byte("n,," + c.clientFirstBare)
}

// WithPassword continues an exchange whose first message c sent with a password instead: for a server whose
// secret is salted differently from the one c's key came from (ErrOtherSecret from Final).
func (c *ClientExchange) WithPassword(password string) *ClientExchange {
	return &ClientExchange{password: password, clientFirstBare: c.clientFirstBare, nonce: c.nonce}
}

// ErrOtherSecret is a server whose salt or iteration count differs from the secret the client's key came from.
var ErrOtherSecret = errors.New("the upstream's SCRAM secret differs from the proxy's (salt or iterations)")

// Final reads the server-first-message and returns the client-final-message.
func (c *ClientExchange) Final(serverFirst []byte) ([]byte, error) {
	var nonce, saltText, iterText string
	for _, a := range strings.Split(string(serverFirst), ",") {
		switch {
		case strings.HasPrefix(a, "r="):
			nonce = a[2:]
		case strings.HasPrefix(a, "s="):
			saltText = a[2:]
		case strings.HasPrefix(a, "i="):
			iterText = a[2:]
		}
	}
	if !strings.HasPrefix(nonce, c.nonce) || len(nonce) == len(c.nonce) {
		return nil, fmt.Errorf("%w: server nonce does not extend ours", ErrMalformed)
	}
	salt, err := base64.StdEncoding.DecodeString(saltText)
	if err != nil || len(salt) == 0 {
		return nil, fmt.Errorf("%w: server salt", ErrMalformed)
	}
	iter, err := strconv.Atoi(iterText)
	if err != nil || iter < 1 {
		return nil, fmt.Errorf("%w: server iterations", ErrMalformed)
	}
	if c.password != "" {
		if c.clientKey, c.serverKey, err = SCRAMKeys(c.password, salt, iter); err != nil {
			return nil, err
		}
	} else if iter != c.iterations || !hmac.Equal(salt, c.salt) {
		return nil, ErrOtherSecret
	}
	withoutProof := "c=biws,r=" + nonce // biws: base64 of "n,,"
	authMessage := []byte(c.clientFirstBare + "," + string(serverFirst) + "," + withoutProof)
	stored := sha256.Sum256(c.clientKey[:])
	sig := hmacSHA256(stored[:], authMessage)
	proof := make([]byte, sha256.Size)
	for i := range proof {
		proof[i] = c.clientKey[i] ^ sig[i]
	}
	c.serverSig = hmacSHA256(c.serverKey[:], authMessage)
	return []byte(withoutProof + ",p=" + base64.StdEncoding.EncodeToString(proof)), nil
}

// Verify checks the server-final-message: the server knew the secret too.
func (c *ClientExchange) Verify(serverFinal []byte) error {
	v, ok := strings.CutPrefix(string(serverFinal), "v=")
	if !ok {
		return fmt.Errorf("%w: server-final-message %q", ErrMalformed, serverFinal)
	}
	sig, err := base64.StdEncoding.DecodeString(v)
	if err != nil || !hmac.Equal(sig, c.serverSig) {
		return errors.New("the upstream's SCRAM server signature does not match: it does not know the secret")
	}
	return nil
}
