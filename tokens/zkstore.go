package tokens

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
)

// ZKStore keeps locks in ZooKeeper with the standard lock recipe: each acquirer creates an ephemeral sequential
// node under the lock's path (root/name), the one with the lowest sequence number holds the lock, and each
// waiter watches its predecessor, so a release wakes exactly one waiter. Node names follow Curator's protected
// mode ("_c_<id>-lock-<sequence>") and are ordered as Curator orders them (by the part after "lock-"), so a
// fenceproxy lock and Curator's InterProcessMutex on the same path exclude each other.
//
// The token is the czxid of the holder's node: the ZooKeeper transaction that created it. ZooKeeper's
// transaction ids are one total order over the whole ensemble, so tokens grow from holder to holder (a waiter's
// node is created after every earlier holder's) and are comparable across locks.
//
// The lease is the ZooKeeper session (one per ZKStore): Lost is closed as soon as the client is disconnected
// (the session may still be alive on the server, but it can no longer be confirmed), when the session
// expires, or when the holder's node is deleted by someone else. A disconnected store gives its session up for
// good (the server expires it and its nodes after the session timeout); open a new store to lock again.
type ZKStore struct {
	conn *zk.Conn
	root string

	mu      sync.Mutex
	lost    context.Context // done when the session can no longer be relied on
	markAs  context.CancelCauseFunc
	session time.Duration
}

// DefaultZKRoot is the parent path of every lock unless ZKOptions.Root says otherwise.
const DefaultZKRoot = "/fenceproxy/locks"

// ZKOptions configure a ZKStore.
type ZKOptions struct {
	// Root is the parent path of the locks' paths; default DefaultZKRoot. A Curator InterProcessMutex on
	// Root+"/"+name is the same lock.
	Root string
	// SessionTimeout is the ZooKeeper session timeout, the lease's length; default DefaultTTL. The server
	// bounds it (by default to 2..20 ticks of 2 s).
	SessionTimeout time.Duration
	// ConnectTimeout bounds establishing the session; default 10s.
	ConnectTimeout time.Duration
	// Observe makes a store that only reads (List, for the metrics): it holds no lock, so a disconnect does not
	// end it; the client reconnects. Acquire on such a store is refused.
	Observe bool
}

// NewZKStore opens a ZooKeeper session to servers (host:port each) and waits until it is established.
func NewZKStore(ctx context.Context, servers []string, o ZKOptions) (*ZKStore, error) {
	if o.Root == "" {
		o.Root = DefaultZKRoot
	}
	if o.SessionTimeout <= 0 {
		o.SessionTimeout = DefaultTTL
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	conn, events, err := zk.Connect(servers, o.SessionTimeout, zk.WithLogger(log.New(io.Discard, "", 0)))
	if err != nil {
		return nil, fmt.Errorf("zookeeper %v: %w", servers, err)
	}
	ctx, cancel := context.WithTimeout(ctx, o.ConnectTimeout)
	defer cancel()
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				lost, markAs := context.WithCancelCause(context.Background())
				s := &ZKStore{conn: conn, root: path.Clean(o.Root), lost: lost, markAs: markAs, session: o.SessionTimeout}
				if o.Observe {
					markAs(errors.New("this ZooKeeper store only observes locks (ZKOptions.Observe)"))
					go func() {
						for range events {
						}
					}()
					return s, nil
				}
				go s.watchSession(events)
				return s, nil
			}
			if ev.State == zk.StateAuthFailed {
				conn.Close()
				return nil, fmt.Errorf("zookeeper %v: authentication failed", servers)
			}
		case <-ctx.Done():
			conn.Close()
			return nil, fmt.Errorf("zookeeper %v: no session within %v: %w", servers, o.ConnectTimeout, context.Cause(ctx))
		}
	}
}

// watchSession marks the session lost at the first sign that it can no longer be relied on, and then gives the
// session up: the client stops reconnecting, so the server expires the session after its timeout and deletes
// its nodes. A session that reconnected later would keep holding locks its holder has already been told it lost,
// and nobody else could take them.
func (s *ZKStore) watchSession(events <-chan zk.Event) {
	for ev := range events {
		if ev.Type != zk.EventSession {
			continue
		}
		switch ev.State {
		case zk.StateDisconnected:
			s.markAs(fmt.Errorf("%w: disconnected from ZooKeeper %s: the session cannot be confirmed", ErrLeaseLost, ev.Server))
			go s.conn.Close()
		case zk.StateExpired:
			s.markAs(fmt.Errorf("%w: ZooKeeper session expired", ErrLeaseLost))
			go s.conn.Close()
		}
	}
	s.markAs(fmt.Errorf("%w: ZooKeeper client closed", ErrLeaseLost))
}

// Kind is "zookeeper".
func (s *ZKStore) Kind() string { return "zookeeper" }

// Close ends the session: ZooKeeper deletes its ephemeral nodes, which releases every lock it held.
func (s *ZKStore) Close() error {
	s.conn.Close()
	return nil
}

// lockSuffix ends every contender's node name before its sequence number (Curator's LOCK_NAME).
const lockSuffix = "lock-"

// sequence is the part of a contender's node name Curator sorts by.
func sequence(node string) string {
	if i := strings.LastIndex(node, lockSuffix); i >= 0 {
		return node[i+len(lockSuffix):]
	}
	return node
}

// contenders lists the lock's nodes in lock order.
func (s *ZKStore) contenders(dir string) ([]string, error) {
	children, _, err := s.conn.Children(dir)
	if err != nil {
		return nil, err
	}
	sort.Slice(children, func(i, j int) bool { return sequence(children[i]) < sequence(children[j]) })
	return children, nil
}

// Acquire creates this acquisition's node and waits until it is the lowest. The session's timeout is the
// lease; o.TTL is ignored (set ZKOptions.SessionTimeout).
func (s *ZKStore) Acquire(ctx context.Context, name string, o AcquireOptions) (Held, error) {
	if name == "" || strings.Contains(name, "/") {
		return nil, fmt.Errorf("lock name %q: must be non-empty and without '/'", name)
	}
	if o.TokenOffset < 0 {
		return nil, fmt.Errorf("token offset %d is negative", o.TokenOffset)
	}
	if err := s.lost.Err(); err != nil {
		return nil, context.Cause(s.lost)
	}
	dir := s.root + "/" + name
	if err := s.ensurePath(dir); err != nil {
		return nil, fmt.Errorf("lock %q: %w", dir, err)
	}
	node, err := s.conn.CreateProtectedEphemeralSequential(dir+"/"+lockSuffix, nil, zk.WorldACL(zk.PermAll))
	if err != nil {
		return nil, fmt.Errorf("lock %q: create node: %w", dir, err)
	}
	mine := path.Base(node)
	giveUp := func(err error) (Held, error) {
		s.conn.Delete(node, -1)
		return nil, fmt.Errorf("lock %q: %w", dir, err)
	}
	for {
		all, err := s.contenders(dir)
		if err != nil {
			return giveUp(err)
		}
		i := slicesIndex(all, mine)
		if i < 0 {
			return giveUp(fmt.Errorf("%w: our node %s vanished (session expired?)", ErrLeaseLost, node))
		}
		if i == 0 {
			_, st, err := s.conn.Exists(node)
			if err != nil || st == nil {
				return giveUp(fmt.Errorf("read our node's czxid: %v", err))
			}
			if st.Czxid > math.MaxInt64-o.TokenOffset {
				return giveUp(fmt.Errorf("czxid %d plus offset %d overflows a token", st.Czxid, o.TokenOffset))
			}
			token := st.Czxid + o.TokenOffset
			if err := s.recordGrant(name, node, token); err != nil {
				// Fail closed: a token the barrier cannot know of is not handed out.
				return giveUp(err)
			}
			return s.held(name, node, token)
		}
		if o.Try {
			return giveUp(ErrLocked)
		}
		exists, _, ch, err := s.conn.ExistsW(dir + "/" + all[i-1])
		if err != nil {
			return giveUp(err)
		}
		if !exists {
			continue
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return giveUp(context.Cause(ctx))
		case <-s.lost.Done():
			return giveUp(context.Cause(s.lost))
		}
	}
}

// grantsPath is the parent of the nodes that record each lock's newest grant (root+".granted"): beside the
// locks' paths, not under them, where a child would count as a contender (and confuse Curator).
func (s *ZKStore) grantsPath() string { return s.root + ".granted" }

// recordGrant records token as the newest grant of the lock name (the persistent node grantsPath()/name,
// holding the token in decimal) before the token is handed out, for the failover barrier (docs/ha.md). Each
// write is one multi: the holder's node still exists (so a holder whose session ended records nothing) and the
// record is still the version read (so a concurrent writer's record is re-read, never overwritten blindly); a
// record already at or above token is left alone: the record only ever grows.
func (s *ZKStore) recordGrant(name, holderNode string, token int64) error {
	rec := s.grantsPath() + "/" + name
	val := []byte(strconv.FormatInt(token, 10))
	holding := &zk.CheckVersionRequest{Path: holderNode, Version: -1}
	for {
		data, st, err := s.conn.Get(rec)
		var write any
		switch {
		case errors.Is(err, zk.ErrNoNode):
			write = &zk.CreateRequest{Path: rec, Data: val, Acl: zk.WorldACL(zk.PermAll)}
		case err != nil:
			return fmt.Errorf("record grant %d: read %s: %w", token, rec, err)
		default:
			if cur, err := strconv.ParseInt(string(data), 10, 64); err == nil && cur >= token {
				return nil
			}
			write = &zk.SetDataRequest{Path: rec, Data: val, Version: st.Version}
		}
		res, err := s.conn.Multi(holding, write)
		if err == nil {
			return nil
		}
		if len(res) == 2 && errors.Is(res[0].Error, zk.ErrNoNode) {
			return fmt.Errorf("record grant %d: %w: node %s is gone", token, ErrLeaseLost, holderNode)
		}
		if len(res) == 2 && errors.Is(res[1].Error, zk.ErrNoNode) {
			// The first grant under this root: create the records' parent, then write again.
			if err := s.ensurePath(s.grantsPath()); err != nil {
				return fmt.Errorf("record grant %d: %w", token, err)
			}
			continue
		}
		if errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNodeExists) ||
			len(res) == 2 && (errors.Is(res[1].Error, zk.ErrBadVersion) || errors.Is(res[1].Error, zk.ErrNodeExists)) {
			continue // another holder recorded meanwhile: compare with its record
		}
		return fmt.Errorf("record grant %d in %s: %w", token, rec, err)
	}
}

// Granted reports, per lock, the newest token granted for it as recorded at acquisition (under grantsPath),
// and the czxid of the lock's current holder where that is higher (a Curator holder records nothing). A record
// that is not a positive token is an error: the barrier cannot tell what it should raise the lock's mark to.
func (s *ZKStore) Granted(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	names, _, err := s.conn.Children(s.grantsPath())
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return nil, fmt.Errorf("zookeeper lock store: read grants under %s: %w", s.grantsPath(), err)
	}
	for _, name := range names {
		rec := s.grantsPath() + "/" + name
		data, _, err := s.conn.Get(rec)
		if errors.Is(err, zk.ErrNoNode) {
			continue // deleted meanwhile (by an operator: fenceproxy never deletes a record)
		}
		if err != nil {
			return nil, fmt.Errorf("zookeeper lock store: read grant %s: %w", rec, err)
		}
		tok, err := strconv.ParseInt(string(data), 10, 64)
		if err != nil || tok <= 0 {
			return nil, fmt.Errorf("zookeeper lock store: grant %s is %q, not a token", rec, data)
		}
		out[name] = tok
	}
	held, err := s.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("zookeeper lock store: list holders: %w", err)
	}
	for _, li := range held {
		out[li.Name] = max(out[li.Name], li.Token)
	}
	return out, nil
}

func slicesIndex(list []string, v string) int {
	for i, x := range list {
		if x == v {
			return i
		}
	}
	return -1
}

// ensurePath creates dir and its parents as persistent nodes.
func (s *ZKStore) ensurePath(dir string) error {
	p := ""
	for _, part := range strings.Split(strings.Trim(dir, "/"), "/") {
		p += "/" + part
		_, err := s.conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll))
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

func (s *ZKStore) held(name, node string, token int64) (Held, error) {
	lost, markAs := context.WithCancelCause(context.Background())
	h := &zkHeld{s: s, name: name, node: node, token: token, lost: lost, markAs: markAs}
	stopSession := context.AfterFunc(s.lost, func() { markAs(context.Cause(s.lost)) })
	go func() {
		defer stopSession()
		// Someone deleting our node (an operator, Curator's revocation) ends the lock too.
		for lost.Err() == nil {
			exists, _, ch, err := s.conn.ExistsW(node)
			if err != nil {
				markAs(fmt.Errorf("%w: watch %s: %v", ErrLeaseLost, node, err))
				return
			}
			if !exists {
				markAs(fmt.Errorf("%w: node %s was deleted", ErrLeaseLost, node))
				return
			}
			select {
			case <-ch:
			case <-lost.Done():
				return
			}
		}
	}()
	return h, nil
}

type zkHeld struct {
	s      *ZKStore
	name   string
	node   string
	token  int64
	lost   context.Context
	markAs context.CancelCauseFunc

	releaseOnce sync.Once
	releaseErr  error
}

func (h *zkHeld) Name() string          { return h.name }
func (h *zkHeld) Token() int64          { return h.token }
func (h *zkHeld) Lost() <-chan struct{} { return h.lost.Done() }

func (h *zkHeld) Err() error {
	if h.lost.Err() == nil {
		return nil
	}
	return context.Cause(h.lost)
}

// Release deletes this holder's node (only its own: the path includes its sequence number).
func (h *zkHeld) Release(ctx context.Context) error {
	h.releaseOnce.Do(func() {
		h.markAs(ErrReleased)
		err := h.s.conn.Delete(h.node, -1)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			h.releaseErr = fmt.Errorf("lock %q: %w (node %s was already gone)", h.name, ErrNotOwner, h.node)
		case err != nil:
			h.releaseErr = fmt.Errorf("lock %q: release: %w (the node goes when the session ends)", h.name, err)
		}
	})
	return h.releaseErr
}

// List describes every lock under the root: the holder's node, its token (czxid) and the number of waiters.
// The lease left is the session's business and not visible per lock (-1).
func (s *ZKStore) List(ctx context.Context) ([]LockInfo, error) {
	names, _, err := s.conn.Children(s.root)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []LockInfo
	for _, name := range names {
		all, err := s.contenders(s.root + "/" + name)
		if err != nil {
			return nil, err
		}
		if len(all) == 0 {
			continue
		}
		_, st, err := s.conn.Exists(s.root + "/" + name + "/" + all[0])
		if err != nil || st == nil {
			continue // released meanwhile
		}
		out = append(out, LockInfo{Name: name, Holder: all[0] + " (session " + strconv.FormatInt(st.EphemeralOwner, 16) + ")",
			Token: st.Czxid, LeaseLeft: -1, Waiters: len(all) - 1})
	}
	return out, nil
}
