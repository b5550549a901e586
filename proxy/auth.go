package proxy

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Client authentication by the proxy (auth.type scram-sha-256, pool.mode transaction): SCRAM-SHA-256 (RFC 5802,
// RFC 7677) against the secrets of an auth file in pgbouncer's userlist format, the form PostgreSQL stores in
// pg_authid.rolpassword. The proxy holds no password: a secret lets it check a proof, not make one. Channel
// binding is not offered. A user the file does not list goes through the same exchange, against a secret made
// up for that user name, and fails at the proof with the same error: no user enumeration by answers.

// scramSecret is a user's SCRAM-SHA-256 secret.
type scramSecret struct {
	iterations int
	salt       []byte
	storedKey  []byte
	serverKey  []byte
}

// Authentication request codes of the SASL exchange.
const (
	authSASLContinue = 11
	authSASLFinal    = 12
)

// sqlstateInvalidPassword is PostgreSQL's invalid_password.
const sqlstateInvalidPassword = "28P01"

// errAuthFailed: the client did not prove the password; it gets 28P01.
var errAuthFailed = errors.New("password authentication failed")

// lookupSecret reads user's secret from the auth file; ok false when the file does not list it.
func lookupSecret(file, user string) (scramSecret, bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return scramSecret{}, false, fmt.Errorf("auth.file: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := userlistFields(sc.Text())
		if len(fields) < 2 || fields[0] != user {
			continue
		}
		s, err := parseSCRAMSecret(fields[1])
		if err != nil {
			return scramSecret{}, false, fmt.Errorf("auth.file: user %q: %w", user, err)
		}
		return s, true, nil
	}
	return scramSecret{}, false, sc.Err()
}

// userlistFields splits a userlist line into its double-quoted fields ("" inside a field is a quote).
func userlistFields(line string) []string {
	var fields []string
	for {
		line = strings.TrimLeft(line, " \t")
		if !strings.HasPrefix(line, `"`) {
			return fields
		}
		var b strings.Builder
		i := 1
		for ; i < len(line); i++ {
			if line[i] == '"' {
				if i+1 < len(line) && line[i+1] == '"' {
					b.WriteByte('"')
					i++
					continue
				}
				break
			}
			b.WriteByte(line[i])
		}
		if i >= len(line) {
			return fields // unterminated: ignore the line's rest
		}
		fields = append(fields, b.String())
		line = line[i+1:]
	}
}

// parseSCRAMSecret reads SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>.
func parseSCRAMSecret(s string) (scramSecret, error) {
	rest, ok := strings.CutPrefix(s, "SCRAM-SHA-256$")
	if !ok {
		return scramSecret{}, errors.New("not a SCRAM-SHA-256 secret (md5 and plain passwords are not supported)")
	}
	params, keys, ok := strings.Cut(rest, "$")
	iter, salt, ok1 := strings.Cut(params, ":")
	stored, server, ok2 := strings.Cut(keys, ":")
	if !ok || !ok1 || !ok2 {
		return scramSecret{}, errors.New("malformed SCRAM-SHA-256 secret")
	}
	var sec scramSecret
	var err error
	if sec.iterations, err = strconv.Atoi(iter); err != nil || sec.iterations < 1 {
		return scramSecret{}, errors.New("malformed SCRAM-SHA-256 iteration count")
	}
	dec := base64.StdEncoding
	if sec.salt, err = dec.DecodeString(salt); err != nil {
		return scramSecret{}, errors.New("malformed SCRAM-SHA-256 salt")
	}
	if sec.storedKey, err = dec.DecodeString(stored); err != nil || len(sec.storedKey) != sha256.Size {
		return scramSecret{}, errors.New("malformed SCRAM-SHA-256 StoredKey")
	}
	if sec.serverKey, err = dec.DecodeString(server); err != nil || len(sec.serverKey) != sha256.Size {
		return scramSecret{}, errors.New("malformed SCRAM-SHA-256 ServerKey")
	}
	return sec, nil
}

// madeUpSecret is the secret an unknown user is checked against: its salt depends on the user name and the
// server's own key, so that repeated attempts see the same one, as for a real user.
func (s *Server) madeUpSecret(user string) scramSecret {
	h := hmac.New(sha256.New, s.authKey[:])
	h.Write([]byte(user))
	salt := h.Sum(nil)[:16]
	key := make([]byte, sha256.Size)
	rand.Read(key)
	return scramSecret{iterations: 4096, salt: salt, storedKey: key, serverKey: key}
}

// authenticateSCRAM runs the SCRAM-SHA-256 exchange with the client; nil when it proved the password.
func (ss *session) authenticateSCRAM() error {
	s := ss.srv
	user := ss.params["user"]
	sec, known, err := lookupSecret(s.cfg.Auth.File, user)
	if err != nil {
		ss.log.Error("client authentication", "err", err)
		known = false
	}
	if !known {
		sec = s.madeUpSecret(user)
	}
	writeMsg(ss.cw, msgAuthentication, append(binary.BigEndian.AppendUint32(nil, authSASL), "SCRAM-SHA-256\x00\x00"...), "")
	if err := ss.cw.Flush(); err != nil {
		return err
	}
	first, err := ss.readPassword()
	if err != nil {
		return err
	}
	mech, rest, ok := cutNul(first)
	if !ok || string(mech) != "SCRAM-SHA-256" || len(rest) < 4 {
		return fmt.Errorf("%w: SASLInitialResponse for mechanism %q", errProtocol, mech)
	}
	n := int32(binary.BigEndian.Uint32(rest))
	if n < 0 || int(n) != len(rest)-4 {
		return fmt.Errorf("%w: malformed SASLInitialResponse", errProtocol)
	}
	clientFirst := string(rest[4:])
	gs2, bare, ok := cutGS2(clientFirst)
	if !ok {
		return fmt.Errorf("%w: malformed SCRAM client-first-message", errProtocol)
	}
	clientNonce := scramAttr(bare, 'r')
	if clientNonce == "" {
		return fmt.Errorf("%w: SCRAM client-first-message without a nonce", errProtocol)
	}
	var nonce [18]byte
	rand.Read(nonce[:])
	fullNonce := clientNonce + base64.StdEncoding.EncodeToString(nonce[:])
	serverFirst := "r=" + fullNonce + ",s=" + base64.StdEncoding.EncodeToString(sec.salt) + ",i=" + strconv.Itoa(sec.iterations)
	writeMsg(ss.cw, msgAuthentication, append(binary.BigEndian.AppendUint32(nil, authSASLContinue), serverFirst...), "")
	if err := ss.cw.Flush(); err != nil {
		return err
	}
	final, err := ss.readPassword()
	if err != nil {
		return err
	}
	clientFinal := string(final)
	withoutProof, proofB64, ok := strings.Cut(clientFinal, ",p=")
	if !ok {
		return fmt.Errorf("%w: SCRAM client-final-message without a proof", errProtocol)
	}
	proof, err := base64.StdEncoding.DecodeString(proofB64)
	if scramAttr(withoutProof, 'c') != base64.StdEncoding.EncodeToString([]byte(gs2)) || scramAttr(withoutProof, 'r') != fullNonce ||
		err != nil || len(proof) != sha256.Size {
		return errAuthFailed
	}
	authMessage := bare + "," + serverFirst + "," + withoutProof
	clientSig := hmacSHA256(sec.storedKey, authMessage)
	clientKey := make([]byte, sha256.Size)
	for i := range clientKey {
		clientKey[i] = proof[i] ^ clientSig[i]
	}
	storedKey := sha256.Sum256(clientKey)
	if subtle.ConstantTimeCompare(storedKey[:], sec.storedKey) != 1 || !known {
		return errAuthFailed
	}
	serverSig := hmacSHA256(sec.serverKey, authMessage)
	writeMsg(ss.cw, msgAuthentication, append(binary.BigEndian.AppendUint32(nil, authSASLFinal), "v="+base64.StdEncoding.EncodeToString(serverSig)...), "")
	return nil
}

// readPassword reads the client's next message, which must be a SASL response ('p').
func (ss *session) readPassword() ([]byte, error) {
	typ, _, err := ss.cr.next()
	if err != nil {
		return nil, err
	}
	if typ != msgPassword {
		return nil, fmt.Errorf("%w: expected a SASL response, got message %q", errProtocol, typ)
	}
	body, err := ss.cr.body()
	if err != nil {
		return nil, err
	}
	return append([]byte(nil), body...), nil
}

// cutGS2 splits a client-first-message into its GS2 header ("n,," or "y,,": no channel binding, no authzid)
// and the bare message.
func cutGS2(m string) (gs2, bare string, ok bool) {
	for _, h := range []string{"n,,", "y,,"} {
		if b, found := strings.CutPrefix(m, h); found {
			return h, b, true
		}
	}
	return "", "", false
}

// scramAttr returns the value of attribute a in a comma-separated SCRAM message.
func scramAttr(m string, a byte) string {
	for _, part := range strings.Split(m, ",") {
		if len(part) >= 2 && part[0] == a && part[1] == '=' {
			return part[2:]
		}
	}
	return ""
}

func hmacSHA256(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}
