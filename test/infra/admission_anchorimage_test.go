package infra_test

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"

	"labkeep/shared/kube"
	"labkeep/shared/session"
)

// The policy's message for the anchor Job's image, as
// admission-policy.yaml writes it (its start).
const refusedAnchorImage = "the anchor Job must run an image of anchorImages"

// The anchor Job runs an image of anchorImages and no other image of the
// allowlist, and that image can be pinned by digest as guardian's can.
// Under admission-policy.yaml on the real API server (rbac.yaml, the
// functions impersonated):
//   - with the file's parameters, a copy of labkeep's own anchor passes the
//     policy (and finds its name taken), and one running a lab's image
//     (allowlisted, but its sshd would run in a Pod nobody watches) is
//     refused;
//   - with anchorImages naming repository@digest, labkeep's own session
//     with LABKEEP_ANCHOR_IMAGE at that digest is created for real, and a
//     copy of its anchor running the same repository by tag or by another
//     digest is refused.
func TestAdmissionPinsAnchorImage(t *testing.T) {
	// runs is an edit giving the anchor's container image.
	runs := func(image string) func(j *batchv1.Job) {
		return func(j *batchv1.Job) { j.Spec.Template.Spec.Containers[0].Image = image }
	}

	t.Run("anchorImages of the file", func(t *testing.T) {
		f := newShapeFixture(t, "anc", nil)
		testAdmission(t, f.fnDyn, f.place.Sessions, []admissionCase{
			{"labkeep's own anchor", f.ownAnchor(func(*batchv1.Job) {}), nameTaken},
			{"an anchor running a lab's image", f.ownAnchor(runs(f.workspace.Spec.Containers[0].Image)), refusedAnchorImage},
		})
	})

	t.Run("anchorImages pinned by digest", func(t *testing.T) {
		const repo = "registry.k8s.io/pause"
		pinned := pinnedTo(t, repo)
		f := newPolicyFixture(t, "apin", map[string]string{"anchorImages": pinned}, func(cfg *kube.Config) { cfg.AnchorImage = pinned })
		s, _ := f.ownSession(t, "shell")
		var anchor batchv1.Job
		typed(t, stored(t, jobsGVR, f.place.Sessions, session.AnchorName(s.ID)), &anchor)
		anchors := anchorCopies(&anchor, s.ID)
		testAdmission(t, f.fnDyn, f.place.Sessions, []admissionCase{
			{"labkeep's own anchor pinned by digest", anchors(func(*batchv1.Job) {}), nameTaken},
			{"an anchor of the pinned repository by tag", anchors(runs(repo + ":3.10")), refusedAnchorImage},
			{"an anchor of the pinned repository by another digest", anchors(runs(repo + "@sha256:" + strings.Repeat("f", 64))), refusedAnchorImage},
		})
	})
}
