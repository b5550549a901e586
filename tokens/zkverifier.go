package tokens

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"time"

	"github.com/go-zookeeper/zk"
)

// ZKVerifier refuses fencing tokens larger than any ZooKeeper could have issued: a ZooKeeper lock's token is
// its holder node's czxid, so a token above the ensemble's current zxid (plus the token offset) is forged. It
// learns the current zxid by writing a probe node (a write goes through the leader and gets a zxid above every
// earlier one), only when a token is above the highest bound seen so far. Safe for concurrent use.
type ZKVerifier struct {
	ceilingVerifier
	conn  *zk.Conn
	probe string
}

// DefaultZKProbe is the node ZKVerifier writes to learn the current zxid.
const DefaultZKProbe = "/fenceproxy/zxid"

// NewZKVerifier connects to the ZooKeeper servers (host:port each). It does not wait for a session: an
// unreachable ensemble shows up in Check. cfg.Endpoints is ignored; cfg.ProbeKey is the probe node's path
// (default DefaultZKProbe).
func NewZKVerifier(servers []string, cfg VerifierConfig) (*ZKVerifier, error) {
	if len(servers) == 0 {
		return nil, errors.New("zookeeper verifier: no servers")
	}
	if cfg.TokenOffset < 0 {
		return nil, fmt.Errorf("zookeeper verifier: token offset %d is negative", cfg.TokenOffset)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultVerifyTimeout
	}
	if cfg.ProbeKey == "" {
		cfg.ProbeKey = DefaultZKProbe
	}
	conn, _, err := zk.Connect(servers, 30*time.Second, zk.WithLogger(log.New(io.Discard, "", 0)))
	if err != nil {
		return nil, fmt.Errorf("zookeeper verifier: %w", err)
	}
	v := &ZKVerifier{conn: conn, probe: cfg.ProbeKey}
	v.ceilingVerifier = ceilingVerifier{service: "ZooKeeper", counter: "zxid", current: v.currentZxid,
		offset: cfg.TokenOffset, failOpen: cfg.FailOpen, timeout: cfg.Timeout}
	return v, nil
}

// Check returns nil if ZooKeeper could have issued token (token <= current zxid + offset), else a
// *TokenNotIssuedError; ErrUnavailable when ZooKeeper had to be asked and did not answer (unless FailOpen).
func (v *ZKVerifier) Check(ctx context.Context, token int64) error { return v.check(ctx, token) }

// Close closes the verifier's ZooKeeper connection.
func (v *ZKVerifier) Close() error {
	v.conn.Close()
	return nil
}

func (v *ZKVerifier) currentZxid(ctx context.Context) (int64, error) {
	type answer struct {
		zxid int64
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		st, err := v.conn.Set(v.probe, nil, -1)
		if errors.Is(err, zk.ErrNoNode) {
			s := &ZKStore{conn: v.conn}
			if err = s.ensurePath(v.probe); err == nil {
				st, err = v.conn.Set(v.probe, nil, -1)
			}
		}
		if err != nil {
			done <- answer{err: err}
			return
		}
		done <- answer{zxid: st.Mzxid}
	}()
	select {
	case a := <-done:
		return a.zxid, a.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}
