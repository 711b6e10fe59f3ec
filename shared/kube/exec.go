package kube

import (
	"errors"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"labkeep/shared/labs"
)

// WorkspaceExecutor is a pods/exec call into the workspace container of
// Pod pod in namespace: through the API server to the kubelet and the
// container runtime, with no network path into the Pod. It speaks the
// WebSocket exec protocol and falls back to SPDY when the API server or a
// proxy on the way cannot upgrade to WebSocket, as kubectl does. opts
// names the command and which streams it has; its Container is set here.
func WorkspaceExecutor(rc *rest.Config, client kubernetes.Interface, namespace, pod string, opts corev1.PodExecOptions) (remotecommand.Executor, error) {
	return containerExecutor(rc, client, namespace, pod, labs.WorkspaceContainer, opts)
}

// canExec says why this adapter cannot exec (nil if it can): pods/exec
// needs the REST config NewForConfig keeps.
func (c *Cluster) canExec() error {
	if c.rc == nil {
		return errors.New("this cluster adapter was made without a REST config (NewForConfig): it cannot exec")
	}
	return nil
}

// containerExecutor is WorkspaceExecutor into container.
func containerExecutor(rc *rest.Config, client kubernetes.Interface, namespace, pod, container string, opts corev1.PodExecOptions) (remotecommand.Executor, error) {
	opts.Container = container
	u := client.CoreV1().RESTClient().Post().Namespace(namespace).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&opts, scheme.ParameterCodec).URL()
	ws, err := remotecommand.NewWebSocketExecutor(rc, "GET", u.String())
	if err != nil {
		return nil, err
	}
	spdy, err := remotecommand.NewSPDYExecutor(rc, "POST", u)
	if err != nil {
		return nil, err
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}
