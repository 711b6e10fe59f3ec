package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"labkeep/localrun/childproc"
)

// Options configures Start. The zero value is usable: binaries are built or
// taken from the default cache, and temp files go to the system temp dir.
type Options struct {
	// Binaries to run; if empty, EnsureBinaries fills them from BinCache.
	Binaries Binaries
	// BinCache overrides the binary cache dir (LABKEEP_BIN_CACHE).
	BinCache string
	// TempRoot is where the control plane's temp dir is made ("" = os.TempDir).
	TempRoot string
	// QuotaSyncPeriod is kube-controller-manager's --resource-quota-sync-period.
	// Short, so quotas naming CRDs never stay "status unknown" for long.
	QuotaSyncPeriod time.Duration
	// Progress receives build progress and start-up messages (nil = discard).
	Progress io.Writer
	// StartTimeout bounds the whole start-up (default 2 minutes).
	StartTimeout time.Duration
	// StopOnSignal stops this control plane when the process gets SIGINT or
	// SIGTERM and then lets the signal take its default effect. For test
	// binaries, whose TestMain cleanup never runs on Ctrl-C; commands that
	// handle signals themselves leave it off.
	StopOnSignal bool
}

// ControlPlane is a running etcd + kube-apiserver + kube-controller-manager.
type ControlPlane struct {
	// Dir is the temp dir holding data, certificates, logs and kubeconfigs;
	// Stop removes it.
	Dir string
	// Admin is a system:masters config for tests and virt-sim.
	Admin *rest.Config
	// AdminKubeconfig is a kubeconfig file with the same credentials.
	AdminKubeconfig string
	// Node is the identity of the local node's kubelet: user
	// system:node:<NodeName> in group system:nodes, which the Node
	// authorizer limits to that node and the Pods bound to it.
	Node *rest.Config
	// V2Node is the identity of the kubelet of V2NodeName.
	V2Node *rest.Config
	// Scheduler is kube-scheduler's identity (user system:kube-scheduler,
	// bound to its bootstrap ClusterRoles).
	Scheduler *rest.Config
	// APIServerURL is https://127.0.0.1:<port>.
	APIServerURL string
	// Ports are every loopback port the components listen on.
	Ports []int

	pki      *pki
	unsignal func()
	procs    []*childproc.Process // in start order
	stopOnce sync.Once
}

// The cluster's Service range, the cluster DNS Service's address in it and
// the cluster's DNS domain. The API server's certificate holds the
// range's first address (the default/kubernetes Service's).
const (
	ServiceCIDR   = "10.0.0.0/24"
	ClusterDNSIP  = "10.0.0.10"
	ClusterDomain = "cluster.local"
)

// ControllersRun lists the kube-controller-manager controllers the local
// control plane runs: exactly those labkeep's behaviour depends on.
var ControllersRun = []string{
	"garbage-collector-controller",
	"resourcequota-controller",
	"job-controller",
	"ttl-after-finished-controller",
	"namespace-controller",
	"serviceaccount-controller",
	// Removes the not-ready taint a kubelet registers its node with, once
	// the node is Ready: without it no Pod is ever scheduled.
	"node-lifecycle-controller",
	// Publishes kube-root-ca.crt into every namespace: the kubelet needs it
	// for a Pod that mounts a ServiceAccount token.
	"root-ca-certificate-publisher-controller",
	// A Service's endpoints, which kube-proxy and the cluster DNS read
	// (slices) and the API server reads to call a webhook behind a
	// Service (see --enable-aggregator-routing).
	"endpointslice-controller",
	"endpoints-controller",
	// The cluster DNS runs as a Deployment, as on a production cluster.
	"deployment-controller",
	"replicaset-controller",
	// KubeVirt's virt-handler runs as a DaemonSet.
	"daemonset-controller",
	// Students' homes are claims: bound to the volumes the node makes,
	// and kept from deletion while a Pod uses them (the API server gives
	// every claim and volume a protection finalizer that only these
	// remove).
	"persistentvolume-binder-controller",
	"persistentvolumeclaim-protection-controller",
	"persistentvolume-protection-controller",
}

// NodeName is the name of the local stack's node; the control plane's
// static token file holds its kubelet's identity (see Node).
const NodeName = "labkeep-node"

// V2NodeName is the name of the production-like node a test may add: a
// cgroup v2 guest (package guestnode); its kubelet's identity is V2Node.
const V2NodeName = "labkeep-node-v2"

const (
	v2NodeToken    = "labkeep-local-v2-node-token"
	adminToken     = "labkeep-local-admin-token"
	nodeToken      = "labkeep-local-node-token"
	schedulerToken = "labkeep-local-scheduler-token"
)

// Start launches a fresh control plane on free loopback ports and returns once
// the API server is ready, the KubeVirt CRDs are established and the
// controllers are running. On error everything started so far is stopped.
func Start(ctx context.Context, opts Options) (cp *ControlPlane, err error) {
	if opts.QuotaSyncPeriod == 0 {
		opts.QuotaSyncPeriod = 2 * time.Second
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 2 * time.Minute
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	cache, err := DefaultCacheDir(opts.BinCache)
	if err != nil {
		return nil, err
	}
	if opts.Binaries.APIServer == "" {
		if opts.Binaries, err = EnsureBinaries(ctx, cache, DefaultVersions, progress); err != nil {
			return nil, err
		}
	}
	kubeVirtCRDs, err := EnsureKubeVirtCRDs(ctx, cache, DefaultVersions, progress)
	if err != nil {
		return nil, err
	}
	childproc.SweepStale(opts.TempRoot, "labkeep-cp")
	dir, err := childproc.TempDir(opts.TempRoot, "labkeep-cp")
	if err != nil {
		return nil, err
	}
	cp = &ControlPlane{Dir: dir}
	if opts.StopOnSignal {
		cp.unsignal = childproc.CleanupOnSignal(cp.Stop)
	}
	defer func() {
		if err != nil {
			cp.Stop()
			cp = nil
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	if cp.pki, err = writePKI(dir); err != nil {
		return cp, err
	}
	ports, err := FreePorts(4)
	if err != nil {
		return cp, err
	}
	cp.Ports = ports
	etcdClient, etcdPeer, apiPort, kcmPort := ports[0], ports[1], ports[2], ports[3]
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	etcd, err := childproc.Start("etcd", filepath.Join(dir, "etcd.log"), childproc.Attr{}, opts.Binaries.Etcd,
		"--name=labkeep", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=labkeep="+peerURL, "--unsafe-no-fsync=true",
		"--log-level=warn", "--quota-backend-bytes=4294967296")
	if err != nil {
		return cp, err
	}
	cp.procs = append(cp.procs, etcd)

	tokens := filepath.Join(dir, "tokens.csv")
	tokenLines := adminToken + ",labkeep-admin,labkeep-admin,system:masters\n" +
		nodeToken + ",system:node:" + NodeName + ",system:node:" + NodeName + ",system:nodes\n" +
		v2NodeToken + ",system:node:" + V2NodeName + ",system:node:" + V2NodeName + ",system:nodes\n" +
		schedulerToken + ",system:kube-scheduler,system:kube-scheduler\n"
	if err := os.WriteFile(tokens, []byte(tokenLines), 0o600); err != nil {
		return cp, err
	}
	cp.APIServerURL = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	api, err := childproc.Start("kube-apiserver", filepath.Join(dir, "kube-apiserver.log"), childproc.Attr{}, opts.Binaries.APIServer,
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(apiPort),
		"--tls-cert-file="+cp.pki.certFile, "--tls-private-key-file="+cp.pki.keyFile,
		"--token-auth-file="+tokens,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		// The local node's InternalIP is the host's address on its Pod
		// bridge: logs, exec and port-forward reach the kubelet there,
		// never through a host name.
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+cp.pki.saPubFile,
		"--service-account-signing-key-file="+cp.pki.saKeyFile,
		"--service-cluster-ip-range="+ServiceCIDR,
		// The API server listens on the host's loopback, which no Pod
		// reaches: the node publishes where Pods reach it (the endpoints of
		// the default/kubernetes Service) itself.
		"--endpoint-reconciler-type=none",
		// The host has no route to ClusterIPs (kube-proxy's rules live in
		// the node's namespace), so the API server calls a webhook or an
		// aggregated API behind a Service at one of its Pods' addresses,
		// which the host routes to the node.
		"--enable-aggregator-routing=true",
		"--requestheader-client-ca-file="+cp.pki.frontProxyCAFile,
		"--requestheader-allowed-names="+frontProxyClient,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file="+cp.pki.frontProxyCert,
		"--proxy-client-key-file="+cp.pki.frontProxyKey,
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--cert-dir="+filepath.Join(dir, "apiserver-certs"),
		"--v=0")
	if err != nil {
		return cp, err
	}
	cp.procs = append(cp.procs, api)
	cp.Admin = &rest.Config{
		Host:            cp.APIServerURL,
		BearerToken:     adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.pki.caPEM},
		QPS:             200,
		Burst:           400,
	}
	cp.Node = rest.CopyConfig(cp.Admin)
	cp.Node.BearerToken = nodeToken
	cp.V2Node = rest.CopyConfig(cp.Admin)
	cp.V2Node.BearerToken = v2NodeToken
	cp.Scheduler = rest.CopyConfig(cp.Admin)
	cp.Scheduler.BearerToken = schedulerToken
	if err := cp.waitReady(ctx, api); err != nil {
		return cp, err
	}
	cp.AdminKubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := WriteKubeconfig(cp.AdminKubeconfig, cp.Admin, "labkeep-admin"); err != nil {
		return cp, err
	}
	fmt.Fprintf(progress, "labkeep: kube-apiserver ready at %s\n", cp.APIServerURL)

	// CRDs first, so the garbage collector and quota controller discover
	// them at start instead of after a resync.
	if err := InstallKubeVirtCRDs(ctx, cp.Admin, kubeVirtCRDs); err != nil {
		return cp, fmt.Errorf("install KubeVirt CRDs: %w", err)
	}
	if err := warmUpCRDs(ctx, cp.Admin); err != nil {
		return cp, err
	}

	kcm, err := childproc.Start("kube-controller-manager", filepath.Join(dir, "kube-controller-manager.log"), childproc.Attr{}, opts.Binaries.ControllerManager,
		"--kubeconfig="+cp.AdminKubeconfig,
		"--controllers="+strings.Join(ControllersRun, ","),
		"--leader-elect=false",
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(kcmPort),
		"--resource-quota-sync-period="+opts.QuotaSyncPeriod.String(),
		"--concurrent-gc-syncs=10",
		"--use-service-account-credentials=false",
		"--root-ca-file="+cp.pki.caFile,
		// A new node is schedulable within a second of being Ready.
		"--node-monitor-period=1s",
		"--controller-start-interval=0s",
		"--profiling=false",
		"--v=0")
	if err != nil {
		return cp, err
	}
	cp.procs = append(cp.procs, kcm)
	if err := cp.waitControllers(ctx, kcm); err != nil {
		return cp, err
	}
	fmt.Fprintln(progress, "labkeep: kube-controller-manager running ("+strings.Join(ControllersRun, ", ")+")")
	return cp, nil
}

// waitReady polls /readyz until the API server answers ok.
func (cp *ControlPlane) waitReady(ctx context.Context, api *childproc.Process) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp.pki.caPEM)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	alive := func() error {
		for _, p := range cp.procs {
			if done, err := p.Exited(); done {
				return fmt.Errorf("%s %w (%v); log:\n%s", p.Name, childproc.ErrExited, err, p.LogTail(3000))
			}
		}
		return nil
	}
	if err := WaitOK(ctx, hc, cp.APIServerURL+"/readyz", adminToken, alive); err != nil {
		return fmt.Errorf("kube-apiserver not ready: %w; log:\n%s", err, api.LogTail(3000))
	}
	return nil
}

// WaitOK polls url (with bearer, if not empty) every 100 ms until it
// answers 200 OK. alive, if set, is asked first on every round: its error
// ends the wait (a process that exited will never answer). Returns the
// context's error when it ends first.
func WaitOK(ctx context.Context, hc *http.Client, url, bearer string, alive func() error) error {
	defer hc.CloseIdleConnections()
	for {
		if alive != nil {
			if err := alive(); err != nil {
				return err
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitControllers returns once the serviceaccount controller has created the
// "default" ServiceAccount in kube-system: proof that kube-controller-manager
// is up and its informers synced.
func (cp *ControlPlane) waitControllers(ctx context.Context, kcm *childproc.Process) error {
	cs, err := kubernetes.NewForConfig(cp.Admin)
	if err != nil {
		return err
	}
	for {
		if done, err := kcm.Exited(); done {
			return fmt.Errorf("kube-controller-manager %w (%v); log:\n%s", childproc.ErrExited, err, kcm.LogTail(3000))
		}
		_, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-controller-manager not running: %w; log:\n%s", ctx.Err(), kcm.LogTail(3000))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops every component (controllers first, etcd last) and removes the
// temp dir. It is safe to call more than once and on a partly started plane.
func (cp *ControlPlane) Stop() {
	if cp == nil {
		return
	}
	cp.stopOnce.Do(func() {
		if cp.unsignal != nil {
			cp.unsignal()
		}
		for i := len(cp.procs) - 1; i >= 0; i-- {
			cp.procs[i].Stop(syscall.SIGTERM, 10*time.Second)
		}
		if cp.Dir != "" {
			os.RemoveAll(cp.Dir)
		}
	})
}

// Pids returns the process ids of the running components, for leak checks.
func (cp *ControlPlane) Pids() []int {
	var pids []int
	for _, p := range cp.procs {
		pids = append(pids, p.Pid())
	}
	return pids
}

// ServiceAccountConfig creates (if missing) the ServiceAccount ns/name and
// returns a config authenticated as it through a TokenRequest, so tests can
// run code with exactly the RBAC bound to that account and nothing more.
// Binding roles is the caller's job (e.g. applying infra/ manifests).
func (cp *ControlPlane) ServiceAccountConfig(ctx context.Context, ns, name string) (*rest.Config, error) {
	cs, err := kubernetes.NewForConfig(cp.Admin)
	if err != nil {
		return nil, err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	ttl := int64(24 * 3600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for %s/%s: %w", ns, name, err)
	}
	return &rest.Config{
		Host:            cp.APIServerURL,
		BearerToken:     tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.pki.caPEM},
		QPS:             200,
		Burst:           400,
	}, nil
}

// WriteKubeconfig writes cfg (token auth, CA data) as a kubeconfig file that
// kubectl and client-go accept.
func WriteKubeconfig(path string, cfg *rest.Config, user string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["labkeep-local"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, TLSServerName: cfg.ServerName}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["labkeep-local"] = &clientcmdapi.Context{Cluster: "labkeep-local", AuthInfo: user, Namespace: "default"}
	kc.CurrentContext = "labkeep-local"
	return clientcmd.WriteToFile(*kc, path)
}

// FreePorts reserves n distinct loopback ports by listening and closing. A
// port can in principle be taken between close and use; the component then
// fails to bind, its starter reports that, and callers may retry.
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
