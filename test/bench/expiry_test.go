package bench_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"labkeep/localrun/benchtable"
	"labkeep/localrun/devserve"
	"labkeep/localrun/stacktest"
	"labkeep/shared/session"
)

// expiryScale is one run of the expiry benchmark: how many sessions, how
// long each lives, how far apart they open and the scheduler's period.
type expiryScale struct {
	sessions        int
	lifetime, every time.Duration
	period          time.Duration
}

// productionPeriod is the period of the shipped schedules (PingSource,
// CronJob, EventBridge, `make run`'s LABKEEP_REAP_INTERVAL): every minute.
const productionPeriod = time.Minute

// BenchmarkTableExpiry: a session's expiry → every object of it gone, on
// the real schedule. The functions run on the wall clock (the deployment's
// clock is never moved) and devserve's scheduler, the one `make run` runs,
// POSTs /reapTick with the scheduler token every period, as the production
// schedules do;
// nothing else ends a session. Sessions open at spread-out moments so
// their expiries fall at every phase of the schedule. The physical floor
// is the period: a session expiring just after a tick waits for the next
// one.
func BenchmarkTableExpiry(b *testing.B) {
	sc := expiryScale{sessions: 20, lifetime: 30 * time.Second, every: 6 * time.Second, period: productionPeriod}
	note := "real 60 s schedule, wall clock"
	if benchtable.Quick() {
		sc = expiryScale{sessions: 3, lifetime: 3 * time.Second, every: 2 * time.Second, period: 5 * time.Second}
		note = "quick: scheduler period shortened to 5 s"
	}
	d := stacktest.Deploy(b, st, stacktest.Options{Lifetime: sc.lifetime, MaxVMs: 1000, KubeQPS: 500, KubeBurst: 1000, DBConns: 20, Log: stacktest.Discard()})
	for range b.N {
		lat, ticks := expiryRun(b, d, sc)
		// Each gap is the time from expiry to the tick that ended it plus
		// the deletions; more than a period means a tick missed it.
		p := func(q float64) float64 { return benchtable.Quantile(lat, q).Seconds() }
		c := fmt.Sprintf("%d VM sessions, lifetime %s, opened %s apart, scheduler every %s", sc.sessions, sc.lifetime, sc.every, sc.period)
		for _, f := range []struct {
			name string
			v    float64
		}{{"expiry → objects gone p50", p(0.5)}, {"expiry → objects gone p99", p(0.99)}, {"expiry → objects gone max", p(1)}} {
			benchtable.Record(b, benchtable.Row{
				Group: "Expiry on the schedule", Case: c, Figure: f.name, Value: f.v, Unit: "s",
				Baseline: "the schedule period (physical floor of the worst case)", BaselineValue: benchtable.F(sc.period.Seconds()),
				Note: fmt.Sprintf("%s; %d ticks, all 200", note, ticks),
			})
		}
	}
}

// expiryRun opens sc.sessions VM sessions sc.every apart while a scheduler
// ticks every sc.period, and returns, per session, the time from its
// expiresAt until none of its objects is left, and the number of ticks.
func expiryRun(b *testing.B, d *stacktest.Deployment, sc expiryScale) ([]time.Duration, int) {
	b.Helper()
	ctx, stop := context.WithCancel(context.Background())
	sched := expirySchedule(ctx, d.URL, sc.period)
	defer func() {
		stop()
		sched.wait()
	}()
	type opened struct {
		id, student string
		expires     time.Time
		gone        time.Time
	}
	var sessions []*opened
	student := stacktest.Suffix()
	next := time.Now()
	bound := time.Now().Add(time.Duration(sc.sessions)*sc.every + sc.lifetime + 3*sc.period + 2*time.Minute)
	for {
		if len(sessions) < sc.sessions && !time.Now().Before(next) {
			name := fmt.Sprintf("expiry-%s-%d", student, len(sessions))
			s := d.Opened(name, "linux-vm")
			sessions = append(sessions, &opened{id: s.ID, student: name, expires: s.ExpiresAt})
			next = next.Add(sc.every)
		}
		// One listing of the namespace says which sessions still have
		// objects; an object's absence from it is the session's end.
		left := map[string]bool{}
		for _, o := range d.List(stacktest.Listing{LeaveOutAnchorPods: true}) {
			left[o.Session] = true
		}
		now, pending := time.Now(), 0
		for _, s := range sessions {
			if s.gone.IsZero() && !left[s.id] {
				if now.Before(s.expires) {
					b.Fatalf("session %s lost its objects at %s, before its expiry %s", s.id, now, s.expires)
				}
				s.gone = now
			}
			if s.gone.IsZero() {
				pending++
			}
		}
		if len(sessions) == sc.sessions && pending == 0 {
			break
		}
		if now.After(bound) {
			b.Fatalf("%d sessions still have objects at %s; ticks: %v", pending, now, sched.outcomes())
		}
		time.Sleep(200 * time.Millisecond)
	}
	var lat []time.Duration
	for _, s := range sessions {
		lat = append(lat, s.gone.Sub(s.expires))
		if got := d.Session(s.id).Status; got != session.StatusExpired {
			b.Errorf("session %s ended %s, want expired", s.id, got)
		}
	}
	out := sched.outcomes()
	for _, code := range out {
		if code != http.StatusOK {
			b.Fatalf("a scheduled reapTick answered %d; all: %v", code, out)
		}
	}
	return lat, len(out)
}

// expiryScheduler is devserve's scheduler (the one `make run` plays the
// production schedule with), keeping each tick's HTTP status.
type expiryScheduler struct {
	mu    sync.Mutex
	codes []int // each tick's HTTP status, 0 when it got no answer
	done  chan struct{}
}

func expirySchedule(ctx context.Context, url string, period time.Duration) *expiryScheduler {
	s := &expiryScheduler{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		devserve.Schedule(ctx, url, stacktest.SchedulerToken, period, func(status int, _ []byte, _ error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.codes = append(s.codes, status)
		})
	}()
	return s
}

func (s *expiryScheduler) wait() { <-s.done }

func (s *expiryScheduler) outcomes() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.codes)
}
