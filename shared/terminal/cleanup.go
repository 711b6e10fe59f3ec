package terminal

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"labkeep/shared/access"
	"labkeep/shared/labs"
)

// Where guardian's cleanup token is: the Secret the workspace Pod's
// GUARDIAN_CLEANUP_TOKEN comes from (infra/guardian/workspace-pod.yaml).
const (
	GuardianSecret   = "labkeep-guardian"
	GuardianTokenKey = "cleanup-token"
)

// Guardian calls the guardian of a workspace Pod. It reaches guardian at
// the Pod's IP and API port, not through the API server's pods/proxy: the
// API server removes the Authorization header of a request it has
// authenticated, so guardian's bearer token cannot pass through it. So the
// functions need a network path to the Pod network (the on-prem server has
// one) and the token, which they read from the Secret GuardianSecret at
// each call (a rotated token takes effect at once); the student never
// sees it.
type Guardian struct {
	Kube      kubernetes.Interface
	Namespace string
	// Timeout bounds the whole call.
	Timeout time.Duration
}

// Cleanup asks the guardian of Pod pod to kill every unprotected process
// in the workspace and returns its report. guardian refusing or failing
// is an access.ErrBadGateway with guardian's own words.
func (g *Guardian) Cleanup(ctx context.Context, pod string) (CleanupReport, error) {
	ctx, cancel := context.WithTimeout(ctx, g.Timeout)
	defer cancel()
	sec, err := g.Kube.CoreV1().Secrets(g.Namespace).Get(ctx, GuardianSecret, metav1.GetOptions{})
	if err != nil {
		return CleanupReport{}, fmt.Errorf("reading guardian's cleanup token: %w", err)
	}
	token := strings.TrimSpace(string(sec.Data[GuardianTokenKey]))
	if token == "" {
		return CleanupReport{}, fmt.Errorf("the Secret %s has no %s", GuardianSecret, GuardianTokenKey)
	}
	p, err := g.Kube.CoreV1().Pods(g.Namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return CleanupReport{}, fmt.Errorf("reading workspace Pod %s: %w", pod, err)
	}
	var port int32
	for _, c := range p.Spec.InitContainers {
		for _, cp := range c.Ports {
			if cp.Name == labs.GuardianAPIPort {
				port = cp.ContainerPort
			}
		}
	}
	switch {
	case port == 0:
		return CleanupReport{}, fmt.Errorf("workspace Pod %s has no port %s", pod, labs.GuardianAPIPort)
	case p.Status.PodIP == "":
		return CleanupReport{}, fmt.Errorf("%w: the workspace Pod has no address yet", access.ErrBadGateway)
	}
	u := "http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port))) + "/cleanup"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return CleanupReport{}, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return CleanupReport{}, fmt.Errorf("%w: guardian in the workspace Pod did not answer: %v", access.ErrBadGateway, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return CleanupReport{}, fmt.Errorf("%w: reading guardian's answer: %v", access.ErrBadGateway, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(body, &e)
		return CleanupReport{}, fmt.Errorf("%w: guardian answered %d: %s", access.ErrBadGateway, resp.StatusCode, e.Error)
	}
	var r CleanupReport
	if err := json.Unmarshal(body, &r); err != nil {
		return CleanupReport{}, fmt.Errorf("%w: guardian's answer is not its cleanup report: %v", access.ErrBadGateway, err)
	}
	if r.Killed == nil {
		r.Killed = []int{}
	}
	return r, nil
}
