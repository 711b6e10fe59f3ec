package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the files kube-apiserver needs: a CA, a serving certificate for
// 127.0.0.1 signed by it, a key pair to sign ServiceAccount tokens, and the
// front proxy's CA and client certificate, with which the API server's
// aggregator calls an aggregated API server (KubeVirt's virt-api serves
// the VMs' console and VNC that way and trusts the caller by that CA).
type pki struct {
	caPEM                         []byte
	caFile                        string
	certFile, keyFile             string
	saPubFile, saKeyFile          string
	frontProxyCAFile              string
	frontProxyCert, frontProxyKey string
}

// frontProxyClient is the front proxy's client certificate's name, the one
// aggregated API servers accept (--requestheader-allowed-names).
const frontProxyClient = "front-proxy-client"

// writePKI generates fresh ECDSA keys (fast, unlike RSA) into dir. Nothing is
// reused between runs, so a leaked kubeconfig is worthless after Stop.
func writePKI(dir string) (*pki, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "labkeep-local-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	p := &pki{
		caPEM:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		caFile:    filepath.Join(dir, "ca.crt"),
		certFile:  filepath.Join(dir, "apiserver.crt"),
		keyFile:   filepath.Join(dir, "apiserver.key"),
		saPubFile: filepath.Join(dir, "sa.pub"),
		saKeyFile: filepath.Join(dir, "sa.key"),
	}
	srvKeyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return nil, err
	}
	saKeyDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	fpCAKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	fpCATmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(3),
		Subject:               pkix.Name{CommonName: "labkeep-front-proxy-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	fpCADER, err := x509.CreateCertificate(rand.Reader, fpCATmpl, fpCATmpl, &fpCAKey.PublicKey, fpCAKey)
	if err != nil {
		return nil, err
	}
	fpCACert, err := x509.ParseCertificate(fpCADER)
	if err != nil {
		return nil, err
	}
	fpKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	fpDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(4),
		Subject:      pkix.Name{CommonName: frontProxyClient},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, fpCACert, &fpKey.PublicKey, fpCAKey)
	if err != nil {
		return nil, err
	}
	fpKeyDER, err := x509.MarshalECPrivateKey(fpKey)
	if err != nil {
		return nil, err
	}
	p.frontProxyCAFile = filepath.Join(dir, "front-proxy-ca.crt")
	p.frontProxyCert = filepath.Join(dir, "front-proxy-client.crt")
	p.frontProxyKey = filepath.Join(dir, "front-proxy-client.key")
	files := map[string][]byte{
		p.frontProxyCAFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: fpCADER}),
		p.frontProxyCert:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: fpDER}),
		p.frontProxyKey:    pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: fpKeyDER}),
		p.caFile:           p.caPEM,
		p.certFile:         pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		p.keyFile:          pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: srvKeyDER}),
		p.saKeyFile:        pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saKeyDER}),
		p.saPubFile:        pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER}),
	}
	for name, data := range files {
		if err := os.WriteFile(name, data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}
