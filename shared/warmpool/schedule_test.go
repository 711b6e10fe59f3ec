package warmpool

import (
	"errors"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the time zones tested, whatever the machine has installed

	"github.com/google/go-cmp/cmp"
)

func mustLoad(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("load time zone %s: %v", name, err)
	}
	return loc
}

func mustParse(t *testing.T, spec string, loc *time.Location, lead time.Duration) Schedule {
	t.Helper()
	s, err := Parse(spec, loc, lead)
	if err != nil {
		t.Fatalf("Parse(%q): %v", spec, err)
	}
	return s
}

func TestParse(t *testing.T) {
	weekdays := []time.Weekday{time.Monday, time.Tuesday, time.Wednesday, time.Thursday, time.Friday}
	tests := []struct {
		name string
		spec string
		want []Rule
	}{
		{"empty is no pool", "", nil},
		{"blanks and stray separators are no pool", "  ; ;", nil},
		{"always", "shell=2", []Rule{{Lab: "shell", Size: 2}}},
		{"the documented example",
			"shell=2; linux-vm=20@Mon-Fri 13:50-16:00; linux-vm=4@Sat 09:00-12:00",
			[]Rule{
				{Lab: "shell", Size: 2},
				{Lab: "linux-vm", Size: 20, Days: weekdays, From: Clock{13, 50}, To: Clock{16, 0}},
				{Lab: "linux-vm", Size: 4, Days: []time.Weekday{time.Saturday}, From: Clock{9, 0}, To: Clock{12, 0}},
			}},
		{"spaces around the parts", " shell = 3 @ Tue  8:00-9:30 ;",
			[]Rule{{Lab: "shell", Size: 3, Days: []time.Weekday{time.Tuesday}, From: Clock{8, 0}, To: Clock{9, 30}}}},
		{"times without days are every day", "shell=1@07:00-24:00",
			[]Rule{{Lab: "shell", Size: 1, From: Clock{7, 0}, To: Clock{24, 0}}}},
		{"days without times are whole days", "shell=1@sat,SUN",
			[]Rule{{Lab: "shell", Size: 1, Days: []time.Weekday{time.Sunday, time.Saturday}}}},
		{"a wrapping range runs through the weekend, in week order", "shell=1@Fri-Mon",
			[]Rule{{Lab: "shell", Size: 1, Days: []time.Weekday{time.Sunday, time.Monday, time.Friday, time.Saturday}}}},
		{"lists and ranges mix, repeats once", "shell=1@Mon,Wed-Thu,Wed 10:00-11:00",
			[]Rule{{Lab: "shell", Size: 1, Days: []time.Weekday{time.Monday, time.Wednesday, time.Thursday}, From: Clock{10, 0}, To: Clock{11, 0}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := Schedule{Rules: tc.want, Location: time.UTC, Lead: 10 * time.Minute}
			got := mustParse(t, tc.spec, time.UTC, 10*time.Minute)
			if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b *time.Location) bool { return a == b })); diff != "" {
				t.Errorf("Parse (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseRejectsBadInput(t *testing.T) {
	tests := []struct {
		name string
		spec string
		lead time.Duration
		// want are the fragments the error must contain: the rule and the
		// part at fault.
		want []string
	}{
		{"size not a number", "shell=two", 0, []string{`rule 1 "shell=two"`, `size "two"`}},
		{"size zero", "shell=0", 0, []string{`size "0"`}},
		{"size negative", "shell=-1", 0, []string{`size "-1"`}},
		{"no size", "shell", 0, []string{`rule 1 "shell"`, "lab=size"}},
		{"no lab", "=3", 0, []string{"no lab name"}},
		{"unknown day", "shell=1; vm=2@Mon-Fry 10:00-11:00", 0, []string{`rule 2 "vm=2@Mon-Fry 10:00-11:00"`, `unknown day "Fry"`}},
		{"from equals to", "vm=2@Mon 10:00-10:00", 0, []string{`"10:00-10:00"`, "start must be before end"}},
		{"from after to", "vm=2@Mon 22:00-02:00", 0, []string{"start must be before end", "cannot cross midnight"}},
		{"hour out of range", "vm=2@Mon 10:00-25:00", 0, []string{`time "25:00"`}},
		{"minute out of range", "vm=2@10:60-11:00", 0, []string{`time "10:60"`}},
		{"one-digit minutes", "vm=2@10:0-11:00", 0, []string{`time "10:0"`}},
		{"signed hour", "vm=2@+9:00-11:00", 0, []string{`time "+9:00"`}},
		{"start at 24:00", "vm=2@24:00-24:00", 0, []string{"cannot start at 24:00"}},
		{"time range without dash", "vm=2@Mon 10:00", 0, []string{`time range "10:00"`}},
		{"garbage window", "vm=2@every day at noon", 0, []string{`window "every day at noon"`}},
		{"garbage", "%%%", 0, []string{`rule 1 "%%%"`}},
		{"every bad rule is named", "a=x; b=1; c=1@Funday", 0, []string{`rule 1 "a=x"`, `rule 3 "c=1@Funday"`}},
		{"negative lead", "shell=1", -time.Minute, []string{"lead -1m0s"}},
		{"lead over a day", "shell=1", 25 * time.Hour, []string{"lead 25h0m0s"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(tc.spec, time.UTC, tc.lead)
			if err == nil {
				t.Fatalf("Parse(%q) = %+v, want an error", tc.spec, s)
			}
			if diff := cmp.Diff(Schedule{}, s); diff != "" {
				t.Errorf("Parse returned a schedule with its error (-want +got):\n%s", diff)
			}
			for _, frag := range tc.want {
				if !strings.Contains(err.Error(), frag) {
					t.Errorf("error %q does not mention %q", err, frag)
				}
			}
		})
	}
	if _, err := Parse("shell=1", nil, 0); err == nil {
		t.Error("Parse without a time zone: no error")
	}
}

func TestTarget(t *testing.T) {
	berlin := mustLoad(t, "Europe/Berlin")
	const example = "shell=2; linux-vm=20@Mon-Fri 13:50-16:00; linux-vm=4@Sat 09:00-12:00"
	// 2026-11-30 is a Monday.
	utc := func(day, hour, minute int) time.Time { return time.Date(2026, 11, day, hour, minute, 0, 0, time.UTC) }
	local := func(loc *time.Location, y int, m time.Month, day, hour, minute int) time.Time {
		return time.Date(y, m, day, hour, minute, 0, 0, loc)
	}
	tests := []struct {
		name string
		spec string
		loc  *time.Location
		lead time.Duration
		lab  string
		now  time.Time
		want int
	}{
		{"a lab without rules wants none", example, time.UTC, 10 * time.Minute, "other", utc(30, 14, 0), 0},
		{"an always rule holds at any time", example, time.UTC, 10 * time.Minute, "shell", utc(29, 3, 17), 2},
		{"before the lead the window is not in force", example, time.UTC, 10 * time.Minute, "linux-vm", utc(30, 13, 39), 0},
		{"the pool grows exactly lead before the window opens", example, time.UTC, 10 * time.Minute, "linux-vm", utc(30, 13, 40), 20},
		{"inside the window", example, time.UTC, 10 * time.Minute, "linux-vm", utc(30, 15, 59), 20},
		{"the pool shrinks when the window closes", example, time.UTC, 10 * time.Minute, "linux-vm", utc(30, 16, 0), 0},
		{"without lead the pool grows only at the opening", example, time.UTC, 0, "linux-vm", utc(30, 13, 49), 0},
		{"without lead, at the opening", example, time.UTC, 0, "linux-vm", utc(30, 13, 50), 20},
		{"weekday filter: Sunday has no window", example, time.UTC, 10 * time.Minute, "linux-vm", time.Date(2026, 12, 6, 14, 0, 0, 0, time.UTC), 0},
		{"weekday filter: Saturday has its own size", example, time.UTC, 10 * time.Minute, "linux-vm", time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC), 4},
		{"weekday filter: Saturday afternoon none", example, time.UTC, 10 * time.Minute, "linux-vm", time.Date(2026, 12, 5, 14, 0, 0, 0, time.UTC), 0},
		{"lead reaches into the next day's window", "vm=5@Tue 00:00-01:00", time.UTC, 10 * time.Minute, "vm", utc(30, 23, 55), 5},
		{"lead does not reach a window on a filtered day", "vm=5@Wed 00:00-01:00", time.UTC, 10 * time.Minute, "vm", utc(30, 23, 55), 0},
		{"whole-day rule ends at midnight", "vm=5@Mon", time.UTC, 0, "vm", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), 0},
		{"whole-day rule, last minute", "vm=5@Mon", time.UTC, 0, "vm", utc(30, 23, 59), 5},
		{"window to 24:00 holds until midnight", "vm=5@20:00-24:00", time.UTC, 0, "vm", utc(30, 23, 59), 5},
		{"timezone: 13:50 Berlin is 12:50 UTC; lead starts 12:40 UTC", example, berlin, 10 * time.Minute, "linux-vm", utc(30, 12, 40), 20},
		{"timezone: 12:39 UTC is before the Berlin lead", example, berlin, 10 * time.Minute, "linux-vm", utc(30, 12, 39), 0},
		{"timezone: 16:00 Berlin is 15:00 UTC", example, berlin, 10 * time.Minute, "linux-vm", utc(30, 15, 0), 0},
		{"timezone: the day is Berlin's (Monday 23:30 UTC is Tuesday there)", "vm=3@Tue", berlin, 0, "vm", utc(30, 23, 30), 3},
		{"timezone: the same instant in UTC is still Monday", "vm=3@Tue", time.UTC, 0, "vm", utc(30, 23, 30), 0},
		{"daylight saving: 09:00 Berlin on the day clocks go forward is 07:00 UTC",
			"vm=3@Sun 09:00-12:00", berlin, 0, "vm", time.Date(2026, 3, 29, 7, 0, 0, 0, time.UTC), 3},
		{"daylight saving: 06:59 UTC that day is 08:59 Berlin",
			"vm=3@Sun 09:00-12:00", berlin, 0, "vm", time.Date(2026, 3, 29, 6, 59, 0, 0, time.UTC), 0},
		{"local instants read in the schedule's zone", example, berlin, 0, "linux-vm", local(berlin, 2026, 12, 4, 15, 59), 20},
		{"overlapping rules take the max, not the sum", "vm=3; vm=10@Mon 09:00-10:00; vm=7@Mon-Tue", time.UTC, 0, "vm", utc(30, 9, 30), 10},
		{"overlap: outside the big window the next largest holds", "vm=3; vm=10@Mon 09:00-10:00; vm=7@Mon-Tue", time.UTC, 0, "vm", utc(30, 10, 0), 7},
		{"overlap: a small window does not lower an always rule", "vm=3; vm=1@Mon", time.UTC, 0, "vm", utc(30, 10, 0), 3},
		{"lead overlapping two windows takes the larger", "vm=2@Mon 09:00-10:00; vm=6@Mon 10:05-11:00", time.UTC, 10 * time.Minute, "vm", utc(30, 9, 58), 6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustParse(t, tc.spec, tc.loc, tc.lead)
			if got := s.Target(tc.lab, tc.now); got != tc.want {
				t.Errorf("Target(%q, %s) = %d, want %d", tc.lab, tc.now, got, tc.want)
			}
		})
	}
}

func TestLabsAndCheck(t *testing.T) {
	s := mustParse(t, "vm=1; shell=2@Mon; vm=3@Tue; db=1", time.UTC, 0)
	if diff := cmp.Diff([]string{"db", "shell", "vm"}, s.Labs()); diff != "" {
		t.Errorf("Labs (-want +got):\n%s", diff)
	}
	known := func(lab string) error {
		if lab == "vm" || lab == "shell" {
			return nil
		}
		return errors.New("unknown lab")
	}
	err := s.Check(known)
	if err == nil || !strings.Contains(err.Error(), `lab "db": unknown lab`) || strings.Contains(err.Error(), `"vm"`) {
		t.Errorf("Check = %v, want exactly db named as unknown", err)
	}
	if err := mustParse(t, "vm=1; shell=1", time.UTC, 0).Check(known); err != nil {
		t.Errorf("Check of known labs = %v", err)
	}
	if err := (Schedule{}).Check(known); err != nil {
		t.Errorf("Check of no pool = %v", err)
	}
}
