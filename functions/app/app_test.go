package app

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/infra"
	"labkeep/shared/access"
	"labkeep/shared/alerts"
	"labkeep/shared/httpapi"
	"labkeep/shared/kube"
	"labkeep/shared/lifetime"
	"labkeep/shared/reap"
	"labkeep/shared/seating"
	"labkeep/shared/session"
	"labkeep/shared/termlimit"
)

func setValid(t *testing.T) {
	t.Helper()
	t.Setenv("LABKEEP_ENV", "dev")
	t.Setenv("LABKEEP_DATABASE_URL", "postgres://nowhere/labkeep")
	t.Setenv("LABKEEP_JWT_SECRET", strings.Repeat("s", 32))
	t.Setenv("LABKEEP_WORKSPACE_KEY", strings.Repeat("w", 32))
	t.Setenv("LABKEEP_SCHEDULER_TOKEN", strings.Repeat("t", 32))
}

// required are the variables setValid sets, which have no default.
var required = map[string]bool{"LABKEEP_ENV": true, "LABKEEP_DATABASE_URL": true, "LABKEEP_JWT_SECRET": true, "LABKEEP_WORKSPACE_KEY": true,
	"LABKEEP_SCHEDULER_TOKEN": true}

func TestConfigDefaults(t *testing.T) {
	setValid(t)
	c, err := FromEnv(os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Policy.Lifetime != 60*time.Minute || c.Policy.MaxLifetime != 180*time.Minute || c.Kube.DeadlineGrace != 15*time.Minute ||
		c.Limits.MaxVMs != 8 || c.HTTPAddr != ":8080" || c.Limits.CapacityWait != 60*time.Second {
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
		{"missing workspace key", "LABKEEP_WORKSPACE_KEY", ""},
		{"short workspace key", "LABKEEP_WORKSPACE_KEY", "short"},
		{"workspace key is the JWT secret", "LABKEEP_WORKSPACE_KEY", strings.Repeat("s", 32)},
		{"unparsable lifetime", "LABKEEP_SESSION_LIFETIME", "an hour"},
		{"zero lifetime", "LABKEEP_SESSION_LIFETIME", "0s"},
		{"cap below lifetime", "LABKEEP_SESSION_MAX_LIFETIME", "30m"},
		{"negative grace", "LABKEEP_DEADLINE_GRACE", "-1m"},
		{"non-numeric max VMs", "LABKEEP_MAX_CONCURRENT_VMS", "eight"},
		{"negative max VMs", "LABKEEP_MAX_CONCURRENT_VMS", "-1"},
		{"zero max VMs", "LABKEEP_MAX_CONCURRENT_VMS", "0"},
		{"zero max workspace Pods", "LABKEEP_MAX_CONCURRENT_PODS", "0"},
		{"missing scheduler token", "LABKEEP_SCHEDULER_TOKEN", ""},
		{"run deadline at the schedule period", "LABKEEP_REAP_RUN_DEADLINE", "1m"},
		{"grace beyond the provision timeout", "LABKEEP_REAP_PROVISION_GRACE", "11m"},
		{"capacity wait beyond the provision grace", "LABKEEP_CAPACITY_WAIT", "2m"},
		{"bad namespace", "LABKEEP_NAMESPACE", "Not_A_Namespace"},
		{"the old name of the platform keys", "LABKEEP_SSH_AUTHORIZED_KEYS", "ssh-ed25519 AAA grader"},
		{"workspace Pod file missing", "LABKEEP_WORKSPACE_POD_FILE", "/nonexistent/workspace-pod.yaml"},
		{"zero kube timeout", "LABKEEP_KUBE_TIMEOUT", "0s"},
		{"negative token leeway", "LABKEEP_JWT_LEEWAY", "-1s"},
		{"token leeway beyond clock skew", "LABKEEP_JWT_LEEWAY", "1h"},
		{"zero token lifetime", "LABKEEP_JWT_MAX_LIFETIME", "0s"},
		{"unparsable token lifetime", "LABKEEP_JWT_MAX_LIFETIME", "a day"},
		{"audience with a trailing space", "LABKEEP_JWT_AUDIENCE", "labkeep "},
		{"relative guardian webhook", "LABKEEP_GUARDIAN_WEBHOOK_URL", "/guardianAlert"},
		{"guardian webhook with a query", "LABKEEP_GUARDIAN_WEBHOOK_URL", "https://labkeep.example/guardianAlert?token=x"},
		{"no alerts kept", "LABKEEP_GUARDIAN_ALERTS_PER_SESSION", "0"},
		{"alert texts too short", "LABKEEP_GUARDIAN_ALERT_MAX_TEXT", "10"},
		{"metrics on the public listener", "LABKEEP_METRICS_ADDR", ":8080"},
		{"negative labs reload", "LABKEEP_LABS_RELOAD", "-1s"},
		{"unparsable warm pool", "LABKEEP_WARM_POOL", "linux-vm=many"},
		{"unknown warm pool time zone", "LABKEEP_WARM_POOL_TZ", "Mars/Olympus"},
		{"zero warm pool TTL", "LABKEEP_WARM_POOL_TTL", "0s"},
		{"negative warm pool lead", "LABKEEP_WARM_POOL_LEAD", "-1m"},
		{"no terminal per student", "LABKEEP_TERMINALS_PER_STUDENT", "0"},
		{"no terminal per process", "LABKEEP_TERMINALS_PER_PROCESS", "0"},
		{"zero terminal auth timeout", "LABKEEP_TERMINAL_AUTH_TIMEOUT", "0s"},
		{"zero terminal idle timeout", "LABKEEP_TERMINAL_IDLE", "0s"},
		{"negative terminal lifetime", "LABKEEP_TERMINAL_MAX_LIFETIME", "-1h"},
		{"zero terminal recheck", "LABKEEP_TERMINAL_RECHECK", "0s"},
		{"negative opens per student", "LABKEEP_OPENS_PER_STUDENT", "-1"},
		{"an open rate with no window", "LABKEEP_OPENS_WINDOW", "0s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			setValid(t)
			if tc.value == "" {
				os.Unsetenv(tc.variable)
			} else {
				t.Setenv(tc.variable, tc.value)
			}
			c, err := FromEnv(os.LookupEnv)
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
	c, err := FromEnv(os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	c.LabsFile = filepath.Join(t.TempDir(), "labs.yaml")
	os.WriteFile(c.LabsFile, []byte("labs: [{name: x, kind: lxc}]"), 0o644)
	_, err = Build(context.Background(), c, time.Now, slog.Default())
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
		"LABKEEP_HTTP_ADDR": "127.0.0.1:9", "LABKEEP_PLATFORM_SSH_KEYS": "ssh-ed25519 AAA a,ssh-ed25519 BBB b",
	}
	for k, v := range vars {
		t.Setenv(k, v)
	}
	c, err := FromEnv(os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	got := []any{c.Env, c.DatabaseURL, c.Kube.Namespace, c.Policy.Lifetime, c.Policy.MaxLifetime, c.Kube.DeadlineGrace,
		c.Limits.MaxVMs, c.LabsFile, len(c.JWTSecret), c.HTTPAddr, len(c.Kube.PlatformSSHKeys), c.Kubeconfig}
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
		c := DefaultConfig()
		c.Env, c.DatabaseURL, c.JWTSecret, c.SchedulerToken = "dev", "postgres://x/y", strings.Repeat("j", 32), strings.Repeat("s", 16)
		c.WorkspaceSecret = strings.Repeat("w", 32)
		return c
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
		{"refused opens kept shorter than the open rate's window", func(c *Config) { c.OpenRate.Per, c.Reap.RefusedRetention = 2*time.Hour, time.Hour },
			"LABKEEP_REAP_REFUSED_RETENTION: 1h0m0s is below LABKEEP_OPENS_WINDOW 2h0m0s"},
		{"refused opens kept as long as the open rate's window", func(c *Config) { c.OpenRate.Per, c.Reap.RefusedRetention = 2*time.Hour, 2*time.Hour }, ""},
		{"metrics token on the public handler", func(c *Config) { c.MetricsToken = strings.Repeat("m", 16) }, ""},
		{"metrics token too short", func(c *Config) { c.MetricsToken = "short" },
			"LABKEEP_METRICS_TOKEN: must be at least 16 bytes, got 5"},
		{"max VMs zero", func(c *Config) { c.Limits.MaxVMs = 0 },
			"LABKEEP_MAX_CONCURRENT_VMS: must be at least 1, got 0"},
		{"max VMs negative", func(c *Config) { c.Limits.MaxVMs = -3 },
			"LABKEEP_MAX_CONCURRENT_VMS: must be at least 1, got -3"},
		{"max VMs one", func(c *Config) { c.Limits.MaxVMs = 1 }, ""},
		{"run deadline at the period", func(c *Config) { c.Reap.RunDeadline = time.Minute },
			"LABKEEP_REAP_RUN_DEADLINE: 1m0s must be below the reaper's schedule period 1m0s"},
		{"run deadline above the period", func(c *Config) { c.Reap.RunDeadline = 90 * time.Second },
			"LABKEEP_REAP_RUN_DEADLINE: 1m30s must be below the reaper's schedule period 1m0s"},
		{"run deadline just below the period", func(c *Config) { c.Reap.RunDeadline = 59 * time.Second }, ""},
		{"run deadline negative", func(c *Config) { c.Reap.RunDeadline = -time.Second },
			"LABKEEP_REAP_RUN_DEADLINE: must be positive"},
		{"grace above the timeout", func(c *Config) { c.Reap.ProvisionGrace, c.Reap.ProvisionTimeout = 5*time.Minute, 4*time.Minute },
			"LABKEEP_REAP_PROVISION_GRACE: 5m0s exceeds the provision timeout 4m0s"},
		{"grace above the default timeout", func(c *Config) { c.Reap.ProvisionGrace = 11 * time.Minute },
			"LABKEEP_REAP_PROVISION_GRACE: 11m0s exceeds the provision timeout 10m0s"},
		{"timeout below the default grace", func(c *Config) { c.Reap.ProvisionTimeout = time.Minute },
			"LABKEEP_REAP_PROVISION_GRACE: 2m0s exceeds the provision timeout 1m0s"},
		{"grace equal to the timeout", func(c *Config) { c.Reap.ProvisionGrace, c.Reap.ProvisionTimeout = 3*time.Minute, 3*time.Minute }, ""},
		{"capacity wait at the grace", func(c *Config) { c.Limits.CapacityWait = 2 * time.Minute },
			"LABKEEP_CAPACITY_WAIT: 2m0s must be below LABKEEP_REAP_PROVISION_GRACE 2m0s"},
		{"default capacity wait above a short grace", func(c *Config) { c.Reap.ProvisionGrace = 30 * time.Second },
			"LABKEEP_CAPACITY_WAIT: 1m0s must be below LABKEEP_REAP_PROVISION_GRACE 30s"},
		{"capacity wait negative", func(c *Config) { c.Limits.CapacityWait = -time.Second },
			"LABKEEP_CAPACITY_WAIT: must be positive"},
		{"token leeway negative", func(c *Config) { c.Tokens.Leeway = -time.Second },
			"LABKEEP_JWT_LEEWAY: must not be negative, got -1s"},
		{"token lifetime zero", func(c *Config) { c.Tokens.MaxLifetime = 0 },
			"LABKEEP_JWT_MAX_LIFETIME: must be positive, got 0s"},
		{"token audience and issuer required", func(c *Config) { c.Tokens.Audience, c.Tokens.Issuer = "labkeep", "https://portal.example" }, ""},
		{"workspace key is required", func(c *Config) { c.WorkspaceSecret = "" },
			"LABKEEP_WORKSPACE_KEY: must be at least 32 bytes, got 0"},
		{"workspace key is not the JWT secret", func(c *Config) { c.WorkspaceSecret = c.JWTSecret },
			"LABKEEP_WORKSPACE_KEY: must not be LABKEEP_JWT_SECRET"},
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

// Every default of the settings is the owning package's: with only the
// required variables set, the configuration each package receives is
// exactly that package's DefaultConfig, and every variable of the table
// holds the default DefaultConfig gives it (the one the reference shows).
func TestDefaultsAreThePackagesDefaults(t *testing.T) {
	setValid(t)
	c, err := FromEnv(os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	wantKube := kube.DefaultConfig()
	wantKube.Env, wantKube.MaxLifetime = "dev", lifetime.DefaultPolicy().MaxLifetime
	wantKube.WorkspaceKey = c.WorkspaceKey()
	wantReap := reap.DefaultConfig()
	wantReap.Env = "dev"
	r := must(c.resolve())
	for name, diff := range map[string]string{
		"lifetime": cmp.Diff(lifetime.DefaultPolicy(), r.Policy),
		"kube":     cmp.Diff(wantKube, r.Kube),
		"reap":     cmp.Diff(wantReap, r.Reap),
		"seating":  cmp.Diff(seating.DefaultLimits(), r.Limits),
		"tokens":   cmp.Diff(access.DefaultTokenRules(), r.Tokens),
		"alerts":   cmp.Diff(alerts.DefaultLimits(), r.Alerts),
		"terminal": cmp.Diff(termlimit.DefaultLimits(), r.Terminal),
	} {
		if diff != "" {
			t.Errorf("%s config from the environment differs from the package default (-want +got):\n%s", name, diff)
		}
	}
	if c.RetryAfter != httpapi.DefaultRetryAfter {
		t.Errorf("RetryAfter = %s, want httpapi's %s", c.RetryAfter, httpapi.DefaultRetryAfter)
	}
	def := DefaultConfig()
	want, got := def.Settings(), c.Settings()
	for i, v := range got.Vars {
		if v.Default() != want.Vars[i].Default() && !required[got.Key(v)] {
			t.Errorf("%s = %q with only the required variables set, want DefaultConfig's %q", got.Key(v), v.Default(), want.Vars[i].Default())
		}
	}
}

// Every field of every package configuration is read from some variable:
// with every variable set to a value other than its default, no field of
// Config keeps its default, and no field of the composed package
// configurations does either.
func TestEveryConfigFieldComesFromAVariable(t *testing.T) {
	podFile := filepath.Join(t.TempDir(), "workspace-pod.yaml")
	if err := os.WriteFile(podFile, infra.WorkspacePod(), 0o644); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{
		"LABKEEP_ENV": "prod", "LABKEEP_DATABASE_URL": "postgres://db/x", "LABKEEP_NAMESPACE": "vms",
		"LABKEEP_SESSION_LIFETIME": "2m", "LABKEEP_SESSION_MAX_LIFETIME": "5m", "LABKEEP_DEADLINE_GRACE": "1m",
		"LABKEEP_MAX_CONCURRENT_VMS": "3", "LABKEEP_MAX_CONCURRENT_PODS": "7", "LABKEEP_LABS_FILE": "/labs.yaml", "LABKEEP_JWT_SECRET": strings.Repeat("k", 40),
		"LABKEEP_WORKSPACE_KEY": strings.Repeat("w", 40), "LABKEEP_HTTP_ADDR": "127.0.0.1:9", "LABKEEP_METRICS_ADDR": "127.0.0.1:10", "LABKEEP_METRICS_TOKEN": strings.Repeat("m", 16), "LABKEEP_LABS_RELOAD": "3s", "LABKEEP_KUBECONFIG": "/kubeconfig", "LABKEEP_KUBE_TIMEOUT": "3s",
		"LABKEEP_ANCHOR_IMAGE": "pause:x", "LABKEEP_ANCHOR_BACKOFF_LIMIT": "2", "LABKEEP_ANCHOR_COMPLETIONS": "7",
		"LABKEEP_GUARDIAN_IMAGE": "guardian:x", "LABKEEP_PLATFORM_SSH_KEYS": "ssh-ed25519 AAA a",
		"LABKEEP_RETRY_AFTER": "9s", "LABKEEP_SCHEDULER_TOKEN": strings.Repeat("t", 20), "LABKEEP_CAPACITY_WAIT": "20s",
		"LABKEEP_CLEANUP_TIMEOUT": "7s", "LABKEEP_QUEUE_IDLE": "30s", "LABKEEP_WORKSPACE_POD_FILE": podFile,
		"LABKEEP_REAP_DRY_RUN": "true", "LABKEEP_REAP_RUN_DEADLINE": "40s", "LABKEEP_REAP_PROVISION_TIMEOUT": "9m",
		"LABKEEP_REAP_PROVISION_GRACE": "3m", "LABKEEP_KUBE_QPS": "7", "LABKEEP_KUBE_BURST": "9", "LABKEEP_HOME_TOTAL": "3Gi", "LABKEEP_REAP_HOME_RETENTION": "240h", "LABKEEP_HOME_STORAGE_CLASS": "homes", "LABKEEP_HOME_READER_IMAGE": "ghcr.io/labkeep/reader:1",
		"LABKEEP_REAP_WORKERS": "3", "LABKEEP_ADMIN_STATUS_RUNS": "4",
		"LABKEEP_JWT_AUDIENCE": "labkeep", "LABKEEP_JWT_ISSUER": "https://portal.example", "LABKEEP_JWT_COURSES_CLAIM": "courses", "LABKEEP_RESERVATION_LEAD": "7m", "LABKEEP_RESERVATION_RELEASE": "9m", "LABKEEP_RESERVATION_MAX_LENGTH": "5h", "LABKEEP_RESERVATION_MAX_AHEAD": "720h", "LABKEEP_JWT_MAX_LIFETIME": "2h", "LABKEEP_JWT_LEEWAY": "5s",
		"LABKEEP_REAP_RETENTION": "48h", "LABKEEP_REAP_REFUSED_RETENTION": "3h", "LABKEEP_REAP_RETENTION_BATCH": "5",
		"LABKEEP_REAP_ABSENT_CONFIRM": "10s", "LABKEEP_REAP_DOWN_GRACE": "2m",
		"LABKEEP_DB_MAX_CONNS": "12", "LABKEEP_REAP_DB_CONNS": "3",
		"LABKEEP_SSH_SOURCE_CIDRS": "203.0.113.0/24", "LABKEEP_EGRESS_BLOCKED_CIDRS": "10.0.0.0/8,fd00::/8", "LABKEEP_PLATFORM_NAMESPACE": "fn",
		"LABKEEP_PLATFORM_SOURCE_CIDRS": "198.51.100.7/32", "LABKEEP_CLUSTER_DNS": "dns-system/app=resolver,tier=node",
		"LABKEEP_GUARDIAN_WEBHOOK_URL": "https://labkeep.example/guardianAlert", "LABKEEP_GUARDIAN_ALERT_MAX_TEXT": "1024",
		"LABKEEP_GUARDIAN_ALERT_MAX_FIELDS": "20", "LABKEEP_GUARDIAN_ALERTS_PER_SESSION": "50", "LABKEEP_GUARDIAN_ALERTS_PER_WINDOW": "20", "LABKEEP_GUARDIAN_ALERTS_WINDOW": "30s", "LABKEEP_GUARDIAN_ALERTS_AFTER_END": "1m",
		"LABKEEP_WARM_POOL": "shell=2; linux-vm=3@Mon-Fri 13:50-16:00", "LABKEEP_WARM_POOL_TZ": "Europe/Paris",
		"LABKEEP_WARM_POOL_LEAD": "5m", "LABKEEP_WARM_POOL_TTL": "2h", "LABKEEP_PORTAL": "false",
		"LABKEEP_TERMINALS_PER_STUDENT": "2", "LABKEEP_TERMINALS_PER_PROCESS": "50", "LABKEEP_TERMINAL_AUTH_TIMEOUT": "2s",
		"LABKEEP_TERMINAL_IDLE": "10m", "LABKEEP_TERMINAL_MAX_LIFETIME": "2h", "LABKEEP_TERMINAL_RECHECK": "3s",
		"LABKEEP_OPENS_PER_STUDENT": "4", "LABKEEP_OPENS_WINDOW": "30s",
	}
	for k, v := range vars {
		t.Setenv(k, v)
	}
	c, err := FromEnv(os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// SSHAuthorizedKeys is the old name Validate refuses (see
	// TestInvalidConfigNamesTheVariable); it feeds nothing.
	c.SSHAuthorizedKeys = []string{"set"}
	unchanged(t, "Config", DefaultConfig(), c)
	r := must(c.resolve())
	unchanged(t, "kube.Config", kube.DefaultConfig(), r.Kube)
	unchanged(t, "reap.Config", reap.DefaultConfig(), r.Reap)
	unchanged(t, "seating.Limits", seating.DefaultLimits(), r.Limits)
	unchanged(t, "lifetime.Policy", lifetime.DefaultPolicy(), r.Policy)
	unchanged(t, "access.TokenRules", access.DefaultTokenRules(), r.Tokens)
	unchanged(t, "alerts.Limits", alerts.DefaultLimits(), r.Alerts)
	unchanged(t, "termlimit.Limits", termlimit.DefaultLimits(), r.Terminal)
	unchanged(t, "session.OpenRate", session.DefaultOpenRate, r.OpenRate)
	// Every variable of the table is among those set here, the old name
	// excepted: a new variable is added to this test.
	tab := c.Settings()
	for _, v := range tab.Vars {
		if _, ok := vars[tab.Key(v)]; !ok && v.Name != "SSH_AUTHORIZED_KEYS" {
			t.Errorf("%s is not set by this test", tab.Key(v))
		}
	}
}

// unchanged fails for every field of got (a struct, embedded structs
// walked) that still equals the same field of def.
func unchanged(t *testing.T, name string, def, got any) {
	t.Helper()
	dv, gv := reflect.ValueOf(def), reflect.ValueOf(got)
	for i := range dv.NumField() {
		f := dv.Type().Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			unchanged(t, name+"."+f.Name, dv.Field(i).Interface(), gv.Field(i).Interface())
			continue
		}
		if reflect.DeepEqual(dv.Field(i).Interface(), gv.Field(i).Interface()) {
			t.Errorf("%s.%s is not set by any variable (still %v)", name, f.Name, gv.Field(i).Interface())
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
