// Package warmpool decides how many pre-provisioned, unclaimed instances
// (VMs or workspace Pods) each lab keeps ready, so that opening a session
// claims one instead of provisioning cold. It is pure: the schedule says how
// many instances a lab should have at an instant, and Plan turns that and
// what exists into creations and deletions. It does no I/O and takes the
// current time as an argument, so callers inject their clock; the store and
// the cluster that carry the plan out live in the adapters.
package warmpool

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Clock is a time of day, Hour 0–24 and Minute 0–59; 24:00 is only valid as
// the end of a window (midnight at the end of the day).
type Clock struct{ Hour, Minute int }

func (c Clock) String() string { return fmt.Sprintf("%02d:%02d", c.Hour, c.Minute) }

func (c Clock) minutes() int { return c.Hour*60 + c.Minute }

// Rule asks for Size instances of Lab, always (no window) or on the given
// weekdays between From (inclusive) and To (exclusive), in the local time of
// the Schedule's Location. Days empty means every day; From and To both zero
// means the whole day. A window never crosses midnight: write two rules.
type Rule struct {
	Lab      string
	Size     int
	Days     []time.Weekday
	From, To Clock
}

// always reports whether the rule is in force at every instant.
func (r Rule) always() bool { return len(r.Days) == 0 && r.wholeDay() }

func (r Rule) wholeDay() bool { return r.From == (Clock{}) && r.To == (Clock{}) }

// onDay reports whether the rule applies on weekday d.
func (r Rule) onDay(d time.Weekday) bool { return len(r.Days) == 0 || slices.Contains(r.Days, d) }

// Schedule is the parsed warm-pool setting: the rules, the time zone their
// windows are read in, and Lead, how long before a window opens its pool
// starts to fill (instances take minutes to become ready, so the pool must
// be full when the first student arrives, not start filling then).
type Schedule struct {
	Rules    []Rule
	Location *time.Location
	Lead     time.Duration
}

// MaxLead bounds Lead: a pool filled more than a day ahead of its window
// only burns capacity, and the bound keeps Target's scan of days short.
const MaxLead = 24 * time.Hour

// CheckLead is the rule a lead must follow, 0 to MaxLead; Parse applies
// it, and a binary may apply it alone to name the lead's own setting.
func CheckLead(lead time.Duration) error {
	if lead < 0 || lead > MaxLead {
		return fmt.Errorf("warm pool: lead %s must be between 0 and %s", lead, MaxLead)
	}
	return nil
}

// Parse reads the warm-pool setting, rules separated by ";":
//
//	shell=2; linux-vm=20@Mon-Fri 13:50-16:00; linux-vm=4@Sat 09:00-12:00
//
// A rule is lab=size, optionally followed by @ and a window: days
// (Mon … Sun, a comma-separated list of days and ranges such as Mon-Fri or
// Fri-Mon), a time range HH:MM-HH:MM (To may be 24:00, From must be before
// To), or days then a time range. A rule without a window is in force
// always; days without times mean those whole days; times without days mean
// every day. Size is a positive whole number. The empty (or all-blank)
// string is no pool. Windows are read in loc; lead is how early a window's
// pool starts filling (0 to MaxLead).
//
// Bad input returns an error naming the rule and the part at fault, and no
// schedule: a typo never silently drops a rule.
func Parse(spec string, loc *time.Location, lead time.Duration) (Schedule, error) {
	if loc == nil {
		return Schedule{}, errors.New("warm pool: no time zone given")
	}
	if err := CheckLead(lead); err != nil {
		return Schedule{}, err
	}
	s := Schedule{Location: loc, Lead: lead}
	var errs []error
	n := 0
	for part := range strings.SplitSeq(spec, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		n++
		r, err := parseRule(part)
		if err != nil {
			errs = append(errs, fmt.Errorf("warm pool rule %d %q: %w", n, part, err))
			continue
		}
		s.Rules = append(s.Rules, r)
	}
	if err := errors.Join(errs...); err != nil {
		return Schedule{}, err
	}
	return s, nil
}

func parseRule(part string) (Rule, error) {
	head, window, timed := strings.Cut(part, "@")
	lab, size, ok := strings.Cut(head, "=")
	if !ok {
		return Rule{}, errors.New(`want lab=size, optionally followed by @window`)
	}
	r := Rule{Lab: strings.TrimSpace(lab)}
	if r.Lab == "" {
		return Rule{}, errors.New("no lab name before =")
	}
	size = strings.TrimSpace(size)
	n, err := strconv.Atoi(size)
	if err != nil || n < 1 {
		return Rule{}, fmt.Errorf("size %q is not a positive whole number", size)
	}
	r.Size = n
	if !timed {
		return r, nil
	}
	fields := strings.Fields(window)
	switch {
	case len(fields) == 1 && strings.Contains(fields[0], ":"):
		r.From, r.To, err = parseTimes(fields[0])
	case len(fields) == 1:
		r.Days, err = parseDays(fields[0])
	case len(fields) == 2:
		if r.Days, err = parseDays(fields[0]); err == nil {
			r.From, r.To, err = parseTimes(fields[1])
		}
	default:
		err = fmt.Errorf("window %q: want days, HH:MM-HH:MM, or days then HH:MM-HH:MM", strings.TrimSpace(window))
	}
	if err != nil {
		return Rule{}, err
	}
	return r, nil
}

var weekdays = map[string]time.Weekday{
	"sun": time.Sunday, "mon": time.Monday, "tue": time.Tuesday, "wed": time.Wednesday,
	"thu": time.Thursday, "fri": time.Friday, "sat": time.Saturday,
}

func parseDay(s string) (time.Weekday, error) {
	d, ok := weekdays[strings.ToLower(s)]
	if !ok {
		return 0, fmt.Errorf("unknown day %q (want Mon, Tue, Wed, Thu, Fri, Sat or Sun)", s)
	}
	return d, nil
}

// parseDays reads "Mon-Fri", "Sat", "Mon,Wed,Fri-Sun"; a range that wraps
// (Fri-Mon) runs through the weekend. The result is in week order, without
// repeats.
func parseDays(s string) ([]time.Weekday, error) {
	var in [7]bool
	for item := range strings.SplitSeq(s, ",") {
		first, last, isRange := strings.Cut(item, "-")
		a, err := parseDay(first)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = parseDay(last); err != nil {
				return nil, err
			}
		}
		for d := a; ; d = (d + 1) % 7 {
			in[d] = true
			if d == b {
				break
			}
		}
	}
	var days []time.Weekday
	for d, ok := range in {
		if ok {
			days = append(days, time.Weekday(d))
		}
	}
	return days, nil
}

func parseTimes(s string) (from, to Clock, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return from, to, fmt.Errorf("time range %q: want HH:MM-HH:MM", s)
	}
	if from, err = parseClock(a); err != nil {
		return from, to, err
	}
	if to, err = parseClock(b); err != nil {
		return from, to, err
	}
	if from.Hour == 24 {
		return from, to, fmt.Errorf("time range %q: a window cannot start at 24:00", s)
	}
	if from.minutes() >= to.minutes() {
		return from, to, fmt.Errorf("time range %q: start must be before end (a window cannot cross midnight; write two rules)", s)
	}
	return from, to, nil
}

func parseClock(s string) (Clock, error) {
	h, m, ok := strings.Cut(s, ":")
	hour, err1 := strconv.Atoi(h)
	minute, err2 := strconv.Atoi(m)
	if !ok || !digits(h) || len(h) > 2 || !digits(m) || len(m) != 2 || err1 != nil || err2 != nil ||
		hour < 0 || minute < 0 || minute > 59 || hour > 24 || (hour == 24 && minute != 0) {
		return Clock{}, fmt.Errorf("time %q: want HH:MM between 00:00 and 24:00", s)
	}
	return Clock{Hour: hour, Minute: minute}, nil
}

func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// Target is how many pool instances of lab should exist at now: the largest
// Size among the lab's rules in force at any instant of [now, now+Lead]. So
// the pool starts filling Lead before a window opens (instances are ready
// when the first student comes) and shrinks as soon as the window closes
// (To is exclusive). Overlapping rules do not add up: the largest wins. A
// lab without rules has a target of 0.
func (s Schedule) Target(lab string, now time.Time) int {
	target := 0
	for _, r := range s.Rules {
		if r.Lab == lab && r.Size > target && s.inForce(r, now, now.Add(s.Lead)) {
			target = r.Size
		}
	}
	return target
}

// inForce reports whether r is in force at some instant of [from, to]. Each
// local day that could overlap is checked, with the window built by
// time.Date in the schedule's location so daylight-saving days are right.
func (s Schedule) inForce(r Rule, from, to time.Time) bool {
	if r.always() {
		return true
	}
	loc := s.Location
	if loc == nil {
		loc = time.UTC
	}
	lf := from.In(loc)
	day := time.Date(lf.Year(), lf.Month(), lf.Day()-1, 0, 0, 0, 0, loc)
	for ; !day.After(to); day = day.AddDate(0, 0, 1) {
		if !r.onDay(day.Weekday()) {
			continue
		}
		start, end := r.From, r.To
		if r.wholeDay() {
			end = Clock{Hour: 24}
		}
		y, m, d := day.Date()
		open := time.Date(y, m, d, start.Hour, start.Minute, 0, 0, loc)
		shut := time.Date(y, m, d, end.Hour, end.Minute, 0, 0, loc)
		if !open.After(to) && shut.After(from) {
			return true
		}
	}
	return false
}

// Labs are the labs the schedule names, sorted, each once.
func (s Schedule) Labs() []string {
	var labs []string
	for _, r := range s.Rules {
		if !slices.Contains(labs, r.Lab) {
			labs = append(labs, r.Lab)
		}
	}
	slices.Sort(labs)
	return labs
}

// Check reports every lab the schedule names that poolable refuses (an
// unknown lab, a lab no instance can be made for ahead of its student), so
// a typo in a lab name fails at start-up instead of keeping no pool.
func (s Schedule) Check(poolable func(lab string) error) error {
	var errs []error
	for _, lab := range s.Labs() {
		if err := poolable(lab); err != nil {
			errs = append(errs, fmt.Errorf("warm pool: lab %q: %w", lab, err))
		}
	}
	return errors.Join(errs...)
}
