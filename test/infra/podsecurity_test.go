package infra_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The Pods labkeep's own components run (the functions, the reap
// forwarder, the reap CronJob's curl) need no privilege at all, so each
// passes the kube-apiserver's Pod Security admission at the "restricted"
// level. The workspace Pod, whose guardian sidecar needs host cgroups and
// capabilities, is the control: restricted must refuse it (which is why
// labkeep-sessions is labelled privileged).
func TestPodTemplatesMeetRestrictedPodSecurity(t *testing.T) {
	tests := []struct {
		name        string
		spec        func(t *testing.T) corev1.PodSpec
		wantRefused bool
	}{
		{"the functions (Knative Service template)", func(t *testing.T) corev1.PodSpec {
			_, spec, _ := functionsPod(t)
			// Knative names the container and fills the probe's port with
			// the container port.
			for i := range spec.Containers {
				c := &spec.Containers[i]
				if c.Name == "" {
					c.Name = "user-container"
				}
				if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Port.IntVal == 0 && len(c.Ports) > 0 {
					c.ReadinessProbe.HTTPGet.Port = intstr.FromInt32(c.Ports[0].ContainerPort)
				}
			}
			return spec
		}, false},
		{"the reap forwarder (Deployment template)", func(t *testing.T) corev1.PodSpec {
			var dep appsv1.Deployment
			typed(t, find(t, "reap-pingsource.yaml", "Deployment", ""), &dep)
			return dep.Spec.Template.Spec
		}, false},
		{"the reap CronJob (Job template)", func(t *testing.T) corev1.PodSpec {
			var cj batchv1.CronJob
			typed(t, find(t, "reap-cronjob.yaml", "CronJob", ""), &cj)
			return cj.Spec.JobTemplate.Spec.Template.Spec
		}, false},
		{"control: the guardian workspace Pod", func(t *testing.T) corev1.PodSpec {
			var pod corev1.Pod
			typed(t, find(t, "../guardian/workspace-pod.yaml", "Pod", ""), &pod)
			return pod.Spec
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := tt.spec(t)
			spec.ServiceAccountName = "" // the namespace's default one exists
			pod := corev1.Pod{Spec: spec}
			pod.APIVersion, pod.Kind = "v1", "Pod"
			pod.Name, pod.Namespace = "psa-check", restrictedNamespace
			obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&pod)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = api.apply(ctx, &unstructured.Unstructured{Object: obj}, "", true)
			var ns *notServedError
			switch {
			case errors.As(err, &ns):
				t.Fatal(err)
			case tt.wantRefused && err == nil:
				t.Fatal("restricted Pod Security admitted it; the check cannot tell privileged Pods apart")
			case tt.wantRefused && !strings.Contains(err.Error(), "violates PodSecurity"):
				t.Fatalf("refused for another reason: %v", err)
			case !tt.wantRefused && err != nil:
				t.Fatalf("refused in a namespace enforcing restricted Pod Security: %v", err)
			}
		})
	}
}
