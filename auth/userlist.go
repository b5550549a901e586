// Package auth holds the pure parts of client authentication by the proxy: pgbouncer's userlist format,
// PostgreSQL's password secrets (SCRAM-SHA-256 and md5), the server side of a SCRAM-SHA-256 exchange (RFC 5802,
// RFC 7677, as PostgreSQL runs it), the client side the proxy uses to log in upstream with a client's recovered
// ClientKey, and md5's challenge. Nothing here touches the network.
package auth

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Userlist is an auth file's users and their secrets.
type Userlist map[string]Secret

// ParseUserlist reads pgbouncer's auth_file format: one user a line, `"user" "secret" ...`, each field in double
// quotes with `""` standing for a quote inside it; the rest of a line is ignored, and so is a line that does not
// start with a quote (comments, blank lines), as pgbouncer does. A plaintext password is refused, naming its line:
// the proxy never keeps a password in plain text (write a SCRAM secret instead, see docs/auth.md). A later line
// for the same user wins, as in pgbouncer.
func ParseUserlist(r io.Reader) (Userlist, error) {
	users := Userlist{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimLeft(sc.Bytes(), " \t\r")
		if len(line) == 0 || line[0] != '"' {
			continue
		}
		user, rest, err := quotedField(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: user name: %w", n, err)
		}
		rest = bytes.TrimLeft(rest, " \t")
		if len(rest) == 0 || rest[0] != '"' {
			return nil, fmt.Errorf("line %d: user %q has no quoted secret", n, user)
		}
		secret, _, err := quotedField(rest)
		if err != nil {
			return nil, fmt.Errorf("line %d: secret of user %q: %w", n, user, err)
		}
		s, err := ParseSecret(secret)
		if err != nil {
			return nil, fmt.Errorf("line %d: user %q: %w", n, user, err)
		}
		users[user] = s
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read userlist: %w", err)
	}
	return users, nil
}

// quotedField reads a field that starts with '"' and returns it unescaped and the bytes after it.
func quotedField(b []byte) (string, []byte, error) {
	var sb strings.Builder
	for i := 1; i < len(b); i++ {
		if b[i] != '"' {
			sb.WriteByte(b[i])
			continue
		}
		if i+1 < len(b) && b[i+1] == '"' {
			sb.WriteByte('"')
			i++
			continue
		}
		return sb.String(), b[i+1:], nil
	}
	return "", nil, errors.New("unterminated quoted field")
}
