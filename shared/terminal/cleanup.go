package terminal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"labkeep/shared/access"
	"labkeep/shared/labs"
	"labkeep/shared/workspacekey"
)

// Guardian calls the guardian of a workspace Pod. It reaches guardian at
// the Pod IP the API server reports for the session's Pod and its API
// port, not through the API server's pods/proxy: the API server removes the
// Authorization header of a request it has authenticated, so guardian's
// bearer token cannot pass through it. So the functions need a network path
// to the Pod network (the on-prem server has one).
//
// The bearer token is the session's own (workspacekey's Cleanup use of the
// workspace key), derived from the session id at each call; the same token
// reaches that session's guardian alone, through the session's Secret
// (shared/kube). Whatever answers at the Pod's address is trusted with
// nothing else, because it cannot be told from guardian: the workspace's
// root can kill guardian and bind its port in the Pod's network namespace
// while the kubelet restarts it, and then receives this call. Such a
// listener can always impersonate that one guardian and learns that one
// session's token, which the same root can read anyway (the session's
// Secret is mounted in the workspace) and which opens no other session's
// guardian. So nothing sent here is worth anything beyond the caller's own
// workspace, and the call follows no redirect (a redirect is refused as a
// bad gateway), so an impersonator cannot bounce the functions' request,
// token and all, to an address of its choosing.
type Guardian struct {
	kube      kubernetes.Interface
	namespace string
	key       workspacekey.Key
	timeout   time.Duration
	client    *http.Client
}

// NewGuardian returns the client of workspace Pods' guardians in namespace,
// read through kc, with the workspace key the cleanup tokens are derived
// from; timeout bounds each whole call.
func NewGuardian(kc kubernetes.Interface, namespace string, key workspacekey.Key, timeout time.Duration) *Guardian {
	return &Guardian{kube: kc, namespace: namespace, key: key, timeout: timeout, client: &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// Cleanup asks the guardian of session's workspace Pod pod to kill every
// unprotected process in the workspace and returns its report. guardian
// refusing or failing, and any redirect, is an access.ErrBadGateway with
// the answer's own words.
func (g *Guardian) Cleanup(ctx context.Context, session, pod string) (CleanupReport, error) {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	token := g.key.Token(workspacekey.Cleanup, session)
	if token == "" {
		return CleanupReport{}, errors.New("no workspace key: guardians' cleanup tokens cannot be derived")
	}
	p, err := g.kube.CoreV1().Pods(g.namespace).Get(ctx, pod, metav1.GetOptions{})
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
	resp, err := g.client.Do(req)
	if err != nil {
		return CleanupReport{}, fmt.Errorf("%w: guardian in the workspace Pod did not answer: %v", access.ErrBadGateway, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return CleanupReport{}, fmt.Errorf("%w: the workspace Pod answered a redirect (%d to %q), which labkeep never follows",
			access.ErrBadGateway, resp.StatusCode, resp.Header.Get("Location"))
	}
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
