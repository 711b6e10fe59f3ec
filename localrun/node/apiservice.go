package node

import (
	"context"
	"fmt"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// publishAPI points the default/kubernetes Service at the API server's
// relay on the Pods' gateway (apiForward), as the API server itself does
// on a cluster whose Pods reach its address: the EndpointSlice kube-proxy
// and the cluster DNS read. The control plane runs with no
// endpoint reconciler, so nothing overwrites them.
func (n *Node) publishAPI(ctx context.Context, cs kubernetes.Interface, apiAddr string) error {
	_, portStr, err := net.SplitHostPort(apiAddr)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return err
	}
	const ns, name = metav1.NamespaceDefault, "kubernetes"
	ready, portName, port32, tcp := true, "https", int32(port), corev1.ProtocolTCP
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: name,
			discoveryv1.LabelManagedBy:   "labkeep-node",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{n.net.gateway}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port32, Protocol: &tcp}},
	}
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("endpoint slice of the kubernetes Service: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("endpoint slice of the kubernetes Service: %w", err)
	}
	return nil
}
