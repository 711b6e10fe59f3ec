// Package netpolicy runs a NetworkPolicy engine for the local node. The
// node's CNI (a plain bridge, localrun/node) enforces no NetworkPolicy, so
// the sessions' policies are only objects there unless an engine programs
// the kernel. The engine is kubernetes-sigs' kube-network-policies (a small
// Go program: nftables rules send a connection's first packets to an
// nfqueue, where it decides against the policies), built once from the Go
// module proxy like the control plane, cached beside it, and run on the
// host with an identity of its own.
//
// It needs the kernel's nftables "queue" expression (CONFIG_NFT_QUEUE,
// module nft_queue) and nfnetlink_queue. A kernel without them refuses the
// engine's rules as one batch, so it changes nothing on the host; Start
// then reports the refusal (ErrUnsupported) and the engine's own words.
package netpolicy

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"

	"labkeep/localrun/childproc"
	"labkeep/localrun/controlplane"
)

// Engine module and version. v0.8.0 runs fail-closed by default (no
// packet of a selected Pod passes while the engine is down).
const (
	Package = "sigs.k8s.io/kube-network-policies/cmd"
	Version = "v0.8.0"
)

// EnsureEngine returns the engine binary under cacheDir (see
// controlplane.DefaultCacheDir), building it from the Go module proxy
// first if it is missing (`go install` of the module's own main package,
// with its own go.mod; no cgo). The binary is written under a temp name
// and renamed, so an interrupted build never leaves a file a later run
// would trust.
func EnsureEngine(ctx context.Context, cacheDir string, progress io.Writer) (string, error) {
	dir := filepath.Join(cacheDir, "kube-network-policies-"+Version)
	out := filepath.Join(dir, "kube-network-policies")
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
	gobin, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(gobin)
	fmt.Fprintf(progress, "labkeep: building %s@%s (once; cached in %s)\n", Package, Version, dir)
	cmd := exec.CommandContext(ctx, "go", "install", "-trimpath", "-ldflags=-s -w", Package+"@"+Version)
	cmd.Dir = gobin
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0", "GOBIN="+gobin, "GOFLAGS=")
	cmd.Stdout, cmd.Stderr = progress, progress
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building %s@%s: %w", Package, Version, err)
	}
	if err := os.Rename(filepath.Join(gobin, filepath.Base(Package)), out); err != nil {
		return "", err
	}
	return out, nil
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// ErrUnsupported is Start's error when this kernel refuses the engine's
// rules; the error's text carries the engine's own log line.
var ErrUnsupported = errors.New("the kernel refuses the NetworkPolicy engine's nftables rules")

// Options say how to run the engine.
type Options struct {
	// Binary is EnsureEngine's result.
	Binary string
	// API is a config authenticated with a bearer token (e.g.
	// ControlPlane.ServiceAccountConfig) whose account may list and watch
	// Pods, Namespaces, Nodes and NetworkPolicies, with CAData.
	API *rest.Config
	// NodeName is the Node whose Pods the engine confines.
	NodeName string
	// Dir holds the engine's log and its service account files.
	Dir string
	// Wait bounds how long Start watches the engine's first rule sync.
	Wait time.Duration
}

// Engine is a running engine.
type Engine struct {
	proc *childproc.Process
	// Log is the engine's log file.
	Log string
}

// Start runs the engine on the host's network namespace, in a mount
// namespace of its own: the engine (v0.8.0) only knows in-cluster
// configuration, so the account's token and CA are mounted where a Pod
// would have them (/var/run/secrets/kubernetes.io/serviceaccount) without
// touching the host's /run. It returns once the engine has synced its
// nftables rules, or ErrUnsupported if the kernel refused them, or the
// engine's log if it stopped or said neither within Wait.
func Start(ctx context.Context, o Options) (*Engine, error) {
	u, err := url.Parse(o.API.Host)
	if err != nil {
		return nil, err
	}
	sa := filepath.Join(o.Dir, "serviceaccount")
	if err := os.MkdirAll(sa, 0o700); err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{"token": []byte(o.API.BearerToken), "ca.crt": o.API.CAData, "namespace": []byte("default")} {
		if err := os.WriteFile(filepath.Join(sa, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	const mount = "/run/secrets/kubernetes.io/serviceaccount"
	script := fmt.Sprintf("mount -t tmpfs -o size=1m,mode=0755 labkeep-netpol /run && mkdir -p %[1]s && cp %[2]s/* %[1]s/ && exec \"$0\" \"$@\"", mount, sa)
	log := filepath.Join(o.Dir, "kube-network-policies.log")
	env := append(os.Environ(), "KUBERNETES_SERVICE_HOST="+u.Hostname(), "KUBERNETES_SERVICE_PORT="+u.Port())
	proc, err := childproc.Start("kube-network-policies", log, childproc.Attr{Env: env},
		"unshare", "--mount", "--propagation", "private", "sh", "-c", script, o.Binary,
		"--hostname-override="+o.NodeName, "--disable-nri", "--metrics-bind-address=127.0.0.1:0", "-v=2")
	if err != nil {
		return nil, err
	}
	e := &Engine{proc: proc, Log: log}
	deadline := time.Now().Add(o.Wait)
	var syncing time.Time
	for {
		text, _ := os.ReadFile(log)
		if line := refusal(string(text)); line != "" {
			e.Stop()
			if lacks := KernelLacks(); len(lacks) > 0 {
				line += fmt.Sprintf(" (this kernel is built without %s)", strings.Join(lacks, ", "))
			}
			return nil, fmt.Errorf("%w: %s", ErrUnsupported, line)
		}
		if syncing.IsZero() && strings.Contains(string(text), "Syncing nftables rules") {
			syncing = time.Now()
		}
		// The engine logs a refusal at once; one that has said nothing
		// for settle after its sync has its rules and its queue.
		if !syncing.IsZero() && time.Since(syncing) > settle {
			return e, nil
		}
		if done, werr := proc.Exited(); done {
			return nil, fmt.Errorf("kube-network-policies stopped (%v): %s", werr, proc.LogTail(2000))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			e.Stop()
			return nil, fmt.Errorf("kube-network-policies did not sync its rules within %s: %s", o.Wait, proc.LogTail(2000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// settle is how long after its first rule sync the engine must stay
// silent about a refusal before Start trusts it.
const settle = 3 * time.Second

// refusal is the engine's log entry saying that the kernel refused its
// rules or its queue (klog continues a multi-line error on lines up to a
// lone ">"), or "".
func refusal(log string) string {
	lines := strings.Split(log, "\n")
	for i, line := range lines {
		if (strings.Contains(line, "syncing nftables rules") && strings.Contains(line, "error")) ||
			strings.Contains(line, "could not open nfqueue socket") {
			entry := []string{strings.TrimSpace(line)}
			if strings.HasSuffix(line, "<") {
				for _, more := range lines[i+1:] {
					if strings.TrimSpace(more) == ">" {
						break
					}
					entry = append(entry, strings.TrimSpace(more))
				}
			}
			return strings.Join(entry, " ")
		}
	}
	return ""
}

// KernelLacks names the kernel options the engine needs that this
// kernel's configuration (/proc/config.gz) says are not set, or nil if all
// are set or the configuration cannot be read.
func KernelLacks() []string {
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		return nil
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil
	}
	config, err := io.ReadAll(z)
	if err != nil {
		return nil
	}
	var lacks []string
	for _, opt := range []string{"CONFIG_NF_TABLES", "CONFIG_NFT_QUEUE", "CONFIG_NETFILTER_NETLINK_QUEUE", "CONFIG_NFT_CT", "CONFIG_NF_CONNTRACK_LABELS"} {
		if !regexp.MustCompile(`(?m)^` + opt + `=[ym]$`).Match(config) {
			lacks = append(lacks, opt)
		}
	}
	return lacks
}

// Stop ends the engine; it removes its own rules on a clean exit.
func (e *Engine) Stop() {
	if e != nil {
		e.proc.Stop(syscall.SIGINT, 10*time.Second)
	}
}
