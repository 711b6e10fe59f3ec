package termlimit

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/setting"
)

// run plays script on a Ledger with limits: each step is "arrive" (a new
// place, numbered from 0), "admit N student" or "leave N". It returns
// each step's outcome ("ok" or the error's code) and the final counts.
func run(t *testing.T, limits Limits, script []string) ([]string, Counts) {
	t.Helper()
	l := NewLedger(limits)
	var places []*Place
	var got []string
	outcome := func(err error) string {
		switch {
		case err == nil:
			return "ok"
		case errors.Is(err, ErrTooMany):
			return ErrTooMany.Error()
		}
		return "error: " + err.Error()
	}
	place := func(s string) *Place {
		t.Helper()
		i, err := strconv.Atoi(s)
		if err != nil || i >= len(places) || places[i] == nil {
			t.Fatalf("script names no place %q", s)
		}
		return places[i]
	}
	for _, step := range script {
		f := strings.Fields(step)
		switch f[0] {
		case "arrive":
			p, err := l.Arrive()
			places = append(places, p)
			got = append(got, outcome(err))
		case "admit":
			got = append(got, outcome(place(f[1]).Admit(f[2])))
		case "leave":
			place(f[1]).Leave()
			got = append(got, "ok")
		default:
			t.Fatalf("unknown step %q", step)
		}
	}
	return got, l.Counts()
}

// The Ledger admits up to PerStudent terminals per student and up to
// PerProcess sockets in all, pending ones included, and every place left
// is given back.
func TestLedger(t *testing.T) {
	small := Limits{PerStudent: 2, PerProcess: 3}
	tests := []struct {
		name   string
		limits Limits
		script []string
		want   []string
		counts Counts
	}{
		{
			name:   "a student's terminals up to their cap",
			limits: small,
			script: []string{"arrive", "admit 0 ann", "arrive", "admit 1 ann"},
			want:   []string{"ok", "ok", "ok", "ok"},
			counts: Counts{Open: 2, ByStudent: map[string]int{"ann": 2}},
		},
		{
			name:   "past the student's cap: refused, the place still pending until it leaves",
			limits: small,
			script: []string{"arrive", "admit 0 ann", "arrive", "admit 1 ann", "arrive", "admit 2 ann"},
			want:   []string{"ok", "ok", "ok", "ok", "ok", "too_many_terminals"},
			counts: Counts{Pending: 1, Open: 2, ByStudent: map[string]int{"ann": 2}},
		},
		{
			name:   "a refused place that leaves frees the process's count",
			limits: small,
			script: []string{"arrive", "admit 0 ann", "arrive", "admit 1 ann", "arrive", "admit 2 ann", "leave 2", "arrive", "admit 3 bob"},
			want:   []string{"ok", "ok", "ok", "ok", "ok", "too_many_terminals", "ok", "ok", "ok"},
			counts: Counts{Open: 3, ByStudent: map[string]int{"ann": 2, "bob": 1}},
		},
		{
			name:   "another student is not held to the first one's cap",
			limits: small,
			script: []string{"arrive", "admit 0 ann", "arrive", "admit 1 ann", "arrive", "admit 2 bob"},
			want:   []string{"ok", "ok", "ok", "ok", "ok", "ok"},
			counts: Counts{Open: 3, ByStudent: map[string]int{"ann": 2, "bob": 1}},
		},
		{
			name:   "a terminal closed makes room for the student's next",
			limits: small,
			script: []string{"arrive", "admit 0 ann", "arrive", "admit 1 ann", "leave 0", "arrive", "admit 2 ann"},
			want:   []string{"ok", "ok", "ok", "ok", "ok", "ok", "ok"},
			counts: Counts{Open: 2, ByStudent: map[string]int{"ann": 2}},
		},
		{
			name:   "sockets that never authenticate fill the process and no more",
			limits: small,
			script: []string{"arrive", "arrive", "arrive", "arrive"},
			want:   []string{"ok", "ok", "ok", "too_many_terminals"},
			counts: Counts{Pending: 3, ByStudent: map[string]int{}},
		},
		{
			name:   "open terminals and pending sockets share the process's cap",
			limits: small,
			script: []string{"arrive", "admit 0 ann", "arrive", "admit 1 bob", "arrive", "arrive"},
			want:   []string{"ok", "ok", "ok", "ok", "ok", "too_many_terminals"},
			counts: Counts{Pending: 1, Open: 2, ByStudent: map[string]int{"ann": 1, "bob": 1}},
		},
		{
			name:   "a pending socket that times out gives its place back",
			limits: small,
			script: []string{"arrive", "arrive", "arrive", "leave 1", "arrive"},
			want:   []string{"ok", "ok", "ok", "ok", "ok"},
			counts: Counts{Pending: 3, ByStudent: map[string]int{}},
		},
		{
			name:   "leaving twice gives back once",
			limits: small,
			script: []string{"arrive", "admit 0 ann", "leave 0", "leave 0", "arrive", "admit 1 ann"},
			want:   []string{"ok", "ok", "ok", "ok", "ok", "ok"},
			counts: Counts{Open: 1, ByStudent: map[string]int{"ann": 1}},
		},
		{
			name:   "a place is admitted once",
			limits: small,
			script: []string{"arrive", "admit 0 ann", "admit 0 bob"},
			want:   []string{"ok", "ok", "error: terminal place already admitted or left"},
			counts: Counts{Open: 1, ByStudent: map[string]int{"ann": 1}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, counts := run(t, tc.limits, tc.script)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.counts, counts); diff != "" {
				t.Errorf("counts (-want +got):\n%s", diff)
			}
		})
	}
}

// A refusal says which cap: the student's or the process's.
func TestRefusalsSayWhichCap(t *testing.T) {
	l := NewLedger(Limits{PerStudent: 1, PerProcess: 2})
	p, _ := l.Arrive()
	if err := p.Admit("ann"); err != nil {
		t.Fatal(err)
	}
	q, _ := l.Arrive()
	if err := q.Admit("ann"); err == nil || !strings.Contains(err.Error(), "you have 1 terminals open") {
		t.Errorf("the student's cap: %v", err)
	}
	if _, err := l.Arrive(); err == nil || !strings.Contains(err.Error(), "this server holds 2 terminals") {
		t.Errorf("the process's cap: %v", err)
	}
}

// Decide closes a terminal on the first bound passed, re-reads its
// session every Recheck and before any close, and wakes at the next
// moment something is due.
func TestDecide(t *testing.T) {
	l := Limits{Idle: 10 * time.Minute, MaxLifetime: time.Hour, Recheck: 5 * time.Second}
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	fresh := Times{Opened: t0, Input: t0, Checked: t0}
	tests := []struct {
		name  string
		times Times
		now   time.Time
		want  Verdict
	}{
		{"just opened: wake at the first recheck", fresh, at(time.Second), Verdict{Wake: at(5 * time.Second)}},
		{"recheck due: re-read, wake a recheck later", fresh, at(5 * time.Second), Verdict{Recheck: true, Wake: at(10 * time.Second)}},
		{"recheck overdue: the next one counts from now", Times{Opened: t0, Input: at(time.Minute), Checked: t0}, at(time.Minute),
			Verdict{Recheck: true, Wake: at(time.Minute + 5*time.Second)}},
		{"idle deadline before the next recheck: wake at it", Times{Opened: t0, Input: t0, Checked: at(10*time.Minute - 2*time.Second)},
			at(10*time.Minute - time.Second), Verdict{Wake: at(10 * time.Minute)}},
		{"no input for Idle: closed idle, its session read first", Times{Opened: t0, Input: t0, Checked: at(10*time.Minute - time.Second)},
			at(10 * time.Minute), Verdict{Timeout: TimeoutIdle, Recheck: true}},
		{"input keeps it open past Idle", Times{Opened: t0, Input: at(9 * time.Minute), Checked: at(11 * time.Minute)},
			at(11*time.Minute + time.Second), Verdict{Wake: at(11*time.Minute + 5*time.Second)}},
		{"lifetime deadline before the next recheck: wake at it", Times{Opened: t0, Input: at(time.Hour - time.Second), Checked: at(time.Hour - 3*time.Second)},
			at(time.Hour - 2*time.Second), Verdict{Wake: at(time.Hour)}},
		{"open for MaxLifetime: closed however recent the input", Times{Opened: t0, Input: at(time.Hour - time.Second), Checked: at(time.Hour - time.Second)},
			at(time.Hour), Verdict{Timeout: TimeoutLifetime, Recheck: true}},
		{"both passed (a clock set forward): lifetime named", fresh, at(2 * time.Hour), Verdict{Timeout: TimeoutLifetime, Recheck: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, l.Decide(tc.times, tc.now)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// The close reasons start with the bound's name and say its length.
func TestReason(t *testing.T) {
	l := DefaultLimits()
	tests := []struct {
		timeout Timeout
		want    string
	}{
		{NoTimeout, ""},
		{TimeoutIdle, "idle: no input for 15m; reconnect for a new shell"},
		{TimeoutLifetime, "lifetime: open for 4h, the longest a terminal stays open; reconnect for a new shell"},
	}
	for _, tc := range tests {
		if diff := cmp.Diff(tc.want, l.Reason(tc.timeout)); diff != "" {
			t.Errorf("Reason(%d) (-want +got):\n%s", tc.timeout, diff)
		}
		// A WebSocket close reason holds at most 123 bytes.
		if n := len(l.Reason(tc.timeout)); n > 123 {
			t.Errorf("Reason(%d) is %d bytes, over a close frame's 123", tc.timeout, n)
		}
	}
}

// Validate names every field out of range; the defaults pass.
func TestValidate(t *testing.T) {
	if err := DefaultLimits().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	err := Limits{PerStudent: 0, PerProcess: 1, AuthTimeout: 0, Idle: time.Minute, MaxLifetime: -1, Recheck: time.Second}.Validate()
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var se *setting.Error
		if errors.As(e, &se) {
			fields = append(fields, se.Field)
		}
	}
	if diff := cmp.Diff([]string{"PerStudent", "AuthTimeout", "MaxLifetime"}, fields); diff != "" {
		t.Errorf("fields at fault (-want +got):\n%s", diff)
	}
}
