package proxy

import (
	"sync/atomic"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// serverReading is what the server has reported (ParameterStatus) about how it reads a session's SQL text:
// client_encoding, server_encoding and standard_conforming_strings, all GUC_REPORT settings. The planner reads
// every Query and Parse under them (the server converts the text from client_encoding and lexes it under
// standard_conforming_strings). Written by whoever reads the server's messages, read by whoever reads the
// client's: an immutable value behind an atomic pointer.
type serverReading struct {
	p atomic.Pointer[rewrite.Settings]
}

// note records one ParameterStatus; other parameters are ignored.
//
// Only the three names copy the settings: the copy is a new value behind the pointer, and it escapes, so
// taking it before the name was looked at cost an allocation per ParameterStatus (a dozen per client at
// startup in transaction mode).
func (r *serverReading) note(name, value string) {
	switch name {
	case "client_encoding", "server_encoding", "standard_conforming_strings":
	default:
		return
	}
	s := new(rewrite.Settings)
	if cur := r.p.Load(); cur != nil {
		*s = *cur
	}
	switch name {
	case "client_encoding":
		s.ClientEncoding = value
	case "server_encoding":
		s.ServerEncoding = value
	default:
		s.StandardConformingStrings = value == "on"
	}
	r.p.Store(s)
}

// settings are the reported settings for a message the client sends now. inFlight says that an earlier
// message has not been answered by ReadyForQuery yet: it may change the settings (SET, set_config in a
// function, the rollback of a SET), and the server reports that only when it answers, so the settings are
// then Unsettled. Called before the message itself is counted as pending.
func (r *serverReading) settings(inFlight bool) rewrite.Settings {
	var s rewrite.Settings
	if cur := r.p.Load(); cur != nil {
		s = *cur
	}
	s.Unsettled = inFlight
	return s
}
