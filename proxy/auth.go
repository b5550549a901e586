package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/asn1"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/auth"
	"github.com/fenceproxy/fenceproxy/config"
)

// Client authentication by the proxy (auth.type other than passthrough; docs/auth.md).
//
// The proxy checks the client itself, before any upstream work: the secret comes from auth.file (a pgbouncer
// userlist) or from auth.query, run as a dedicated role on connections of the proxy's own. Then it opens (or
// resumes, reuse.go) an upstream connection with the client's StartupMessage and answers the server's
// authentication request itself: with the client's SCRAM ClientKey, recovered from its proof, when the server asks
// SCRAM with the same salt and iterations; with the md5 secret for md5; or with a configured password. The client
// sees AuthenticationOk only after both succeeded. From there on the session is relayed as any other.
//
// No user enumeration: an unknown user, or one whose secret cannot answer the method, is given a SCRAM exchange
// (md5 where md5 is the method) against a mock secret derived from a key (auth.mock_key_file's, or drawn at
// start: the same salt every time for the same name), which fails with the same 28P01 as a wrong password,
// after the same work. Verifying a SCRAM proof costs the server a few
// HMACs (the client runs PBKDF2), and no lock is held while it runs, so failed logins do not hold others up; the
// auth query has a bounded pool of its own, and each login waits for it no longer than limits.startup_timeout.

// maxName is the longest user or database name, in bytes, that PostgreSQL takes as it is sent: it cuts a longer
// one to NAMEDATALEN-1 bytes (63 in every build but a custom one) before it looks the role or database up.
const maxName = 63

// Authentication request codes beyond authOK and authSASL.
const (
	authCleartext    = 3
	authMD5          = 5
	authSASLContinue = 11
	authSASLFinal    = 12
)

// maxAuthMessage is the largest password or SASL message a client may send, PostgreSQL's limit.
const maxAuthMessage = 65535

// authQueryConns bounds the auth query's own connections: lookups queue for them (never longer than a login
// may take) instead of opening a connection per login.
const authQueryConns = 4

// authenticator holds what client authentication needs; nil when auth.type is passthrough.
type authenticator struct {
	cfg     config.Auth
	log     *slog.Logger
	mockKey []byte // key of the mock secrets: auth.mock_key_file's, or drawn at start

	mu       sync.RWMutex
	file     auth.Userlist // auth.file, as last read
	fileSeen fileVersion   // auth.file's version when last read
	// The iteration counts of auth.file's SCRAM secrets and of those auth.query returned: a mock SCRAM secret
	// shows the one counted most (mockIterations).
	fileIterations, queryIterations map[int]int

	queryCfg *pgx.ConnConfig // auth.query's connections; nil without it
	// usersChanged, when set (New: the pools' authUsersChanged), is called after auth.file's users were read
	// again and applied, no lock held.
	usersChanged func()
	// queryConns holds authQueryConns slots: an idle connection, or nil for one not opened (or dropped).
	queryConns chan *pgx.Conn
}

func newAuthenticator(cfg *config.Config, upTLS *tls.Config, log *slog.Logger) (*authenticator, error) {
	if !cfg.Auth.ByProxy() {
		return nil, nil
	}
	a := &authenticator{cfg: cfg.Auth, log: log, mockKey: make([]byte, 32)}
	rand.Read(a.mockKey)
	if f := cfg.Auth.MockKeyFile; f != "" {
		key, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("auth.mock_key_file: %w", err)
		}
		if len(key) < config.MinMockKey {
			return nil, fmt.Errorf("auth.mock_key_file %s: %d bytes, want at least %d random ones (head -c 32 /dev/urandom > %s)", f, len(key), config.MinMockKey, f)
		}
		a.mockKey = key
	}
	if err := a.reload(); err != nil {
		return nil, err
	}
	if a.cfg.Query != "" {
		host, port, err := net.SplitHostPort(cfg.Upstream.Address)
		if err != nil {
			return nil, fmt.Errorf("upstream.address: %w", err)
		}
		cc, err := pgx.ParseConfig("")
		if err != nil {
			return nil, fmt.Errorf("auth.query connection: %w", err)
		}
		cc.Host, cc.User, cc.Database, cc.Password = host, a.cfg.User, a.cfg.Database, a.cfg.Password
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("upstream.address port: %w", err)
		}
		cc.Port = uint16(p)
		cc.TLSConfig, cc.Fallbacks = upTLS, nil
		cc.ConnectTimeout = cfg.Upstream.ConnectTimeout
		// Nothing from the environment (PGOPTIONS and the like) and nothing of any client's: the query runs
		// with search_path pinned, so that nothing a role or a client creates can shadow what it names. And
		// with client_encoding SQL_ASCII, under which the server converts nothing: the user name reaches the
		// query as the bytes of the StartupMessage, which the server compares with role names unconverted.
		// Under a client_encoding its database or role gave (UTF8 in a LATIN1 database, say), the name
		// would be converted first and could find another role than the one the server then logs in.
		cc.RuntimeParams = map[string]string{"search_path": "pg_catalog", "client_encoding": "SQL_ASCII",
			"application_name": "fenceproxy auth query"}
		a.queryCfg = cc
		a.queryConns = make(chan *pgx.Conn, authQueryConns)
		for range authQueryConns {
			a.queryConns <- nil
		}
	}
	return a, nil
}

// fileVersion tells one content of a file from the next without reading it.
type fileVersion struct {
	mod  time.Time
	size int64
}

func statVersion(path string) fileVersion {
	fi, err := os.Stat(path)
	if err != nil {
		return fileVersion{}
	}
	return fileVersion{fi.ModTime(), fi.Size()}
}

func readUserlist(path string) (auth.Userlist, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth.file: %w", err)
	}
	defer f.Close()
	users, err := auth.ParseUserlist(f)
	if err != nil {
		return nil, fmt.Errorf("auth.file %s: %w", path, err)
	}
	return users, nil
}

// close releases the auth query's idle connections; one in use is closed when given back.
func (a *authenticator) close() {
	if a == nil || a.queryConns == nil {
		return
	}
	for range authQueryConns {
		if c := <-a.queryConns; c != nil {
			c.Close(context.Background())
		}
	}
}

// reload reads auth.file again, keeping the users it had when the file is unreadable or broken.
func (a *authenticator) reload() error {
	apply, err := a.readAgain()
	if err != nil {
		return err
	}
	apply()
	return nil
}

// readAgain reads auth.file again without applying it: apply makes its users the proxy's. An unreadable or broken
// file is an error, and nothing is read to apply.
func (a *authenticator) readAgain() (apply func(), err error) {
	if a == nil || a.cfg.File == "" {
		return func() {}, nil
	}
	seen := statVersion(a.cfg.File)
	users, err := readUserlist(a.cfg.File)
	if err != nil {
		return nil, err
	}
	return func() {
		a.mu.Lock()
		a.file, a.fileSeen, a.fileIterations = users, seen, auth.IterationCounts(users)
		a.mu.Unlock()
		if a.usersChanged != nil {
			a.usersChanged()
		}
	}, nil
}

// removed reports whether user can no longer log in because auth.file, the only place its secret is looked up
// (scram-sha-256 or md5, no auth.query), does not have it.
func (a *authenticator) removed(user string) bool {
	if a == nil || a.cfg.File == "" || a.queryCfg != nil || (a.cfg.Type != config.AuthSCRAM && a.cfg.Type != config.AuthMD5) {
		return false
	}
	a.mu.RLock()
	_, ok := a.file[user]
	a.mu.RUnlock()
	return !ok
}

// mockIterations is the iteration count a mock SCRAM secret shows: the one counted most among the secrets seen
// (a few distinct counts: a small map per SCRAM login).
func (a *authenticator) mockIterations() int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	counts := maps.Clone(a.fileIterations)
	if counts == nil {
		counts = map[int]int{}
	}
	for it, n := range a.queryIterations {
		counts[it] += n
	}
	return auth.MostCounted(counts)
}

// reloadIfChanged reads auth.file again when it changed since it was last read: an operator's new secret works
// at the next login, without SIGHUP. A broken file keeps the users it had, and says so.
func (a *authenticator) reloadIfChanged() {
	if a.cfg.File == "" {
		return
	}
	v := statVersion(a.cfg.File)
	a.mu.RLock()
	same := v == a.fileSeen
	a.mu.RUnlock()
	if same {
		return
	}
	if err := a.reload(); err != nil {
		a.log.Error("auth.file changed but could not be read; the previous users stay", "err", err)
		a.mu.Lock()
		a.fileSeen = v // say it once per change
		a.mu.Unlock()
	}
}

// ReloadAuth reads auth.file again (SIGHUP).
func (s *Server) ReloadAuth() error { return s.auth.reload() }

// ReadAuthAgain is ReloadAuth in two steps, for a reload that applies all it reads or nothing: it reads and
// checks auth.file, and apply makes the users read the proxy's. A file that is unreadable or broken is an error.
func (s *Server) ReadAuthAgain() (apply func(), err error) { return s.auth.readAgain() }

// lookup finds user's secret: in auth.file first (read again when it changed), then through auth.query (user bound as $1, never spliced; the
// query's last column is the secret, NULL, no row or several rows meaning no such user). A plaintext answer is treated as no
// secret: the proxy does not keep passwords. timeout bounds auth.query's wait for a connection and its run; the
// context that carries it is made only for the query, since a timer per login that auth.file answers (nearly
// always stopped unfired) was one more for the runtime to keep and wake its netpoller for.
func (a *authenticator) lookup(timeout time.Duration, user string) (auth.Secret, bool, error) {
	a.reloadIfChanged()
	a.mu.RLock()
	sec, ok := a.file[user]
	a.mu.RUnlock()
	if ok || a.queryCfg == nil {
		return sec, ok, nil
	}
	if !utf8.ValidString(user) {
		// A UTF8 database refuses the parameter (22021, even under SQL_ASCII, which converts nothing but
		// checks), and a name PostgreSQL cannot show its clients consistently is not worth the risk elsewhere:
		// an unknown user, not a failed lookup, which would answer 08006 and log an error at every try.
		return auth.Secret{}, false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var conn *pgx.Conn
	select {
	case conn = <-a.queryConns:
	case <-ctx.Done():
		return auth.Secret{}, false, fmt.Errorf("auth.query: waiting for a connection: %w", ctx.Err())
	}
	text, found, err := a.runQuery(ctx, &conn, user)
	a.queryConns <- conn
	if err != nil {
		return auth.Secret{}, false, err
	}
	if !found {
		return auth.Secret{}, false, nil
	}
	sec, err = auth.ParseSecret(text)
	if err != nil {
		a.log.Error("auth.query returned no usable secret; the user cannot log in", "user", user, "err", err)
		return auth.Secret{}, false, nil
	}
	if sec.Kind == auth.KindSCRAM {
		// The count the server's secrets have (scram_iterations when they were set), for the mock ones to show:
		// what the query returned so far, with auth.file's.
		a.mu.Lock()
		if a.queryIterations == nil {
			a.queryIterations = map[int]int{}
		}
		a.queryIterations[sec.Iterations]++
		a.mu.Unlock()
	}
	return sec, true, nil
}

// runQuery runs auth.query for user on *conn, opening it first when nil, and drops a connection that failed.
func (a *authenticator) runQuery(ctx context.Context, conn **pgx.Conn, user string) (string, bool, error) {
	if *conn == nil || (*conn).IsClosed() {
		c, err := connectOwnRole(ctx, a.queryCfg)
		if err != nil {
			*conn = nil
			return "", false, fmt.Errorf("auth.query: connect as %s: %w", a.cfg.User, err)
		}
		*conn = c
	}
	rows, err := (*conn).Query(ctx, a.cfg.Query, user)
	if unspellable(err) {
		return "", false, nil
	}
	if err != nil {
		(*conn).Close(context.Background())
		*conn = nil
		return "", false, fmt.Errorf("auth.query: %w", err)
	}
	defer rows.Close()
	var text string
	found := false
	if rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return "", false, fmt.Errorf("auth.query: %w", err)
		}
		if len(vals) > 0 {
			text, found = vals[len(vals)-1].(string)
		}
	}
	// A second row means the query does not say which secret is the user's: taking the first would let a
	// password that matches any of them in (and log in upstream with a configured password). No usable secret.
	several := rows.Next()
	rows.Close()
	if err := rows.Err(); unspellable(err) {
		return "", false, nil
	} else if err != nil {
		return "", false, fmt.Errorf("auth.query: %w", err)
	}
	if several {
		a.log.Error("auth.query returned several rows; the user cannot log in", "user", user)
		return "", false, nil
	}
	return text, found, nil
}

// unspellable reports whether the auth query failed because the database's encoding cannot spell the user name
// (the query's connection converts nothing, SQL_ASCII, but the server checks the bytes): no role there has that
// name, so the user is unknown, and the connection, which an error of the server's leaves usable, stays. Counted
// as a failed lookup, each such login would drop it and open another upstream.
func unspellable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == sqlstateNotInRepertoire || pe.Code == sqlstateUntranslatable)
}

// clientLogin is what the proxy keeps of an authenticated client to log in upstream as it: never a password the
// configuration did not give.
type clientLogin struct {
	user      string
	secret    auth.Secret // the secret the client proved itself against (SCRAM or md5); zero for trust and cert
	hasKey    bool
	clientKey [sha256.Size]byte // recovered from the client's SCRAM proof
	password  string            // auth.upstream_password(s), or ""
}

// errLoginFailed: the client failed authentication and was told (28P01 or 28000).
var errLoginFailed = errors.New("client authentication failed")

// authenticateClient authenticates the client of ss when the proxy does authentication (auth.type). It returns
// nil and no error for passthrough, where PostgreSQL authenticates through the relay. On failure the client has
// been told why. On success the client waits for AuthenticationOk, which the caller sends once upstream agreed
// (loginUpstream, or resume for a kept connection). Session and transaction pooling both start here.
func (s *Server) authenticateClient(ss *session) (*clientLogin, error) {
	a := s.auth
	if a == nil {
		return nil, nil
	}
	user := ss.params["user"]
	// The proxy checks the client as the name the startup gives, and the server logs in the name it reads
	// there: both must be one role. PostgreSQL refuses a startup without a user name and cuts one longer than
	// maxName, so a certificate, a userlist line or a configured password for the long name would log in
	// as another role, its cut form. Neither is answered here, and nothing goes upstream; the refusal depends
	// on the name alone, so it tells nothing about which users exist.
	if user == "" {
		s.metrics.authFailure("malformed")
		ss.fatal(sqlstateInvalidAuthorization, "no PostgreSQL user name specified in startup packet", "")
		return nil, errLoginFailed
	}
	if len(user) > maxName {
		s.metrics.authFailure("malformed")
		ss.fatalHint(sqlstateInvalidAuthorization, fmt.Sprintf("user name of %d bytes is too long", len(user)), "",
			fmt.Sprintf("PostgreSQL would log in its first %d bytes, another role than the one the proxy would check", maxName))
		return nil, errLoginFailed
	}
	login := &clientLogin{user: user, password: a.cfg.UpstreamPasswordFor(user)}
	switch a.cfg.Type {
	case config.AuthTrust:
		return login, nil
	case config.AuthCert:
		return login, ss.checkClientCert(user)
	}
	sec, found, err := a.lookup(s.cfg.Limits.StartupTimeout, user)
	if err != nil {
		s.metrics.authFailure("lookup")
		ss.logger().Error("could not look the user's secret up", "err", err)
		ss.fatal(sqlstateConnectionFailure, "fenceproxy could not look the user up", "")
		return nil, err
	}
	switch {
	case a.cfg.Type == config.AuthMD5 && found && sec.Kind == auth.KindMD5:
		err = ss.md5Exchange(sec, false)
	case a.cfg.Type == config.AuthMD5 && !found:
		// Where md5 is the method an unknown user is asked for md5 too (as PostgreSQL does with
		// password_encryption md5): a SCRAM challenge would tell it from the md5 users at once.
		err = ss.md5Exchange(auth.MockMD5Secret(a.mockKey, user), true)
	default:
		var key [sha256.Size]byte
		key, err = ss.scramExchange(auth.NewLoginExchange(a.mockKey, a.mockIterations(), user, sec, found))
		login.clientKey, login.hasKey = key, err == nil
	}
	if err != nil {
		if errors.Is(err, auth.ErrMalformed) || errors.Is(err, errProtocol) {
			s.metrics.authFailure("malformed")
			ss.logger().Info("authentication protocol violation", "err", err)
			ss.fatal(sqlstateProtocolViolation, "malformed authentication message", "")
			return nil, err
		}
		if errors.Is(err, auth.ErrFailed) {
			s.metrics.authFailure("password")
			// One message for an unknown user and a wrong password, as PostgreSQL's.
			ss.logger().Info("password authentication failed")
			ss.fatal(sqlstateInvalidPassword, fmt.Sprintf("password authentication failed for user %q", user), "")
			return nil, errLoginFailed
		}
		ss.startupFailed(err)
		return nil, err
	}
	login.secret = sec
	return login, nil
}

// checkClientCert accepts a client whose TLS certificate, verified against tls.client_ca_file, names user as
// its common name.
func (ss *session) checkClientCert(user string) error {
	tc, ok := ss.client.(*tls.Conn)
	if !ok || len(tc.ConnectionState().VerifiedChains) == 0 {
		ss.srv.metrics.authFailure("certificate")
		ss.fatal(sqlstateInvalidAuthorization, "connection requires a valid client certificate", "")
		return errLoginFailed
	}
	if cn, ok := soleCommonName(tc.ConnectionState().PeerCertificates[0]); !ok || cn != user {
		ss.srv.metrics.authFailure("certificate")
		ss.logger().Info("certificate common name does not match the user", "cn", cn, "one_common_name", ok)
		ss.fatal(sqlstateInvalidAuthorization, fmt.Sprintf("certificate authentication failed for user %q", user), "")
		return errLoginFailed
	}
	return nil
}

// soleCommonName is the common name of cert's subject, and whether the subject has exactly one. With several,
// parsers disagree on which names the holder (crypto/x509 keeps the last, OpenSSL, as PostgreSQL's cert method
// and much CA tooling use it, the first), so the CA may have vetted another name than the one compared here:
// such a certificate names no one.
func soleCommonName(cert *x509.Certificate) (string, bool) {
	commonName := asn1.ObjectIdentifier{2, 5, 4, 3} // X.520's commonName attribute type
	n := 0
	for _, a := range cert.Subject.Names {
		if a.Type.Equal(commonName) {
			n++
		}
	}
	return cert.Subject.CommonName, n == 1
}

// readPasswordMessage reads the client's next message, which must be a PasswordMessage ('p': password, SASL).
func (ss *session) readPasswordMessage() ([]byte, error) {
	if err := ss.cw.Flush(); err != nil {
		return nil, err
	}
	// An unauthenticated client gets no more than PostgreSQL gives it (PG_MAX_AUTH_TOKEN_LENGTH), not
	// limits.max_message_size.
	defer func(max int) { ss.cr.max = max }(ss.cr.max)
	ss.cr.max = maxAuthMessage
	typ, _, err := ss.cr.next()
	if err != nil {
		return nil, err
	}
	if typ != msgPassword {
		return nil, fmt.Errorf("%w: expected a password message, got %q", errProtocol, typ)
	}
	return ss.cr.body()
}

// scramExchange runs SCRAM-SHA-256 with the client and returns its ClientKey.
func (ss *session) scramExchange(e *auth.ServerExchange) ([sha256.Size]byte, error) {
	var none [sha256.Size]byte
	ss.writeAuthRequest(authSASL, []byte(auth.Mechanism+"\x00\x00"))
	body, err := ss.readPasswordMessage()
	if err != nil {
		return none, err
	}
	// SASLInitialResponse: mechanism, NUL, length of the data (-1: none), data.
	mech, rest, ok := cutNul(body)
	if !ok || len(rest) < 4 {
		return none, fmt.Errorf("%w: SASLInitialResponse", auth.ErrMalformed)
	}
	if string(mech) != auth.Mechanism {
		return none, fmt.Errorf("%w: client chose mechanism %q", auth.ErrMalformed, mech)
	}
	n := int32(binary.BigEndian.Uint32(rest))
	if n < 0 || int(n) != len(rest)-4 {
		return none, fmt.Errorf("%w: SASLInitialResponse data length", auth.ErrMalformed)
	}
	serverFirst, err := e.First(rest[4:])
	if err != nil {
		return none, err
	}
	ss.writeAuthRequest(authSASLContinue, serverFirst)
	if err := ss.askClient(); err != nil {
		return none, err
	}
	body, err = ss.readPasswordMessage()
	if err != nil {
		return none, err
	}
	serverFinal, key, err := e.Final(body)
	if err != nil {
		return none, err
	}
	ss.writeAuthRequest(authSASLFinal, serverFinal)
	return key, nil
}

// askClient sends what cw holds, ending with a question the client can answer only once it has read it (its
// answer is made from the question's contents: a salt, a nonce), from inside the read that waits for the answer
// (rawSocket.holdWrites): a read begun after the bytes went out would find nothing first, one empty read per
// question (SCRAM's proof takes the client a key derivation, milliseconds). That read must come before any
// other write of the client's socket (a write would send the held bytes first, rawSocket.Write), and parks
// without looking: safe because whatever the client sent before it read the question it sent too early, and is
// read with its answer, or by the startup deadline's end. With bytes already buffered, or another transport
// (session mode, TLS), it flushes as before.
func (ss *session) askClient() error {
	h, ok := ss.clientIO.(writeHolder)
	if !ok || ss.cr.r.Buffered() > 0 || ss.clientTLS {
		return ss.cw.Flush()
	}
	h.holdWrites(true)
	err := ss.cw.Flush()
	h.holdWrites(false)
	return err
}

// writeAuthRequest writes an Authentication message with code and data to the client (flushed by the next read).
func (ss *session) writeAuthRequest(code uint32, data []byte) {
	ss.cw.Write(appendMessage(nil, msgAuthentication, binary.BigEndian.AppendUint32(nil, code), data))
}

// md5Exchange runs md5 password authentication with the client; mock fails it whatever the client answers,
// after the same work (an unknown user).
func (ss *session) md5Exchange(sec auth.Secret, mock bool) error {
	var salt [4]byte
	rand.Read(salt[:])
	ss.writeAuthRequest(authMD5, salt[:])
	if err := ss.askClient(); err != nil {
		return err
	}
	body, err := ss.readPasswordMessage()
	if err != nil {
		return err
	}
	answer, _, ok := cutNul(body)
	if !ok {
		return fmt.Errorf("%w: password message", auth.ErrMalformed)
	}
	if !auth.VerifyMD5(sec, salt, answer) || mock {
		return auth.ErrFailed
	}
	return nil
}

// upstreamRefused is the ErrorResponse the server ended a login with.
type upstreamRefused struct{ body []byte }

func (e *upstreamRefused) Error() string {
	return fmt.Sprintf("upstream refused the login: %s: %s", errorField(e.body, fieldCode), errorField(e.body, fieldMessage))
}

// answerUpstream answers the server's authentication requests on a connection that was sent the client's
// StartupMessage, up to and including AuthenticationOk. NegotiateProtocolVersion goes to other (the client).
func (l *clientLogin) answerUpstream(r *msgReader, w *bufio.Writer, other func(typ byte, body []byte)) error {
	var scram *auth.ClientExchange
	send := func(parts ...[]byte) error {
		if _, err := w.Write(appendMessage(nil, msgPassword, parts...)); err != nil {
			return err
		}
		return w.Flush()
	}
	for {
		typ, _, err := r.next()
		if err != nil {
			return fmt.Errorf("read the upstream's authentication request: %w", err)
		}
		body, err := r.body()
		if err != nil {
			return fmt.Errorf("read the upstream's authentication request: %w", err)
		}
		switch typ {
		case msgErrorResponse:
			return &upstreamRefused{body: bytes.Clone(body)}
		case msgNegotiateProtocolVersion:
			other(typ, body)
			continue
		case msgAuthentication:
		default:
			return fmt.Errorf("%w: upstream sent %q during authentication", errProtocol, typ)
		}
		if len(body) < 4 {
			return fmt.Errorf("%w: short authentication request from upstream", errProtocol)
		}
		code, data := binary.BigEndian.Uint32(body), body[4:]
		switch code {
		case authOK:
			return nil
		case authCleartext:
			if l.password == "" {
				return fmt.Errorf("upstream asks user %q for a password and auth.upstream_password(s) gives none", l.user)
			}
			err = send([]byte(l.password), []byte{0})
		case authMD5:
			if len(data) != 4 {
				return fmt.Errorf("%w: md5 request of %d bytes", errProtocol, len(data))
			}
			var secret string
			switch {
			case l.password != "":
				secret = auth.MD5Secret(l.user, l.password)
			case l.secret.Kind == auth.KindMD5:
				secret = l.secret.MD5
			default:
				return fmt.Errorf("upstream asks user %q for md5 and the proxy has neither its md5 secret nor auth.upstream_password(s)", l.user)
			}
			err = send([]byte(auth.MD5Response(secret, [4]byte(data))), []byte{0})
		case authSASL:
			if !slices.ContainsFunc(bytes.Split(data, []byte{0}), func(m []byte) bool { return string(m) == auth.Mechanism }) {
				return fmt.Errorf("upstream offers no %s", auth.Mechanism)
			}
			switch {
			case l.hasKey:
				scram = auth.NewKeyClient(l.clientKey, l.secret)
			case l.password != "":
				scram = auth.NewPasswordClient(l.password)
			default:
				return fmt.Errorf("upstream asks user %q for SCRAM and the proxy has neither the client's key nor auth.upstream_password(s)", l.user)
			}
			first := scram.First()
			err = send([]byte(auth.Mechanism), []byte{0}, binary.BigEndian.AppendUint32(nil, uint32(len(first))), first)
		case authSASLContinue:
			if scram == nil {
				return fmt.Errorf("%w: SASLContinue before SASL", errProtocol)
			}
			final, ferr := scram.Final(data)
			if errors.Is(ferr, auth.ErrOtherSecret) && l.password != "" {
				// The upstream's secret is salted differently from the proxy's: the key cannot answer, the
				// configured password can.
				scram = scram.WithPassword(l.password)
				final, ferr = scram.Final(data)
			}
			if errors.Is(ferr, auth.ErrOtherSecret) {
				return fmt.Errorf("user %q: %w; give the proxy the upstream's secret (SELECT rolpassword FROM pg_authid) or auth.upstream_password(s)", l.user, ferr)
			}
			if ferr != nil {
				return fmt.Errorf("user %q: %w", l.user, ferr)
			}
			err = send(final)
		case authSASLFinal:
			if scram == nil {
				return fmt.Errorf("%w: SASLFinal before SASL", errProtocol)
			}
			if err := scram.Verify(data); err != nil {
				return err
			}
		default:
			return fmt.Errorf("upstream asks for authentication method %d, which the proxy cannot answer", code)
		}
		if err != nil {
			return fmt.Errorf("answer the upstream's authentication request: %w", err)
		}
	}
}

// loginUpstream opens the session's upstream connection with the client's StartupMessage and logs in as the
// client (answerUpstream). When the server refuses the password (28P01) the proxy refreshes its secrets once
// (auth.file read again; auth.query runs at every login anyway) and tries again if the client's credential is
// still the one the fresh secret says; otherwise the client gets the server's error. On success the client is
// sent AuthenticationOk, and the session goes on like one whose authentication was relayed.
func (ss *session) loginUpstream(login *clientLogin, startup []byte) bool {
	s := ss.srv
	for attempt := 0; ; attempt++ {
		if !ss.openUpstream(startup) {
			return false
		}
		err := login.answerUpstream(&ss.sr, ss.sw, func(typ byte, body []byte) {
			ss.state.authAsked = true // a kept connection could not show it to the next client (core.go)
			writeMsg(ss.cw, typ, body, "")
		})
		if err == nil {
			writeMsg(ss.cw, msgAuthentication, []byte{0, 0, 0, authOK}, "")
			return true
		}
		ss.upstream.Close()
		var refused *upstreamRefused
		if errors.As(err, &refused) && errorField(refused.body, fieldCode) == sqlstateInvalidPassword && attempt == 0 && s.refreshLogin(login, ss.logger()) {
			ss.logger().Info("upstream refused the login; secret refreshed, trying again", "err", err)
			continue
		}
		s.metrics.authFailure("upstream")
		if refused != nil {
			ss.logger().Warn("upstream refused the login", "err", err)
			ss.cw.Write(appendMessage(nil, msgErrorResponse, refused.body))
			ss.cw.Flush()
			return false
		}
		ss.logger().Warn("could not log in upstream", "err", err)
		ss.fatal(sqlstateConnectionFailure, "fenceproxy could not log in to the upstream server", err.Error())
		return false
	}
}

// refreshLogin refreshes the secrets after the upstream refused login's credential (auth.file read again, and
// the user looked up again: auth.query runs again), and reports whether trying again is worth it: the client's
// secret is still current (so its key is), or a configured password is used. Session mode (loginUpstream) and
// the pools' server connections (pool.go: txPool.dial) both refresh here.
func (s *Server) refreshLogin(login *clientLogin, log *slog.Logger) bool {
	a := s.auth
	if err := a.reload(); err != nil {
		log.Warn("auth.file not read again", "err", err)
	}
	if !login.hasKey && login.secret.Kind != auth.KindMD5 {
		return login.password != ""
	}
	fresh, found, err := a.lookup(s.cfg.Limits.StartupTimeout, login.user)
	return err == nil && found && fresh.String() == login.secret.String()
}

// openUpstream dials the upstream and sends it the client's StartupMessage exactly as the client sent it: every
// parameter, options included, and the protocol version, so that NegotiateProtocolVersion comes from PostgreSQL
// itself. It tells the client when it fails.
func (ss *session) openUpstream(startup []byte) bool {
	s := ss.srv
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(s.cfg.Limits.StartupTimeout))
	up, err := s.dialHost(ctx, ss.host.addr) // the host startup picked (upstream.address, or the router's)
	cancel()
	if err != nil {
		s.metrics.upstreamError()
		ss.logger().Warn("upstream connection failed", "err", err)
		ss.fatal(sqlstateConnectionFailure, "fenceproxy could not connect to the upstream server", err.Error())
		return false
	}
	ss.attachUpstream(up)
	ss.born = time.Now()
	up.SetDeadline(time.Now().Add(s.cfg.Limits.StartupTimeout))
	ss.out = binary.BigEndian.AppendUint32(ss.out[:0], uint32(len(startup)+4))
	ss.out = append(ss.out, startup...)
	if _, err := ss.sw.Write(ss.out); err != nil || ss.sw.Flush() != nil {
		s.metrics.upstreamError()
		ss.fatal(sqlstateConnectionFailure, "fenceproxy lost the upstream server during startup", "")
		up.Close()
		return false
	}
	return true
}
