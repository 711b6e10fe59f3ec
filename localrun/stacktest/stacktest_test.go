package stacktest

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/functions/app"
)

func TestIsList(t *testing.T) {
	tests := []struct {
		path string
		want bool
	}{
		{"/apis/kubevirt.io/v1/namespaces/s/virtualmachines", true},
		{"/api/v1/namespaces/s/pods", true},
		{"/apis/kubevirt.io/v1/namespaces/s/virtualmachines/lk-1-vm", false},
		{"/api/v1/namespaces/s", false},
		{"/api/v1/namespaces", false},
		{"/apis/kubevirt.io/v1/virtualmachines", false},
	}
	for _, tc := range tests {
		if got := isList(&url.URL{Path: tc.path}); got != tc.want {
			t.Errorf("isList(%s) = %v, want %v", tc.path, got, tc.want)
		}
	}
}

func TestUntil(t *testing.T) {
	calls := 0
	err := Until(context.Background(), func() (bool, string) {
		calls++
		return calls == 3, "not yet"
	})
	if err != nil || calls != 3 {
		t.Errorf("Until = %v after %d calls, want nil after 3", err, calls)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = Until(ctx, func() (bool, string) { return false, "still pending" })
	if !errors.Is(err, context.Canceled) || err.Error() != "still pending (context canceled)" {
		t.Errorf("Until on an ended context = %v, want the last why and the context's error", err)
	}
}

func TestNamesMarksDeleting(t *testing.T) {
	got := Names([]Object{{Kind: "Job", Name: "lk-1-anchor"}, {Kind: "VirtualMachine", Name: "lk-1-vm", Deleting: true}})
	want := []string{"Job/lk-1-anchor", "VirtualMachine/lk-1-vm (deleting)"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Names (-want +got):\n%s", diff)
	}
}

// Options change exactly the settings they name; the rest stay
// app.DefaultConfig's.
func TestOptionsConfig(t *testing.T) {
	def := app.DefaultConfig()
	base := def
	base.Kube.AnchorImage, base.Kube.GuardianImage = AnchorImage, GuardianImage
	tests := []struct {
		name string
		o    Options
		want func(*app.Config)
	}{
		{"zero options keep the defaults", Options{}, func(*app.Config) {}},
		{"lifetime alone sets the cap to three times it", Options{Lifetime: time.Second},
			func(c *app.Config) { c.Policy.Lifetime, c.Policy.MaxLifetime = time.Second, 3*time.Second }},
		{"both lifetimes", Options{Lifetime: time.Second, MaxLifetime: 2 * time.Second},
			func(c *app.Config) { c.Policy.Lifetime, c.Policy.MaxLifetime = time.Second, 2*time.Second }},
		{"reaper and limits", Options{MaxVMs: 3, CapacityWait: time.Second, DryRun: true, RunDeadline: 5 * time.Second, DeadlineGrace: time.Minute},
			func(c *app.Config) {
				c.Limits.MaxVMs, c.Limits.CapacityWait, c.Reap.DryRun, c.Reap.RunDeadline, c.Kube.DeadlineGrace = 3, time.Second, true, 5*time.Second, time.Minute
			}},
		{"client rate limits", Options{KubeQPS: 500, KubeBurst: 1000}, func(c *app.Config) { c.Kube.QPS, c.Kube.Burst = 500, 1000 }},
		{"guardian's webhook", Options{GuardianWebhookURL: "http://10.217.0.1:8080/guardianAlert"},
			func(c *app.Config) { c.Kube.GuardianWebhookURL = "http://10.217.0.1:8080/guardianAlert" }},
		{"platform keys", Options{PlatformSSHKeys: []string{"ssh-ed25519 AAAA grader"}},
			func(c *app.Config) { c.Kube.PlatformSSHKeys = []string{"ssh-ed25519 AAAA grader"} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := base
			tc.want(&want)
			if diff := cmp.Diff(want, tc.o.config(def)); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}
