package node

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"labkeep/shared/kube"
)

// capabilityBits are the kernel's capabilities by the bit it gives them in
// /proc/PID/status: every one, so a capability this host cannot grant is
// always recognised and dropped from the request.
var capabilityBits = map[corev1.Capability]uint{
	"CHOWN": unix.CAP_CHOWN, "DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE,
	"DAC_READ_SEARCH": unix.CAP_DAC_READ_SEARCH, "FOWNER": unix.CAP_FOWNER, "FSETID": unix.CAP_FSETID,
	"KILL": unix.CAP_KILL, "SETGID": unix.CAP_SETGID, "SETUID": unix.CAP_SETUID,
	"SETPCAP": unix.CAP_SETPCAP, "LINUX_IMMUTABLE": unix.CAP_LINUX_IMMUTABLE,
	"NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE, "NET_BROADCAST": unix.CAP_NET_BROADCAST,
	"NET_ADMIN": unix.CAP_NET_ADMIN, "NET_RAW": unix.CAP_NET_RAW, "IPC_LOCK": unix.CAP_IPC_LOCK,
	"IPC_OWNER": unix.CAP_IPC_OWNER, "SYS_MODULE": unix.CAP_SYS_MODULE,
	"SYS_RAWIO": unix.CAP_SYS_RAWIO, "SYS_CHROOT": unix.CAP_SYS_CHROOT,
	"SYS_PTRACE": unix.CAP_SYS_PTRACE, "SYS_PACCT": unix.CAP_SYS_PACCT,
	"SYS_ADMIN": unix.CAP_SYS_ADMIN, "SYS_BOOT": unix.CAP_SYS_BOOT, "SYS_NICE": unix.CAP_SYS_NICE,
	"SYS_RESOURCE": unix.CAP_SYS_RESOURCE, "SYS_TIME": unix.CAP_SYS_TIME,
	"SYS_TTY_CONFIG": unix.CAP_SYS_TTY_CONFIG, "MKNOD": unix.CAP_MKNOD, "LEASE": unix.CAP_LEASE,
	"AUDIT_WRITE": unix.CAP_AUDIT_WRITE, "AUDIT_CONTROL": unix.CAP_AUDIT_CONTROL,
	"SETFCAP": unix.CAP_SETFCAP, "MAC_OVERRIDE": unix.CAP_MAC_OVERRIDE,
	"MAC_ADMIN": unix.CAP_MAC_ADMIN, "SYSLOG": unix.CAP_SYSLOG, "WAKE_ALARM": unix.CAP_WAKE_ALARM,
	"BLOCK_SUSPEND": unix.CAP_BLOCK_SUSPEND, "AUDIT_READ": unix.CAP_AUDIT_READ,
	"PERFMON": unix.CAP_PERFMON, "BPF": unix.CAP_BPF,
	"CHECKPOINT_RESTORE": unix.CAP_CHECKPOINT_RESTORE,
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
