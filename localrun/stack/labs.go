package stack

import (
	"fmt"

	"sigs.k8s.io/yaml"

	"labkeep/localrun/images"
	"labkeep/shared/labs"
)

// LocalVMLabs returns the lab catalog catalog (a labs file) with every VM
// lab made to boot on the local node under real KubeVirt: its disk is the
// local guest disk (images.GuestDebian, Debian 12 with cloud-init, sshd
// and the guest agent; nothing can be pulled here), and its nodes are
// sized for a 2-core machine that emulates every guest instruction in
// software: 1 GiB each, one vCPU for a one-VM lab, half a CPU each for a
// lab of several VMs (so three fit beside KubeVirt's own Pods). Pod labs
// and everything else are kept as they are.
func LocalVMLabs(catalog []byte) ([]byte, error) {
	var f struct {
		Labs []labs.Lab `json:"labs"`
	}
	if err := yaml.UnmarshalStrict(catalog, &f); err != nil {
		return nil, fmt.Errorf("lab catalog: %w", err)
	}
	for i, l := range f.Labs {
		if l.Kind != labs.KindVM {
			continue
		}
		l.Disk = labs.Disk{ContainerDisk: images.GuestDebian}
		cpu := "1"
		if l.VMCount() > 1 {
			cpu = "500m"
		}
		for j := range l.Nodes {
			l.Nodes[j].CPU, l.Nodes[j].Memory = cpu, "1Gi"
		}
		f.Labs[i] = l
	}
	out, err := yaml.Marshal(f)
	if err != nil {
		return nil, err
	}
	if _, err := labs.Parse(out); err != nil {
		return nil, fmt.Errorf("local lab catalog: %w", err)
	}
	return out, nil
}
