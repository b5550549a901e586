package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
)

// pgbenchRound is what a select-only pgbench transaction looks like on the wire, server side: the messages the
// hot path forwards without reading.
func serverRound() []byte {
	var b []byte
	b = appendMessage(b, '1', nil)
	b = appendMessage(b, '2', nil)
	b = appendMessage(b, 'T', bytes.Repeat([]byte{1}, 30))
	b = appendMessage(b, 'D', bytes.Repeat([]byte{2}, 12))
	b = appendMessage(b, 'C', []byte("SELECT 1\x00"))
	return b
}

func TestForwardDoesNotAllocate(t *testing.T) {
	round := serverRound()
	src := bytes.NewReader(round)
	m := msgReader{r: bufio.NewReaderSize(src, readBufferSize)}
	w := bufio.NewWriterSize(io.Discard, writeBufferSize)
	allocs := testing.AllocsPerRun(1000, func() {
		src.Reset(round)
		m.r.Reset(src)
		for {
			if _, _, err := m.next(); err != nil {
				break
			}
			if err := m.forward(w); err != nil {
				t.Fatal(err)
			}
			if !m.nextBuffered() {
				w.Flush()
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("forwarding allocated %.1f times per round; the hot path must not allocate", allocs)
	}
}

func TestForwardLargeMessageStreams(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 100_000) // 1 MB, far over the buffer size
	msg := appendMessage(nil, 'D', body)
	m := msgReader{r: bufio.NewReaderSize(bytes.NewReader(msg), readBufferSize)}
	var out bytes.Buffer
	w := bufio.NewWriterSize(&out, writeBufferSize)
	if _, n, err := m.next(); err != nil || n != len(body) {
		t.Fatalf("next: %d %v", n, err)
	}
	if err := m.forward(w); err != nil {
		t.Fatal(err)
	}
	w.Flush()
	if !bytes.Equal(out.Bytes(), msg) {
		t.Fatal("large message corrupted in forwarding")
	}
}

func TestMessageLimits(t *testing.T) {
	for name, in := range map[string][]byte{
		"length below 4": {'Q', 0, 0, 0, 3},
		"negative":       {'Q', 0x80, 0, 0, 0},
		"over the limit": {'Q', 0, 1, 0, 5},
	} {
		m := msgReader{r: bufio.NewReader(bytes.NewReader(in)), max: 65536}
		if _, _, err := m.next(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	m := msgReader{r: bufio.NewReader(bytes.NewReader([]byte{'Q', 0, 0, 0, 10, 'a'}))}
	m.next()
	if _, err := m.body(); err == nil {
		t.Error("truncated body accepted")
	}
}

func TestOptionSetting(t *testing.T) {
	for _, tc := range []struct {
		options, want string
		found         bool
	}{
		{"-c fence.token=42", "42", true},
		{"-cfence.token=7 -c statement_timeout=5s", "7", true},
		{"--fence.token=9", "9", true},
		{"-c FENCE.TOKEN=3", "3", true},
		{`-c fence.token=4\ 2`, "4 2", true},
		{"-c fence.token=1 -c fence.token=2", "2", true},
		{"-c statement_timeout=5s", "", false},
		{"", "", false},
		// getopt's forms (TestOptionSettingAsPostgresReadsIt checks them against the server)
		{"-c fence.token=5 -ec fence.token=7", "7", true},
		{"-c fence.token=5 -e-fence.token=7", "7", true},
		{"-B 128 -c fence.token=3", "3", true},
		{"-B -c fence.token=1", "", false}, // -B takes "-c"; the rest is not an option
		{"-c fence.token=2 -- -c fence.token=1", "2", true},
	} {
		got, found := optionSetting(tc.options, "fence.token")
		if got != tc.want || found != tc.found {
			t.Errorf("optionSetting(%q) = %q, %v; want %q, %v", tc.options, got, found, tc.want, tc.found)
		}
	}
}

// The pool key drops the token and lock settings from options, whatever their form, and keeps the rest: a flag
// grouped before a dropped -c stays.
func TestWithoutOptionSettings(t *testing.T) {
	for _, tc := range []struct{ options, want string }{
		{"-c fence.token=5 -c statement_timeout=5s", "-c statement_timeout=5s"},
		{"-ec fence.token=7 -c statement_timeout=5s", "-e -c statement_timeout=5s"},
		{"-e-fence.lock=L -cfence.token=1", "-e"},
		{`-c search_path=a\ b --fence.token=3`, `-c search_path=a\ b`},
	} {
		if got := withoutOptionSettings(tc.options, "fence.token", "fence.lock"); got != tc.want {
			t.Errorf("withoutOptionSettings(%q) = %q, want %q", tc.options, got, tc.want)
		}
	}
}

func BenchmarkForwardRound(b *testing.B) {
	round := serverRound()
	src := bytes.NewReader(round)
	m := msgReader{r: bufio.NewReaderSize(src, readBufferSize)}
	w := bufio.NewWriterSize(io.Discard, writeBufferSize)
	b.ReportAllocs()
	b.SetBytes(int64(len(round)))
	for b.Loop() {
		src.Reset(round)
		m.r.Reset(src)
		for {
			if _, _, err := m.next(); err != nil {
				break
			}
			m.forward(w)
			if !m.nextBuffered() {
				w.Flush()
			}
		}
	}
}

// A message read (body) is never taken for one not read: its empty body is not nil, also after release dropped
// the buffer of a body over keepBodyBuffer, and forward refuses it. The pooled relay, given a nil body for the
// ParseComplete after a notice of a long statement's text, forwarded the next message's header as its own and
// lost the framing of the server's stream.
func TestReadMessageNeverForwarded(t *testing.T) {
	var in []byte
	in = appendMessage(in, 'N', bytes.Repeat([]byte("x"), keepBodyBuffer+1))
	in = appendMessage(in, '1', nil)
	in = appendMessage(in, 'Z', []byte("I"))
	m := msgReader{r: bufio.NewReaderSize(bytes.NewReader(in), readBufferSize)}
	w := bufio.NewWriter(io.Discard)
	for _, want := range []byte{'N', '1', 'Z'} {
		typ, _, err := m.next()
		if err != nil || typ != want {
			t.Fatalf("next: %q %v, want %q", typ, err, want)
		}
		body, err := m.body()
		if err != nil || body == nil {
			t.Fatalf("body of %q: %v, nil %v", typ, err, body == nil)
		}
		m.release()
		if err := m.forward(w); !errors.Is(err, errReadTwice) {
			t.Fatalf("forward of %q after its body was read: %v", typ, err)
		}
	}
}

// A message is consumed once, whichever way: after forward or body, neither a second forward nor a body reads
// on, and the next message is whole for next. A second body discarded the next message's header and read its
// bytes as this one's body; a second forward copied the next message under this one's length: either lost the
// framing of the stream where the relays' bookkeeping went wrong (errReadTwice guarded only forward after body).
func TestMessageConsumedOnce(t *testing.T) {
	var in []byte
	in = appendMessage(in, 'D', []byte("abc"))
	in = appendMessage(in, '1', nil)
	in = appendMessage(in, 'D', []byte("xyz"))
	in = appendMessage(in, 'Z', []byte("I"))
	m := msgReader{r: bufio.NewReaderSize(bytes.NewReader(in), readBufferSize)}
	var out bytes.Buffer
	w := bufio.NewWriter(&out)
	for i, consume := range []string{"forward", "body", "body", "forward"} {
		if _, _, err := m.next(); err != nil {
			t.Fatalf("next %d: %v", i, err)
		}
		if consume == "forward" {
			if err := m.forward(w); err != nil {
				t.Fatalf("forward %d: %v", i, err)
			}
		} else if _, err := m.body(); err != nil {
			t.Fatalf("body %d: %v", i, err)
		}
		if err := m.forward(w); !errors.Is(err, errReadTwice) {
			t.Fatalf("message %d (%s): forward again: %v", i, consume, err)
		}
		if _, err := m.body(); !errors.Is(err, errReadTwice) {
			t.Fatalf("message %d (%s): body again: %v", i, consume, err)
		}
	}
	w.Flush()
	want := append(appendMessage(nil, 'D', []byte("abc")), appendMessage(nil, 'Z', []byte("I"))...)
	if !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("forwarded %q, want %q", out.Bytes(), want)
	}
}
