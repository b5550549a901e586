//go:build !linux

package proxy

import "net"

// deferAccept is Linux's (listen_linux.go).
func deferAccept(net.Listener) {}
