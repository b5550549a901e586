package auth

import (
	"crypto/hmac"
	"crypto/md5"
	"crypto/pbkdf2"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Kind is the kind of a stored secret.
type Kind uint8

const (
	// KindSCRAM is a SCRAM-SHA-256 secret: salt, iterations, StoredKey and ServerKey.
	KindSCRAM Kind = iota + 1
	// KindMD5 is "md5" followed by md5(password || user) in hex.
	KindMD5
)

// Secret is what PostgreSQL stores for a password (pg_authid.rolpassword): never the password itself.
type Secret struct {
	Kind Kind
	// SCRAM-SHA-256
	Iterations int
	Salt       []byte
	StoredKey  [sha256.Size]byte
	ServerKey  [sha256.Size]byte
	// md5: the 32 hex digits after "md5"
	MD5 string
}

// ErrPlaintext is returned for a secret that is a plain password.
var ErrPlaintext = errors.New("a plaintext password; fenceproxy stores only SCRAM-SHA-256 or md5 secrets (see docs/auth.md)")

// ParseSecret reads a secret as PostgreSQL writes it: `SCRAM-SHA-256$<iter>:<salt>$<StoredKey>:<ServerKey>`
// (base64) or `md5<32 hex digits>`.
func ParseSecret(s string) (Secret, error) {
	if rest, ok := strings.CutPrefix(s, "SCRAM-SHA-256$"); ok {
		return parseSCRAM(rest)
	}
	if h, ok := strings.CutPrefix(s, "md5"); ok && len(h) == 32 {
		if _, err := hex.DecodeString(h); err == nil {
			return Secret{Kind: KindMD5, MD5: strings.ToLower(h)}, nil
		}
	}
	return Secret{}, ErrPlaintext
}

func parseSCRAM(rest string) (Secret, error) {
	bad := func(what string) (Secret, error) {
		return Secret{}, fmt.Errorf("malformed SCRAM-SHA-256 secret: %s", what)
	}
	iterSalt, keys, ok := strings.Cut(rest, "$")
	if !ok {
		return bad("no $ before the keys")
	}
	iterText, saltText, ok := strings.Cut(iterSalt, ":")
	if !ok {
		return bad("no iterations:salt")
	}
	iter, err := strconv.Atoi(iterText)
	if err != nil || iter < 1 {
		return bad("iterations")
	}
	salt, err := base64.StdEncoding.DecodeString(saltText)
	if err != nil || len(salt) == 0 {
		return bad("salt")
	}
	storedText, serverText, ok := strings.Cut(keys, ":")
	if !ok {
		return bad("no StoredKey:ServerKey")
	}
	sec := Secret{Kind: KindSCRAM, Iterations: iter, Salt: salt}
	if err := decodeKey(storedText, &sec.StoredKey); err != nil {
		return bad("StoredKey")
	}
	if err := decodeKey(serverText, &sec.ServerKey); err != nil {
		return bad("ServerKey")
	}
	return sec, nil
}

func decodeKey(text string, key *[sha256.Size]byte) error {
	b, err := base64.StdEncoding.DecodeString(text)
	if err != nil || len(b) != sha256.Size {
		return errors.New("bad key")
	}
	copy(key[:], b)
	return nil
}

// String writes the secret back in PostgreSQL's format.
func (s Secret) String() string {
	switch s.Kind {
	case KindSCRAM:
		return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", s.Iterations, base64.StdEncoding.EncodeToString(s.Salt),
			base64.StdEncoding.EncodeToString(s.StoredKey[:]), base64.StdEncoding.EncodeToString(s.ServerKey[:]))
	case KindMD5:
		return "md5" + s.MD5
	}
	return ""
}

// SCRAMKeys derives a password's ClientKey and ServerKey for a salt and iteration count (RFC 5802) from the
// password as PostgreSQL prepares it (SASLprep): its secret was salted from that, not from the bytes typed.
func SCRAMKeys(password string, salt []byte, iterations int) (clientKey, serverKey [sha256.Size]byte, err error) {
	salted, err := pbkdf2.Key(sha256.New, SASLprep(password), salt, iterations, sha256.Size)
	if err != nil {
		return clientKey, serverKey, fmt.Errorf("derive SCRAM keys: %w", err)
	}
	copy(clientKey[:], hmacSHA256(salted, []byte("Client Key")))
	copy(serverKey[:], hmacSHA256(salted, []byte("Server Key")))
	return clientKey, serverKey, nil
}

// NewSCRAMSecret makes the secret PostgreSQL would store for password with salt and iterations.
func NewSCRAMSecret(password string, salt []byte, iterations int) (Secret, error) {
	ck, sk, err := SCRAMKeys(password, salt, iterations)
	if err != nil {
		return Secret{}, err
	}
	return Secret{Kind: KindSCRAM, Iterations: iterations, Salt: append([]byte(nil), salt...),
		StoredKey: sha256.Sum256(ck[:]), ServerKey: sk}, nil
}

// MD5Secret is PostgreSQL's md5 secret of password for user (without the "md5" prefix). md5 takes the
// password's bytes as they are: PostgreSQL applies SASLprep to SCRAM only.
func MD5Secret(user, password string) string {
	h := md5.Sum([]byte(password + user))
	return hex.EncodeToString(h[:])
}

// MD5Response is the answer to an md5 challenge with salt for a secret (hex, without "md5"): what a client sends.
func MD5Response(secretHex string, salt [4]byte) string {
	h := md5.Sum(append([]byte(secretHex), salt[:]...))
	return "md5" + hex.EncodeToString(h[:])
}

// VerifyMD5 checks a client's answer to an md5 challenge in constant time.
func VerifyMD5(s Secret, salt [4]byte, answer []byte) bool {
	if s.Kind != KindMD5 {
		return false
	}
	want := MD5Response(s.MD5, salt)
	return subtle.ConstantTimeCompare([]byte(want), answer) == 1
}

func hmacSHA256(key, msg []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	return m.Sum(nil)
}
