package lifetime

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

func TestOpen(t *testing.T) {
	p := Policy{Lifetime: 60 * time.Minute, MaxLifetime: 180 * time.Minute}
	want := Window{StartedAt: t0, ExpiresAt: t0.Add(time.Hour), MaxExpiresAt: t0.Add(3 * time.Hour)}
	if diff := cmp.Diff(want, p.Open(t0)); diff != "" {
		t.Errorf("Open (-want +got):\n%s", diff)
	}
}

func TestExtend(t *testing.T) {
	p := Policy{Lifetime: 60 * time.Minute, MaxLifetime: 180 * time.Minute}
	open := p.Open(t0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	tests := []struct {
		name        string
		window      Window
		now         time.Time
		wantExpires time.Time
		wantErr     error
	}{
		{"right after open pushes to now+lifetime", open, at(time.Minute), at(61 * time.Minute), nil},
		{"half-way pushes to now+lifetime", open, at(30 * time.Minute), at(90 * time.Minute), nil},
		{"one second before expiry still extends", open, at(time.Hour - time.Second), at(2*time.Hour - time.Second), nil},
		{"at expiry is refused as expired", open, at(time.Hour), at(time.Hour), ErrExpired},
		{"past expiry is refused as expired", open, at(2 * time.Hour), at(time.Hour), ErrExpired},
		{"near the cap is clamped to the cap",
			Window{t0, at(150 * time.Minute), at(180 * time.Minute)}, at(140 * time.Minute), at(180 * time.Minute), nil},
		{"at the cap is refused",
			Window{t0, at(180 * time.Minute), at(180 * time.Minute)}, at(150 * time.Minute), at(180 * time.Minute), ErrAtCap},
		{"at the cap and past it is refused as expired",
			Window{t0, at(180 * time.Minute), at(180 * time.Minute)}, at(181 * time.Minute), at(180 * time.Minute), ErrExpired},
		{"never shortens when lifetime was lowered",
			Window{t0, at(170 * time.Minute), at(180 * time.Minute)}, at(20 * time.Minute), at(170 * time.Minute), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.Extend(tc.window, tc.now)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Extend error = %v, want %v", err, tc.wantErr)
			}
			if !got.ExpiresAt.Equal(tc.wantExpires) {
				t.Errorf("ExpiresAt = %s, want %s", got.ExpiresAt, tc.wantExpires)
			}
			if !got.MaxExpiresAt.Equal(tc.window.MaxExpiresAt) || !got.StartedAt.Equal(tc.window.StartedAt) {
				t.Errorf("Extend changed start or cap: %+v", got)
			}
		})
	}
}

func TestRemainingAndExpired(t *testing.T) {
	w := Policy{Lifetime: time.Hour, MaxLifetime: 3 * time.Hour}.Open(t0)
	tests := []struct {
		name          string
		now           time.Time
		wantRemaining time.Duration
		wantExpired   bool
		wantExtend    bool
	}{
		{"at open", t0, time.Hour, false, true},
		{"one second left", t0.Add(time.Hour - time.Second), time.Second, false, true},
		{"exactly at expiry", t0.Add(time.Hour), 0, true, false},
		{"long past expiry is zero, not negative", t0.Add(5 * time.Hour), 0, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Remaining(w, tc.now); got != tc.wantRemaining {
				t.Errorf("Remaining = %s, want %s", got, tc.wantRemaining)
			}
			if got := Expired(w, tc.now); got != tc.wantExpired {
				t.Errorf("Expired = %v, want %v", got, tc.wantExpired)
			}
			if got := Extendable(w, tc.now); got != tc.wantExtend {
				t.Errorf("Extendable = %v, want %v", got, tc.wantExtend)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		p       Policy
		wantErr bool
	}{
		{"defaults", Policy{time.Hour, 3 * time.Hour}, false},
		{"equal lifetime and cap", Policy{time.Hour, time.Hour}, false},
		{"zero lifetime", Policy{0, time.Hour}, true},
		{"cap below lifetime", Policy{2 * time.Hour, time.Hour}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.p.Validate(); (err != nil) != tc.wantErr {
				t.Errorf("Validate = %v, wantErr %v", err, tc.wantErr)
			}
		})
	}
}

func TestWarnings(t *testing.T) {
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	tests := []struct {
		name   string
		window Window
		want   []Warning
	}{
		{"an hour: 10 and 5 minutes before expiry",
			Window{t0, at(time.Hour), at(3 * time.Hour)},
			[]Warning{{10 * time.Minute, at(50 * time.Minute)}, {5 * time.Minute, at(55 * time.Minute)}}},
		{"extended: the warnings move with the expiry",
			Window{t0, at(90 * time.Minute), at(3 * time.Hour)},
			[]Warning{{10 * time.Minute, at(80 * time.Minute)}, {5 * time.Minute, at(85 * time.Minute)}}},
		{"8 minutes: only the 5-minute warning",
			Window{t0, at(8 * time.Minute), at(24 * time.Minute)},
			[]Warning{{5 * time.Minute, at(3 * time.Minute)}}},
		{"exactly 10 minutes: warned at the start",
			Window{t0, at(10 * time.Minute), at(30 * time.Minute)},
			[]Warning{{10 * time.Minute, t0}, {5 * time.Minute, at(5 * time.Minute)}}},
		{"2 minutes: none", Window{t0, at(2 * time.Minute), at(6 * time.Minute)}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Warnings(tc.window)); diff != "" {
				t.Errorf("Warnings (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWarningDue(t *testing.T) {
	w := Window{t0, t0.Add(time.Hour), t0.Add(3 * time.Hour)}
	wn := Warning{10 * time.Minute, t0.Add(50 * time.Minute)}
	tests := []struct {
		name string
		now  time.Time
		want bool
	}{
		{"before its time", t0.Add(50*time.Minute - time.Second), false},
		{"at its time", t0.Add(50 * time.Minute), true},
		{"one second before expiry", t0.Add(time.Hour - time.Second), true},
		{"expired", t0.Add(time.Hour), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := wn.Due(w, tc.now); got != tc.want {
				t.Errorf("Due at %s = %v, want %v", tc.now.Sub(t0), got, tc.want)
			}
		})
	}
}

func TestExtendRefusal(t *testing.T) {
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	tests := []struct {
		name   string
		window Window
		now    time.Time
		want   error
	}{
		{"before the cap", Window{t0, at(time.Hour), at(3 * time.Hour)}, at(time.Minute), nil},
		{"at the cap", Window{t0, at(3 * time.Hour), at(3 * time.Hour)}, at(time.Hour), ErrAtCap},
		{"expired", Window{t0, at(time.Hour), at(3 * time.Hour)}, at(time.Hour), ErrExpired},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ExtendRefusal(tc.window, tc.now); !errors.Is(got, tc.want) || (tc.want == nil) != (got == nil) {
				t.Errorf("ExtendRefusal = %v, want %v", got, tc.want)
			}
			if got := Extendable(tc.window, tc.now); got != (tc.want == nil) {
				t.Errorf("Extendable = %v, want %v", got, tc.want == nil)
			}
		})
	}
}
