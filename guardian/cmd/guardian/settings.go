package main

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// This file is guardian's own copy of the settings table labkeep's
// functions use (shared/setting): guardian shares no Go package with
// labkeep, so the idea is copied, not imported.

// envPrefix is the prefix of every variable guardian reads.
const envPrefix = "GUARDIAN"

// setting is one environment variable, bound to the option it fills: the
// table is the one place a variable's name, meaning and parsing are
// written, and its default is whatever the option holds before the
// environment is read (the owning package's).
type setting struct {
	name  string // without the prefix
	doc   string // one line of the settings reference
	alias string // a name read, without the prefix, when the prefixed one is not set; "" for none

	field any // pointer to the option
	parse func(string) error
	show  func() string
}

// unprefixed makes s also read under its bare name, when the prefixed one
// is not set: the Pod's downward API hands guardian the Pod's identity so.
func (s setting) unprefixed() setting {
	s.alias = s.name
	return s
}

func bindVar[T any](name, doc string, p *T, parse func(string) (T, error), show func(T) string) setting {
	return setting{
		name: name, doc: doc, field: p,
		parse: func(s string) error {
			v, err := parse(s)
			if err != nil {
				return err
			}
			*p = v
			return nil
		},
		show: func() string { return show(*p) },
	}
}

func stringVar(name, doc string, p *string) setting {
	return bindVar(name, doc, p, func(s string) (string, error) { return s, nil }, func(s string) string { return s })
}

func durationVar(name, doc string, p *time.Duration) setting {
	return bindVar(name, doc, p, time.ParseDuration, showDuration)
}

// intVar reads like strconv.ParseInt with base 0 (0x and 0o prefixes).
func intVar(name, doc string, p *int) setting {
	return bindVar(name, doc, p, func(s string) (int, error) {
		n, err := strconv.ParseInt(s, 0, strconv.IntSize)
		return int(n), err
	}, strconv.Itoa)
}

func floatVar(name, doc string, p *float64) setting {
	return bindVar(name, doc, p, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) },
		func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) })
}

func boolVar(name, doc string, p *bool) setting {
	return bindVar(name, doc, p, strconv.ParseBool, strconv.FormatBool)
}

// listVar reads a comma-separated list; a value of only white space is the
// empty list (which replaces the default).
func listVar(name, doc string, p *[]string) setting {
	return bindVar(name, doc, p, func(s string) ([]string, error) {
		if strings.TrimSpace(s) == "" {
			return []string{}, nil
		}
		return strings.Split(s, ","), nil
	}, func(l []string) string { return strings.Join(l, ",") })
}

// bytesVar reads a byte count, bare or with a binary suffix (parseBytes).
func bytesVar(name, doc string, p *uint64) setting {
	return bindVar(name, doc, p, parseBytes, showBytes)
}

// levelVar reads a log level as slog.Level.UnmarshalText does (DEBUG,
// INFO, WARN, ERROR, with an optional +n/-n).
func levelVar(name, doc string, p *slog.Level) setting {
	return bindVar(name, doc, p, func(s string) (slog.Level, error) {
		var l slog.Level
		err := l.UnmarshalText([]byte(s))
		return l, err
	}, slog.Level.String)
}

// showDuration writes d as the settings reference shows it: 1h, 15m,
// 30s, 1h30m (time.Duration.String without trailing zero units), which
// time.ParseDuration reads back.
func showDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// showBytes writes n with the largest binary suffix that divides it, as
// parseBytes reads it back; 0 (unset) is empty.
func showBytes(n uint64) string {
	if n == 0 {
		return ""
	}
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"Ti", 40}, {"Gi", 30}, {"Mi", 20}, {"Ki", 10}} {
		if n%(1<<u.shift) == 0 {
			return strconv.FormatUint(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatUint(n, 10)
}

// settingsTable is every variable guardian reads.
type settingsTable []setting

// key is s's full variable name.
func (settingsTable) key(s setting) string { return envPrefix + "_" + s.name }

// read sets every variable lookup (os.LookupEnv) finds into its option:
// the prefixed name, else an unprefixed alias. A variable not set keeps
// the option's value; one set to the empty string is parsed as such.
// Every value that does not parse is reported, naming its variable.
func (t settingsTable) read(lookup func(string) (string, bool)) error {
	var errs []error
	for _, s := range t {
		name := t.key(s)
		v, ok := lookup(name)
		if !ok && s.alias != "" {
			name = s.alias
			v, ok = lookup(name)
		}
		if !ok {
			continue
		}
		if err := s.parse(v); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// keyOf is the full name of the variable that fills field (a pointer to
// the option). It panics on a field no variable fills: a message would
// name nothing, which only a programming error causes.
func (t settingsTable) keyOf(field any) string {
	for _, s := range t {
		if s.field == field {
			return t.key(s)
		}
	}
	panic(fmt.Sprintf("no setting fills %T %p", field, field))
}

// markdown is the settings reference: a Markdown table of every variable,
// its default (as the options hold it) and its meaning.
func (t settingsTable) markdown() string {
	var b strings.Builder
	b.WriteString("| Variable | Default | Meaning |\n|---|---|---|\n")
	for _, s := range t {
		def := "(none)"
		if d := s.show(); d != "" {
			def = "`" + d + "`"
		}
		name := "`" + t.key(s) + "`"
		if s.alias != "" {
			name += " or `" + s.alias + "`"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", name, def, strings.ReplaceAll(s.doc, "|", `\|`))
	}
	return b.String()
}

// settings is o's settings table: every GUARDIAN_* variable, bound to the
// option of o it fills. It is the one place a variable is named: reading
// the environment (read), naming a setting in an error (keyOf) and the
// settings reference in README.md (markdown) all come from it. Only the
// Pod's identity (the settings marked unprefixed) is also read without the
// prefix; every other variable is read under its GUARDIAN_ name only.
func (o *options) settings() settingsTable {
	g, h, a, w := &o.Guard, &o.Guard.Hang, &o.Alert, &o.HTTP
	return settingsTable{
		stringVar("CGROUP", "the cgroup to protect instead of discovering the Pod's workspace container: a v2 directory, or on v1 the path relative to each controller mount", &o.Cgroup),
		stringVar("CGROUP_SUBTREE", "the subtree guardian may touch; empty: the Pod's (discovery) or the cgroup itself", &o.CgroupSubtree),
		stringVar("POD_UID", "the Pod whose workspace container is discovered (downward API)", &o.PodUID).unprefixed(),
		stringVar("POD_NAME", "the workspace's name in alerts; empty: the Pod's UID or the cgroup", &o.PodName).unprefixed(),
		stringVar("CONTAINER_NAME", "the workspace container discovered in the Pod", &o.ContainerName).unprefixed(),
		stringVar("PROC_ROOT", "where /proc is mounted", &o.ProcRoot),
		stringVar("CGROUP_MOUNT", "where the (host) cgroup hierarchies are mounted", &o.CgroupMount),

		bytesVar("MEMORY_LIMIT", "M, bytes or with Ki/Mi/Gi; unset: the cgroup's limit at first start (kept in the state)", &g.MemoryLimit),
		floatVar("MEMORY_HIGH_FRACTION", "memory.high = this·M", &g.HighFraction),
		floatVar("MEMORY_MAX_FRACTION", "memory.max = this·M", &g.MaxFraction),
		floatVar("MEMORY_ALERT_FRACTION", "alert at this·M", &g.AlertFraction),
		floatVar("MEMORY_KILL_FRACTION", "kill the largest unprotected process at this·M", &g.KillFraction),
		floatVar("MEMORY_HELD_STALL", "v2: over memory.high, throttled and stalled on memory this share of the last 10 s (PSI some avg10, 0 to 1), "+
			"the workspace is held there and the largest unprotected process is killed; 0: off", &g.HeldStall),
		boolVar("HANDLE_OOM", "v1: disable the kernel OOM killer so guardian picks the victim; v2: memory.oom.group=0", &g.HandleOOM),
		durationVar("MEMORY_POLL", "how often memory use is read", &g.MemoryPoll),

		intVar("PIDS_MAX", "pids.max of the workspace", &g.PidsMax),
		intVar("OWN_CPU_WEIGHT", "guardian's own container's CPU weight against its siblings in the Pod (cgroup v2 units, 1 to 10000; "+
			"v1 cpu.shares converted as the kubelet does), set at every watch: its emergencies come first on the Pod's CPU; "+
			"0 leaves the runtime's; unused with `GUARDIAN_CGROUP`", &g.OwnCPUWeight),
		intVar("FORK_THRESHOLD", "forks refused at pids.max within the fork window that make a fork bomb", &g.ForkThreshold),
		durationVar("FORK_WINDOW", "the window refused forks are counted in", &g.ForkWindow),
		durationVar("FORK_SCAN", "how often the process count is scanned (on v2 also woken by the kernel's events)", &g.ForkScan),
		floatVar("FORK_GROWTH_FRACTION", "a process count at this fraction of pids.max or more that keeps growing may be a fork bomb", &g.ForkGrowthFraction),
		durationVar("FORK_HORIZON", "growth that reaches pids.max within this is a fork bomb", &g.ForkHorizon),
		floatVar("FORK_BRANCH_FRACTION", "growing processes of which this fraction each fork two or more of the others are a fork bomb", &g.ForkBranchFraction),
		intVar("PIDS_RESERVE", "pids.max is raised by this when the workspace is found at the limit, so a login still forks", &g.PidsReserve),
		durationVar("FREEZE_TIMEOUT", "longest wait for the cgroup to freeze", &g.FreezeTimeout),
		durationVar("HOLD_FORKS_AFTER", "a containment's first freeze that takes longer than this holds every fork (pids.max 0) until its kills are done (0: from the start)", &g.HoldForksAfter),
		intVar("CONTAIN_ROUNDS", "freeze-and-kill rounds of one containment", &g.ContainRounds),
		intVar("CONTAIN_SPARE_LOGIN_MAX", "a login with at most this many processes is spared by containment", &g.SpareLoginMax),

		stringVar("SSH_ADDR", "the sshd the prober checks; its port finds sshd's listener", &o.SSHAddr),
		listVar("SSHD_SESSION_EXES", "executables sshd runs per connection (protected as the listener's children), comma-separated", &g.SessionExes),
		listVar("PROTECT_EXES", "further executables never killed, comma-separated", &g.ProtectExes),
		boolVar("PROTECT_PID1", "protect the workspace's PID 1", &g.ProtectPID1),
		boolVar("PROTECT_INIT", "protect the container's init", &g.ProtectInit),
		durationVar("PROTECT_EVERY", "how often protected processes are looked for and raised", &g.ProtectEvery),
		intVar("RT_PRIORITY", "SCHED_RR priority of sshd's listener; 0: no real-time", &g.RTPriority),
		intVar("RT_RUNTIME_US", "real-time runtime per period granted (v1 cpu.rt_runtime_us)", &g.RTRuntimeUS),
		intVar("FALLBACK_NICE", "nice of sshd when real-time is refused or off", &g.FallbackNice),
		stringVar("SSHD_EXE", "sshd's executable; unset: the first listener's executable", &g.SSHDExe),
		floatVar("RT_MAX_CPU_SHARE", "a real-time process guardian raised that uses more CPU than this share is put back", &g.RTMaxCPUShare),
		durationVar("RT_POLICE_EVERY", "how often the RT police runs", &g.RTPoliceEvery),
		durationVar("RT_POLICE_FOR", "how long a real-time process stays over its share, in every sample, before it is put back (0: at the first sample over it)", &g.RTPoliceFor),

		durationVar("KILL_GRACE", "SIGTERM to SIGKILL", &g.KillGrace),
		durationVar("KILL_WAIT", "longest wait for a killed process to go", &g.KillWait),
		intVar("KILL_MAX", "kills within the kill window before guardian pauses killing", &g.KillMax),
		durationVar("KILL_WINDOW", "the window kills are counted in", &g.KillWindow),
		durationVar("KILL_PAUSE", "how long killing pauses after too many kills", &g.KillPause),

		durationVar("CPU_EVERY", "how often CPU use is sampled", &g.CPUEvery),
		floatVar("HANG_CPU_FRACTION", "CPU share of the workspace that counts as a hang while SSH fails", &h.CPUFraction),
		durationVar("HANG_ALERT_AFTER", "hang: alert", &h.AlertAfter),
		durationVar("HANG_KILL_ONE_AFTER", "hang: kill the top CPU user", &h.KillOne),
		durationVar("HANG_KILL_THREE_AFTER", "hang: kill the top three", &h.KillThree),
		durationVar("HANG_KILL_ALL_AFTER", "hang: kill every unprotected process", &h.KillAll),
		durationVar("HANG_RECOVERY", "how long SSH must answer for a hang to end", &h.Recovery),
		durationVar("STORM_EVERY", "how often CPU storms are looked for", &g.StormEvery),
		floatVar("STORM_CPU_FRACTION", "CPU share of the workspace that makes a storm", &g.Storm.CPUFraction),
		floatVar("STORM_RUNNABLE", "runnable processes per CPU that make a storm", &g.Storm.Runnable),
		floatVar("STORM_MIN_SHARE", "a process below this CPU share is left alone in a storm", &g.Storm.MinShare),
		durationVar("STORM_CALM", "how long calm must last for a storm to end", &g.Storm.Calm),

		durationVar("PROBE_EVERY", "how often SSH is probed", &g.ProbeEvery),
		durationVar("PROBE_TIMEOUT", "bound of one SSH probe", &o.ProbeTimeout),
		durationVar("WATCH_EVERY", "how often guardian looks for the workspace until it runs", &g.WatchEvery),
		durationVar("LISTEN_RETRY", "first wait before taking the API port back", &g.ListenRetry),
		durationVar("LISTEN_RETRY_MAX", "longest wait between tries for the API port", &g.ListenRetryMax),

		stringVar("LISTEN", "the API's address", &o.Listen),
		durationVar("HTTP_READ_HEADER_TIMEOUT", "the API's bound on reading a request's header", &w.ReadHeaderTimeout),
		durationVar("HTTP_READ_TIMEOUT", "the API's bound on reading a request", &w.ReadTimeout),
		durationVar("HTTP_WRITE_TIMEOUT", "the API's bound on writing a response", &w.WriteTimeout),
		durationVar("HTTP_IDLE_TIMEOUT", "how long an idle API connection is kept", &w.IdleTimeout),
		intVar("HTTP_MAX_CONNS", "API connections served at once", &w.MaxConns),
		stringVar("CLEANUP_TOKEN", "bearer token of `POST /cleanup`; empty: cleanup refused", &o.CleanupToken),
		stringVar("WEBHOOK_URL", "where alerts are POSTed; empty: alerts stay in the API only", &a.WebhookURL),
		durationVar("ALERT_WINDOW", "the same alert within this counts up instead of being sent again", &a.Window),
		intVar("ALERT_RATE_PER_MIN", "webhook deliveries per minute", &a.RatePerMin),
		intVar("ALERT_BURST", "webhook deliveries allowed at once", &a.Burst),
		stringVar("STATE_PATH", "the state file (M, kill history); empty: no state kept across restarts", &o.StatePath),
		bytesVar("STATE_MAX_BYTES", "bytes the state file is kept within, 4Ki to 64Mi", &o.StateMax),
		intVar("ALERT_MAX_TEXT", "bytes of an alert's subject, message and each field value, ≥ 64 (keep ≤ labkeep's `LABKEEP_GUARDIAN_ALERT_MAX_TEXT`)", &a.MaxText),
		intVar("ALERT_MAX_FIELDS", "fields kept per alert, ≥ 1 (keep ≤ labkeep's `LABKEEP_GUARDIAN_ALERT_MAX_FIELDS`)", &a.MaxFields),
		levelVar("LOG_LEVEL", "DEBUG, INFO, WARN or ERROR", &o.LogLevel),
	}
}
