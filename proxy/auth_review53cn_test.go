package proxy_test

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// TestAuthCertSeveralCommonNames: a certificate whose subject holds two common names names two users, and
// parsers disagree on which is the one: Go's crypto/x509 keeps the last, OpenSSL (PostgreSQL's cert method, and
// CA tooling built on it) reads the first. A CA that vetted "mallory", the first, issued it; through the proxy it
// logged in as the superuser named last. Such a certificate names no one: 28000. A certificate with one common
// name still logs in.
func TestAuthCertSeveralCommonNames(t *testing.T) {
	ca := newTestCA(t, t.TempDir())
	caFile := ca.file
	certFile, keyFile := ca.issue(2, pkix.Name{CommonName: "127.0.0.1"}, nil, x509.ExtKeyUsageServerAuth, "server")
	oidCN := asn1.ObjectIdentifier{2, 5, 4, 3}
	// Two RDNs of one common name each (pkix.Name cannot say it: an ExtraNames CN replaces CommonName).
	twoSubject, err := asn1.Marshal(pkix.RDNSequence{{{Type: oidCN, Value: "mallory"}}, {{Type: oidCN, Value: pgtest.SuperUser}}})
	if err != nil {
		t.Fatal(err)
	}
	twoCert, twoKey := ca.issue(3, pkix.Name{}, twoSubject, x509.ExtKeyUsageClientAuth, "two")
	oneCert, oneKey := ca.issue(4, pkix.Name{CommonName: pgtest.SuperUser}, nil, x509.ExtKeyUsageClientAuth, "one")
	if c, _ := x509.ParseCertificate(mustPEM(t, twoCert)); c.Subject.CommonName != pgtest.SuperUser || len(c.Subject.Names) != 2 {
		t.Fatalf("the test certificate reads %q (%v) in Go, want two common names, the last %q", c.Subject.CommonName, c.Subject.Names, pgtest.SuperUser)
	}
	p := startProxy(t, proxytest.Options{YAML: fmt.Sprintf("tls:\n  cert_file: %s\n  key_file: %s\n  client_ca_file: %s\nauth:\n  type: cert\n", certFile, keyFile, caFile)})
	dsn := func(cert, key string) string {
		q := "sslmode=verify-full&sslrootcert=" + url.QueryEscape(caFile) + "&sslcert=" + url.QueryEscape(cert) + "&sslkey=" + url.QueryEscape(key)
		return strings.Replace(p.DSN(pgtest.SuperUser, "", pgtest.TestDB), "sslmode=disable", q, 1)
	}
	if code := loginCode(t, dsn(oneCert, oneKey)); code != "" {
		t.Fatalf("a certificate with one common name: %s", code)
	}
	if code := loginCode(t, dsn(twoCert, twoKey)); code != "28000" {
		t.Fatalf("a certificate with the common names mallory and %s, logging in as %s: %q, want 28000", pgtest.SuperUser, pgtest.SuperUser, code)
	}
}

// mustPEM is the DER of the first PEM block of the file at path.
func mustPEM(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	return blk.Bytes
}
