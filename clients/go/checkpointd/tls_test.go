package checkpointd_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"checkpointd.dev/clients/go/checkpointd"
	pb "checkpointd.dev/clients/go/checkpointdv1"
)

type pki struct {
	dir            string
	roots          *x509.CertPool
	client         tls.Certificate
	caPEM, srvPEM  string
	srvKey, cliPEM string
}

// makePKI writes a CA, a server certificate for 127.0.0.1/localhost and a client
// certificate to a fresh directory.
func makePKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	newKey := func() *ecdsa.PrivateKey {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return key
	}
	write := func(name, kind string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	caKey := newKey()
	caTemplate := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "checkpointd test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, key *ecdsa.PrivateKey) []byte {
		template := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), BasicConstraintsValid: true,
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		if usage == x509.ExtKeyUsageServerAuth {
			template.DNSNames = []string{"localhost"}
			template.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		}
		der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	marshal := func(key *ecdsa.PrivateKey) []byte {
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	srvKey, cliKey := newKey(), newKey()
	p := &pki{dir: dir, roots: x509.NewCertPool()}
	p.roots.AddCert(ca)
	p.caPEM = write("ca.pem", "CERTIFICATE", caDER)
	p.srvPEM = write("server.pem", "CERTIFICATE", issue(2, "localhost", x509.ExtKeyUsageServerAuth, srvKey))
	p.srvKey = write("server.key", "PRIVATE KEY", marshal(srvKey))
	p.cliPEM = write("client.pem", "CERTIFICATE", issue(3, "client", x509.ExtKeyUsageClientAuth, cliKey))
	cliKeyPath := write("client.key", "PRIVATE KEY", marshal(cliKey))
	if p.client, err = tls.LoadX509KeyPair(p.cliPEM, cliKeyPath); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTLSWithTokenAndMutualTLS(t *testing.T) {
	p := makePKI(t)
	serverTLS := []string{"--tls-cert", p.srvPEM, "--tls-key", p.srvKey}

	verified := checkpointd.WithTLS(&tls.Config{RootCAs: p.roots, MinVersion: tls.VersionTLS12})
	d, err := startDaemon(true, "tok-tls", serverTLS, verified)
	if err != nil {
		t.Fatal(err)
	}
	defer d.stop()
	client := d.dial(t)
	writeTree(t, d.workspace, map[string]string{"a.txt": "over TLS"})
	if _, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client, checkpointd.CaptureOptions{ThreadID: "t-tls"}); err != nil {
		t.Fatal(err)
	}
	info, err := client.GetServerInfo(ctx(t), &pb.GetServerInfoRequest{})
	if err != nil || !info.GetCapabilities().GetTls() {
		t.Fatalf("server info %v %v", info, err)
	}

	mutual := checkpointd.WithTLS(&tls.Config{RootCAs: p.roots, Certificates: []tls.Certificate{p.client},
		MinVersion: tls.VersionTLS12})
	m, err := startDaemon(true, "", append(serverTLS, "--tls-client-ca", p.caPEM), mutual)
	if err != nil {
		t.Fatal(err)
	}
	defer m.stop()
	mclient := m.dial(t)
	writeTree(t, m.workspace, map[string]string{"m.txt": "mutual"})
	if _, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), mclient, checkpointd.CaptureOptions{ThreadID: "t-mtls"}); err != nil {
		t.Fatal(err)
	}
	if info, err := mclient.GetServerInfo(ctx(t), &pb.GetServerInfoRequest{}); err != nil || !info.GetCapabilities().GetMutualTls() {
		t.Fatalf("server info %v %v", info, err)
	}
}
