// Package kubevirt runs real KubeVirt on the local node: it builds
// KubeVirt's programs from the Go module proxy (build.go), and installs
// KubeVirt on the local cluster by applying the objects virt-operator
// would create (install.go), with guests under software emulation.
package kubevirt
