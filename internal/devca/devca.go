// Package devca makes a private certificate authority and the server
// certificates it signs, for tests and the lab: TLS on loopback without a
// public CA. Keys are ECDSA P-256; certificates are valid for a day.
package devca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
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

// CA is a private certificate authority. Safe for concurrent use.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte
}

// validity is how long the CA and its certificates are valid.
const validity = 24 * time.Hour

// New makes a fresh CA.
func New() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("devca: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "outboxchat dev CA"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(validity),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("devca: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("devca: %w", err)
	}
	return &CA{cert: cert, key: key, der: der}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// Pool returns a cert pool trusting only the CA.
func (c *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.cert)
	return p
}

// ClientConfig returns a TLS client config trusting only the CA.
func (c *CA) ClientConfig() *tls.Config {
	return &tls.Config{RootCAs: c.Pool(), MinVersion: tls.VersionTLS12}
}

// WriteCA writes the CA certificate (PEM) to dir/ca.crt and returns the path.
func (c *CA) WriteCA(dir string) (string, error) {
	p := filepath.Join(dir, "ca.crt")
	return p, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.der}), 0o644)
}

// Issue signs a server certificate for hosts (DNS names or IP addresses)
// and writes it and its key (PEM, key mode 0600) to dir/name.crt and
// dir/name.key.
func (c *CA) Issue(dir, name string, hosts ...string) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("devca: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(validity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return "", "", fmt.Errorf("devca: %w", err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", fmt.Errorf("devca: %w", err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", "", fmt.Errorf("devca: %w", err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return "", "", fmt.Errorf("devca: %w", err)
	}
	return certFile, keyFile, nil
}
