//go:build !linux

package proxy

import "net"

// inputWaiting cannot look into the socket here: a drain decides on what the reader has buffered.
func inputWaiting(net.Conn) bool { return false }

// peerClosed cannot look into the socket here: a client that disconnects while it waits for a server connection
// is noticed when its wait ends.
func peerClosed(net.Conn) bool { return false }

// spokeOrClosed cannot look into the socket here: a server connection's end is noticed when it is next read.
func spokeOrClosed(net.Conn) bool { return false }
