package proxy

import (
	"fmt"
	"testing"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// TestClassMemo: a remembered class is the text's under the settings it was read with, never another text's
// (the memo keeps a copy: the client reader's buffer is reused) nor another reading's (a backslash ends a
// string or escapes its quote by standard_conforming_strings); texts past the memo's size are read again.
func TestClassMemo(t *testing.T) {
	on := rewrite.Settings{ClientEncoding: "UTF8", ServerEncoding: "UTF8", StandardConformingStrings: true}
	off := on
	off.StandardConformingStrings = false
	var m classMemo
	text := []byte(`SELECT 'it\'; SET role = x; --'`)
	if c := m.classOf(text, on); c.plain() {
		t.Errorf("scs on: %q read as plain: %+v", text, c)
	}
	if c := m.classOf(text, off); !c.plain() {
		t.Errorf("scs off, after the same text with scs on: %q not plain: %+v", text, c)
	}
	if c := m.classOf(text, on); c.plain() {
		t.Errorf("scs on again: %q read as plain: %+v", text, c)
	}

	buf := []byte("BEGIN")
	if c := m.classOf(buf, on); !c.LoneBegin() {
		t.Fatalf("BEGIN: %+v", c)
	}
	copy(buf, "ABORT") // the reader's buffer, reused for the next message
	if c := m.classOf(buf, on); c.LoneBegin() || !c.Own {
		t.Errorf("ABORT after BEGIN in the same buffer: %+v", c)
	}

	// More texts than entries: each answer stays its own text's.
	for round := range 2 {
		for i := range 2 * classMemoSize {
			q := []byte(fmt.Sprintf("SELECT %d", i))
			if i%2 == 1 {
				q = []byte(fmt.Sprintf("SET x.y%d = 1", i))
			}
			if c := m.classOf(q, on); c.plain() != (i%2 == 0) {
				t.Errorf("round %d, %q: %+v", round, q, c)
			}
		}
	}
	long := make([]byte, classMemoMaxText+1)
	copy(long, "SET x.y = 1; SELECT ")
	for i := len("SET x.y = 1; SELECT "); i < len(long); i++ {
		long[i] = '1'
	}
	if c := m.classOf(long, on); c.plain() {
		t.Errorf("a long SET read as plain: %+v", c)
	}
	for _, e := range m.entries {
		if len(e.text) > classMemoMaxText {
			t.Errorf("the memo copied a text of %d bytes", len(e.text))
		}
	}
}
