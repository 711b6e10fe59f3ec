package main

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"labkeep/guardian/alert"
	"labkeep/guardian/guard"
	"labkeep/guardian/httpapi"
)

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{"", 0, false},
		{"4294967296", 4 << 30, false},
		{"256Mi", 256 << 20, false},
		{"4Gi", 4 << 30, false},
		{"1Ki", 1024, false},
		{"-5", 0, true},
		{"1.5Gi", 0, true},
		{"lots", 0, true},
	}
	for _, tt := range tests {
		got, err := parseBytes(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseBytes(%q) = %d,%v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// envKeys lists the environment variables guardian reads: every
// variable's full name, and the unprefixed aliases.
func envKeys() map[string]bool {
	keys := map[string]bool{}
	o := defaultOptions()
	t := o.settings()
	for _, s := range t {
		keys[t.key(s)] = true
		if s.alias != "" {
			keys[s.alias] = true
		}
	}
	return keys
}

// clearEnv unsets every variable guardian reads for the test's duration.
func clearEnv(t *testing.T) {
	t.Helper()
	for k := range envKeys() {
		t.Setenv(k, "") // restores the old value after the test
		os.Unsetenv(k)
	}
}

// Every default comes from the package that owns the setting: with no
// variable set, guardian runs with guard.Defaults() and alert.Defaults(),
// and no variable declares a default of its own that could drift.
func TestDefaultsComeFromThePackages(t *testing.T) {
	clearEnv(t)
	got, err := loadOptions()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(guard.Defaults(), got.Guard); diff != "" {
		t.Errorf("guard config with no variables set (-package default +got):\n%s", diff)
	}
	if diff := cmp.Diff(alert.Defaults(), got.Alert); diff != "" {
		t.Errorf("alert config with no variables set (-package default +got):\n%s", diff)
	}
	if diff := cmp.Diff(httpapi.Defaults(), got.HTTP); diff != "" {
		t.Errorf("HTTP config with no variables set (-package default +got):\n%s", diff)
	}
	// No variable carries a default of its own: reading an empty
	// environment leaves every option as defaultOptions composes it.
	want := defaultOptions()
	want.Guard.SSHPort = got.Guard.SSHPort // derived from SSHAddr
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("options with no variables set (-defaultOptions +got):\n%s", diff)
	}
}

// nonDefault gives every variable a valid value different from its
// default, so that each setting visibly changes something.
var nonDefault = map[string]string{
	"CGROUP": "/ws", "CGROUP_SUBTREE": "/pod", "POD_UID": "0f3c2a51-6b7e-4c1d-9a8b-1234567890ab", "POD_NAME": "ws-1",
	"CONTAINER_NAME": "main", "PROC_ROOT": "/host/proc", "CGROUP_MOUNT": "/host/sys/fs/cgroup",
	"MEMORY_LIMIT": "2Gi", "MEMORY_HIGH_FRACTION": "0.8", "MEMORY_MAX_FRACTION": "0.99", "MEMORY_ALERT_FRACTION": "0.9",
	"MEMORY_KILL_FRACTION": "0.96", "MEMORY_HELD_STALL": "0.3", "HANDLE_OOM": "false", "MEMORY_POLL": "3s",
	"PIDS_MAX": "1000", "OWN_CPU_WEIGHT": "50", "FORK_THRESHOLD": "300", "FORK_WINDOW": "5s", "FORK_SCAN": "2s", "FORK_GROWTH_FRACTION": "0.5", "FORK_HORIZON": "2s", "FORK_BRANCH_FRACTION": "0.25", "PIDS_RESERVE": "32", "FREEZE_TIMEOUT": "3s", "HOLD_FORKS_AFTER": "1s", "CONTAIN_ROUNDS": "7", "CONTAIN_SPARE_LOGIN_MAX": "4",
	"SSH_ADDR": "127.0.0.1:2222", "SSHD_SESSION_EXES": "/usr/sbin/sshd-session", "PROTECT_EXES": "/usr/bin/tmux",
	"PROTECT_PID1": "false", "PROTECT_INIT": "false", "PROTECT_EVERY": "10s", "RT_PRIORITY": "2", "RT_RUNTIME_US": "20000",
	"FALLBACK_NICE": "-10", "SSHD_EXE": "/usr/sbin/sshd", "RT_MAX_CPU_SHARE": "0.1", "RT_POLICE_EVERY": "2s", "RT_POLICE_FOR": "10s",
	"KILL_GRACE": "2s", "KILL_WAIT": "3s", "KILL_MAX": "4", "KILL_WINDOW": "20s", "KILL_PAUSE": "2m",
	"CPU_EVERY": "1s", "HANG_CPU_FRACTION": "0.9", "HANG_ALERT_AFTER": "20s", "HANG_KILL_ONE_AFTER": "60s",
	"HANG_KILL_THREE_AFTER": "120s", "HANG_KILL_ALL_AFTER": "240s", "HANG_RECOVERY": "5s",
	"STORM_EVERY": "2s", "STORM_CPU_FRACTION": "0.8", "STORM_RUNNABLE": "3", "STORM_MIN_SHARE": "0.05", "STORM_CALM": "20s",
	"PROBE_EVERY": "15s", "PROBE_TIMEOUT": "2s", "WATCH_EVERY": "2s",
	"HTTP_READ_HEADER_TIMEOUT": "3s", "HTTP_READ_TIMEOUT": "7s", "HTTP_WRITE_TIMEOUT": "90s", "HTTP_IDLE_TIMEOUT": "15s", "HTTP_MAX_CONNS": "16",
	"LISTEN": ":9191", "LISTEN_RETRY": "100ms", "LISTEN_RETRY_MAX": "2s", "CLEANUP_TOKEN": "t0ken", "WEBHOOK_URL": "http://alerts.example/hook", "ALERT_WINDOW": "30s",
	"ALERT_RATE_PER_MIN": "10", "ALERT_BURST": "2", "STATE_PATH": "/state/s.json", "STATE_MAX_BYTES": "128Ki", "ALERT_MAX_TEXT": "256", "ALERT_MAX_FIELDS": "8",
	"LOG_LEVEL": "DEBUG",
}

// Every field of guard.Config (nested ones included) is read from some
// variable: setting every variable to a non-default value changes every
// field. Together with the check that nonDefault covers every variable,
// a field added to the config without a variable fails here.
func TestEveryConfigFieldIsReadFromAVariable(t *testing.T) {
	clearEnv(t)
	o := defaultOptions()
	for _, s := range o.settings() {
		if _, ok := nonDefault[s.name]; !ok {
			t.Errorf("nonDefault has no value for %s", s.name)
		}
	}
	for k, v := range nonDefault {
		if !envKeys()["GUARDIAN_"+k] {
			t.Errorf("nonDefault sets %s, which guardian does not read", k)
		}
		t.Setenv("GUARDIAN_"+k, v)
	}
	got, err := loadOptions()
	if err != nil {
		t.Fatal(err)
	}
	def := defaultOptions()
	for _, f := range unchangedFields(reflect.ValueOf(def.Guard), reflect.ValueOf(got.Guard), "guard.Config") {
		t.Errorf("%s is not set by any variable", f)
	}
	for _, f := range unchangedFields(reflect.ValueOf(def), reflect.ValueOf(got), "options") {
		if !strings.HasPrefix(f, "options.Guard.") && !strings.HasPrefix(f, "options.Alert.") {
			t.Errorf("%s is not set by any variable", f)
		}
	}
	if got.Guard.SSHPort != 2222 || got.Guard.MemoryLimit != 2<<30 {
		t.Errorf("SSH port %d, memory limit %d; want 2222 from GUARDIAN_SSH_ADDR and 2 GiB", got.Guard.SSHPort, got.Guard.MemoryLimit)
	}
}

// unchangedFields lists the leaf fields (structs are descended into) whose
// value is the same in a and b.
func unchangedFields(a, b reflect.Value, path string) []string {
	if a.Kind() == reflect.Struct {
		var out []string
		for i := 0; i < a.NumField(); i++ {
			out = append(out, unchangedFields(a.Field(i), b.Field(i), path+"."+a.Type().Field(i).Name)...)
		}
		return out
	}
	if reflect.DeepEqual(a.Interface(), b.Interface()) {
		return []string{path}
	}
	return nil
}

func TestBadValuesStopGuardian(t *testing.T) {
	tests := []struct {
		name, key, value, wantErr string
	}{
		{"unparsable byte count", "GUARDIAN_MEMORY_LIMIT", "1.5Gi", "GUARDIAN_MEMORY_LIMIT"},
		{"SSH address without a port", "GUARDIAN_SSH_ADDR", "127.0.0.1", "GUARDIAN_SSH_ADDR"},
		{"fraction out of range", "GUARDIAN_MEMORY_KILL_FRACTION", "1.5", "kill fraction"},
		{"held stall out of range", "GUARDIAN_MEMORY_HELD_STALL", "-0.1", "held stall"},
		{"zero interval", "GUARDIAN_PROBE_EVERY", "0s", "probe interval"},
		{"unparsable duration", "GUARDIAN_KILL_GRACE", "soon", "GUARDIAN_KILL_GRACE"},
		{"empty number", "GUARDIAN_PIDS_MAX", "", "GUARDIAN_PIDS_MAX"},
		{"SSH port not a number", "GUARDIAN_SSH_ADDR", "127.0.0.1:ssh", "GUARDIAN_SSH_ADDR"},
		{"state file bound too small", "GUARDIAN_STATE_MAX_BYTES", "1Ki", "GUARDIAN_STATE_MAX_BYTES"},
		{"alert text too short", "GUARDIAN_ALERT_MAX_TEXT", "10", "GUARDIAN_ALERT_MAX_TEXT"},
		{"no alert fields", "GUARDIAN_ALERT_MAX_FIELDS", "0", "GUARDIAN_ALERT_MAX_FIELDS"},
		{"unknown log level", "GUARDIAN_LOG_LEVEL", "LOUD", "GUARDIAN_LOG_LEVEL"},
		{"CPU weight above cpu.weight's range", "GUARDIAN_OWN_CPU_WEIGHT", "10001", "own CPU weight"},
		{"negative CPU weight", "GUARDIAN_OWN_CPU_WEIGHT", "-1", "own CPU weight"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			t.Setenv(tt.key, tt.value)
			_, err := loadOptions()
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("loadOptions() with %s=%s = %v; want an error mentioning %q", tt.key, tt.value, err, tt.wantErr)
			}
		})
	}
}

// The Pod spec runs guardian as a native sidecar with exactly its four
// capabilities, its requests and limits, the shared PID namespace, and only
// environment variables guardian understands.
func TestWorkspacePodSpec(t *testing.T) {
	b, err := os.ReadFile("../../../infra/guardian/workspace-pod.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(b, &pod); err != nil {
		t.Fatalf("workspace-pod.yaml is not a valid Pod: %v", err)
	}
	if pod.Spec.ShareProcessNamespace == nil || !*pod.Spec.ShareProcessNamespace {
		t.Error("shareProcessNamespace must be true")
	}
	if len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].Name != "guardian" {
		t.Fatalf("want guardian as the only init container, got %d", len(pod.Spec.InitContainers))
	}
	g := pod.Spec.InitContainers[0]
	if g.RestartPolicy == nil || *g.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("guardian must be a native sidecar (restartPolicy: Always)")
	}
	sc := g.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("guardian needs a securityContext with capabilities")
	}
	var add []string
	for _, c := range sc.Capabilities.Add {
		add = append(add, string(c))
	}
	slices.Sort(add)
	if diff := cmp.Diff([]string{"KILL", "SYS_NICE", "SYS_PTRACE", "SYS_RESOURCE"}, add); diff != "" {
		t.Errorf("guardian capabilities (-want +got):\n%s", diff)
	}
	if len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("guardian must drop ALL other capabilities, drops %v", sc.Capabilities.Drop)
	}
	want := map[string]map[corev1.ResourceName]string{
		"requests": {corev1.ResourceCPU: "100m", corev1.ResourceMemory: "64Mi"},
		"limits":   {corev1.ResourceCPU: "1", corev1.ResourceMemory: "128Mi"},
	}
	for kind, list := range map[string]corev1.ResourceList{"requests": g.Resources.Requests, "limits": g.Resources.Limits} {
		for name, q := range want[kind] {
			if got := list[name]; got.Cmp(resource.MustParse(q)) != 0 {
				t.Errorf("guardian %s %s = %s; want %s", kind, name, got.String(), q)
			}
		}
	}
	known := envKeys()
	for _, e := range g.Env {
		if !known[e.Name] {
			t.Errorf("guardian env %s is not a setting guardian reads", e.Name)
		}
	}
	var ws *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == "workspace" {
			ws = &pod.Spec.Containers[i]
		}
	}
	if ws == nil {
		t.Fatal("no workspace container")
	}
	marker := false
	for _, e := range ws.Env {
		marker = marker || (e.Name == "LABKEEP_CONTAINER_NAME" && e.Value == ws.Name)
	}
	if !marker {
		t.Error("the workspace container must carry LABKEEP_CONTAINER_NAME=<its name> for discovery")
	}
	// No system capability, which would let root reach past its own
	// processes (SYS_NICE, SYS_RESOURCE, SYS_ADMIN, SYS_PTRACE, ...), but
	// SYS_CHROOT: it changes only the caller's own root directory, and
	// sshd's privilege-separated child needs it.
	for _, c := range ws.SecurityContext.Capabilities.Add {
		if strings.HasPrefix(string(c), "SYS_") && c != "SYS_CHROOT" {
			t.Errorf("the workspace must not get %s", c)
		}
	}
}

// POD_UID, POD_NAME and CONTAINER_NAME, which the downward API sets, are
// read with or without the prefix, the prefixed name winning; every other
// variable is read under its GUARDIAN_ name only.
func TestUnprefixedNames(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want func(options) string
		is   string
	}{
		{"pod UID without the prefix", map[string]string{"POD_UID": "u1"}, func(o options) string { return o.PodUID }, "u1"},
		{"prefixed pod UID wins", map[string]string{"POD_UID": "u1", "GUARDIAN_POD_UID": "u2"}, func(o options) string { return o.PodUID }, "u2"},
		{"pod name without the prefix", map[string]string{"POD_NAME": "ws"}, func(o options) string { return o.PodName }, "ws"},
		{"container name without the prefix", map[string]string{"CONTAINER_NAME": "main"}, func(o options) string { return o.ContainerName }, "main"},
		{"other settings need the prefix", map[string]string{"LISTEN": ":1"}, func(o options) string { return o.Listen }, defaultOptions().Listen},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			got, err := loadOptions()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.is, tt.want(got)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
