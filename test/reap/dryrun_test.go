package reap_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/localrun/stacktest"
	"labkeep/shared/session"
)

// POST /adminReapNow {"dryRun": true} on the deployed handler reports what a
// run would delete and deletes nothing: the namespace and the session's row
// are as before, and the run that follows without dryRun deletes what the
// dry run reported.
func TestAdminReapNowDryRunDeletesNothing(t *testing.T) {
	h := newBackend(t, stacktest.Options{})
	expired := h.open("s-dry", "linux-vm")
	h.Clock.Advance(61 * time.Minute)
	admin := h.Token("ops", "admin")
	before := h.everything()

	type report struct {
		runJSON
		DryRun bool `json:"dryRun"`
	}
	reapNow := func(body string) report {
		t.Helper()
		r := h.Do("POST", "/adminReapNow", admin, body, "application/json")
		var got report
		if err := json.Unmarshal(r.Body, &got); err != nil || r.Status != 200 {
			t.Fatalf("adminReapNow %s: %d %s", body, r.Status, r.Body)
		}
		return got
	}

	dry := reapNow(`{"dryRun": true}`)
	if !dry.DryRun || dry.Trigger != "admin" || dry.Counts["expired"] != 1 || len(dry.Failures) != 0 {
		t.Fatalf("dry run's report: %+v, want dryRun, 1 expired, no failures", dry)
	}
	if diff := cmp.Diff(before, h.everything()); diff != "" {
		t.Fatalf("the dry run changed the namespace (-before +after):\n%s", diff)
	}
	if got := h.status(expired.ID); got != session.StatusRunning {
		t.Fatalf("after the dry run the session is %s, want still %s", got, session.StatusRunning)
	}
	if r := h.Do("POST", "/adminReapNow", admin, `{"dryRun": "yes"}`, "application/json"); r.Status != 400 || r.Code != "bad_request" {
		t.Errorf(`{"dryRun": "yes"}: %d %s, want 400 bad_request`, r.Status, r.Body)
	}

	full := reapNow(`{"dryRun": false}`)
	if full.DryRun || full.Counts["expired"] != 1 {
		t.Fatalf("the run after the dry run: %+v, want 1 expired", full)
	}
	if got := h.status(expired.ID); got != session.StatusExpired {
		t.Fatalf("after the real run the session is %s, want %s", got, session.StatusExpired)
	}
	h.WaitGone(expired.ID)
}
