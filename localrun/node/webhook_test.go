package node

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"labkeep/localrun/poll"
)

// The webhook of these tests: a Service in "default" in front of a Pod
// that runs TestHelperWebhook, refusing the ConfigMap named webhookRefuses.
const (
	webhookService = "webhook"
	webhookRefuses = "refused-by-webhook"
	webhookPort    = 8443
	webhookDirEnv  = "LABKEEP_TEST_WEBHOOK_DIR"
)

// assertWebhookReached shows the API server calling an admission webhook
// that runs in a Pod behind a ClusterIP Service, as KubeVirt's virt-api
// and CDI's webhooks do: with the webhook registered (failurePolicy Fail,
// for ConfigMaps labelled for it), a ConfigMap it allows is created — so
// the call went through — and the one it refuses is refused with its
// message. The webhook Pod runs this test binary (TestHelperWebhook) from
// the host through a hostPath, and is left running for the node's leak
// checks.
func assertWebhookReached(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	host := webhookService + ".default.svc"
	caPEM := writeSelfSigned(t, dir, host)
	file := corev1.HostPathFile
	directory := corev1.HostPathDirectory
	p := pod(webhookService, WorkspaceImage, "", nil)
	p.Labels = map[string]string{"app": webhookService}
	c := &p.Spec.Containers[0]
	c.Command = []string{"/webhook/node.test", "-test.run=^TestHelperWebhook$"}
	c.Env = []corev1.EnvVar{{Name: webhookDirEnv, Value: "/webhook/tls"}}
	c.VolumeMounts = []corev1.VolumeMount{{Name: "bin", MountPath: "/webhook/node.test", ReadOnly: true}, {Name: "tls", MountPath: "/webhook/tls", ReadOnly: true}}
	p.Spec.Volumes = []corev1.Volume{
		{Name: "bin", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: exe, Type: &file}}},
		{Name: "tls", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &directory}}},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: webhookService, Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Selector: p.Labels,
			Ports:    []corev1.ServicePort{{Port: 443, TargetPort: intstr.FromInt32(webhookPort), Protocol: corev1.ProtocolTCP}},
		},
	}
	if _, err := cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	path := "/validate"
	port := int32(443)
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "labkeep-test-webhook"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "configmaps.labkeep.test",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service:  &admissionregistrationv1.ServiceReference{Namespace: "default", Name: webhookService, Path: &path, Port: &port},
				CABundle: caPEM,
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{"labkeep-test-webhook": "on"}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), cfg.Name, metav1.DeleteOptions{})
	})
	create := func(name string) error {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"labkeep-test-webhook": "on"}}}
		_, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{})
		return err
	}
	// Until the Pod serves and the Service has it as an endpoint, the call
	// fails and failurePolicy Fail refuses every creation.
	poll.Eventually(t, 2*time.Minute, func() (bool, string) {
		err := create("allowed-by-webhook")
		return err == nil, fmt.Sprintf("a ConfigMap the webhook allows: %v", err)
	})
	err = create(webhookRefuses)
	if err == nil || !strings.Contains(err.Error(), "refused by the test webhook") {
		t.Errorf("the ConfigMap the webhook refuses: got %v, want the webhook's refusal", err)
	}
}

// writeSelfSigned writes tls.crt and tls.key for host into dir, a
// certificate that is its own CA, and returns it in PEM.
func writeSelfSigned(t *testing.T, dir, host string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: host},
		DNSNames:              []string{host},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	for name, data := range map[string][]byte{
		"tls.crt": certPEM,
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return certPEM
}

// TestHelperWebhook is not a test: assertWebhookReached runs the test
// binary in a Pod with this as the only test, as the webhook the API
// server calls. It refuses the ConfigMap named webhookRefuses and allows
// everything else, until the Pod is stopped.
func TestHelperWebhook(t *testing.T) {
	dir := os.Getenv(webhookDirEnv)
	if dir == "" {
		t.Skip("helper process for assertWebhookReached")
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /validate", func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: review.Request.Name != webhookRefuses}
		if !resp.Allowed {
			resp.Result = &metav1.Status{Message: "refused by the test webhook"}
		}
		review.Response, review.Request = resp, nil
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(review)
	})
	srv := &http.Server{Addr: fmt.Sprintf(":%d", webhookPort), Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	t.Fatal(srv.ListenAndServeTLS("", ""))
}
