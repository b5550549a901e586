//go:build !linux

package proxy

import "net"

// Listen opens the proxy's client listener on addr (TCP), with Go's keepalive on each connection (Linux's
// sets it once on the listening socket: listen_linux.go).
func Listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

// tuneListener is Linux's (listen_linux.go).
func tuneListener(net.Listener) {}
