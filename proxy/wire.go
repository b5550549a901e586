package proxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Buffer sizes for the per-direction readers and writers. PostgreSQL itself sends in 8 KiB chunks; larger
// buffers do not make small OLTP round trips faster and cost memory on every idle session.
const (
	readBufferSize  = 8192
	writeBufferSize = 8192
	// deferAcceptSeconds bounds how long the kernel holds a connection that sent nothing before Accept gets it
	// (deferAccept): about one SYN-ACK retransmission.
	deferAcceptSeconds = 1
	// clientKeepAliveSeconds and clientKeepAliveProbes are the TCP keepalive of client connections (Listen):
	// Go's own default, probes after 15 s idle, every 15 s, 9 of them.
	clientKeepAliveSeconds = 15
	clientKeepAliveProbes  = 9
	// maxStartupPacket matches PostgreSQL's own MAX_STARTUP_PACKET_LENGTH.
	maxStartupPacket = 10000
	// keepBodyBuffer is the largest body buffer a session keeps between messages; a bigger one (a huge query)
	// is dropped after use so that one large statement does not pin memory for the session's lifetime.
	keepBodyBuffer = 64 << 10
)

// connBuffers keeps client connections' read and write buffers from one session for the next: a client that
// connects per transaction would otherwise cost an allocation of both (and their collection) every time. Only a
// session that knows nothing uses its buffers any more gives them back (startPooled); the others leave theirs to
// the collector.
type connBuffers struct{ readers, writers sync.Pool }

// reader is a read buffer of readBufferSize over r.
func (b *connBuffers) reader(r io.Reader) *bufio.Reader {
	if br, ok := b.readers.Get().(*bufio.Reader); ok {
		br.Reset(r)
		return br
	}
	return bufio.NewReaderSize(r, readBufferSize)
}

// writer is a write buffer of writeBufferSize over w.
func (b *connBuffers) writer(w io.Writer) *bufio.Writer {
	if bw, ok := b.writers.Get().(*bufio.Writer); ok {
		bw.Reset(w)
		return bw
	}
	return bufio.NewWriterSize(w, writeBufferSize)
}

// put keeps r and w (from reader and writer) for another session, holding no connection of this one's.
func (b *connBuffers) put(r *bufio.Reader, w *bufio.Writer) {
	if r != nil && r.Size() == readBufferSize {
		r.Reset(nil)
		b.readers.Put(r)
	}
	if w != nil && w.Size() == writeBufferSize {
		w.Reset(nil)
		b.writers.Put(w)
	}
}

// errProtocol marks a client that broke the protocol; the session answers with 08P01 and closes.
var errProtocol = errors.New("protocol violation")

// errReadTwice: a message already consumed (msgReader.body or forward) was to be read or forwarded again; a bug
// of the proxy's, which ends the connection rather than lose the stream's framing.
var errReadTwice = errors.New("message read twice")

// headerLen is the size of a message header: the type byte and the 4-byte big-endian length that counts itself.
const headerLen = 5

// parseHeader reads a message header from the front of b (at least headerLen bytes) and returns the type and the
// body length. It is the one place that applies the framing rules to both transports and both directions: a
// length word under 4 is malformed, and a body longer than max (limits.max_message_size; 0 = unlimited) is
// refused before any of it is read or buffered.
func parseHeader(b []byte, max int) (typ byte, n int, err error) {
	length := int(int32(binary.BigEndian.Uint32(b[1:headerLen])))
	if length < 4 {
		return 0, 0, fmt.Errorf("%w: message %q with length %d", errProtocol, b[0], length)
	}
	if max > 0 && length-4 > max {
		return 0, 0, fmt.Errorf("%w: message %q of %d bytes exceeds the limit of %d", errProtocol, b[0], length, max)
	}
	return b[0], length - 4, nil
}

// msgReader frames PostgreSQL messages on top of a bufio.Reader for the goroutine transport. It never copies
// a message it is only asked to forward: forward streams the body from the reader's buffer to the writer.
// Headers are read with Peek so that a read interrupted at a message boundary (see interrupt) loses nothing
// and can be retried.
//
// Buffer ownership: the bytes of header and body belong to the reader; a body returned by body() is valid
// until the next call of body() or release(). Writers (bufio.Writer) copy what they are given.
type msgReader struct {
	r    *bufio.Reader
	intr *interrupt // the interrupt of the connection under r, or nil: a read it interrupts may resume
	max  int        // largest accepted body length, 0 = unlimited
	typ  byte
	n    int    // body length of the current message
	buf  []byte // reusable body buffer for messages the proxy reads
	// taken: the current message's header is consumed (body, forward); body and forward refuse it then, as
	// the bytes at the reader's front are the next message's. Only next starts a message.
	taken bool
	// rest: the bytes of the message being forwarded that are not copied yet; not 0 only when forward failed in
	// the middle of a message, whose first bytes went to the writer (finishForward sends the rest).
	rest int

	// msgs and bytes count what was read since the last report to the metrics, which happens at each flush
	// rather than per message to keep shared counters off the per-message path.
	msgs, bytes uint64
}

// errEndedAtBoundary: the connection is being closed (intrEndLend, closeUnderRelay), and the reader stopped at
// the message boundary it reached.
var errEndedAtBoundary = errors.New("the server connection was closed by the proxy (at a message boundary)")

// next reads the header of the next message. It returns the message type and the body length. Once the
// connection is being closed under its reader (intrEndLend), it starts no message: the one read before is whole.
func (m *msgReader) next() (byte, int, error) {
	if m.intr != nil && m.intr.reason() == intrEndLend {
		return 0, 0, errEndedAtBoundary
	}
	hdr, err := m.r.Peek(headerLen)
	if err != nil {
		if len(hdr) > 0 && errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, 0, err
	}
	typ, n, err := parseHeader(hdr, m.max)
	if err != nil {
		return 0, 0, err
	}
	m.typ, m.n, m.taken = typ, n, false
	m.msgs++
	m.bytes += uint64(n) + headerLen
	return typ, n, nil
}

// discardHeader consumes the header after a successful next; errReadTwice once it was.
func (m *msgReader) discardHeader() error {
	if m.taken {
		return fmt.Errorf("message %q consumed again: %w", m.typ, errReadTwice)
	}
	m.r.Discard(headerLen)
	m.taken = true
	return nil
}

// body reads the whole body of the current message (after next) into the reusable buffer. The returned slice is
// valid until the next call of body.
//
// It is never nil, an empty body included: the relays take a nil body for a message not read, to be streamed
// (forward). An empty one returned nil once release had dropped the buffer (after a body over keepBodyBuffer)
// made the pooled relay forward the next message's header as the current message's, and then read the bytes
// after it as a header: a ParseComplete after a notice of the whole text of a long statement
// (client_min_messages = debug2) left the relay waiting for a body of some gigabyte that never came.
//
// A message consumed already (body, forward) is refused: a second read took the next message's header and
// bytes for this one's body.
func (m *msgReader) body() ([]byte, error) {
	if err := m.discardHeader(); err != nil {
		return nil, err
	}
	if m.buf == nil || cap(m.buf) < m.n {
		m.buf = make([]byte, m.n) // not nil for n = 0 either
	}
	b := m.buf[:m.n]
	for read := 0; read < len(b); {
		k, err := m.r.Read(b[read:])
		read += k
		if err != nil && read < len(b) {
			if m.intr.resume(err) {
				continue
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return b, nil
}

// release drops an oversized body buffer.
func (m *msgReader) release() {
	if cap(m.buf) > keepBodyBuffer {
		m.buf = nil
	}
}

// forward copies the current message, header and body, to w without decoding or allocating. A message whose
// header was consumed (body, forward) is refused: what it would copy is the next message, and the reader would
// lose the framing of the stream.
func (m *msgReader) forward(w *bufio.Writer) error {
	if m.taken {
		return fmt.Errorf("message %q forwarded after it was consumed: %w", m.typ, errReadTwice)
	}
	hdr, err := m.r.Peek(headerLen)
	if err != nil {
		return err
	}
	if _, err := w.Write(hdr); err != nil {
		return err
	}
	m.r.Discard(headerLen)
	m.taken = true
	m.rest = m.n
	return m.copyBody(w)
}

// finishForward copies to w the rest of a message whose forward failed in the middle (an interrupt that stops,
// a deadline): what the writer's peer read of it must be followed by the rest of it, never by another message.
func (m *msgReader) finishForward(w *bufio.Writer) error { return m.copyBody(w) }

// copyBody streams the rest of the message being forwarded (m.rest bytes) from the reader to w through the
// reader's own buffer.
func (m *msgReader) copyBody(w *bufio.Writer) error {
	for m.rest > 0 {
		n := m.rest
		chunk := min(n, m.r.Size())
		if b := m.r.Buffered(); b > 0 && b < chunk {
			chunk = b
		}
		b, err := m.r.Peek(chunk)
		if len(b) > 0 {
			if _, werr := w.Write(b); werr != nil {
				return werr
			}
			m.r.Discard(len(b))
			m.rest -= len(b)
		}
		if err != nil && m.rest > 0 {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			if m.intr.resume(err) {
				continue // an interrupt that waits for the message boundary: nothing was lost
			}
			return err
		}
	}
	return nil
}

// nextBuffered reports whether the next message is already complete in the read buffer, in which case the
// writer need not be flushed yet: pipelined messages are coalesced into one write.
func (m *msgReader) nextBuffered() bool {
	nb := m.r.Buffered()
	if nb < headerLen {
		return false
	}
	hdr, _ := m.r.Peek(headerLen)
	_, n, err := parseHeader(hdr, m.max)
	return err == nil && nb >= headerLen+n
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// appendMessage appends a message with type typ and the given body parts to dst.
func appendMessage(dst []byte, typ byte, parts ...[]byte) []byte {
	n := 4
	for _, p := range parts {
		n += len(p)
	}
	dst = append(dst, typ)
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	for _, p := range parts {
		dst = append(dst, p...)
	}
	return dst
}

// errorResponse encodes a server-style ErrorResponse.
func errorResponse(severity, code, message, detail, hint string) []byte {
	e := pgproto3.ErrorResponse{
		Severity:            severity,
		SeverityUnlocalized: severity,
		Code:                code,
		Message:             message,
		Detail:              detail,
		Hint:                hint,
	}
	b, err := e.Encode(nil)
	if err != nil {
		// Encode fails only for bodies over 1 GiB; our messages are short constants.
		panic(fmt.Sprintf("encode ErrorResponse: %v", err))
	}
	return b
}

// noticeResponse encodes a server-style NoticeResponse of severity NOTICE.
func noticeResponse(code, message, hint string) []byte {
	n := pgproto3.NoticeResponse{Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: code, Message: message, Hint: hint}
	b, err := n.Encode(nil)
	if err != nil {
		// Encode fails only for bodies over 1 GiB; our messages are short constants.
		panic(fmt.Sprintf("encode NoticeResponse: %v", err))
	}
	return b
}

// readStartupPacket reads an untyped startup-phase packet (length, then body). The body is returned without the
// length word.
func readStartupPacket(r *bufio.Reader) ([]byte, error) {
	var lb [4]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return nil, err
	}
	length := int(int32(binary.BigEndian.Uint32(lb[:])))
	if length < 8 || length > maxStartupPacket {
		return nil, fmt.Errorf("%w: startup packet length %d", errProtocol, length)
	}
	body := make([]byte, length-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, fmt.Errorf("read startup packet: %w", err)
	}
	return body, nil
}

// Startup-phase request codes (the first word of the packet body).
const (
	codeCancelRequest = 80877102
	codeSSLRequest    = 80877103
	codeGSSENCRequest = 80877104
)

// parseStartupParams decodes the key/value pairs of a StartupMessage body after the protocol version word.
func parseStartupParams(b []byte) (map[string]string, error) {
	params := map[string]string{}
	for len(b) > 0 {
		if b[0] == 0 {
			if len(b) != 1 {
				return nil, fmt.Errorf("%w: data after the startup parameters' terminator", errProtocol)
			}
			return params, nil
		}
		k, rest, ok := cutNul(b)
		if !ok {
			return nil, fmt.Errorf("%w: unterminated startup parameter name", errProtocol)
		}
		v, rest, ok := cutNul(rest)
		if !ok {
			return nil, fmt.Errorf("%w: unterminated value of startup parameter %q", errProtocol, k)
		}
		params[string(k)] = string(v)
		b = rest
	}
	return nil, fmt.Errorf("%w: startup parameters not terminated", errProtocol)
}

// cutNul splits b at its first NUL byte (the end of a protocol string); ok is false when b has none. Every
// Query's and Parse's text goes through it, so it uses the library's vectorised search rather than a loop
// over the bytes (which ran 518 Go statements per connection of pgbench -C -M extended).
func cutNul(b []byte) (before, after []byte, ok bool) {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i], b[i+1:], true
	}
	return nil, nil, false
}

// withPending is c read after the bytes of pending (read from it before), and written as c.
func withPending(c net.Conn, pending []byte) io.ReadWriter {
	if len(pending) == 0 {
		return c
	}
	return struct {
		io.Reader
		io.Writer
	}{io.MultiReader(bytes.NewReader(pending), c), c}
}
