package localcluster

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

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// pki holds the paths of the certificates and keys of one cluster. All are
// made fresh by every bring-up and live only in the work directory.
type pki struct {
	dir                   string
	caCert, caKey         string
	apiserverCert, apiKey string
	kubeletClientCert     string // the API server's client certificate towards kubelets
	kubeletClientKey      string
	saKey, saPub          string
}

type identity struct {
	name string // file name stem and kubeconfig user
	cn   string
	orgs []string
}

var (
	adminIdentity     = identity{"admin", "tessera-admin", []string{"system:masters"}}
	cmIdentity        = identity{"controller-manager", "system:kube-controller-manager", nil}
	schedulerIdentity = identity{"scheduler", "system:kube-scheduler", nil}
	kubeletIdentity   = identity{"kubelet", "system:node:" + NodeName, []string{"system:nodes"}}
)

type keyPair struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func writeKeyPair(dir, stem string, kp keyPair) (certPath, keyPath string, err error) {
	certPath, keyPath = filepath.Join(dir, stem+".crt"), filepath.Join(dir, stem+".key")
	if err = writePEM(certPath, "CERTIFICATE", kp.cert.Raw); err != nil {
		return
	}
	der, err := x509.MarshalECPrivateKey(kp.key)
	if err != nil {
		return
	}
	err = writePEM(keyPath, "EC PRIVATE KEY", der)
	return
}

func sign(ca *keyPair, tmpl *x509.Certificate) (keyPair, error) {
	key, err := newKey()
	if err != nil {
		return keyPair{}, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(365 * 24 * time.Hour)
	parent, signer := tmpl, key
	if ca != nil {
		parent, signer = ca.cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		return keyPair{}, err
	}
	cert, err := x509.ParseCertificate(der)
	return keyPair{cert, key}, err
}

// makePKI writes a CA, the API server's serving certificate, client
// certificates for every component and the service-account key pair, plus a
// kubeconfig per identity in kubeconfigDir.
func makePKI(dir, kubeconfigDir, server string) (*pki, error) {
	for _, d := range []string{dir, kubeconfigDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	p := &pki{dir: dir}
	ca, err := sign(nil, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "tessera-localcluster-ca"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
	})
	if err != nil {
		return nil, err
	}
	if p.caCert, p.caKey, err = writeKeyPair(dir, "ca", ca); err != nil {
		return nil, err
	}
	serving, err := sign(&ca, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(serviceIP)},
	})
	if err != nil {
		return nil, err
	}
	if p.apiserverCert, p.apiKey, err = writeKeyPair(dir, "apiserver", serving); err != nil {
		return nil, err
	}
	client := func(id identity) (string, string, error) {
		kp, err := sign(&ca, &x509.Certificate{
			Subject:     pkix.Name{CommonName: id.cn, Organization: id.orgs},
			KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})
		if err != nil {
			return "", "", err
		}
		return writeKeyPair(dir, id.name, kp)
	}
	if p.kubeletClientCert, p.kubeletClientKey, err = client(identity{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}}); err != nil {
		return nil, err
	}
	for _, id := range []identity{adminIdentity, cmIdentity, schedulerIdentity, kubeletIdentity} {
		cert, key, err := client(id)
		if err != nil {
			return nil, err
		}
		if err := writeKubeconfig(filepath.Join(kubeconfigDir, id.name+".kubeconfig"), server, p.caCert, cert, key, id.name); err != nil {
			return nil, err
		}
	}
	saKey, err := newKey()
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	p.saKey, p.saPub = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := writePEM(p.saKey, "EC PRIVATE KEY", der); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.saPub, "PUBLIC KEY", pub); err != nil {
		return nil, err
	}
	return p, nil
}

func writeKubeconfig(path, server, caFile, certFile, keyFile, user string) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	cert, err := os.ReadFile(certFile)
	if err != nil {
		return err
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["tessera"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["tessera"] = &clientcmdapi.Context{Cluster: "tessera", AuthInfo: user}
	cfg.CurrentContext = "tessera"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return os.Chmod(path, 0o600)
}
