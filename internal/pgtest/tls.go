package pgtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// writeTLSFiles generates a CA and a server certificate signed by it, so
// that clients can use sslmode=verify-full with CAFile as root. Generating
// them in Go keeps the harness free of an openssl dependency.
func (c *Cluster) writeTLSFiles() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("pgtest: CA key: %w", err)
	}
	// Backdate a little so that a slightly skewed clock does not matter.
	notBefore := time.Now().Add(-time.Hour)
	notAfter := notBefore.Add(10 * 24 * time.Hour)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "fenceproxy pgtest CA"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("pgtest: CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return fmt.Errorf("pgtest: CA certificate: %w", err)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("pgtest: server key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("pgtest: server certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("pgtest: server key: %w", err)
	}

	c.CAFile = filepath.Join(c.dir, "ca.crt")
	c.CertFile = filepath.Join(c.dir, "server.crt")
	c.KeyFile = filepath.Join(c.dir, "server.key")
	files := []struct {
		path  string
		block *pem.Block
		perm  os.FileMode
	}{
		{c.CAFile, &pem.Block{Type: "CERTIFICATE", Bytes: caDER}, 0o644},
		{c.CertFile, &pem.Block{Type: "CERTIFICATE", Bytes: der}, 0o644},
		// The server refuses a key readable by group or others.
		{c.KeyFile, &pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}, 0o600},
	}
	for _, f := range files {
		if err := c.writeFile(f.path, pem.EncodeToMemory(f.block), f.perm); err != nil {
			return err
		}
	}
	return nil
}
