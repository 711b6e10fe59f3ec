package app

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kelseyhightower/envconfig"
)

func setValid(t *testing.T) {
	t.Helper()
	t.Setenv("LABKEEP_ENV", "dev")
	t.Setenv("LABKEEP_DATABASE_URL", "postgres://nowhere/labkeep")
	t.Setenv("LABKEEP_JWT_SECRET", strings.Repeat("s", 32))
}

func TestConfigDefaults(t *testing.T) {
	setValid(t)
	var c Config
	if err := envconfig.Process(EnvPrefix, &c); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.SessionLifetime != 60*time.Minute || c.SessionMaxLifetime != 180*time.Minute || c.DeadlineGrace != 15*time.Minute ||
		c.MaxConcurrentVms != 8 || c.HTTPAddr != ":8080" {
		t.Errorf("defaults = %+v", c)
	}
}

// Every invalid setting fails at start with a message naming the variable.
func TestInvalidConfigNamesTheVariable(t *testing.T) {
	tests := []struct{ name, variable, value string }{
		{"missing env", "LABKEEP_ENV", ""},
		{"env not a label", "LABKEEP_ENV", "Dev Env!"},
		{"missing database", "LABKEEP_DATABASE_URL", ""},
		{"missing secret", "LABKEEP_JWT_SECRET", ""},
		{"short secret", "LABKEEP_JWT_SECRET", "short"},
		{"unparsable lifetime", "LABKEEP_SESSION_LIFETIME", "an hour"},
		{"zero lifetime", "LABKEEP_SESSION_LIFETIME", "0s"},
		{"cap below lifetime", "LABKEEP_SESSION_MAX_LIFETIME", "30m"},
		{"negative grace", "LABKEEP_DEADLINE_GRACE", "-1m"},
		{"non-numeric max VMs", "LABKEEP_MAX_CONCURRENT_VMS", "eight"},
		{"negative max VMs", "LABKEEP_MAX_CONCURRENT_VMS", "-1"},
		{"bad namespace", "LABKEEP_NAMESPACE", "Not_A_Namespace"},
		{"zero kube timeout", "LABKEEP_KUBE_TIMEOUT", "0s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			setValid(t)
			if tc.value == "" {
				os.Unsetenv(tc.variable)
			} else {
				t.Setenv(tc.variable, tc.value)
			}
			var c Config
			err := envconfig.Process(EnvPrefix, &c)
			if err == nil {
				err = c.Validate()
			}
			if err == nil || !strings.Contains(err.Error(), tc.variable) {
				t.Errorf("error = %v, want one naming %s", err, tc.variable)
			}
		})
	}
}

func TestBuildRejectsBadLabsFile(t *testing.T) {
	setValid(t)
	var c Config
	if err := envconfig.Process(EnvPrefix, &c); err != nil {
		t.Fatal(err)
	}
	c.LabsFile = filepath.Join(t.TempDir(), "labs.yaml")
	os.WriteFile(c.LabsFile, []byte("labs: [{name: x, kind: lxc}]"), 0o644)
	_, err := Build(context.Background(), c, time.Now, slog.Default())
	if err == nil || !strings.Contains(err.Error(), "LABKEEP_LABS_FILE") {
		t.Errorf("Build = %v, want an error naming LABKEEP_LABS_FILE", err)
	}
}

// Every LABKEEP_* variable of the issue is read under exactly that name,
// and unprefixed look-alikes (DATABASE_URL, KUBECONFIG) are ignored.
func TestEveryVariableIsRead(t *testing.T) {
	setValid(t)
	t.Setenv("DATABASE_URL", "postgres://unprefixed")
	t.Setenv("KUBECONFIG", "/unprefixed")
	vars := map[string]string{
		"LABKEEP_ENV": "prod", "LABKEEP_DATABASE_URL": "postgres://db/x", "LABKEEP_NAMESPACE": "vms",
		"LABKEEP_SESSION_LIFETIME": "2m", "LABKEEP_SESSION_MAX_LIFETIME": "5m", "LABKEEP_DEADLINE_GRACE": "1m",
		"LABKEEP_MAX_CONCURRENT_VMS": "3", "LABKEEP_LABS_FILE": "/labs.yaml", "LABKEEP_JWT_SECRET": strings.Repeat("k", 40),
		"LABKEEP_HTTP_ADDR": "127.0.0.1:9", "LABKEEP_SSH_AUTHORIZED_KEYS": "ssh-ed25519 AAA a,ssh-ed25519 BBB b",
	}
	for k, v := range vars {
		t.Setenv(k, v)
	}
	var c Config
	if err := envconfig.Process(EnvPrefix, &c); err != nil {
		t.Fatal(err)
	}
	got := []any{c.Env, c.DatabaseURL, c.Namespace, c.SessionLifetime, c.SessionMaxLifetime, c.DeadlineGrace,
		c.MaxConcurrentVms, c.LabsFile, len(c.JWTSecret), c.HTTPAddr, len(c.SSHAuthorizedKeys), c.Kubeconfig}
	want := []any{"prod", "postgres://db/x", "vms", 2 * time.Minute, 5 * time.Minute, time.Minute,
		3, "/labs.yaml", 40, "127.0.0.1:9", 2, ""}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("field %d = %v, want %v", i, got[i], want[i])
		}
	}
}
