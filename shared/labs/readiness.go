package labs

import "fmt"

// Readiness is when a VM node counts as running (vm labs only): KubeVirt
// probes the guest and marks the VirtualMachineInstance Ready only once
// the probe passes, and labkeep reports a session running only when every
// node is Ready. Without a probe a VM is Ready as soon as it boots, long
// before sshd listens, and a student told "running" cannot log in.
type Readiness struct {
	// TCPPort must accept a TCP connection; default the lab's SSHPort.
	TCPPort int32 `json:"tcpPort,omitempty"`
	// InitialDelaySeconds and PeriodSeconds are KubeVirt's probe timing;
	// 0 keeps KubeVirt's defaults (no delay, every 10 seconds).
	InitialDelaySeconds int32 `json:"initialDelaySeconds,omitempty"`
	PeriodSeconds       int32 `json:"periodSeconds,omitempty"`
}

// normaliseReadiness gives a vm lab its readiness probe (default: TCP on
// the SSH port) and refuses one on a pod lab, whose workspace Pod has its
// own.
func normaliseReadiness(l *Lab) error {
	if l.Kind != KindVM {
		if l.Readiness != nil {
			return fmt.Errorf("readiness: only vm labs have one; a pod lab's workspace Pod has its own")
		}
		return nil
	}
	r := l.VMReadiness()
	switch {
	case r.TCPPort < 1 || r.TCPPort > 65535:
		return fmt.Errorf("readiness.tcpPort %d out of range", r.TCPPort)
	case r.InitialDelaySeconds < 0:
		return fmt.Errorf("readiness.initialDelaySeconds must not be negative")
	case r.PeriodSeconds < 0:
		return fmt.Errorf("readiness.periodSeconds must not be negative")
	}
	l.Readiness = &r
	return nil
}

// VMReadiness is the readiness of the lab's VM nodes: the catalog's, with
// the port defaulting to the SSH port (22 when that is unset too).
func (l Lab) VMReadiness() Readiness {
	r := Readiness{}
	if l.Readiness != nil {
		r = *l.Readiness
	}
	if r.TCPPort == 0 {
		r.TCPPort = l.SSHPort
	}
	if r.TCPPort == 0 {
		r.TCPPort = DefaultSSHPort
	}
	return r
}
