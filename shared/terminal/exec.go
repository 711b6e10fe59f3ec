package terminal

import (
	"context"
	"io"
	"net/url"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	kvcorev1 "kubevirt.io/client-go/kubevirt/typed/core/v1"

	"labkeep/shared/kube"
)

// Shell is what the terminal runs in a workspace container: bash as a
// login shell where the image has it, else sh, in root's home, with a TERM
// xterm.js understands. It needs nothing of the container but /bin/sh —
// in particular not sshd.
var Shell = []string{"/bin/sh", "-c",
	`export TERM=xterm-256color; cd ~ 2>/dev/null; if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l`}

// execPod runs Shell in the workspace container of Pod pod with a TTY,
// through the API server's pods/exec (the kubelet and the container
// runtime; no network path into the Pod). It speaks the WebSocket exec
// protocol (v5) and falls back to SPDY when the API server or a proxy on
// the way cannot upgrade to WebSocket, as kubectl does.
func (h *Handler) execPod(ctx context.Context, pod string, stdin io.Reader, stdout io.Writer, sizes remotecommand.TerminalSizeQueue) error {
	u := h.kube.CoreV1().RESTClient().Post().Namespace(h.o.Namespace).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: kube.WorkspaceContainer, Command: Shell,
			Stdin: true, Stdout: true, TTY: true,
		}, scheme.ParameterCodec).URL()
	ws, err := remotecommand.NewWebSocketExecutor(h.o.Kube, "GET", u.String())
	if err != nil {
		return err
	}
	spdy, err := remotecommand.NewSPDYExecutor(h.o.Kube, "POST", u)
	if err != nil {
		return err
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return err
	}
	return exec.StreamWithContext(ctx, remotecommand.StreamOptions{
		Stdin: stdin, Stdout: stdout, Tty: true, TerminalSizeQueue: sizes,
	})
}

// serialConsole connects stdin and stdout to the serial console of VMI
// vmi: KubeVirt's virtualmachineinstances/console subresource
// (subresources.kubevirt.io), a WebSocket through the API server to
// virt-handler — the call kubevirt.io/client-go's
// VirtualMachineInstance(ns).SerialConsole makes. The serial console has
// no window size, so resizes are ignored. The local stack's KubeVirt
// stand-in (virtsim) serves no subresources, so this path runs only
// against a real KubeVirt.
func (h *Handler) serialConsole(ctx context.Context, vmi string, stdin io.Reader, stdout io.Writer) error {
	stream, err := kvcorev1.AsyncSubresourceHelper(h.o.Kube, "virtualmachineinstances", h.o.Namespace, vmi, "console", url.Values{})
	if err != nil {
		return err
	}
	conn := stream.AsConn()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	return stream.Stream(kvcorev1.StreamOptions{In: stdin, Out: stdout})
}
