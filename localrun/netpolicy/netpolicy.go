// Package netpolicy builds the NetworkPolicy engine the local node runs:
// kube-router's network policy controller alone (iptables and ipset, the
// way k3s embeds it for bridge networks), built once from the Go module
// proxy and cached beside the control plane. The node (localrun/node) runs
// it in its network namespace, so what it programs filters the node's
// Pods and nothing else on the host.
//
// The engine is a small main package of labkeep's (engine.go.txt) in a
// wrapper module that links kube-router's netpol, healthcheck and options
// packages only: none of kube-router's BGP, IPVS or Docker code, which
// carry the advisories reported against v2.1.0 (GHSA-phqm-jgc3-qf8g, the
// service proxy; GHSA-v5mh-h5hx-7v92, the router's gRPC port). The
// wrapper pins golang.org/x/net and x/text past their advisories and
// Kubernetes' client libraries to the control plane's release.
//
// kube-router needs the ipset and iptables commands on the host
// (localrun/setup.sh installs ipset), the kernel's ip_set (hash:ip,
// hash:net), xt_set, physdev, addrtype, conntrack, comment, mark,
// multiport, NFLOG and limit, and bridged traffic passed to iptables
// (bridge-nf-call-iptables, which the node sets in its namespace).
package netpolicy

import (
	"context"
	_ "embed"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"labkeep/localrun/controlplane"
)

// Version is kube-router's release; the only one the module proxy serves.
const Version = "v2.1.0"

// engineMain is the engine's main package.
//
//go:embed engine.go.txt
var engineMain string

// Binary is the engine's file name in the cache.
const Binary = "kube-router-netpol"

// EnsureEngine returns the engine built for control-plane versions v under
// cacheDir, building it first if it is missing (a few minutes on a cold
// Go cache).
func EnsureEngine(ctx context.Context, cacheDir string, v controlplane.Versions, progress io.Writer) (string, error) {
	dir := filepath.Join(cacheDir, "kube-router-"+Version+"_k8s-"+v.Kubernetes)
	out := filepath.Join(dir, Binary)
	if isExecutable(out) {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := controlplane.LockFile(filepath.Join(dir, ".lock"))
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if isExecutable(out) {
		return out, nil
	}
	gomod := fmt.Sprintf(`module labkeep.local/netpolbuild

go 1.24

require (
	github.com/cloudnativelabs/kube-router/v2 %s
	golang.org/x/net v0.62.0
	golang.org/x/text v0.44.0
	k8s.io/api %[2]s
	k8s.io/apimachinery %[2]s
	k8s.io/client-go %[2]s
)
`, Version, v.ClientLibraries())
	start := time.Now()
	fmt.Fprintf(progress, "labkeep: building kube-router %s's network policy controller (once; cached in %s)\n", Version, dir)
	if err := controlplane.BuildWrapper(ctx, dir, map[string]string{"go.mod": gomod, "main.go": engineMain}, out, progress); err != nil {
		return "", fmt.Errorf("build kube-router %s: %w", Version, err)
	}
	fmt.Fprintf(progress, "labkeep: built %s in %s\n", Binary, time.Since(start).Round(time.Second))
	return out, nil
}

// HealthPort is where the engine serves /healthz, in the node's network
// namespace: 200 once its first full sync is done and while its
// controller keeps reporting.
const HealthPort = 20244

// Args are the engine's arguments for the node named node whose Pods it
// confines, as the identity in kubeconfig (which may list and watch Pods,
// Namespaces, Nodes and NetworkPolicies), for a cluster whose Services are
// in serviceCIDR.
func Args(kubeconfig, node, serviceCIDR string) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--hostname-override=" + node,
		"--service-cluster-ip-range=" + serviceCIDR,
		"--health-port=" + strconv.Itoa(HealthPort),
	}
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}
