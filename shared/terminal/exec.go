package terminal

import (
	"context"
	"io"
	"net/url"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/remotecommand"
	kvcorev1 "kubevirt.io/client-go/kubevirt/typed/core/v1"
)

// TerminalVar marks the processes of one terminal: its shell runs with
// TerminalVar=<the connection's id>, and so does everything started from
// it.
const TerminalVar = "LABKEEP_TERMINAL"

// Shell is what the terminal with id runs in a workspace container: bash
// as a login shell where the image has it, else sh, in root's home, with a
// TERM xterm.js understands, marked with TerminalVar. It needs nothing of
// the container but /bin/sh — in particular not sshd.
func Shell(id string) []string {
	return []string{"/bin/sh", "-c", `export TERM=xterm-256color ` + TerminalVar + `=` + id +
		`; cd ~ 2>/dev/null; if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l`}
}

// Hangup is what hangs up the terminal with id: SIGHUP to every process
// marked with its TerminalVar, as a terminal's hang-up signals its
// session. A stream that ends does not end its exec (the runtime keeps
// the TTY open), so without it the shell of a closed page would run on.
func Hangup(id string) []string {
	return []string{"/bin/sh", "-c", `for d in /proc/[0-9]*; do ` +
		`if tr '\0' '\n' <"$d/environ" 2>/dev/null | grep -qx '` + TerminalVar + `=` + id + `'; then kill -HUP "${d#/proc/}" 2>/dev/null; fi; done; true`}
}

// execPod runs command in the workspace container of Pod pod through
// pods/exec (Options.Exec), with a TTY when sizes is not nil.
func (h *Handler) execPod(ctx context.Context, pod string, command []string, stdin io.Reader, stdout io.Writer, sizes remotecommand.TerminalSizeQueue) error {
	tty := sizes != nil
	exec, err := h.o.Exec(h.o.Kube, h.kube, h.o.Namespace, pod, corev1.PodExecOptions{
		Command: command, Stdin: stdin != nil, Stdout: true, TTY: tty,
	})
	if err != nil {
		return err
	}
	o := remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Tty: tty}
	if tty {
		o.TerminalSizeQueue = sizes
	}
	return exec.StreamWithContext(ctx, o)
}

// serialConsole connects stdin and stdout to the serial console of VMI
// vmi: KubeVirt's virtualmachineinstances/console subresource
// (subresources.kubevirt.io), a WebSocket through the API server to
// virt-handler — the call kubevirt.io/client-go's
// VirtualMachineInstance(ns).SerialConsole makes. The serial console has
// no window size, so resizes are ignored. up is called once virt-handler
// has accepted the connection. The local stack's KubeVirt stand-in
// (virtsim) serves no subresources, so this path runs only against a real
// KubeVirt.
func (h *Handler) serialConsole(ctx context.Context, vmi string, stdin io.Reader, stdout io.Writer, up func()) error {
	stream, err := kvcorev1.AsyncSubresourceHelper(h.o.Kube, "virtualmachineinstances", h.o.Namespace, vmi, "console", url.Values{})
	if err != nil {
		return err
	}
	up()
	conn := stream.AsConn()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	return stream.Stream(kvcorev1.StreamOptions{In: stdin, Out: stdout})
}
