package seating

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/reservation"
	"labkeep/shared/session"
)

var t0 = time.Date(2026, 12, 1, 13, 0, 0, 0, time.UTC)

func at(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }

func mins(ms ...int) []time.Duration {
	var out []time.Duration
	for _, m := range ms {
		out = append(out, time.Duration(m)*time.Minute)
	}
	return out
}

func TestQueueETAs(t *testing.T) {
	for _, tc := range []struct {
		name                string
		in                  ETAInput
		wantLikely, wantMax []time.Duration
	}{{
		name:       "room for the head: it starts now",
		in:         ETAInput{Now: t0, Capacity: 2, Live: []Holding{{1, at(30), at(90)}}, Waiting: []int{1}},
		wantLikely: mins(0), wantMax: mins(0),
	}, {
		name: "the k-th waiting student gets the k-th earliest freeing slot",
		in: ETAInput{Now: t0, Capacity: 3, Live: []Holding{{1, at(30), at(120)}, {1, at(10), at(60)}, {1, at(50), at(90)}},
			Waiting: []int{1, 1, 1}, Likely: 40 * time.Minute, Latest: 180 * time.Minute, Lag: 2 * time.Minute},
		wantLikely: mins(10, 30, 50), wantMax: mins(62, 92, 122),
	}, {
		name: "beyond the live sessions the line waits for those it served",
		in: ETAInput{Now: t0, Capacity: 1, Live: []Holding{{1, at(10), at(60)}},
			Waiting: []int{1, 1, 1}, Likely: 40 * time.Minute, Latest: 180 * time.Minute},
		wantLikely: mins(10, 50, 90), wantMax: mins(60, 240, 420),
	}, {
		name: "a head that does not fit blocks everyone behind it",
		in: ETAInput{Now: t0, Capacity: 3, Live: []Holding{{1, at(10), at(20)}, {2, at(30), at(40)}},
			Waiting: []int{3, 1}, Likely: 60 * time.Minute, Latest: 100 * time.Minute},
		wantLikely: mins(30, 90), wantMax: mins(40, 140),
	}, {
		name: "a session past its likely end is counted as freeing now",
		in: ETAInput{Now: t0, Capacity: 1, Live: []Holding{{1, at(-5), at(30)}},
			Waiting: []int{1}, Likely: time.Hour, Latest: 3 * time.Hour},
		wantLikely: mins(0), wantMax: mins(30),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var likely, latest []time.Duration
			for _, e := range QueueETAs(tc.in) {
				likely, latest = append(likely, e.Likely), append(latest, e.Latest)
			}
			if diff := cmp.Diff(tc.wantLikely, likely); diff != "" {
				t.Errorf("likely (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantMax, latest); diff != "" {
				t.Errorf("latest (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEarlyCloseShare(t *testing.T) {
	ended := func(startM, expM, finM int) session.Session {
		return session.Session{Window: lifetime.Window{StartedAt: at(startM), ExpiresAt: at(expM), MaxExpiresAt: at(expM + 120)},
			ReadyAt: at(startM + 1), FinishedAt: at(finM)}
	}
	neverReady := ended(0, 60, 5)
	neverReady.ReadyAt = time.Time{}
	for _, tc := range []struct {
		name  string
		ended []session.Session
		want  float64
	}{
		{"no sessions: no early closes assumed", nil, 0},
		{"ran out its time", []session.Session{ended(0, 60, 61)}, 0},
		{"closed half way", []session.Session{ended(0, 60, 30)}, 0.5},
		{"median of an odd count", []session.Session{ended(0, 60, 60), ended(0, 60, 30), ended(0, 60, 6)}, 0.5},
		{"median of an even count", []session.Session{ended(0, 60, 60), ended(0, 60, 30)}, 0.25},
		{"a session that never ran is no sample", []session.Session{neverReady, ended(0, 60, 45)}, 0.25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := EarlyCloseShare(tc.ended); got != tc.want {
				t.Errorf("share = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestHoldingOf(t *testing.T) {
	s := session.Session{Window: lifetime.Window{StartedAt: at(0), ExpiresAt: at(60), MaxExpiresAt: at(180)}}
	for _, tc := range []struct {
		name  string
		share float64
		now   time.Time
		want  Holding
	}{
		{"no early closes: likely at expiry", 0, at(10), Holding{1, at(60), at(180)}},
		{"a quarter left unused", 0.25, at(10), Holding{1, at(45), at(180)}},
		{"likely end already passed: now", 0.5, at(40), Holding{1, at(40), at(180)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, HoldingOf(s, 1, tc.share, tc.now)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// simStudent is one student of the simulated afternoon.
type simStudent struct {
	arrive time.Time
	vms    int
	// wants is how long they would use the lab: less than the hour (they
	// close early), more (they extend when warned), or forever (they let
	// it run out).
	wants time.Duration
	// reapLag is how late after the expiry the reaper frees the VMs.
	reapLag time.Duration

	joined  time.Time
	started time.Time
	sess    session.Session
	// etas are the ETAs shown while waiting, each with when it was shown.
	etas []shownETA
}

type shownETA struct {
	at  time.Time
	eta ETA
}

// An afternoon of 24 students arriving over four hours for 8 VM slots
// (one in eight opens a 3-VM lab), with realistic lifetimes: a third close
// early, a third extend (up to the 3-hour cap) and a third let the hour
// run out, the reaper freeing their VMs up to 90 s after the expiry. Every
// minute each waiting student is shown the ETA computed from what labkeep
// knows then (live windows, the early-close share of the sessions ended so
// far). The logged figures are how far the likely ETA was from the real
// wait; the latest bound must never be exceeded. Pure: the clock is the
// simulation's, in whole seconds.
func TestETAOverASimulatedAfternoon(t *testing.T) {
	policy := lifetime.DefaultPolicy()
	const capacity = 8
	rng := rand.New(rand.NewPCG(42, 7))
	var students []*simStudent
	const arrivals = 24
	for i := range arrivals {
		s := &simStudent{arrive: t0.Add(time.Duration(rng.IntN(4*3600)) * time.Second), vms: 1,
			reapLag: time.Duration(rng.IntN(91)) * time.Second}
		if i%8 == 0 {
			s.vms = 3
		}
		switch rng.IntN(3) {
		case 0:
			s.wants = time.Duration(5+rng.IntN(50)) * time.Minute
		case 1:
			s.wants = time.Duration(65+rng.IntN(120)) * time.Minute
		default:
			s.wants = 24 * time.Hour
		}
		students = append(students, s)
	}
	slices.SortFunc(students, func(a, b *simStudent) int { return a.arrive.Compare(b.arrive) })
	everyone := slices.Clone(students)

	var line, live []*simStudent
	var ended []session.Session
	used := 0
	for now := t0; ; now = now.Add(time.Second) {
		// Sessions end: closed by the student, or expired and reaped.
		for _, s := range slices.Clone(live) {
			w := s.sess.Window
			// Warned 10 minutes before the end: extend if they want more.
			if w.ExpiresAt.Sub(now) == 10*time.Minute && w.StartedAt.Add(s.wants).After(w.ExpiresAt) {
				if ext, err := policy.Extend(w, now); err == nil {
					s.sess.Window, w = ext, ext
				}
			}
			closeAt := w.StartedAt.Add(s.wants)
			freeAt := w.ExpiresAt.Add(s.reapLag)
			if closeAt.Before(w.ExpiresAt) {
				freeAt = closeAt
			}
			if now.Before(freeAt) {
				continue
			}
			s.sess.FinishedAt = now
			ended = append(ended, s.sess)
			used -= s.vms
			live = slices.DeleteFunc(live, func(l *simStudent) bool { return l == s })
		}
		for len(students) > 0 && !students[0].arrive.After(now) {
			s := students[0]
			students = students[1:]
			s.joined = now
			line = append(line, s)
		}
		// Served strictly first come, first served.
		for len(line) > 0 && used+line[0].vms <= capacity {
			s := line[0]
			line = line[1:]
			s.started = now
			s.sess = session.Session{Window: policy.Open(now), ReadyAt: now}
			used += s.vms
			live = append(live, s)
		}
		if now.Sub(t0)%time.Minute == 0 && len(line) > 0 {
			share := EarlyCloseShare(ended)
			in := ETAInput{Now: now, Capacity: capacity, Lag: reapLag,
				Likely: time.Duration(float64(policy.Lifetime) * (1 - share)), Latest: policy.MaxLifetime}
			for _, l := range live {
				in.Live = append(in.Live, HoldingOf(l.sess, l.vms, share, now))
			}
			for _, s := range line {
				in.Waiting = append(in.Waiting, s.vms)
			}
			for i, eta := range QueueETAs(in) {
				line[i].etas = append(line[i].etas, shownETA{now, eta})
			}
		}
		if len(students) == 0 && len(line) == 0 {
			break
		}
	}

	var errs []time.Duration
	var waited, shown, exceeded int
	var longest time.Duration
	for _, s := range everyone {
		if len(s.etas) == 0 {
			continue
		}
		waited++
		for _, e := range s.etas {
			actual := s.started.Sub(e.at)
			shown++
			d := e.eta.Likely - actual
			errs = append(errs, max(d, -d))
			if actual > e.eta.Latest {
				exceeded++
				t.Errorf("student joined %s: shown at %s latest %s, started after %s", s.joined.Format("15:04:05"), e.at.Format("15:04"), e.eta.Latest, actual)
			}
			longest = max(longest, actual)
		}
	}
	if waited == 0 || shown == 0 {
		t.Fatal("nobody waited: the afternoon is not busy enough to test anything")
	}
	slices.Sort(errs)
	p := func(q float64) time.Duration { return errs[int(q*float64(len(errs)-1))].Round(time.Second) }
	t.Logf("%d of %d students waited; %d ETAs shown; longest wait %s; |ETA − actual| p50 %s, p80 %s, max %s; latest bound exceeded %d times",
		waited, arrivals, shown, longest.Round(time.Second), p(0.5), p(0.8), errs[len(errs)-1].Round(time.Second), exceeded)
}

func TestReservedHoldings(t *testing.T) {
	now := time.Date(2026, 12, 7, 13, 50, 0, 0, time.UTC)
	rules := reservation.Rules{Lead: 10 * time.Minute, Release: 15 * time.Minute}
	hold := func(id int64, seats, per int, kind labs.Kind, start time.Time) reservation.Hold {
		return reservation.Hold{Reservation: reservation.Reservation{ID: id, Seats: seats, Start: start, End: start.Add(time.Hour)}, Kind: kind, PerSeat: per}
	}
	at14 := now.Add(10 * time.Minute)
	holds := []reservation.Hold{
		hold(1, 5, 1, labs.KindVM, at14),                        // holding now: 3 of 5 taken
		hold(2, 2, 2, labs.KindVM, now.Add(45*time.Minute)),     // holds later: counted from now
		hold(3, 4, 1, labs.KindPod, at14),                       // another bucket
		hold(4, 3, 1, labs.KindVM, now.Add(-20*time.Minute)),    // released already
		hold(5, 2, 1, labs.KindVM, at14.Add(-50*time.Minute+1)), // every seat taken
	}
	got := ReservedHoldings(now, holds, map[int64]reservation.Use{1: {Taken: 3}, 5: {Taken: 1, Pooled: 1}}, labs.KindVM, rules)
	want := []Holding{
		{VMs: 2, Likely: at14.Add(15 * time.Minute), Latest: at14.Add(15 * time.Minute)},
		{VMs: 4, Likely: now.Add(60 * time.Minute), Latest: now.Add(60 * time.Minute)},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// The line waits for them: one student needing 1 of 3 VMs, 1 in use
	// until 15:00, waits for the class's seats' release at 14:15.
	etas := QueueETAs(ETAInput{Now: now, Capacity: 3, Live: append([]Holding{{VMs: 1, Likely: now.Add(70 * time.Minute), Latest: now.Add(70 * time.Minute)}}, got[0]),
		Waiting: []int{1}, Likely: time.Hour, Latest: time.Hour})
	if etas[0].Latest != 25*time.Minute {
		t.Errorf("the wait behind the class's held seats: %v; want 25m (their release)", etas[0])
	}
}
