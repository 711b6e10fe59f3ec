package kube

import (
	"errors"
	"net/url"
	"testing"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/alerts"
	"labkeep/shared/setting"
	"labkeep/shared/workspacekey"
)

// guardianEnv is the value of name in the workspace Pod's guardian
// container, and whether it is a plain value (not from a ConfigMap or
// Secret).
func guardianEnv(t *testing.T, b builder, name string) (string, bool) {
	t.Helper()
	pod, err := b.workspace(b.anchor())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range pod.Spec.InitContainers[0].Env {
		if e.Name == name {
			return e.Value, e.ValueFrom == nil
		}
	}
	return "", false
}

// With a webhook URL, each workspace's guardian posts to it with its own
// session's credentials; without one, the definition's GUARDIAN_WEBHOOK_URL
// (the labkeep-guardian ConfigMap) stays.
func TestWorkspaceGuardianWebhook(t *testing.T) {
	b := testBuilder(t, "shell")
	if _, plain := guardianEnv(t, b, "GUARDIAN_WEBHOOK_URL"); plain {
		t.Errorf("without LABKEEP_GUARDIAN_WEBHOOK_URL the definition's ConfigMap reference must stay")
	}
	key := workspacekey.Key{Secret: []byte("0123456789abcdef0123456789abcdef"), Env: "dev"}
	b.cfg.GuardianWebhookURL, b.cfg.WorkspaceKey = "https://labkeep.example/guardianAlert", key
	got, plain := guardianEnv(t, b, "GUARDIAN_WEBHOOK_URL")
	u, err := url.Parse(got)
	if !plain || err != nil {
		t.Fatalf("GUARDIAN_WEBHOOK_URL = %q (plain %v, %v)", got, plain, err)
	}
	pass, _ := u.User.Password()
	if diff := cmp.Diff([]string{b.sess.ID, alerts.Key(key).Token(b.sess.ID), "labkeep.example", "/guardianAlert"},
		[]string{u.User.Username(), pass, u.Host, u.Path}); diff != "" {
		t.Errorf("webhook URL (-want +got):\n%s", diff)
	}
}

func TestGuardianWebhookSetting(t *testing.T) {
	key := workspacekey.Key{Secret: []byte("k"), Env: "dev"}
	tests := []struct {
		name, url string
		key       workspacekey.Key
		ok        bool
	}{
		{"none", "", workspacekey.Key{}, true},
		{"an https URL", "https://labkeep.example/guardianAlert", key, true},
		{"no key", "https://labkeep.example/guardianAlert", workspacekey.Key{}, false},
		{"credentials of its own", "https://u:p@labkeep.example/guardianAlert", key, false},
		{"relative", "/guardianAlert", key, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := guardianWebhook(tc.url, tc.key)
			var se *setting.Error
			if (err == nil) != tc.ok || (err != nil && (!errors.As(err, &se) || se.Field != "GuardianWebhookURL")) {
				t.Errorf("guardianWebhook(%q) = %v, want ok=%v", tc.url, err, tc.ok)
			}
		})
	}
}
