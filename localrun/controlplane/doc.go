// Package controlplane builds and runs a real, disposable Kubernetes control
// plane (etcd, kube-apiserver, kube-controller-manager) on loopback, so tests
// and `make run` exercise the garbage collector, quota, Job and TTL
// controllers for real instead of a fake clientset. There is no kubelet:
// Pods are accepted and stay Pending, which is all labkeep needs of them.
package controlplane
