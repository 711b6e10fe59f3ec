package node

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/kube"
)

// The adapted definition asks only for capabilities this host can grant,
// keeps everything else, and says what it dropped.
func TestWorkspacePodAsksOnlyForGrantableCapabilities(t *testing.T) {
	bounding, err := boundingSet()
	if err != nil {
		t.Fatal(err)
	}
	data, dropped, err := WorkspacePod(nil)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := kube.ParseWorkspacePod(data)
	if err != nil {
		t.Fatalf("adapted definition does not parse: %v", err)
	}
	orig, _ := kube.ParseWorkspacePod(nil)
	guardian := pod.Spec.InitContainers[0].SecurityContext.Capabilities.Add
	for _, c := range orig.Spec.InitContainers[0].SecurityContext.Capabilities.Add {
		grantable := bounding&(1<<capabilityBits[c]) != 0
		if kept := slices.Contains(guardian, c); kept != grantable {
			t.Errorf("guardian capability %s kept %v, host can grant it %v", c, kept, grantable)
		}
		if slices.Contains(dropped, c) == grantable {
			t.Errorf("dropped %v: %s reported wrongly", dropped, c)
		}
	}
	pod.Spec.InitContainers[0].SecurityContext.Capabilities.Add = orig.Spec.InitContainers[0].SecurityContext.Capabilities.Add
	if diff := cmp.Diff(orig, pod); diff != "" {
		t.Errorf("adapting changed more than capabilities (-built-in +adapted):\n%s", diff)
	}
}
