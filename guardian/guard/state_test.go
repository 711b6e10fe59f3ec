package guard

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"golang.org/x/sys/unix"

	"labkeep/guardian/alert"
	"labkeep/guardian/victim"
)

func TestFileStore(t *testing.T) {
	saved := State{MemoryLimit: 1024 * mib, Kills: 2, Starts: 1,
		Budget: victim.KillBudget{Kills: []time.Time{time.Unix(1_000_000, 0).UTC()}}}
	tests := []struct {
		name      string
		content   *string // nil: no file
		want      State
		wantOK    bool
		wantErrIs error
	}{
		{name: "nothing saved yet", wantOK: false},
		{name: "torn file", content: ptr(`{"memory_limit": 10`), wantErrIs: ErrStateUnreadable},
		{name: "foreign file", content: ptr(`[1,2,3]`), wantErrIs: ErrStateUnreadable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := FileStore{Path: filepath.Join(t.TempDir(), "state.json")}
			if tt.content != nil {
				if err := os.WriteFile(f.Path, []byte(*tt.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, ok, err := f.Load()
			if !errors.Is(err, tt.wantErrIs) || (tt.wantErrIs == nil && err != nil) {
				t.Fatalf("Load() error = %v; want %v", err, tt.wantErrIs)
			}
			if ok != tt.wantOK {
				t.Errorf("Load() ok = %v; want %v", ok, tt.wantOK)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Load() (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("saved state loads back, replacing the old file whole", func(t *testing.T) {
		dir := t.TempDir()
		f := FileStore{Path: filepath.Join(dir, "state.json")}
		if err := f.Save(State{MemoryLimit: 1, Alerts: nil, Bombs: 7}); err != nil {
			t.Fatal(err)
		}
		if err := f.Save(saved); err != nil {
			t.Fatal(err)
		}
		got, ok, err := f.Load()
		if err != nil || !ok {
			t.Fatalf("Load() = %v, %v", ok, err)
		}
		if diff := cmp.Diff(saved, got); diff != "" {
			t.Errorf("Load() after Save (-want +got):\n%s", diff)
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 {
			t.Errorf("directory holds %d entries after two saves; want the state file only", len(entries))
		}
	})
}

// A state file guardian cannot read must not stop it: it starts afresh.
func TestStartWithUnreadableState(t *testing.T) {
	r := newRigWith(t, testConfig(), func(r *rig) {
		r.store.Path = filepath.Join(t.TempDir(), "state.json")
		if err := os.WriteFile(r.store.Path, []byte("{torn"), 0o600); err != nil {
			t.Fatal(err)
		}
	})
	if r.g.st.Starts != 1 {
		t.Errorf("starts = %d; want 1 (a fresh state)", r.g.st.Starts)
	}
	st, ok, err := r.store.Load()
	if err != nil || !ok || st.Starts != 1 {
		t.Errorf("state after start = %+v, %v, %v; want the fresh state saved over the torn one", st, ok, err)
	}
}

func ptr[T any](v T) *T { return &v }

// alertsOf returns n alerts of about size bytes each, kinds a0…a(n-1).
func alertsOf(n, size int) []alert.Alert {
	var out []alert.Alert
	for i := range n {
		out = append(out, alert.Alert{Kind: "a" + strconv.Itoa(i), Message: strings.Repeat("m", size),
			First: time.Unix(1, 0).UTC(), Last: time.Unix(1, 0).UTC(), Count: 1})
	}
	return out
}

// The state file stays within its cap however many alerts there are: the
// oldest are left out, and as many of the newest kept, in order, as fit.
func TestFileStoreSaveIsBounded(t *testing.T) {
	const max = 16 << 10
	tests := []struct {
		name     string
		alerts   []alert.Alert
		wantSome bool // some alerts must be left out
	}{
		{"alerts that fit are all kept", alertsOf(5, 100), false},
		{"too many alerts: the newest that fit", alertsOf(200, 1000), true},
		{"one alert bigger than the cap is left out", alertsOf(1, max), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := FileStore{Path: filepath.Join(t.TempDir(), "state.json"), MaxBytes: max}
			if err := f.Save(State{MemoryLimit: 1, Starts: 3, Alerts: tt.alerts}); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(f.Path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() > max {
				t.Errorf("state file is %d bytes; want at most %d", fi.Size(), max)
			}
			got, ok, err := f.Load()
			if err != nil || !ok {
				t.Fatalf("Load() = %v, %v", ok, err)
			}
			if got.Starts != 3 || got.MemoryLimit != 1 {
				t.Errorf("loaded %+v; want the rest of the state whole", got)
			}
			kept := len(got.Alerts)
			if diff := cmp.Diff(tt.alerts[len(tt.alerts)-kept:], got.Alerts, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("alerts kept are not the newest in order (-want +got):\n%s", diff)
			}
			if dropped := len(tt.alerts) - kept; (dropped > 0) != tt.wantSome {
				t.Errorf("%d of %d alerts left out; want some left out: %v", dropped, len(tt.alerts), tt.wantSome)
			}
			if kept < len(tt.alerts) {
				// The next older one would not have fitted.
				next, err := json.Marshal(tt.alerts[len(tt.alerts)-kept-1])
				if err != nil {
					t.Fatal(err)
				}
				if int(fi.Size())+len(next)+1 <= max {
					t.Errorf("file of %d bytes left out an alert of %d that fitted under %d", fi.Size(), len(next), max)
				}
			}
		})
	}
}

// A file of exactly the cap loads; one byte more is refused as unreadable
// without being read whole.
func TestFileStoreLoadAtTheCap(t *testing.T) {
	dir := t.TempDir()
	small := FileStore{Path: filepath.Join(dir, "state.json"), MaxBytes: 1 << 20}
	if err := small.Save(State{Starts: 2, Alerts: alertsOf(3, 50)}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(small.Path)
	if err != nil {
		t.Fatal(err)
	}
	const max = 4096
	atCap := append(b, bytes.Repeat([]byte(" "), max-len(b))...) // JSON allows trailing space
	if err := os.WriteFile(small.Path, atCap, 0o600); err != nil {
		t.Fatal(err)
	}
	f := FileStore{Path: small.Path, MaxBytes: max}
	st, ok, err := f.Load()
	if err != nil || !ok || st.Starts != 2 || len(st.Alerts) != 3 {
		t.Fatalf("Load() of a %d-byte file at the cap = %+v, %v, %v; want the saved state", len(atCap), st, ok, err)
	}
	if err := os.WriteFile(f.Path, append(atCap, ' '), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Load(); !errors.Is(err, ErrStateUnreadable) {
		t.Errorf("Load() of a file one byte over the cap = %v; want ErrStateUnreadable", err)
	}
}

// A state file over the cap (left by a guardian without one, or written
// by someone else) is ignored with an alert, and guardian starts afresh
// and saves a good state over it.
func TestStartWithOversizedState(t *testing.T) {
	r := newRigWith(t, testConfig(), func(r *rig) {
		r.store.Path = filepath.Join(t.TempDir(), "state.json")
		huge := `{"starts": 41, "alerts": [{"kind": "x", "message": "` + strings.Repeat("A", DefaultStateMaxBytes) + `"}]}`
		if err := os.WriteFile(r.store.Path, []byte(huge), 0o600); err != nil {
			t.Fatal(err)
		}
	})
	if r.g.st.Starts != 1 {
		t.Errorf("starts = %d; want 1 (a fresh state)", r.g.st.Starts)
	}
	if !slices.Contains(r.alertKinds(), "state-unreadable") {
		t.Errorf("alerts %v; want state-unreadable", r.alertKinds())
	}
	st, ok, err := r.store.Load()
	if err != nil || !ok || st.Starts != 1 {
		t.Errorf("state after start = %+v, %v, %v; want the fresh state saved over the oversized one", st, ok, err)
	}
}

// On a full volume a save fails, the previous state stays whole, and
// guardian still starts (and says it cannot save). The volume is a real
// tmpfs of 64 KiB.
func TestSaveOnAFullVolume(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("mount a tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	path := filepath.Join(dir, "state.json")
	if err := (FileStore{Path: path}).Save(State{Starts: 5, MemoryLimit: 1024 * mib}); err != nil {
		t.Fatal(err)
	}
	filler, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := filler.Write(make([]byte, 4096)); err != nil {
			break // ENOSPC
		}
	}
	filler.Close()
	err = (FileStore{Path: path}).Save(State{Starts: 6, Alerts: alertsOf(20, 1000)})
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("Save() on a full volume = %v; want ENOSPC", err)
	}
	r := newRigWith(t, testConfig(), func(r *rig) { r.store.Path = path })
	if r.g.st.Starts != 6 || r.g.st.MemoryLimit != 1024*mib {
		t.Errorf("started with %+v; want the state before the failed save taken up (starts 5+1, M)", r.g.st)
	}
	if !slices.Contains(r.alertKinds(), "state-save-failed") {
		t.Errorf("alerts %v; want state-save-failed", r.alertKinds())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("volume holds %d entries; want the state and the filler, no temporary file left", len(entries))
	}
}
