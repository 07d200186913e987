package webhook

import (
	"context"
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
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Keys of the CA Secret.
const (
	caCertKey = "ca.crt"
	caKeyKey  = "ca.key"
)

// CA is the certificate authority that signs the serving certificate.
type CA struct {
	CertPEM []byte
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
}

// EnsureCA reads the CA from the Secret, creating it (or filling a Secret
// an installer created empty) when missing. All replicas share it, so the
// caBundle in the webhook configurations is the same whoever writes it,
// and it survives restarts.
func EnsureCA(ctx context.Context, c client.Client, namespace, name string) (*CA, error) {
	var s corev1.Secret
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &s)
	if err == nil && len(s.Data[caCertKey]) == 0 {
		// Created empty (the Helm chart does): fill it. A conflict means
		// another replica filled it first; use its CA.
		ca, err := newCA()
		if err != nil {
			return nil, err
		}
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		keyPEM, err := ca.keyPEM()
		if err != nil {
			return nil, err
		}
		s.Data[caCertKey], s.Data[caKeyKey] = ca.CertPEM, keyPEM
		if err := c.Update(ctx, &s); err == nil {
			return ca, nil
		} else if !apierrors.IsConflict(err) {
			return nil, fmt.Errorf("filling webhook CA secret %s/%s: %w", namespace, name, err)
		}
		err = c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &s)
		if err != nil {
			return nil, fmt.Errorf("reading webhook CA secret %s/%s: %w", namespace, name, err)
		}
	}
	if apierrors.IsNotFound(err) {
		ca, err := newCA()
		if err != nil {
			return nil, err
		}
		keyPEM, err := ca.keyPEM()
		if err != nil {
			return nil, err
		}
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{"app.kubernetes.io/name": "tessera-controller"}},
			Type:       corev1.SecretTypeOpaque,
			Data: map[string][]byte{
				caCertKey: ca.CertPEM,
				caKeyKey:  keyPEM,
			},
		}
		err = c.Create(ctx, &s)
		if err == nil {
			return ca, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating webhook CA secret %s/%s: %w", namespace, name, err)
		}
		// Another replica was faster: use its CA.
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &s); err != nil {
			return nil, fmt.Errorf("reading webhook CA secret %s/%s: %w", namespace, name, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("reading webhook CA secret %s/%s: %w", namespace, name, err)
	}
	return parseCA(s.Data[caCertKey], s.Data[caKeyKey])
}

func (ca *CA) keyPEM() ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(ca.key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func newCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "tessera-controller-webhook-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key}, nil
}

func parseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("webhook CA secret does not hold a PEM certificate and key (%s, %s)", caCertKey, caKeyKey)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("webhook CA certificate: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("webhook CA key: %w", err)
	}
	return &CA{CertPEM: certPEM, cert: cert, key: key}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// ServingCert issues a serving certificate for the hosts (IP addresses or
// DNS names), valid from an hour before now until now+validity.
func (ca *CA) ServingCert(hosts []string, now time.Time, validity time.Duration) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "tessera-controller-webhook"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// Serving certificates live ServingValidity and are reissued once less
// than RenewBefore of it is left: a controller that runs for years keeps
// serving valid certificates without a restart.
const (
	ServingValidity = 90 * 24 * time.Hour
	RenewBefore     = 30 * 24 * time.Hour
)

// ServingCerts hands the TLS server the current serving certificate
// (tls.Config.GetCertificate) and reissues it from the CA before it
// expires. Checking on every handshake is a comparison of two times; a
// reissue (milliseconds) happens once per renewal period.
type ServingCerts struct {
	CA    *CA
	Hosts []string
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu  sync.Mutex
	cur *tls.Certificate
}

// GetCertificate implements tls.Config.GetCertificate.
func (s *ServingCerts) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	now := time.Now()
	if s.Now != nil {
		now = s.Now()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil && now.Before(s.cur.Leaf.NotAfter.Add(-RenewBefore)) {
		return s.cur, nil
	}
	cert, err := s.CA.ServingCert(s.Hosts, now, ServingValidity)
	if err != nil {
		if s.cur != nil && now.Before(s.cur.Leaf.NotAfter) {
			return s.cur, nil // still valid: retry at the next handshake
		}
		return nil, fmt.Errorf("webhook serving certificate: %w", err)
	}
	s.cur = cert
	return cert, nil
}
