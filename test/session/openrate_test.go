package session_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"labkeep/localrun/stacktest"
	"labkeep/shared/session"
)

// One student opening in a loop while every seat is taken: each refusal
// before the open rate is reached leaves its row (the student reads why
// it failed); past the rate every answer is 429 too_many_opens with a
// Retry-After no later than the rate's window, and writes nothing. So
// 1,000 refused opens add at most the rate's rows per window.
func TestOpensPastTheRateWriteNoRows(t *testing.T) {
	e := newEnv(t, stacktest.Options{MaxVMs: 1})
	e.Opened("holder", "linux-vm")
	rate := e.App.Config.OpenRate
	if rate.Max <= 0 {
		t.Fatalf("the deployment has no open rate (%+v)", rate)
	}
	const tries = 1000
	began := time.Now()
	counts := map[string]int{}
	for i := range tries {
		r := e.Open("looper", "linux-vm")
		counts[strconv.Itoa(r.Status)+" "+r.Code]++
		if r.Status != http.StatusTooManyRequests {
			continue
		}
		s, err := strconv.Atoi(r.Header.Get("Retry-After"))
		if err != nil || s < 1 || time.Duration(s)*time.Second > rate.Per {
			t.Fatalf("open %d: 429 with Retry-After %q, want 1…%s", i, r.Header.Get("Retry-After"), rate.Per)
		}
		noInternals(t, "too_many_opens", r)
	}
	took := time.Since(began)
	windows := int(took/rate.Per) + 1
	rows := e.Count(`SELECT count(*) FROM sessions WHERE student = 'looper'`)
	t.Logf("%d opens in %s: %v; %d rows", tries, took.Round(time.Millisecond), counts, rows)
	if rows < rate.Max || rows > rate.Max*windows {
		t.Errorf("looper's rows = %d after %d opens in %s, want %d…%d (the rate %d per %s)", rows, tries, took, rate.Max, rate.Max*windows, rate.Max, rate.Per)
	}
	if counts["503 no_capacity"] != rows || counts["429 "+session.ErrTooManyOpens.Error()] != tries-rows {
		t.Errorf("answers %v, want %d no_capacity (one per row) and the rest too_many_opens", counts, rows)
	}
}
