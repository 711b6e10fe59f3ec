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
	t.Setenv("LABKEEP_SCHEDULER_TOKEN", strings.Repeat("t", 32))
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
		c.MaxConcurrentVms != 8 || c.HTTPAddr != ":8080" || c.CapacityWait != 60*time.Second {
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
		{"zero max VMs", "LABKEEP_MAX_CONCURRENT_VMS", "0"},
		{"missing scheduler token", "LABKEEP_SCHEDULER_TOKEN", ""},
		{"run deadline at the schedule period", "LABKEEP_REAP_RUN_DEADLINE", "1m"},
		{"grace beyond the provision timeout", "LABKEEP_REAP_PROVISION_GRACE", "11m"},
		{"capacity wait beyond the provision grace", "LABKEEP_CAPACITY_WAIT", "2m"},
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

// Validate's own messages, one per rule, on a Config built in code (as the
// test harnesses and platform shims build it): the message names the
// variable and says what is wrong, and a valid neighbour passes.
func TestValidateMessages(t *testing.T) {
	valid := func() Config {
		return Config{
			Env: "dev", DatabaseURL: "postgres://x/y", Namespace: "labkeep-sessions",
			SessionLifetime: time.Hour, SessionMaxLifetime: 3 * time.Hour, DeadlineGrace: 15 * time.Minute,
			MaxConcurrentVms: 8, LabsFile: "/labs.yaml", JWTSecret: strings.Repeat("j", 32),
			SchedulerToken: strings.Repeat("s", 16), KubeTimeout: 10 * time.Second,
		}
	}
	tests := []struct {
		name   string
		change func(*Config)
		want   string // "" = valid
	}{
		{"defaults are valid", func(*Config) {}, ""},
		{"scheduler token is required", func(c *Config) { c.SchedulerToken = "" },
			"LABKEEP_SCHEDULER_TOKEN: is required"},
		{"scheduler token too short", func(c *Config) { c.SchedulerToken = "short" },
			"LABKEEP_SCHEDULER_TOKEN: must be at least 16 bytes, got 5"},
		{"max VMs zero", func(c *Config) { c.MaxConcurrentVms = 0 },
			"LABKEEP_MAX_CONCURRENT_VMS: must be at least 1, got 0"},
		{"max VMs negative", func(c *Config) { c.MaxConcurrentVms = -3 },
			"LABKEEP_MAX_CONCURRENT_VMS: must be at least 1, got -3"},
		{"max VMs one", func(c *Config) { c.MaxConcurrentVms = 1 }, ""},
		{"run deadline at the period", func(c *Config) { c.ReapRunDeadline = time.Minute },
			"LABKEEP_REAP_RUN_DEADLINE: 1m0s must be below the reaper's schedule period 1m0s"},
		{"run deadline above the period", func(c *Config) { c.ReapRunDeadline = 90 * time.Second },
			"LABKEEP_REAP_RUN_DEADLINE: 1m30s must be below the reaper's schedule period 1m0s"},
		{"run deadline just below the period", func(c *Config) { c.ReapRunDeadline = 59 * time.Second }, ""},
		{"run deadline negative", func(c *Config) { c.ReapRunDeadline = -time.Second },
			"LABKEEP_REAP_RUN_DEADLINE: must not be negative"},
		{"grace above the timeout", func(c *Config) { c.ReapProvisionGrace, c.ReapProvisionTimeout = 5*time.Minute, 4*time.Minute },
			"LABKEEP_REAP_PROVISION_GRACE: 5m0s exceeds LABKEEP_REAP_PROVISION_TIMEOUT 4m0s"},
		{"grace above the default timeout", func(c *Config) { c.ReapProvisionGrace = 11 * time.Minute },
			"LABKEEP_REAP_PROVISION_GRACE: 11m0s exceeds LABKEEP_REAP_PROVISION_TIMEOUT 10m0s"},
		{"timeout below the default grace", func(c *Config) { c.ReapProvisionTimeout = time.Minute },
			"LABKEEP_REAP_PROVISION_GRACE: 2m0s exceeds LABKEEP_REAP_PROVISION_TIMEOUT 1m0s"},
		{"grace equal to the timeout", func(c *Config) { c.ReapProvisionGrace, c.ReapProvisionTimeout = 3*time.Minute, 3*time.Minute }, ""},
		{"capacity wait at the grace", func(c *Config) { c.CapacityWait = 2 * time.Minute },
			"LABKEEP_CAPACITY_WAIT: 2m0s must be below LABKEEP_REAP_PROVISION_GRACE 2m0s"},
		{"default capacity wait above a short grace", func(c *Config) { c.ReapProvisionGrace = 30 * time.Second },
			"LABKEEP_CAPACITY_WAIT: 1m0s must be below LABKEEP_REAP_PROVISION_GRACE 30s"},
		{"capacity wait negative", func(c *Config) { c.CapacityWait = -time.Second },
			"LABKEEP_CAPACITY_WAIT: must not be negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.change(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate = %v, want valid", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate = %v, want a message containing %q", err, tc.want)
			}
		})
	}
}
