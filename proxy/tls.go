package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"

	"github.com/fenceproxy/fenceproxy/config"
)

// serverTLSConfig loads the certificate presented to clients; nil when client TLS is off.
func serverTLSConfig(c config.ServerTLS) (*tls.Config, error) {
	if !c.Enabled() {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("load tls.cert_file/tls.key_file: %w", err)
	}
	tc := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		// "postgresql" is the ALPN protocol PostgreSQL 17 clients send with sslnegotiation=direct.
		NextProtos: []string{"postgresql"},
	}
	if c.ClientCAFile != "" {
		// A certificate is asked for, and verified when given; auth.type cert refuses a client without one.
		pem, err := os.ReadFile(c.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("read tls.client_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.client_ca_file %s: no PEM certificates", c.ClientCAFile)
		}
		tc.ClientCAs, tc.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	return tc, nil
}

// upstreamTLSConfig builds the client TLS configuration for the upstream leg; nil when mode is disable.
func upstreamTLSConfig(u config.Upstream) (*tls.Config, error) {
	switch u.TLS.Mode {
	case "", "disable":
		return nil, nil
	}
	host, _, err := net.SplitHostPort(u.Address)
	if err != nil {
		return nil, fmt.Errorf("upstream.address: %w", err)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
	if u.TLS.ServerName != "" {
		tc.ServerName = u.TLS.ServerName
	}
	if u.TLS.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(u.TLS.CertFile, u.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load upstream.tls.cert_file/key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	switch u.TLS.Mode {
	case "require":
		// Encrypt but do not verify, like libpq's sslmode=require without a root certificate.
		tc.InsecureSkipVerify = true
	case "verify-full":
		pem, err := os.ReadFile(u.TLS.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read upstream.tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("upstream.tls.ca_file %s: no PEM certificates", u.TLS.CAFile)
		}
		tc.RootCAs = pool
	default:
		return nil, fmt.Errorf("upstream.tls.mode %q", u.TLS.Mode)
	}
	return tc, nil
}
