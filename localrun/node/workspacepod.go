package node

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"labkeep/shared/kube"
)

// capabilityBits are the capabilities a workspace Pod may ask for, by the
// bit the kernel gives them in /proc/PID/status.
var capabilityBits = map[corev1.Capability]uint{
	"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "KILL": 5, "SETGID": 6, "SETUID": 7,
	"NET_BIND_SERVICE": 10, "NET_ADMIN": 12, "NET_RAW": 13, "SYS_CHROOT": 18, "SYS_PTRACE": 19,
	"SYS_ADMIN": 21, "SYS_NICE": 23, "SYS_RESOURCE": 24,
}

// WorkspacePod adapts a workspace Pod definition (YAML; empty means the
// built-in one) to this host: every capability a container adds that this
// process's bounding set lacks is dropped from the request, because runc
// cannot grant it and would refuse to start the container (here: root
// without CAP_SYS_RESOURCE). It returns the definition to hand the
// functions (LABKEEP_WORKSPACE_POD_FILE) and the capabilities it dropped,
// so callers can say what the local Pods lack.
func WorkspacePod(definition []byte) ([]byte, []corev1.Capability, error) {
	pod, err := kube.ParseWorkspacePod(definition)
	if err != nil {
		return nil, nil, err
	}
	bounding, err := boundingSet()
	if err != nil {
		return nil, nil, err
	}
	var dropped []corev1.Capability
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			sc := list[i].SecurityContext
			if sc == nil || sc.Capabilities == nil {
				continue
			}
			var keep []corev1.Capability
			for _, c := range sc.Capabilities.Add {
				if bit, known := capabilityBits[corev1.Capability(strings.TrimPrefix(string(c), "CAP_"))]; known && bounding&(1<<bit) == 0 {
					dropped = append(dropped, c)
					continue
				}
				keep = append(keep, c)
			}
			sc.Capabilities.Add = keep
		}
	}
	out, err := yaml.Marshal(pod)
	return out, dropped, err
}

// WriteWorkspacePod writes the built-in workspace Pod definition, adapted
// to this host (WorkspacePod), to path, for LABKEEP_WORKSPACE_POD_FILE, and
// returns the capabilities it dropped.
func WriteWorkspacePod(path string) ([]corev1.Capability, error) {
	pod, dropped, err := WorkspacePod(nil)
	if err != nil {
		return nil, err
	}
	return dropped, os.WriteFile(path, pod, 0o644)
}

// boundingSet is this process's capability bounding set.
func boundingSet() (uint64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("no CapBnd in /proc/self/status")
}
